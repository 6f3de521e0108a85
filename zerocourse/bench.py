"""Benchmarks (`make bench`): figures printed, and written to bench/results.json.

Not a timed test: it measures and reports. Today it measures the launcher:
median launch + teardown of a trivial all-reduce on 2 and 4 ranks, for
zerocourse.launch (ranks forked from a fork server) and torchrun, in the same run.

results.json schema:
    {"launcher": {"<N>": {"zerocourse_s": median, "torchrun_s": median,
                          "ratio": zerocourse_s / torchrun_s, "repeats": k}},
     "machine": {"cpus": int, "torch": str}}
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
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
dist.destroy_process_group()
"""


def _allreduce(rank, world_size):
    import torch
    import torch.distributed as dist
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def _median(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_launcher(world_sizes=(2, 4), repeats: int = 7, torchrun_repeats: int = 3) -> dict:
    """Median launch + teardown of a one-all-reduce job: zerocourse.launch vs torchrun."""
    launch(_allreduce, 2)                     # start the fork server once (paid once per kernel)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "trivial.py")
        with open(script, "w") as f:
            f.write(_TRIVIAL)
        for n in world_sizes:
            ours = _median(lambda: launch(_allreduce, n), repeats)
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc_per_node={n}", script]
            theirs = _median(lambda: subprocess.run(cmd, check=True, capture_output=True),
                             torchrun_repeats)
            out[str(n)] = {"zerocourse_s": round(ours, 4), "torchrun_s": round(theirs, 3),
                           "ratio": round(ours / theirs, 4), "repeats": repeats}
    return out


def main() -> int:
    results = {"machine": {"cpus": os.cpu_count(), "torch": torch.__version__},
               "launcher": bench_launcher()}
    print(f"{'ranks':>5} {'zerocourse.launch':>18} {'torchrun':>10} {'ratio':>7}")
    for n, r in results["launcher"].items():
        print(f"{n:>5} {r['zerocourse_s']:>17.3f}s {r['torchrun_s']:>9.2f}s {r['ratio']:>7.3f}")
    os.makedirs("bench", exist_ok=True)
    with open(os.path.join("bench", "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    print("wrote bench/results.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
