"""Benchmarks (`make bench`): figures printed, and written to bench/results.json.

Not a timed test: it measures and reports, in one run (`--only launcher,stages,...` for parts):
1. the launcher: median launch + teardown of a trivial all-reduce on 2 and 4 ranks, for
   zerocourse.launch (ranks forked from a fork server) and torchrun, and the first launch
   in a fresh interpreter; under stress (`--only stress`): K = 1, 4, 8 kernels launching
   at once beside CPU burners, launches per second, failures, p50/p95 launch time and their
   ratio (tests/test_launch_stress.py checks the failures and leftovers, never the times);
2. every stage, the course's reference implementation (loaded from solutions/ with the
   notebook loader; a learner's handout: my-notebooks/) against torch's own on the same
   TinyGPT, data and N (2 and 4 gloo
   ranks): DP vs DistributedDataParallel, ZeRO-1 vs ZeroRedundancyOptimizer, ZeRO-2 vs FSDP
   SHARD_GRAD_OP, ZeRO-3 vs FSDP2 fully_shard. Step times are fp32 (torch's wrappers all
   run it); bytes held and sent are measured on our implementations in bf16 + fp32-master
   Adam, the setting of the paper's formulas, next to what the notebooks' own formulas (01's
   model_state_bytes, 06's comm_bytes_per_rank, loaded like the implementations) give: this
   package holds no graded formula; `--only overlap`: 07_overlap's bucketed,
   overlapped DP vs DistributedDataParallel and its prefetching ZeRO-3 vs FSDP2 (bench_overlap);
3. every notebook: its solution run top to bottom headless, and the autograde time of the
   solution submitted through autograder/grade.py (with --blank, of the release copy too);
4. `--only class`: a class graded: `--class-size` submissions of every notebook with each
   `--class-jobs` value and the totals (`--class-budget-min`: what does not fit is listed as
   not measured); `python -m tests.measured --from-bench bench/results.json --write` puts them
   in autograder/notes/WORKSHOP.md's class table, dated.

results.json schema:
    {"machine": {"cpus": int, "torch": str, "gpus": int, "backend": str},
     "launcher": {"<N>": {"zerocourse_s", "torchrun_s", "ratio", "repeats"}},
     "first_launch": {"first_launch_s", "import_s", "repeats"},  # fresh interpreter
     "stress": {"<K>": {"kernels", "burners", "launches", "failures", "failure_lines",
                        "launches_per_s", "p50_s", "p95_s", "max_s",
                        "first_launch_s", "leftover"}},       # K kernels at once, see bench_stress
     "stages": {"<N>": {"<stage 0-3>": {
         "ours": str, "torch": str,                # what ran
         "ours_step_s", "torch_step_s", "ratio",   # median step time, ours / torch's
         "bytes_per_rank",                         # model-state bytes on rank 0 (bf16) between
                                                   # steps (zero_grad done)
         "bytes_in_step",                          # their most during a step (after backward
                                                   # or after the optimizer's step)
         "bytes_01",                               # 01's model_state_bytes(Ψ, N, stage): the
                                                   # formula as the notebook 01 at hand has it
         "sent_per_rank", "sent_06"}}},            # ring bytes rank 0 sends per step (measured),
                                                   # and 06's comm_bytes_per_rank(stage, Ψ, N, 2)
     "params": int,                                # Ψ of the benchmark model
     "overlap": [{"N", "name", "ours_ms", "torch_ms", "ratio"}],  # 07_overlap's reference vs torch:
                                                   # name "bucketed_dp_vs_ddp" (OverlappedDP vs DDP)
                                                   # or "zero3_prefetch_vs_fsdp2" (ZeRO3PrefetchModule
                                                   # vs FSDP2); fp32 median step ms, ratio = ours/torch
     "notebooks": {"<assignment>": {"execute_s"}}, # solution run top to bottom, headless
     "notebooks_total_s": float,
     "autograde": {"<assignment>": {               # autograder/grade.py, one row per submission
         "reference_s", "reference_score",         # the solution notebook submitted
         "max_score", "manual_points",             # manual points: graded by hand, not here
         "blank_s", "blank_score"}},               # with --blank: the release copy (stubs)
     "autograde_sandboxed": bool,                  # kernels ran in the bubblewrap sandbox
     "class": {"size", "sandboxed", "cpus", "date", # see bench_class
               "notebooks": {"<assignment>": {"jobs<J>_s", "jobs<J>_full"}},
               "totals": {"jobs<J>_s"}, "totals_over": [...], "not_measured": [...]}}
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from zerocourse.launch import launch

_TRIVIAL = """
import os, torch, torch.distributed as dist
backend = os.environ["ZC_BENCH_BACKEND"]
dist.init_process_group(backend)
device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if backend == "nccl" else torch.device("cpu")
t = torch.ones(1, device=device)
dist.all_reduce(t)
dist.destroy_process_group()
"""


def _allreduce(rank, world_size):
    import torch
    import torch.distributed as dist
    from zerocourse.devices import rank_device
    t = torch.ones(1, device=rank_device())
    dist.all_reduce(t)
    return t.item()


def _sync(device) -> None:
    """Wait for the device's queued work: a CUDA step time means nothing before it is done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_launcher(world_sizes=(2, 4), repeats: int = 7, torchrun_repeats: int = 3,
                   backend: str = "gloo") -> dict:
    """Median launch + teardown of a one-all-reduce job: zerocourse.launch vs torchrun."""
    launch(_allreduce, 2, backend=backend)    # start the fork server once (paid once per kernel)
    out = {}
    env = dict(os.environ, ZC_BENCH_BACKEND=backend)
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "trivial.py")
        with open(script, "w") as f:
            f.write(_TRIVIAL)
        for n in world_sizes:
            ours = _median(lambda: launch(_allreduce, n, backend=backend), repeats)
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc_per_node={n}", script]
            theirs = _median(lambda: subprocess.run(cmd, check=True, capture_output=True, env=env),
                             torchrun_repeats)
            out[str(n)] = {"zerocourse_s": round(ours, 4), "torchrun_s": round(theirs, 3),
                           "ratio": round(ours / theirs, 4), "repeats": repeats}
    return out


# --------------------------------------------------------------------------
# the launcher under stress: K notebook kernels launching at once beside CPU burners
# --------------------------------------------------------------------------
def _stress_collectives(rank, world_size):
    import torch
    import torch.distributed as dist
    t = torch.ones(4)
    dist.all_reduce(t)
    dist.broadcast(t, 0)
    return t.sum().item()


def _stress_nothing(rank, world_size):
    return rank


def _stress_rank0_first(rank, world_size):
    import time
    if rank != 0:
        time.sleep(0.02)        # rank 0 returns (and would tear down) while this rank is busy
    return rank


# (name, world_size, fn): every launch a notebook makes in 00's sweep and the demos.
STRESS_SCENARIOS = [("collectives", 2, _stress_collectives), ("collectives", 4, _stress_collectives),
                    ("nothing", 2, _stress_nothing), ("nothing", 4, _stress_nothing),
                    ("rank0-first", 2, _stress_rank0_first), ("rank0-first", 4, _stress_rank0_first)]


def _stress_kernel(rounds: int) -> dict:
    """One "kernel": its own launcher and fork server, `rounds` x every scenario.

    Args:
        rounds: how many times each scenario of STRESS_SCENARIOS is launched.
    Returns:
        first_s (the first launch, fork server start included), times (s, each later launch),
        failures (one line each), start/end (time.time() of the steady part).
    """
    t0 = time.perf_counter()
    launch(_stress_nothing, 2, timeout=120)
    first = time.perf_counter() - t0
    times, failures = [], []
    start = time.time()
    for _ in range(rounds):
        for name, n, fn in STRESS_SCENARIOS:
            t0 = time.perf_counter()
            try:
                out = launch(fn, n, timeout=60)
                if fn is _stress_nothing or fn is _stress_rank0_first:
                    assert out == list(range(n)), out
            except Exception as e:                 # noqa: BLE001 - every failure is counted
                failures.append(f"{name}/{n}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
            times.append(time.perf_counter() - t0)
    return {"first_s": first, "times": times, "failures": failures, "start": start,
            "end": time.time()}


def _burn() -> None:
    while True:
        pass


def bench_stress(kernels: int = 4, rounds: int = 5, burners: int = 2, timeout: float = 300) -> dict:
    """K kernels (separate processes, each with its own fork server) launching at once.

    Args:
        kernels: concurrent kernels K.
        rounds: rounds of STRESS_SCENARIOS per kernel (6 launches a round).
        burners: processes spinning on a core each, beside them.
        timeout: seconds before the kernels are killed (counted as failures).
    Returns:
        launches, failures (and the first few failure lines), launches_per_s (sustained, first
        launches excluded), p50_s, p95_s, max_s, first_launch_s (median over kernels),
        leftover (processes still alive afterwards).
    """
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    burn = [subprocess.Popen([sys.executable, "-c", "from zerocourse.bench import _burn; _burn()"],
                             env=env) for _ in range(burners)]
    procs = [subprocess.Popen([sys.executable, "-m", "zerocourse.bench", "--stress-kernel",
                               str(rounds)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env, start_new_session=True) for _ in range(kernels)]
    pids = [p.pid for p in procs]
    reports, errors = [], []
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            try:
                out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                out, err = p.communicate()
                errors.append(f"kernel {p.pid} timed out")
                continue
            line = [x for x in out.splitlines() if x.startswith("{")]
            if p.returncode != 0 or not line:
                errors.append(f"kernel {p.pid} exited {p.returncode}: {err[-500:]}")
                continue
            reports.append(json.loads(line[-1]))
    finally:
        for b in burn:
            b.kill()
            b.wait()
        for p in procs:                      # interrupted: no kernel (nor its ranks) survives
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
    time.sleep(0.5)                          # fork servers exit when their kernel's pipe closes
    leftover = [pid for pid in _session_members(pids)]
    times = sorted(t for r in reports for t in r["times"])
    failures = [f for r in reports for f in r["failures"]] + errors
    span = (max(r["end"] for r in reports) - min(r["start"] for r in reports)) if reports else 0
    q = (lambda f: times[min(len(times) - 1, int(f * len(times)))]) if times else (lambda f: float("nan"))
    return {"kernels": kernels, "burners": burners, "launches": len(times) + len(reports),
            "failures": len(failures), "failure_lines": failures[:5],
            "launches_per_s": round(len(times) / span, 2) if span else 0.0,
            "p50_s": round(q(0.5), 3), "p95_s": round(q(0.95), 3), "max_s": round(q(1.0), 3),
            "first_launch_s": round(statistics.median(r["first_s"] for r in reports), 2)
            if reports else float("nan"), "leftover": leftover}


def _session_members(sids: list[int]) -> list[int]:
    """PIDs of live processes whose session id is one of `sids` (what a kernel left behind)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[3]) in sids:
            out.append(int(entry))
    return out


_FIRST_LAUNCH = """
import time
t0 = time.perf_counter()
import torch, zerocourse
from zerocourse.launch import launch, warm_up
warm_up()                                  # what `import zerocourse` does in a Jupyter kernel
t1 = time.perf_counter()
def f(rank, world_size):
    return rank
launch(f, 2)
t2 = time.perf_counter()
print(round(t1 - t0, 3), round(t2 - t1, 3))
"""


def bench_first_launch(repeats: int = 3) -> dict:
    """The first launch in a fresh interpreter (fork server start included), right after
    `import torch, zerocourse`: the worst case of a notebook whose next cell launches.

    Returns:
        first_launch_s (median), import_s (median time of the imports before it), repeats.
    """
    runs = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", _FIRST_LAUNCH], check=True,
                             capture_output=True, text=True).stdout.split()
        runs.append((float(out[-2]), float(out[-1])))
    return {"first_launch_s": statistics.median(r[1] for r in runs),
            "import_s": statistics.median(r[0] for r in runs), "repeats": repeats}


STAGE_NOTEBOOKS = {0: ("02_data_parallelism", ["dp_train_step", "broadcast_parameters"]),
                   1: ("03_zero1", ["ZeRO1Adam"]), 2: ("04_zero2", ["ZeRO2Adam"]),
                   3: ("05_zero3", ["ZeRO3Module", "ZeRO3Adam"])}
TORCH_EQUIVALENT = {0: "DistributedDataParallel", 1: "ZeroRedundancyOptimizer",
                    2: "FSDP SHARD_GRAD_OP", 3: "FSDP2 fully_shard"}


def _fsdp2(model, world_size):
    """FSDP2 `fully_shard` on each TinyGPT block and on the root, over a mesh of all ranks on
    the rank's device type (cpu under gloo, cuda under NCCL)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from zerocourse.devices import rank_device
    mesh = init_device_mesh(rank_device().type, (world_size,))
    for block in model.h:
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _setup(rank, world_size, stage, nb, dtype, ours: bool):
    """Model, a step function and the objects holding model state, for one stage (everything
    on the rank's device: zerocourse.devices)."""
    from zerocourse.devices import rank_device
    from zerocourse.models import GPTConfig, TinyGPT, lm_loss, make_toy_batch
    from zerocourse.optim import MixedPrecisionAdam
    device = rank_device()
    torch.manual_seed(0)
    model = TinyGPT(GPTConfig(vocab_size=64, block_size=64, n_layer=2, n_head=4, n_embd=64,
                              bias=False), device=device).to(dtype)
    x, y = make_toy_batch(16, 64, 64, seed=1, device=device)   # the global batch
    k = len(x) // world_size
    xs, ys = x[rank * k:(rank + 1) * k], y[rank * k:(rank + 1) * k]
    adam = MixedPrecisionAdam if dtype == torch.bfloat16 else torch.optim.Adam
    if ours:
        if stage == 0:
            nb.broadcast_parameters(model)
            opt = adam(model.parameters(), lr=1e-3)
            return (lambda: nb.dp_train_step(model, opt, x, y, lm_loss)), model, opt
        if stage == 3:
            model = nb.ZeRO3Module(model)
            opt = nb.ZeRO3Adam(model, lr=1e-3)
        else:
            opt = (nb.ZeRO1Adam if stage == 1 else nb.ZeRO2Adam)(model.parameters(), lr=1e-3)
    else:
        if stage == 0:
            model = torch.nn.parallel.DistributedDataParallel(model)
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        elif stage == 1:
            from torch.distributed.optim import ZeroRedundancyOptimizer
            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
        elif stage == 2:
            from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
            model = FullyShardedDataParallel(model, sharding_strategy=ShardingStrategy.SHARD_GRAD_OP,
                                             device_id=device)
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        else:
            model = _fsdp2(model, world_size)
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        lm_loss(model(xs), ys).backward()
        opt.step()
        opt.zero_grad()
    return step, model, opt


def _stage_job(rank, world_size, stage, nb, steps):
    """Median step times (ours, torch's; fp32) and ours' bytes held and sent (bf16).

    Bytes held are measured between steps and right after backward and after the optimizer's
    step of one more step (lm_loss(...).backward(); opt.step(); opt.zero_grad(): the step of
    ZeRO-1/2/3; for DP the same without its all-reduce, which holds no state).
    """
    from zerocourse.comm import CommTracer
    from zerocourse.devices import rank_device
    from zerocourse.memory import measure_state_bytes
    device = rank_device()
    out = {}
    for ours in (True, False):
        step, _, _ = _setup(rank, world_size, stage, nb, torch.float32, ours)
        step()                                            # warm-up (allocations, lazy init)
        times = []
        for _ in range(steps):
            _sync(device)
            t0 = time.perf_counter()
            step()
            _sync(device)
            times.append(time.perf_counter() - t0)
        out["ours_step_s" if ours else "torch_step_s"] = statistics.median(times)
    step, model, opt = _setup(rank, world_size, stage, nb, torch.bfloat16, True)
    step()
    with CommTracer() as tracer:
        step()
    out["sent_per_rank"] = tracer.sent_bytes
    out["bytes_per_rank"] = measure_state_bytes(model, opt)["total"]
    from zerocourse.models import lm_loss, make_toy_batch
    x, y = make_toy_batch(16, 64, 64, seed=1, device=device)
    k = len(x) // world_size
    lm_loss(model(x[rank * k:(rank + 1) * k]), y[rank * k:(rank + 1) * k]).backward()
    after_backward = measure_state_bytes(model, opt)["total"]
    opt.step()
    out["bytes_in_step"] = max(after_backward, measure_state_bytes(model, opt)["total"])
    opt.zero_grad()
    return out


def _learners_formula(folder: str, aid: str, name: str):
    """The function `name` of notebook `aid` in `folder` (the formulas are the learner's to
    write: the package holds none), or None with a line saying why it is not used."""
    from zerocourse.loader import NotebookLoadError, load_notebook
    try:
        return getattr(load_notebook(os.path.join(folder, aid, f"{aid}.ipynb"), names=[name]), name)
    except NotebookLoadError as e:
        print(f"  {aid}'s {name} not used: {e}", flush=True)
        return None


def _call(fn, *args):
    """fn(*args) as a float, or None where the formula is not written yet (a stub) or fails."""
    if fn is None:
        return None
    try:
        return float(fn(*args))
    except Exception as e:                       # noqa: BLE001 - a learner's stub, or a bug
        print(f"  {fn.__name__}{args}: {type(e).__name__}: {e}", flush=True)
        return None


def bench_stages(world_sizes=(2, 4), steps: int = 5, backend: str = "gloo") -> tuple[dict, int]:
    """Reference implementations vs torch's, per stage and N (see the module docstring).

    The bytes to expect come from the notebooks' own formulas (01's model_state_bytes, 06's
    comm_bytes_per_rank, loaded from the same folder as the implementations), never from here.
    """
    from zerocourse.loader import load_notebook
    from zerocourse.models import GPTConfig, TinyGPT
    folder = _impl_dir()
    psi = sum(p.numel() for p in TinyGPT(GPTConfig(vocab_size=64, block_size=64, n_layer=2,
                                                   n_head=4, n_embd=64, bias=False)).parameters())
    held = _learners_formula(folder, "01_bytes_per_parameter", "model_state_bytes")
    sent = _learners_formula(folder, "06_communication_bill", "comm_bytes_per_rank")
    out = {}
    for n in world_sizes:
        out[str(n)] = {}
        for stage, (aid, names) in STAGE_NOTEBOOKS.items():
            nb = load_notebook(os.path.join(folder, aid, f"{aid}.ipynb"), names=names)
            r = launch(_stage_job, n, stage, nb, steps, timeout=600, backend=backend)[0]
            r.update(ours=f"{aid} ({os.path.basename(folder)}/)", torch=TORCH_EQUIVALENT[stage],
                     ratio=r["ours_step_s"] / r["torch_step_s"],
                     bytes_01=_call(held, psi, n, stage), sent_06=_call(sent, stage, psi, n, 2))
            out[str(n)][str(stage)] = r
    return out, psi


OVERLAP_NOTEBOOK = ("07_overlap", ["OverlappedDP", "ZeRO3PrefetchModule"])
OVERLAP_ROWS = {"bucketed_dp_vs_ddp": "DistributedDataParallel (default bucket_cap_mb)",
                "zero3_prefetch_vs_fsdp2": "FSDP2 fully_shard per block + root"}


def _overlap_job(rank, world_size, name, nb, z3nb, steps, bucket_bytes):
    """Median fp32 step times (ms) of ours and torch's for one row, on the bench_stages TinyGPT.

    The two run side by side, one step of each in turn, so that a load change on a shared
    machine hits both alike.
    """
    from zerocourse.devices import rank_device
    from zerocourse.models import GPTConfig, TinyGPT, lm_loss, make_toy_batch
    device = rank_device()
    x, y = make_toy_batch(16, 64, 64, seed=1, device=device)
    k = len(x) // world_size
    xs, ys = x[rank * k:(rank + 1) * k], y[rank * k:(rank + 1) * k]

    def setup(ours):
        torch.manual_seed(0)
        model = TinyGPT(GPTConfig(vocab_size=64, block_size=64, n_layer=2, n_head=4, n_embd=64, bias=False),
                        device=device)
        finish = None
        if name == "bucketed_dp_vs_ddp":
            if ours:
                model = nb.OverlappedDP(model, bucket_bytes=bucket_bytes)
                finish = model.finish_gradient_sync
            else:
                model = torch.nn.parallel.DistributedDataParallel(model)
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        elif ours:
            model = nb.ZeRO3PrefetchModule(model, prefetch=1)
            opt = z3nb.ZeRO3Adam(model, lr=1e-3)
        else:
            model = _fsdp2(model, world_size)
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step():
            lm_loss(model(xs), ys).backward()
            if finish is not None:
                finish()
            opt.step()
            opt.zero_grad()
        return step

    runs = {"ours_ms": setup(True), "torch_ms": setup(False)}
    times = {key: [] for key in runs}
    for i in range(steps + 3):                          # 3 warm-up steps
        for key, step in runs.items():
            torch.distributed.barrier()
            _sync(device)
            t0 = time.perf_counter()
            step()
            _sync(device)
            if i >= 3:
                times[key].append(time.perf_counter() - t0)
    return {key: 1e3 * statistics.median(t) for key, t in times.items()}


def bench_overlap(world_sizes=(2, 4), steps: int = 20, bucket_bytes: int = 2 ** 20,
                  backend: str = "gloo") -> list[dict]:
    """07_overlap's reference (loaded from solutions/) vs torch's, fp32, on bench_stages' TinyGPT.

    Rows {"N", "name", "ours_ms", "torch_ms", "ratio"}: "bucketed_dp_vs_ddp" (OverlappedDP +
    torch.optim.Adam vs DistributedDataParallel with its default bucket_cap_mb) and
    "zero3_prefetch_vs_fsdp2" (ZeRO3PrefetchModule + 05's ZeRO3Adam vs FSDP2 fully_shard per
    block and root + torch.optim.Adam); median step time of `steps` steps after 3 warm-up steps,
    ours and torch's alternating step by step; ratio = ours / torch. bucket_bytes = 1 MiB is
    DDP's own first bucket (torch's _DEFAULT_FIRST_BUCKET_BYTES): the benchmark model (425 kB of
    fp32 gradients) is one bucket on both sides, so the row compares the implementations, not
    two bucketings.
    """
    from zerocourse.loader import load_notebook
    folder = _impl_dir()
    aid, names = OVERLAP_NOTEBOOK
    nb = load_notebook(os.path.join(folder, aid, f"{aid}.ipynb"), names=names)
    z3nb = load_notebook(os.path.join(folder, "05_zero3", "05_zero3.ipynb"), names=["ZeRO3Adam"])
    rows = []
    for n in world_sizes:
        for name in OVERLAP_ROWS:
            r = launch(_overlap_job, n, name, nb, z3nb, steps, bucket_bytes, timeout=600,
                       backend=backend)[0]
            rows.append({"N": n, "name": name, "ours_ms": round(r["ours_ms"], 3),
                         "torch_ms": round(r["torch_ms"], 3), "ratio": round(r["ours_ms"] / r["torch_ms"], 3)})
            print(f"  N={n} {name}: ours {r['ours_ms']:.2f} ms, torch {r['torch_ms']:.2f} ms, "
                  f"ratio {r['ours_ms'] / r['torch_ms']:.2f}", flush=True)
    return rows


def _course_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _impl_dir() -> str:
    """Where the implementations come from: the course's solutions/, else (a learner's handout,
    which has none) the learner's own my-notebooks/."""
    for name in ("solutions", "my-notebooks"):
        folder = os.path.join(_course_root(), name)
        if os.path.isdir(folder):
            return folder
    raise FileNotFoundError(f"no solutions/ or my-notebooks/ in {_course_root()}: the stages and "
                            f"overlap parts run notebooks' implementations (`make lab` makes "
                            f"my-notebooks/)")


def _assignments() -> list[str]:
    src = os.path.join(_course_root(), "solutions")
    return sorted(d for d in os.listdir(src) if os.path.isfile(os.path.join(src, d, f"{d}.ipynb")))


def bench_notebooks() -> dict:
    """Seconds to run each solution notebook top to bottom, headless (nbclient, one kernel each)."""
    import nbformat
    from nbclient import NotebookClient
    out = {}
    for aid in _assignments():
        folder = os.path.join(_course_root(), "solutions", aid)
        nb = nbformat.read(os.path.join(folder, f"{aid}.ipynb"), as_version=4)
        t0 = time.perf_counter()
        NotebookClient(nb, timeout=600, kernel_name="python3",
                       resources={"metadata": {"path": folder}}).execute()
        out[aid] = {"execute_s": round(time.perf_counter() - t0, 2)}
        print(f"  executed {aid} in {out[aid]['execute_s']:.1f} s", flush=True)
    return out


def _manual_points(aid: str) -> float:
    """Points of an assignment graded by hand (nbgrader: a graded cell that is also a solution)."""
    with open(os.path.join(_course_root(), "solutions", aid, f"{aid}.ipynb")) as f:
        cells = json.load(f)["cells"]
    meta = [c.get("metadata", {}).get("nbgrader", {}) for c in cells]
    return float(sum(m.get("points", 0) for m in meta if m.get("grade") and m.get("solution")))


def _grade(subs: str, graded: str, sandboxed: bool, *args: str) -> None:
    """Run autograder/grade.py on `subs` into `graded` (sandboxed when bubblewrap is there)."""
    cmd = [sys.executable, os.path.join(_course_root(), "autograder", "grade.py"), subs, graded,
           *args] + ([] if sandboxed else ["--no-sandbox"])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=7200)
    if proc.returncode != 0:
        raise RuntimeError(f"grade.py {' '.join(args)} failed:\n{proc.stderr[-3000:]}")


def bench_autograde(blank: bool = False) -> tuple[dict, bool]:
    """Seconds `make grade` spends per submission, per notebook: the reference solution
    submitted (full auto-graded marks expected) and, with `blank`, the release copy (stubs).

    One autograder/grade.py run, sandboxed when bubblewrap is there (as instructors grade);
    the per-row "seconds" of its grades.csv are the figures.
    """
    import csv
    import shutil as _shutil
    root = _course_root()
    sandboxed = _shutil.which("bwrap") is not None
    with tempfile.TemporaryDirectory(prefix="zc-bench-grade-") as tmp:
        subs, graded = os.path.join(tmp, "submissions"), os.path.join(tmp, "graded")
        for student, kind in (("reference", "solutions"),) + ((("blank", "notebooks"),) if blank else ()):
            for aid in _assignments():
                os.makedirs(os.path.join(subs, student, aid))
                _shutil.copy(os.path.join(root, kind, aid, f"{aid}.ipynb"),
                             os.path.join(subs, student, aid, f"{aid}.ipynb"))
        _grade(subs, graded, sandboxed)
        with open(os.path.join(graded, "grades.csv")) as f:
            rows = list(csv.DictReader(f))
    out = {}
    for r in rows:
        entry = out.setdefault(r["assignment_id"], {"max_score": float(r["max_score"]),
                                                    "manual_points": _manual_points(r["assignment_id"])})
        entry[f"{r['student_id']}_s"] = float(r["seconds"])
        entry[f"{r['student_id']}_score"] = float(r["score"])
    return out, sandboxed


def _as_submission(aid: str) -> dict:
    """The solution as a learner submits it: the release copy (notebooks/) with each answer
    cell's source taken from solutions/, nbgrader's solution markers removed."""
    import re
    root = _course_root()
    with open(os.path.join(root, "solutions", aid, f"{aid}.ipynb")) as f:
        sol = {c.get("metadata", {}).get("nbgrader", {}).get("grade_id"): c for c in json.load(f)["cells"]}
    with open(os.path.join(root, "notebooks", aid, f"{aid}.ipynb")) as f:
        nb = json.load(f)
    for cell in nb["cells"]:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("solution"):
            src = sol[meta["grade_id"]]["source"]
            src = "".join(src) if isinstance(src, list) else src
            cell["source"] = re.sub(r"^\s*### (BEGIN|END) SOLUTION\s*\n", "", src, flags=re.M)
    return nb


def bench_class(size: int = 20, jobs: tuple[int, ...] = (1, 2), aids: list[str] | None = None,
                budget_s: float | None = None) -> dict:
    """Wall-clock seconds to grade a class: `size` submissions of each notebook (the reference
    solution as a learner submits it), graded by autograder/grade.py with each JOBS value.

    Args:
        size: submissions per notebook (a workshop's class size).
        jobs: the JOBS values to compare (submissions graded at once).
        aids: notebooks (default: all).
        budget_s: stop starting new gradings once this many seconds have gone (the rest is
            listed as not measured, never estimated); None: measure everything.
    Returns:
        {"size", "sandboxed", "cpus", "date", "notebooks": {aid: {"jobs<j>_s", "jobs<j>_full"}},
         "totals": {"jobs<j>_s": seconds over the notebooks measured with every JOBS value},
         "not_measured": ["<aid> JOBS=<j>", ...]}. "jobs<j>_full" counts the submissions that
        got every autograded point: a fast run that graded wrongly shows there.
    """
    import csv
    import shutil as _shutil
    sandboxed = _shutil.which("bwrap") is not None
    out, not_measured = {}, []
    t_start = time.monotonic()
    for aid in aids or _assignments():
        top = None
        with tempfile.TemporaryDirectory(prefix="zc-bench-class-") as tmp:
            subs = os.path.join(tmp, "submissions")
            nb = _as_submission(aid)
            for k in range(size):
                os.makedirs(os.path.join(subs, f"learner{k:02d}", aid))
                with open(os.path.join(subs, f"learner{k:02d}", aid, f"{aid}.ipynb"), "w") as f:
                    json.dump(nb, f)
            for j in jobs:
                if budget_s is not None and time.monotonic() - t_start > budget_s:
                    not_measured.append(f"{aid} JOBS={j}")
                    continue
                graded = os.path.join(tmp, f"graded-{j}")
                t0 = time.monotonic()
                _grade(subs, graded, sandboxed, "--jobs", str(j))
                took = time.monotonic() - t0
                with open(os.path.join(graded, "grades.csv")) as f:
                    rows = list(csv.DictReader(f))
                top = float(rows[0]["max_score"]) - _manual_points(aid) if rows else top
                full = sum(float(r["score"]) == top for r in rows)
                out.setdefault(aid, {})[f"jobs{j}_s"] = round(took, 1)
                out[aid][f"jobs{j}_full"] = full
                print(f"  {aid}: {size} submissions, JOBS={j}: {took:.1f} s "
                      f"({took / size:.1f} s each; full marks {full}/{size})", flush=True)
    complete = [a for a, r in out.items() if all(f"jobs{j}_s" in r for j in jobs)]
    totals = {f"jobs{j}_s": round(sum(out[a][f"jobs{j}_s"] for a in complete), 1) for j in jobs}
    return {"size": size, "sandboxed": sandboxed, "cpus": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d"), "notebooks": out, "totals": totals,
            "totals_over": complete, "not_measured": not_measured}


def main(argv=None) -> int:
    import argparse
    parser = argparse.ArgumentParser(description="Course benchmarks: figures printed and written "
                                                 "to bench/results.json (not a test).")
    parser.add_argument("--only", default="launcher,stress,stages,overlap,notebooks,autograde",
                        help="comma-separated parts to run (default: all)")
    parser.add_argument("--blank", action="store_true",
                        help="also autograde each notebook's blank release copy (+3 min)")
    parser.add_argument("--class-size", type=int, default=20,
                        help="`--only class`: submissions per notebook (default 20)")
    parser.add_argument("--class-jobs", default="1,2", help="`--only class`: JOBS values (default 1,2)")
    parser.add_argument("--class-notebooks", default="",
                        help="`--only class`: comma-separated notebook ids (default: all)")
    parser.add_argument("--class-budget-min", type=float, default=None,
                        help="`--only class`: start no new grading after this many minutes; the "
                             "rest is listed as not measured (default: measure everything)")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                        help="launcher, stages and overlap parts: gloo (CPU ranks, default) or nccl "
                             "(one GPU per rank; `make test-gpu` runs them so)")
    parser.add_argument("--stress-kernel", type=int, metavar="ROUNDS", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.stress_kernel is not None:        # one kernel of bench_stress: a JSON line out
        print(json.dumps(_stress_kernel(args.stress_kernel)))
        return 0
    parts = set(args.only.split(","))
    results = {"machine": {"cpus": os.cpu_count(), "torch": torch.__version__,
                           "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
                           "backend": args.backend}}
    if "launcher" in parts:
        results["launcher"] = bench_launcher(backend=args.backend)
        results["first_launch"] = bench_first_launch()
    if "stress" in parts:
        results["stress"] = {str(k): bench_stress(kernels=k, rounds=rounds)
                             for k, rounds in ((1, 20), (4, 8), (8, 4))}
    if "stages" in parts:
        results["stages"], results["params"] = bench_stages(backend=args.backend)
    if "overlap" in parts:
        results["overlap"] = bench_overlap(backend=args.backend)
    if "real" in parts or args.only == parser.get_default("only"):   # 09: zerocourse/bench_real.py
        from zerocourse.bench_real import bench_real, print_real
        results["real"] = bench_real()
        print_real(results["real"])
    if "notebooks" in parts:
        results["notebooks"] = bench_notebooks()
        results["notebooks_total_s"] = round(sum(r["execute_s"] for r in results["notebooks"].values()), 2)
    if "autograde" in parts:
        results["autograde"], results["autograde_sandboxed"] = bench_autograde(args.blank)
    if "class" in parts:
        results["class"] = bench_class(args.class_size, tuple(int(j) for j in args.class_jobs.split(",")),
                                       [a for a in args.class_notebooks.split(",") if a] or None,
                                       None if args.class_budget_min is None else 60 * args.class_budget_min)
    _print(results)
    os.makedirs("bench", exist_ok=True)
    with open(os.path.join("bench", "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    print("wrote bench/results.json")
    return 0


def _print(results: dict) -> None:
    if "class" in results:
        c = results["class"]
        jobs = sorted({k for r in c["notebooks"].values() for k in r if k.endswith("_s")})
        print(f"class grading: {c['size']} submissions per notebook, "
              f"{'sandboxed' if c['sandboxed'] else 'not sandboxed'}, {c['cpus']} cores, {c['date']}")
        print(f"{'notebook':<32} " + " ".join(f"{j.replace('_s', ' s'):>10}" for j in jobs)
              + "  full marks")
        for aid, r in c["notebooks"].items():
            full = "/".join(str(r.get(j.replace("_s", "_full"), "-")) for j in jobs)
            print(f"{aid:<32} " + " ".join(f"{r.get(j, float('nan')):>10.1f}" for j in jobs)
                  + f"  {full} of {c['size']}")
        print(f"{'total (' + str(len(c['totals_over'])) + ' notebooks)':<32} "
              + " ".join(f"{c['totals'].get(j, float('nan')):>10.1f}" for j in jobs))
        if c["not_measured"]:
            print("not measured (budget): " + ", ".join(c["not_measured"]))
        print("WORKSHOP.md's class table from these figures (in the course repository): "
              "python -m tests.measured --from-bench bench/results.json --write")
    if "launcher" in results:
        print(f"{'ranks':>5} {'zerocourse.launch':>18} {'torchrun':>10} {'ratio':>7}")
    for n, r in results.get("launcher", {}).items():
        print(f"{n:>5} {r['zerocourse_s']:>17.3f}s {r['torchrun_s']:>9.2f}s {r['ratio']:>7.3f}")
    if "first_launch" in results:
        f = results["first_launch"]
        print(f"first launch in a fresh interpreter (fork server start included): "
              f"{f['first_launch_s']:.2f}s, after {f['import_s']:.2f}s of imports "
              f"(median of {f['repeats']})")
    if "stress" in results:
        print(f"\nstress: K kernels launching at once (2 and 4 ranks; collectives, none, rank 0 "
              f"returning at once) beside {next(iter(results['stress'].values()))['burners']} "
              f"CPU burners")
        print("(p95/p50 far above 2: some launches wait a fixed time, e.g. a stalled connect; "
              "a figure of this machine under this load, not a test's bound)")
        print(f"{'K':>2} {'launches':>8} {'failures':>8} {'launch/s':>8} {'p50 s':>6} {'p95 s':>6} "
              f"{'p95/p50':>7} {'max s':>6} {'first s':>7} {'leftover':>8}")
        for k, r in results["stress"].items():
            ratio = r["p95_s"] / r["p50_s"] if r["p50_s"] else float("nan")
            print(f"{k:>2} {r['launches']:>8} {r['failures']:>8} {r['launches_per_s']:>8.2f} "
                  f"{r['p50_s']:>6.2f} {r['p95_s']:>6.2f} {ratio:>7.2f} {r['max_s']:>6.2f} "
                  f"{r['first_launch_s']:>7.2f} {len(r['leftover']):>8}")
            for line in r["failure_lines"]:
                print(f"   {line}")
    if "stages" in results:
        print(f"\nstages (TinyGPT, {results.get('params')} params; times fp32, bytes bf16 + fp32 Adam)")
        print("held: between steps; in step: the most after backward or the optimizer's step; "
              "01: model_state_bytes, 06: comm_bytes_per_rank, the notebooks' own formulas")
        print(f"{'N':>2} {'stage':>5} {'torch equivalent':>24} {'ours ms':>8} {'torch ms':>9} {'ratio':>6} "
              f"{'held kB':>8} {'in step':>8} {'01 kB':>8} {'sent kB':>8} {'06 kB':>8}")
    kb = lambda v: f"{v / 1e3:>8.1f}" if v is not None else f"{'n/a':>8}"   # noqa: E731
    for n, stages in results.get("stages", {}).items():
        for st, r in stages.items():
            print(f"{n:>2} {st:>5} {r['torch']:>24} {1e3 * r['ours_step_s']:>8.1f} "
                  f"{1e3 * r['torch_step_s']:>9.1f} {r['ratio']:>6.2f} {kb(r['bytes_per_rank'])} "
                  f"{kb(r['bytes_in_step'])} {kb(r['bytes_01'])} {kb(r['sent_per_rank'])} "
                  f"{kb(r['sent_06'])}")
    if "overlap" in results:
        print("\noverlap (07_overlap's reference vs torch; fp32 median step, ours and torch's alternating)")
        print(f"{'N':>2} {'name':>24} {'ours ms':>8} {'torch ms':>9} {'ratio':>6}")
        for r in results["overlap"]:
            print(f"{r['N']:>2} {r['name']:>24} {r['ours_ms']:>8.1f} {r['torch_ms']:>9.1f} {r['ratio']:>6.2f}")
    if "notebooks" in results or "autograde" in results:
        sandbox = "sandboxed" if results.get("autograde_sandboxed") else "not sandboxed"
        print(f"\nnotebooks: solutions run top to bottom (headless), and `make grade` per "
              f"submission ({sandbox})")
        blank = any("blank_s" in g for g in results.get("autograde", {}).values())
        print(f"{'notebook':<24} {'execute s':>9} {'grade reference s':>18} {'score auto/max':>15} "
              + (f"{'grade blank s':>14} {'score':>6}" if blank else ""))
        nan = float("nan")
        for aid in sorted(set(results.get("notebooks", {})) | set(results.get("autograde", {}))):
            ex = results.get("notebooks", {}).get(aid, {}).get("execute_s", nan)
            g = results.get("autograde", {}).get(aid, {})
            mx, manual = g.get("max_score", nan), g.get("manual_points", 0)
            # reference score / auto-graded points / all points (the rest are graded by hand)
            score = f"{g.get('reference_score', nan):g}/{mx - manual:g}/{mx:g}"
            print(f"{aid:<24} {ex:>9.1f} {g.get('reference_s', nan):>18.1f} {score:>15} "
                  + (f"{g.get('blank_s', nan):>14.1f} {g.get('blank_score', nan):>6g}" if blank else ""))
        if "notebooks_total_s" in results:
            print(f"{'total':<24} {results['notebooks_total_s']:>9.1f}")


if __name__ == "__main__":
    sys.exit(main())
