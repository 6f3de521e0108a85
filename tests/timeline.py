"""Where the suite's time goes: each test's worker, start and end, and a report of them.

A pytest plugin (tests/conftest.py loads it; on any checkout, e.g. a baseline of main without
this file: `PYTHONPATH=<folder of this file> python -m pytest -p timeline ...`) that writes, on
the controlling process, one record per test: its xdist worker ("gw0", or "main" without
xdist), when its setup started and its teardown ended (epoch seconds) and the seconds of each
phase. It goes to $ZEROCOURSE_TIMELINE, else artifacts/timings/timeline.json.

The report, from one or more timelines (`make test` writes one per part):

    python tests/timeline.py artifacts/timings/timeline-parallel.json [--top 40]

prints the seconds per file, the slowest tests, and each worker's timeline (which files it ran,
when) with its busy time and idle tail (the wall time it waited while the other still ran).
`--estimates tests/durations.json` also writes the per-test seconds that tests/conftest.py
orders the parallel part by (longest first).

Measured figures, never bounds: nothing here fails a test.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import sys
import time
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_PATH = os.path.join(ROOT, "artifacts", "timings", "timeline.json")


def base_nodeid(nodeid: str) -> str:
    """The test's id without the "@group" suffix that xdist's loadgroup adds."""
    at, bracket = nodeid.rfind("@"), nodeid.rfind("]")
    return nodeid[:at] if at > bracket else nodeid


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def record_timing(kind: str, key: str, seconds: float, **extra) -> None:
    """Keep a measured time in artifacts/timings/<kind>.json (figures for notes and the workshop
    plan). Locked: two xdist workers may record into the same file at once."""
    folder = os.path.join(ROOT, "artifacts", "timings")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{kind}.json")
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        text = f.read()
        data = json.loads(text) if text.strip() else {}
        data[key] = {"seconds": round(seconds, 1), "load": round(os.getloadavg()[0], 1), **extra}
        f.seek(0)
        f.truncate()
        json.dump(data, f, indent=1)


# --------------------------------------------------------------------------
# the plugin
# --------------------------------------------------------------------------
class Recorder:
    """Collects the reports on the controlling process and writes the timeline at the end."""

    def __init__(self, path: str):
        self.path = path
        self.tests: dict[str, dict] = {}
        self.started = time.time()

    def pytest_runtest_logreport(self, report) -> None:
        node = getattr(report, "node", None)
        worker = node.gateway.id if node is not None else "main"
        rec = self.tests.setdefault(report.nodeid, {"nodeid": base_nodeid(report.nodeid),
                                                    "worker": worker, "start": report.start,
                                                    "stop": report.stop, "outcome": "passed"})
        rec[report.when] = round(report.duration, 3)
        rec["start"], rec["stop"] = min(rec["start"], report.start), max(rec["stop"], report.stop)
        if report.failed:
            rec["outcome"] = "failed"
        elif report.skipped and rec["outcome"] == "passed":
            rec["outcome"] = "skipped"

    def pytest_sessionfinish(self, session) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path, "w") as f:
            json.dump({"started": self.started, "ended": time.time(), "cpus": os.cpu_count(),
                       "load_at_end": round(os.getloadavg()[0], 1),
                       "args": sys.argv[1:], "tests": list(self.tests.values())}, f, indent=0)


def pytest_configure(config) -> None:
    if hasattr(config, "workerinput"):          # an xdist worker: the controller records
        return
    if not config.pluginmanager.has_plugin("zerocourse-timeline"):
        path = os.environ.get("ZEROCOURSE_TIMELINE") or DEFAULT_PATH
        config.pluginmanager.register(Recorder(path), "zerocourse-timeline")


# --------------------------------------------------------------------------
# the report
# --------------------------------------------------------------------------
def _mmss(s: float) -> str:
    return f"{int(s // 60)}:{int(s % 60):02d}"


def load(paths: list[str]) -> list[dict]:
    runs = []
    for p in paths:
        with open(p) as f:
            runs.append(json.load(f))
    return runs


def report(run: dict, top: int = 40, out=sys.stdout) -> None:
    """Per file, per test, per worker (timeline, busy, idle tail) of one pytest run."""
    tests = run["tests"]
    t0, t_end = run["started"], run["ended"]
    secs = lambda r: r.get("setup", 0) + r.get("call", 0) + r.get("teardown", 0)   # noqa: E731
    wall = t_end - t0
    p = lambda *a: print(*a, file=out)  # noqa: E731
    p(f"run: {' '.join(run.get('args', []))}")
    p(f"wall {wall:.0f} s ({_mmss(wall)}), {len(tests)} tests, {run.get('cpus')} cores, "
      f"load {run.get('load_at_end')} at the end")
    files: dict[str, list] = defaultdict(list)
    for r in tests:
        files[file_of(r["nodeid"])].append(r)
    total = sum(secs(r) for r in tests) or 1.0
    p(f"\n{'file':<44} {'tests':>5} {'seconds':>8} {'share':>6} {'slowest test s':>14}  workers")
    for f, rs in sorted(files.items(), key=lambda kv: -sum(secs(r) for r in kv[1])):
        s = sum(secs(r) for r in rs)
        workers = ",".join(sorted({r["worker"] for r in rs}))
        p(f"{f:<44} {len(rs):>5} {s:>8.1f} {100 * s / total:>5.1f}% {max(secs(r) for r in rs):>14.1f}"
          f"  {workers}")
    p(f"{'all':<44} {len(tests):>5} {total:>8.1f}")
    p(f"\nslowest {top} tests (setup + call + teardown; a module fixture counts in its first test)")
    for r in sorted(tests, key=lambda r: -secs(r))[:top]:
        p(f"{secs(r):>8.1f} s  {r['worker']:<5} {r['nodeid']}  [{r['outcome']}]")
    by_worker: dict[str, list] = defaultdict(list)
    for r in tests:
        by_worker[r["worker"]].append(r)
    p("\nworkers (offsets from the start of the run):")
    last = max((r["stop"] for r in tests), default=t_end)
    for w, rs in sorted(by_worker.items()):
        rs.sort(key=lambda r: r["start"])
        busy = sum(secs(r) for r in rs)
        first, end = rs[0]["start"] - t0, rs[-1]["stop"] - t0
        p(f"  {w}: {len(rs)} tests, busy {busy:.0f} s, from {_mmss(first)} to {_mmss(end)}, "
          f"idle tail {last - rs[-1]['stop']:.0f} s")
        seg = None
        for r in rs + [None]:
            f = file_of(r["nodeid"]) if r else None
            if seg and (f != seg[0] or r is None):
                p(f"      {_mmss(seg[1] - t0):>6}-{_mmss(seg[2] - t0):<6} {seg[3]:>4} test(s) "
                  f"{seg[2] - seg[1]:>7.0f} s  {seg[0]}")
                seg = None
            if r is None:
                break
            if seg is None:
                seg = [f, r["start"], r["stop"], 0]
            seg[2], seg[3] = r["stop"], seg[3] + 1


def estimates(runs: list[dict]) -> dict[str, float]:
    """nodeid -> seconds (setup + call + teardown), the last run's figure winning."""
    out = {}
    for run in runs:
        for r in run["tests"]:
            out[r["nodeid"]] = round(r.get("setup", 0) + r.get("call", 0) + r.get("teardown", 0), 1)
    return dict(sorted(out.items()))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("timelines", nargs="*", default=[DEFAULT_PATH])
    parser.add_argument("--top", type=int, default=40, help="slowest tests listed (default 40)")
    parser.add_argument("--estimates", metavar="PATH",
                        help="also write nodeid -> seconds there (tests/durations.json)")
    args = parser.parse_args(argv)
    runs = load(args.timelines)
    for path, run in zip(args.timelines, runs):
        print(f"== {path}")
        report(run, args.top)
        print()
    if args.estimates:
        est = {}
        if os.path.exists(args.estimates):
            with open(args.estimates) as f:
                est = json.load(f)
        est.update(estimates(runs))
        with open(args.estimates, "w") as f:
            json.dump(dict(sorted(est.items())), f, indent=0)
            f.write("\n")
        print(f"wrote {len(est)} estimates to {args.estimates}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
