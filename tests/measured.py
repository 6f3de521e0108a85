"""The one measured source of the run times the README and WORKSHOP print: docs/measured.json.

    python -m tests.measured --from-timings artifacts/timings/notebook_run_s.json   # (refused since
                                   # make test's runs leave the test cells' checks out: use bench)
    python -m tests.measured --from-grading artifacts/timings/grading_s.json        # after make test
    python -m tests.measured --from-bench bench/results.json                        # after make bench
    python -m tests.measured --write          # render README's and WORKSHOP's tables from it
    python -m tests.measured                  # check them (what tests/test_consistency.py does)

docs/measured.json is committed and dated: when, at which commit, on which machine and how each
figure was measured. Rendered from it (and nowhere else written by hand):
- README.md, "The notebooks": the "runs in" column (the solution top to bottom), and the date in
  its header;
- autograder/notes/WORKSHOP.md, "Measured times": the run and `make grade` columns (with the
  load average), the date in the run column's header, and the class table derived from them
  (class size x one submission, divided by the JOBS=2 speed-up measured with `make bench
  BENCH_ARGS="--only class"`).
A notebook with no figure in docs/measured.json renders as "not measured" and fails the check,
saying how to measure it. The per-notebook notes point to WORKSHOP's table instead of quoting
run times (tests/test_consistency.py flags a run time stated there).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "docs", "measured.json")
README = os.path.join(ROOT, "README.md")
WORKSHOP = os.path.join(ROOT, "autograder", "notes", "WORKSHOP.md")
HOW_TO = "measure it (python -m tests.measured --help) and run python -m tests.measured --write"


def load(path: str = SOURCE) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def assignments() -> list[str]:
    base = os.path.join(ROOT, "solutions")
    return sorted(a for a in os.listdir(base) if os.path.exists(os.path.join(base, a, f"{a}.ipynb")))


def runs_in(seconds: float | None) -> str:
    """README's spelling of a run time: "15 s" under 100 s, "1.9 min" above."""
    if seconds is None:
        return "not measured"
    return f"{seconds:.0f} s" if seconds < 100 else f"{seconds / 60:.1f} min"


def dated(m: dict, part: str) -> str:
    """The day `part`'s figures were measured: its own stamp, else the file's (older files)."""
    return m.get("stamps", {}).get(part, {}).get("measured") or m["measured"]


def _fig(m: dict, part: str, aid: str) -> dict | None:
    row = m.get(part, {}).get(aid)
    return row if isinstance(row, dict) and row.get("seconds") is not None else None


# --- markdown tables ---------------------------------------------------------------------------

def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _tables(lines: list[str]) -> list[tuple[int, list[str]]]:
    """(index of the header line, header cells) of every markdown table."""
    out = []
    for i, line in enumerate(lines[:-1]):
        if line.startswith("|") and re.match(r"^\|[\s:|-]+\|\s*$", lines[i + 1]):
            out.append((i, _cells(line)))
    return out


def _table_rows(lines: list[str], header: int) -> list[int]:
    rows, i = [], header + 2
    while i < len(lines) and lines[i].startswith("|"):
        rows.append(i)
        i += 1
    return rows


def _aid_of(cell: str, aids: list[str]) -> str | None:
    """The notebook a table row is about: its id in the cell (`02_data_parallelism`, 02, ...)."""
    cell = cell.strip("` *[]")
    for aid in aids:
        if cell == aid or cell == aid[:2] or cell.startswith(aid):
            return aid
    return None


# --- rendering ---------------------------------------------------------------------------------

def render_readme(text: str, m: dict, aids: list[str]) -> str:
    """README's notebook table with the "runs in" column (and its header) from m."""
    lines = text.split("\n")
    for h, header in _tables(lines):
        col = next((j for j, c in enumerate(header) if c.startswith("runs in")), None)
        if col is None:
            continue
        header[col] = f"runs in (2 cores, busy; {dated(m, 'run')})"
        lines[h] = _row(header)
        for i in _table_rows(lines, h):
            cells = _cells(lines[i])
            aid = _aid_of(cells[1] if len(cells) > 1 else "", aids) or _aid_of(cells[0], aids)
            if aid and col < len(cells):
                fig = _fig(m, "run", aid)
                cells[col] = runs_in(fig["seconds"] if fig else None)
                lines[i] = _row(cells)
    return "\n".join(lines)


def render_workshop(text: str, m: dict, aids: list[str]) -> str:
    """WORKSHOP's measured table (run, make grade) and its derived class table, from m."""
    lines = text.split("\n")
    cls = m.get("class", {})
    for h, header in _tables(lines):
        run = next((j for j, c in enumerate(header) if c.startswith("solution run top to bottom")), None)
        grade = next((j for j, c in enumerate(header) if c.startswith("`make grade`, one submission")), None)
        jobs = [j for j, c in enumerate(header) if re.match(r"JOBS=\d", c)]
        if run is not None:
            header[run] = f"solution run top to bottom (busy, {dated(m, 'run')})"
            lines[h] = _row(header)
        if grade is not None:
            header[grade] = re.sub(r"\d{4}-\d\d-\d\d", dated(m, "grade"), header[grade])
            lines[h] = _row(header)
        for i in _table_rows(lines, h):
            cells = _cells(lines[i])
            aid = _aid_of(cells[0], aids)
            if not aid:
                continue
            r, g = _fig(m, "run", aid), _fig(m, "grade", aid)
            if run is not None:
                cells[run] = (f"{r['seconds']:.1f} s" + (f" (load {r['load']:.1f})" if r.get("load") is not None
                                                        else "")) if r else "not measured"
            if grade is not None:
                cells[grade] = f"{g['seconds']:.1f} s" if g else "not measured"
            for j in jobs:
                n = int(re.match(r"JOBS=(\d)", header[j]).group(1))
                measured = cls.get("notebooks", {}).get(aid, {}).get(f"jobs{n}_s")
                speedup = 1.0 if n == 1 else cls.get(f"jobs{n}_speedup")
                if measured is not None:
                    cells[j] = f"{measured / 60:.0f} min"
                elif g and speedup and cls.get("size"):
                    cells[j] = f"{cls['size'] * g['seconds'] / 60 / speedup:.0f} min" + \
                        (" (derived)" if cls.get("notebooks") else "")
                else:
                    cells[j] = "not measured"
            lines[i] = _row(cells)
        for j in jobs:          # measured by `make bench --only class` where it says so, dated
            n = int(re.match(r"JOBS=(\d)", header[j]).group(1))
            header[j] = (f"JOBS={n} (measured, {cls['measured']})" if cls.get("notebooks")
                         else f"JOBS={n} (derived)")
            lines[h] = _row(header)
    return "\n".join(lines)


def problems(m: dict | None = None, aids: list[str] | None = None) -> list[str]:
    """What README and WORKSHOP print that docs/measured.json does not say (file: item)."""
    m = m if m is not None else load()
    aids = aids if aids is not None else assignments()
    out = []
    for path, render in ((README, render_readme), (WORKSHOP, render_workshop)):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        want = render(text, m, aids).split("\n")
        rel = os.path.relpath(path, ROOT)
        for n, (have, should) in enumerate(zip(text.split("\n"), want), 1):
            if have == should:
                continue
            a, b = _cells(have), _cells(should)
            diff = [f"{x!r} should be {y!r}" for x, y in zip(a, b) if x != y] if len(a) == len(b) \
                else [f"{have.strip()[:80]!r} should be {should.strip()[:80]!r}"]
            out.append(f"{rel}:{n} ({a[0] if a[0] not in ('#', '') else a[1]}): {'; '.join(diff)} "
                       f"(from docs/measured.json: python -m tests.measured --write)")
    for aid in aids:
        for part in ("run", "grade"):
            if not _fig(m, part, aid):
                out.append(f"docs/measured.json: no {part} time for {aid}: {HOW_TO}")
    return out


def write(m: dict | None = None) -> list[str]:
    """Render README and WORKSHOP from docs/measured.json in place; returns the files changed."""
    m = m if m is not None else load()
    aids, changed = assignments(), []
    for path, render in ((README, render_readme), (WORKSHOP, render_workshop)):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        new = render(text, m, aids)
        if new != text:
            with open(path, "w", encoding="utf-8") as f:
                f.write(new)
            changed.append(os.path.relpath(path, ROOT))
    return changed


# --- recording a measurement -------------------------------------------------------------------

def _stamp(m: dict, how: str, parts: list[str]) -> None:
    """Date, commit and machine of a measurement: the file's (the newest) and each part's own,
    so a part measured another day keeps its date when another part is updated."""
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or None
    stamp = dict(measured=datetime.date.today().isoformat(), commit=commit,
                 machine=f"{os.cpu_count()} cores ({sys.platform})")
    m.update(stamp)
    for part in parts:
        m.setdefault("stamps", {})[part] = dict(stamp)
    m.setdefault("how", {})["last_update"] = how


def from_timings(m: dict, path: str) -> dict:
    """make test's artifacts/timings/notebook_run_s.json ({aid: {seconds, load}}) -> "run"."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    partial = sorted(aid for aid, row in data.items() if row.get("test_cells") == "definitions only")
    if partial:
        # Since 2026-12-01 make test's runs give the test cells only their definitions
        # (tests/test_notebooks.py): not a learner's run, so not README's "runs in".
        raise SystemExit(f"{path}: make test ran {', '.join(partial)} without their test cells' "
                         f"checks, which is not how long the notebook runs: measure whole runs "
                         f"with make bench BENCH_ARGS=\"--only notebooks\" and use --from-bench")
    for aid, row in data.items():
        m.setdefault("run", {})[aid] = {"seconds": round(row["seconds"], 1), "load": row.get("load")}
    m.setdefault("how", {})["run"] = ("the solution notebook top to bottom, headless "
                                      "(tests/test_notebooks.py in make test)")
    _stamp(m, f"run: {os.path.relpath(path, ROOT)}", ["run"])
    return m


def from_grading(m: dict, path: str) -> dict:
    """make test's artifacts/timings/grading_s.json (tests/test_grading_e2e.py: "ref/<aid>" is the
    reference solution's submission in its part's make grade) -> "grade"."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    for key, row in data.items():
        student, _, aid = key.partition("/")
        if student == "ref" and aid:
            m.setdefault("grade", {})[aid] = {"seconds": round(row["seconds"], 1), "load": row.get("load")}
    m.setdefault("how", {})["grade"] = (
        "the reference solution as one submission of tests/test_grading_e2e.py's make grade parts, "
        "sandboxed (rank host, per-submission box), beside the other pytest worker")
    _stamp(m, f"grade: {os.path.relpath(path, ROOT)}", ["grade"])
    return m


def from_bench(m: dict, path: str) -> dict:
    """make bench's bench/results.json: notebooks.execute_s -> "run", autograde.reference_s
    -> "grade" (load averages: not recorded by the bench)."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    how = m.setdefault("how", {})
    for aid, row in data.get("notebooks", {}).items():
        m.setdefault("run", {})[aid] = {"seconds": round(row["execute_s"], 1), "load": None}
        how["run"] = "the solution notebook top to bottom, headless (make bench, part notebooks)"
    for aid, row in data.get("autograde", {}).items():
        if row.get("reference_s") is not None:
            m.setdefault("grade", {})[aid] = {"seconds": round(row["reference_s"], 1)}
            how["grade"] = ("the reference solution as one submission of autograder/grade.py "
                            f"(make bench, part autograde; sandboxed: {data.get('autograde_sandboxed')})")
    c = data.get("class")
    if c and c.get("notebooks"):          # make bench --only class (zerocourse/bench.py bench_class)
        cls = m.setdefault("class", {})
        cls.update(size=c["size"], measured=c["date"],
                   notebooks={aid: {k: v for k, v in r.items() if k.endswith("_s")}
                              for aid, r in c["notebooks"].items()},
                   not_measured=c.get("not_measured", []))
        both = [r for r in c["notebooks"].values() if "jobs1_s" in r and "jobs2_s" in r]
        if both:                          # for the rows not measured: derived with this speed-up
            cls["jobs2_speedup"] = round(sum(r["jobs1_s"] for r in both) / sum(r["jobs2_s"] for r in both), 2)
        how["class"] = (f"make bench BENCH_ARGS=\"--only class --class-size {c['size']}\": {c['size']} "
                        f"submissions of each notebook graded with JOBS=1 and 2 on {c['cpus']} cores "
                        f"({'sandboxed' if c['sandboxed'] else 'not sandboxed'}); not measured: "
                        f"{', '.join(c.get('not_measured', [])) or 'none'}")
    _stamp(m, f"bench: {os.path.relpath(path, ROOT)}",
           [p for p, key in (("run", "notebooks"), ("grade", "autograde"), ("class", "class"))
            if data.get(key)])
    return m


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from-timings", metavar="JSON", help="record make test's notebook run times")
    parser.add_argument("--from-bench", metavar="JSON", help="record make bench's run and grade times")
    parser.add_argument("--from-grading", metavar="JSON",
                        help="record make test's grading times (artifacts/timings/grading_s.json)")
    parser.add_argument("--write", action="store_true", help="render README and WORKSHOP from it")
    args = parser.parse_args(argv)
    m = load()
    if args.from_timings or args.from_bench or args.from_grading:
        if args.from_timings:
            from_timings(m, args.from_timings)
        if args.from_grading:
            from_grading(m, args.from_grading)
        if args.from_bench:
            from_bench(m, args.from_bench)
        with open(SOURCE, "w", encoding="utf-8") as f:
            json.dump(m, f, indent=1, ensure_ascii=False)
            f.write("\n")
        print(f"updated {os.path.relpath(SOURCE, ROOT)} (measured {m['measured']} at {m['commit']})")
    if args.write:
        print("rendered: " + (", ".join(write(m)) or "nothing to change"))
    found = problems(m)
    for p in found:
        print(p)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
