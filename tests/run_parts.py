"""`make test`'s driver: run the suite's parts in lanes, then print each part's wall time.

    python tests/run_parts.py "parallel part=python -m pytest tests -n 2 ..." \
                              "||" "browser=python -m pytest tests/test_browser.py" "hub=..."

Each argument is NAME=COMMAND, or `||`, which starts a new lane. Lanes run at the same time; the
parts of one lane run one after the other, and the first one that fails stops its lane (the
others go on, so the report is whole). The exit status is the first failed part's, in argument
order. The first lane prints as it runs; every other lane's output goes to
artifacts/timings/<part>.log and is printed whole when its lane ends (a CI log stays readable).
Whatever happened, the last lines say how long each part took, measured here: a figure for CI's
log and the issue's budget (35 minutes on 2 cores), never a bound that fails a run. Each part's
per-test timeline goes to artifacts/timings/timeline-<name>.json (tests/timeline.py reports it).
"""
from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMINGS = os.path.join(ROOT, "artifacts", "timings")
BUDGET_S = 35 * 60
LANE = "||"


def _mmss(s: float) -> str:
    return f"{int(s // 60)}:{int(s % 60):02d}"


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def parse_lanes(args: list[str]) -> list[list[tuple[str, list[str]]]]:
    """[[(name, argv), ...], ...]: the lanes, each a list of parts, from the arguments."""
    lanes: list[list[tuple[str, list[str]]]] = [[]]
    for a in args:
        if a.strip() == LANE:
            lanes.append([])
            continue
        name, sep, cmd = a.partition("=")
        if not sep or not name.strip() or not cmd.strip():
            raise SystemExit(f"run_parts: expected NAME=COMMAND or {LANE}, got {a!r}")
        lanes[-1].append((name.strip(), shlex.split(cmd)))
    if not all(lanes):
        raise SystemExit(f"run_parts: a lane has no part (two {LANE} in a row, or one at an end)")
    names = [n for lane in lanes for n, _ in lane]
    if len(set(map(_slug, names))) != len(names):
        raise SystemExit(f"run_parts: two parts share a name: {names}")
    return lanes


def parse(args: list[str]) -> list[tuple[str, list[str]]]:
    """[(name, argv)] of every part, lanes flattened in argument order."""
    return [part for lane in parse_lanes(args) for part in lane]


def summary(results: list[tuple[str, float | None, int | None]], total: float) -> list[str]:
    """The closing lines: one per part (seconds, m:ss, passed/failed/not run), then the total."""
    width = max([len(n) for n, _, _ in results] + [len("total")])
    lines = [f"== make test wall time ({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} now):"]
    for name, secs, rc in results:
        if secs is None:
            lines.append(f"==   {name:<{width}}      -        not run (an earlier part of its lane failed)")
        else:
            state = "passed" if rc == 0 else f"FAILED (exit {rc})"
            lines.append(f"==   {name:<{width}} {secs:>6.0f} s {_mmss(secs):>7}  {state}")
    lines.append(f"==   {'total':<{width}} {total:>6.0f} s {_mmss(total):>7}  "
                 f"(budget {BUDGET_S // 60} min on 2 cores: a figure, not a bound)")
    return lines


class _Lane(threading.Thread):
    """Runs one lane's parts in turn; output to the terminal (first lane) or to a log per part."""

    def __init__(self, parts, live: bool):
        super().__init__(daemon=True)
        self.parts, self.live = parts, live
        self.results: dict[str, tuple[float | None, int | None]] = {}
        self.logs: list[tuple[str, str]] = []
        self.procs: list[subprocess.Popen] = []
        self.stopped = False

    def run(self) -> None:
        status = 0
        for name, cmd in self.parts:
            if status != 0 or self.stopped:
                self.results[name] = (None, None)
                continue
            env = dict(os.environ, ZEROCOURSE_TIMELINE=os.path.join(TIMINGS, f"timeline-{_slug(name)}.json"))
            print(f"== {name}: {' '.join(cmd)}" + ("" if self.live else
                  f" (beside the first lane; output: artifacts/timings/{_slug(name)}.log)"), flush=True)
            t0 = time.monotonic()
            try:
                if self.live:
                    out = None
                else:
                    os.makedirs(TIMINGS, exist_ok=True)
                    path = os.path.join(TIMINGS, f"{_slug(name)}.log")
                    self.logs.append((name, path))
                    out = open(path, "w")
                # Its own process group: Ctrl-C or a stop reaches every process of the part.
                proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out,
                                        stderr=None if out is None else subprocess.STDOUT,
                                        start_new_session=not self.live)
                self.procs.append(proc)
                rc = proc.wait()
                if out is not None:
                    out.close()
            except OSError as e:
                print(f"run_parts: cannot run {name}: {e}", file=sys.stderr, flush=True)
                rc = 127
            self.results[name] = (time.monotonic() - t0, rc)
            status = rc

    def stop(self) -> None:
        """Ends the lane's running part (SIGTERM to it, then SIGKILL) and skips what follows."""
        self.stopped = True
        for proc in list(self.procs):
            for sig in (signal.SIGTERM, signal.SIGKILL):
                if proc.poll() is not None:
                    break
                try:        # a side lane's part leads its own group: the signal reaches all of it
                    proc.send_signal(sig) if self.live else os.killpg(proc.pid, sig)
                    proc.wait(timeout=30)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    pass


def main(argv=None) -> int:
    lanes = parse_lanes(sys.argv[1:] if argv is None else argv)
    t_start = time.monotonic()
    runners = [_Lane(parts, live=(i == 0)) for i, parts in enumerate(lanes)]
    for lane in runners:
        lane.start()
    try:
        for lane in runners:
            while lane.is_alive():
                lane.join(0.5)
            for name, path in lane.logs:        # a side lane's output, once it has ended
                print(f"== {name}: its output ({os.path.relpath(path, ROOT)}):", flush=True)
                with open(path, errors="replace") as f:
                    sys.stdout.write(f.read())
                sys.stdout.flush()
    except KeyboardInterrupt:
        interrupted = True
        for lane in runners:
            lane.stop()
        for lane in runners:
            lane.join(60)
    else:
        interrupted = False
    results = [(name, *lane.results.get(name, (None, None))) for lane in runners for name, _ in lane.parts]
    status = next((rc for _, _, rc in results if rc not in (0, None)), 130 if interrupted else 0)
    print("\n".join(summary(results, time.monotonic() - t_start)), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
