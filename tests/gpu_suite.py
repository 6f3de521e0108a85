"""`make test-gpu`: the course on NCCL, on a machine with one GPU per rank (issue 29).

Every step runs with ZEROCOURSE_BACKEND=nccl in the environment, so the notebooks' own
`launch(fn, N)` calls use NCCL (launch's "auto" stays on gloo until this has passed: see
zerocourse/launch.py NCCL_VERIFIED); the probe and the bench pass backend="nccl" explicitly.

1. probe: the launcher on NCCL for 1..RANKS ranks: each rank's zerocourse.rank_device() is
   cuda:<rank>, an all-reduce of a tensor on it sums, the results come back on the CPU;
2. solutions: every solution notebook top to bottom (nbclient; the kernel's environment has
   ZEROCOURSE_BACKEND=nccl);
3. graded: every notebook's graded cells with the reference solution (tests/harness.py's
   assert_full_marks, on the real devices: no proxy);
4. bench: zerocourse.bench's stages and overlap parts with backend="nccl": DP vs DDP, ZeRO-1 vs
   ZeroRedundancyOptimizer, ZeRO-2 vs FSDP, ZeRO-3 vs FSDP2 (ratios and absolute step times),
   written to bench/results-gpu.json.

Without one GPU per rank of the course's largest launch (RANKS) it says so in one line and
exits 1: nothing is run on fewer GPUs, so a pass always means the whole course ran on NCCL.
`--dry-run` prints the plan for this machine (or for `--gpus K`) without running it; `--only`
picks steps. Where it passes, record the figures and the date in the README, then set
NCCL_VERIFIED.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
# The course's largest launch: 4 ranks (00's hello, the demos and tests of 02-04, the bench).
RANKS = 4
STEPS = ("probe", "solutions", "graded", "bench")


def gpu_count() -> int:
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def plan(gpus: int, steps=STEPS, ranks: int = RANKS) -> tuple[bool, list[str]]:
    """(whether it can run, the lines that say what runs or why not) for `gpus` GPUs.

    Args:
        gpus: GPUs on this machine.
        steps: the steps asked for (a subset of STEPS).
        ranks: GPUs needed: one per rank of the course's largest launch.
    """
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        return False, [f"make test-gpu: unknown step(s) {unknown}; choose among {list(STEPS)}"]
    if gpus == 0:
        return False, [f"make test-gpu: no GPU on this machine (torch.cuda sees none); it needs "
                       f"{ranks}, one per rank of the course's largest launch. Nothing run."]
    if gpus < ranks:
        return False, [f"make test-gpu: {gpus} GPU(s) here, {ranks} needed (one per rank of the "
                       f"course's largest launch). Nothing run."]
    what = {"probe": f"launcher probe on NCCL, 1..{ranks} ranks",
            "solutions": "every solution notebook top to bottom on NCCL",
            "graded": "every notebook's graded cells with the reference solution on NCCL",
            "bench": "bench stages + overlap on NCCL (ratios vs DDP, ZeroRedundancyOptimizer, "
                     "FSDP, FSDP2; step times) -> bench/results-gpu.json"}
    return True, [f"make test-gpu: {gpus} GPUs, ZEROCOURSE_BACKEND=nccl"] + \
        [f"  {i + 1}. {what[s]}" for i, s in enumerate(steps)]


def _assignments() -> list[str]:
    src = os.path.join(ROOT, "solutions")
    return sorted(d for d in os.listdir(src) if os.path.isfile(os.path.join(src, d, f"{d}.ipynb")))


def _probe_rank(rank, world_size):
    import torch
    import torch.distributed as dist
    from zerocourse.devices import rank_device
    device = rank_device()
    assert device == torch.device("cuda", rank), f"rank {rank}: rank_device() is {device}"
    assert dist.get_backend() == "nccl", dist.get_backend()
    t = torch.full((4,), float(rank + 1), device=device)
    dist.all_reduce(t)
    return t                                  # comes back on the CPU


def step_probe() -> list[str]:
    import torch
    from zerocourse.launch import launch
    lines = []
    for n in range(1, RANKS + 1):
        t0 = time.perf_counter()
        out = launch(_probe_rank, n, backend="nccl", timeout=300)
        want = float(n * (n + 1) // 2)
        assert all(t.device.type == "cpu" and torch.equal(t, torch.full((4,), want)) for t in out), out
        lines.append(f"probe: {n} rank(s) on NCCL, all-reduce right, results on the CPU "
                     f"({time.perf_counter() - t0:.2f} s)")
    return lines


def step_solutions() -> list[str]:
    import nbformat
    from nbclient import NotebookClient
    lines = []
    for aid in _assignments():
        folder = os.path.join(ROOT, "solutions", aid)
        nb = nbformat.read(os.path.join(folder, f"{aid}.ipynb"), as_version=4)
        t0 = time.perf_counter()
        NotebookClient(nb, timeout=600, kernel_name="python3",
                       resources={"metadata": {"path": folder}}).execute(env=dict(os.environ))
        lines.append(f"solutions: {aid} ran top to bottom on NCCL in {time.perf_counter() - t0:.1f} s")
    return lines


def step_graded() -> list[str]:
    from tests.harness import assert_full_marks, score
    lines = []
    for aid in _assignments():
        results = assert_full_marks(aid, device_proxy=False)
        earned, possible = score(aid, results)
        lines.append(f"graded: {aid} reference {earned:g}/{possible:g} on NCCL")
    return lines


def step_bench() -> list[str]:
    from zerocourse import bench
    results = {"machine": {"cpus": os.cpu_count(), "gpus": gpu_count(), "backend": "nccl",
                           "date": time.strftime("%Y-%m-%d")}}
    results["stages"], results["params"] = bench.bench_stages(backend="nccl")
    results["overlap"] = bench.bench_overlap(backend="nccl")
    bench._print(results)
    os.makedirs(os.path.join(ROOT, "bench"), exist_ok=True)
    path = os.path.join(ROOT, "bench", "results-gpu.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=2)
    return [f"bench: written to {path}"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(STEPS), help=f"steps (default: {','.join(STEPS)})")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    parser.add_argument("--gpus", type=int, default=None, help="with --dry-run: plan for K GPUs")
    args = parser.parse_args(argv)
    steps = [s for s in args.only.split(",") if s]
    gpus = args.gpus if args.gpus is not None and args.dry_run else gpu_count()
    ok, lines = plan(gpus, steps)
    print("\n".join(lines), flush=True)
    if not ok:
        return 1
    if args.dry_run:
        return 0
    os.environ["ZEROCOURSE_BACKEND"] = "nccl"
    os.environ.pop("ZEROCOURSE_DEVICE_PROXY", None)
    failed = []
    for name in steps:
        t0 = time.monotonic()
        try:
            for line in globals()[f"step_{name}"]():
                print(line, flush=True)
            print(f"== {name}: passed ({time.monotonic() - t0:.0f} s)", flush=True)
        except Exception:                          # noqa: BLE001 - report every step's failure
            failed.append(name)
            traceback.print_exc()
            print(f"== {name}: FAILED ({time.monotonic() - t0:.0f} s)", flush=True)
    if failed:
        print(f"make test-gpu: FAILED ({', '.join(failed)}); the NCCL path is not verified")
        return 1
    print("make test-gpu: passed. Record the figures and the date in the README, then set "
          "zerocourse/launch.py NCCL_VERIFIED = True.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
