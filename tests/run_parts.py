"""`make test`'s driver: run the suite's parts in turn, then print each part's wall time.

    python tests/run_parts.py "parallel part=python -m pytest tests -n 2 ..." \
                              "browser=python -m pytest tests/test_browser.py" ...

Each argument is NAME=COMMAND. The parts run one after the other, as the Makefile's lines did,
and the first one that fails stops the run (its exit status is this script's). Whatever
happened, the last lines say how long each part took, measured here: a figure for CI's log and
the issue's budget (35 minutes on 2 cores), never a bound that fails a run. Each part's
per-test timeline goes to artifacts/timings/timeline-<name>.json (tests/timeline.py reports it).
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUDGET_S = 35 * 60


def _mmss(s: float) -> str:
    return f"{int(s // 60)}:{int(s % 60):02d}"


def parse(args: list[str]) -> list[tuple[str, list[str]]]:
    """[(name, argv)] from NAME=COMMAND arguments."""
    parts = []
    for a in args:
        name, sep, cmd = a.partition("=")
        if not sep or not name.strip() or not cmd.strip():
            raise SystemExit(f"run_parts: expected NAME=COMMAND, got {a!r}")
        parts.append((name.strip(), shlex.split(cmd)))
    return parts


def summary(results: list[tuple[str, float | None, int | None]], total: float) -> list[str]:
    """The closing lines: one per part (seconds, m:ss, passed/failed/not run), then the total."""
    width = max([len(n) for n, _, _ in results] + [len("total")])
    lines = [f"== make test wall time ({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} now):"]
    for name, secs, rc in results:
        if secs is None:
            lines.append(f"==   {name:<{width}}      -        not run (an earlier part failed)")
        else:
            state = "passed" if rc == 0 else f"FAILED (exit {rc})"
            lines.append(f"==   {name:<{width}} {secs:>6.0f} s {_mmss(secs):>7}  {state}")
    lines.append(f"==   {'total':<{width}} {total:>6.0f} s {_mmss(total):>7}  "
                 f"(budget {BUDGET_S // 60} min on 2 cores: a figure, not a bound)")
    return lines


def main(argv=None) -> int:
    parts = parse(sys.argv[1:] if argv is None else argv)
    results: list[tuple[str, float | None, int | None]] = []
    t_start, status = time.monotonic(), 0
    for name, cmd in parts:
        if status != 0:
            results.append((name, None, None))
            continue
        slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
        env = dict(os.environ, ZEROCOURSE_TIMELINE=os.path.join(
            ROOT, "artifacts", "timings", f"timeline-{slug}.json"))
        print(f"== {name}: {' '.join(cmd)}", flush=True)
        t0 = time.monotonic()
        try:
            rc = subprocess.call(cmd, cwd=ROOT, env=env)
        except KeyboardInterrupt:
            rc = 130
        except OSError as e:
            print(f"run_parts: cannot run {name}: {e}", file=sys.stderr)
            rc = 127
        results.append((name, time.monotonic() - t0, rc))
        status = rc
    print("\n".join(summary(results, time.monotonic() - t_start)), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
