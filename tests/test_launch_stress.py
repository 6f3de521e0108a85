"""The launcher under load: several kernels launching at once beside CPU burners.

Issue 17: on a busy 2-core machine, ~2% of launches failed with "Gloo connectFullMesh
failed" (a rank tore down while a peer was still connecting) and ~1 in 6 stalled ~5 s
(the TCPStore's connect under load). Bounded: about a minute on 2 cores.

Functional only: no failure, every launch done (a launch that stalls past its 60 s timeout, or
a kernel past 110 s, is a failure), nothing left behind. How fast the launches are (p50/p95: a
fixed hidden wait shows as p95 far above p50) depends on the machine's load, so it is a figure
that `make bench BENCH_ARGS="--only stress"` prints, never a bound here (issue 26).
"""
import os
import time

from tests.proc_util import descendants
from zerocourse.bench import STRESS_SCENARIOS, bench_stress

KERNELS, ROUNDS = 4, 4


def test_concurrent_kernels_launch_without_failures_stalls_or_leftovers():
    before = descendants(os.getpid())
    res = bench_stress(kernels=KERNELS, rounds=ROUNDS, burners=2, timeout=110)
    print(res)
    assert res["failures"] == 0, res["failure_lines"]
    # every kernel: a first launch + ROUNDS x every scenario (2 and 4 ranks; collectives,
    # none, rank 0 returning at once)
    assert res["launches"] == KERNELS * (1 + ROUNDS * len(STRESS_SCENARIOS))
    assert res["leftover"] == []                       # no fork server, no rank
    # No burner, no kernel: a process still exiting on a loaded machine may take a moment to go.
    deadline = time.monotonic() + 20
    while (extra := descendants(os.getpid()) - before) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not extra, {pid: _cmdline(pid) for pid in extra}


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "(gone)"
