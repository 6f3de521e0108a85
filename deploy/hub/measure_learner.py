"""Measure what one learner costs: run a finished course notebook as a learner's kernel would,
inside a cgroup of its own, and report its CPU seconds, peak memory and wall time.

    sudo .venv/bin/python deploy/hub/measure_learner.py [ASSIGNMENT ...]   (default: 00_setup 05_zero3)

Memory is the peak of the summed PSS (proportional set size: pages the forked ranks share with
their fork server are counted once) of the kernel, its fork server and its ranks, sampled every
50 ms; CPU is the cgroup's cpuacct.usage (every process, ranks included, however short-lived).
Needs root and cgroup v1 (cpuacct) for the CPU figure; without it only memory and wall time.
"""
import json
import os
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from tests.fixtures.make_submission import solution_as_submission  # noqa: E402

CG = f"/sys/fs/cgroup/cpuacct/zc-measure-{os.getpid()}"


def pss_total() -> int:
    """Summed PSS in bytes of every process in our cgroup (or our process tree's children)."""
    try:
        with open(os.path.join(CG, "cgroup.procs")) as f:
            pids = [int(p) for p in f.read().split()]
    except OSError:
        pids = []
    total = 0
    for pid in pids:
        if pid == os.getpid():
            continue                   # the measuring process itself is not the learner's
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def cpu_s() -> float:
    with open(os.path.join(CG, "cpuacct.usage")) as f:
        return int(f.read()) / 1e9


def measure(aid: str) -> dict:
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.reads(json.dumps(solution_as_submission(aid)), as_version=4)
    peak, stop = [0], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], pss_total())
            time.sleep(0.05)
    with tempfile.TemporaryDirectory() as tmp:
        # The capstone reads its sibling notebooks: run where the learner's copies are.
        client = NotebookClient(nb, timeout=600, kernel_name="python3",
                                resources={"metadata": {"path": tmp}})
        t = threading.Thread(target=sample, daemon=True)
        cpu0, wall0 = cpu_s(), time.monotonic()
        t.start()
        with client.setup_kernel():
            idle = None
            for i, cell in enumerate(nb.cells):
                client.execute_cell(cell, i)
                if idle is None and cell.cell_type == "code" and "import" in cell.source:
                    time.sleep(3)       # imports done, fork server up: a learner between launches
                    idle = pss_total()
            wall, cpu = time.monotonic() - wall0, cpu_s() - cpu0
        stop.set()
        t.join()
    launches = sum(c.source.count("launch(") for c in nb.cells if c.cell_type == "code")
    return {"assignment": aid, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
            "peak_pss_mib": peak[0] >> 20, "idle_pss_mib": idle >> 20,
            "launch_calls_in_source": launches}


def main() -> int:
    if os.geteuid() != 0 or not os.path.isdir("/sys/fs/cgroup/cpuacct"):
        sys.exit("measure_learner.py needs root and cgroup v1 cpuacct (/sys/fs/cgroup/cpuacct)")
    os.mkdir(CG)
    try:
        with open(os.path.join(CG, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))     # the kernel and its ranks inherit it
        rows = [measure(aid) for aid in (sys.argv[1:] or ["00_setup", "05_zero3"])]
    finally:
        with open("/sys/fs/cgroup/cpuacct/cgroup.procs", "w") as f:
            f.write(str(os.getpid()))
        time.sleep(0.5)
        os.rmdir(CG)
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
