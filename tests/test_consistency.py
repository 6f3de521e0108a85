"""The course's text agrees with the course: findings of the content review that can come back
mechanically are checked here (issue 28).

Read: every notebook cell (notebooks/), README.md, autograder/README.md, the handout's README,
autograder/notes/*.md and docs/*.md. Checked against the notebooks themselves (ids, grade_ids
and points from their nbgrader metadata, the probe's time.sleep) and docs/measured.json:
- notebook counts ("Over eight notebooks") and tables that list the notebooks (00's overview,
  README's, the notes' and WORKSHOP's) against the notebooks there are;
- the capstone's number wherever a number names it ("the capstone (07)", "07 | capstone");
- notebook ids (`05_zero3`, "notebook 07", "notebooks 03–05") that do not exist, and every
  notebook's notes file;
- grade_ids named in the notes and READMEs that no notebook has, the notes' points (a graded
  cell's row, "Graded cells (N points)", a rubric's points, notes/README's column and total) and
  a notebook's "counts for one point" against its cells' points;
- text against checks: "the last rank starts 0.4 s late" against the probe's time.sleep;
- README sections that the text points to (README, "Beyond one machine");
- run times: README's and WORKSHOP's come from docs/measured.json (tests/measured.py); the
  per-notebook notes state none of their own.
Each failure names the file, the cell or line and the stale item. KNOWN lists the items other
engineers are fixing, with the review's finding id: the integrator deletes an entry when its fix
lands (test_known_items_still_fail prints those no longer needed; it never fails).
"""
from __future__ import annotations

import datetime
import glob
import json
import os
import re
from dataclasses import dataclass

import pytest

from tests import measured

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUMBERS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty".split())}

# (finding id, file, text of the stale item): known failures that a notebook or notes fix removes.
KNOWN = [
    # C5: run times the per-notebook notes state themselves (they point to WORKSHOP's table
    # once fixed; the integrator measures the notebooks into docs/measured.json at the end)
]


@dataclass
class Problem:
    file: str
    where: str                  # "cell 3 line 2", "line 14"
    item: str                   # the stale text itself
    message: str

    def __str__(self):
        return f"{self.file} {self.where}: {self.item!r}: {self.message}"


# --- what the course is ------------------------------------------------------------------------

def _nb(kind: str, aid: str) -> dict:
    with open(os.path.join(ROOT, kind, aid, f"{aid}.ipynb"), encoding="utf-8") as f:
        return json.load(f)


def _src(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _meta(cell: dict) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


@dataclass
class Course:
    aids: list                  # notebook ids, sorted
    points: dict                # aid -> total points (auto + manual)
    cell_points: dict           # grade_id -> (aid, points) of every graded cell
    grade_ids: set              # every grade_id (answer cells too)
    capstone: str               # the capstone's number ("10")


def course() -> Course:
    aids = sorted(os.path.basename(os.path.dirname(p))
                  for p in glob.glob(os.path.join(ROOT, "solutions", "*", "*.ipynb")))
    points, cell_points, ids = {}, {}, set()
    for aid in aids:
        total = 0
        for c in _nb("solutions", aid)["cells"]:
            m = _meta(c)
            if m.get("grade_id"):
                ids.add(m["grade_id"])
            if m.get("grade"):
                total += m.get("points", 0)
                cell_points[(aid, m["grade_id"])] = (aid, m.get("points", 0))
        points[aid] = total
    capstone = next(a[:2] for a in aids if a.endswith("_capstone"))
    return Course(aids, points, cell_points, ids, capstone)


# --- what the text says ------------------------------------------------------------------------

def documents() -> list[tuple[str, str, str]]:
    """(file, where, text): notebook cells one by one, markdown files one line at a time."""
    out = []
    for path in sorted(glob.glob(os.path.join(ROOT, "notebooks", "*", "*.ipynb"))):
        rel = os.path.relpath(path, ROOT)
        with open(path, encoding="utf-8") as f:
            for i, cell in enumerate(json.load(f)["cells"]):
                out.append((rel, f"cell {i}", _src(cell)))
    files = ["README.md", "autograder/README.md", "autograder/handout/README.md"]
    files += sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "autograder", "notes", "*.md")))
    files += sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
    for rel in files:
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                out.append((rel, f"line {n}", line.rstrip("\n")))
    return out


def _at(where: str, text: str, pos: int) -> str:
    """A cell's "where" with the line of `pos` in it."""
    return f"{where} line {text.count(chr(10), 0, pos) + 1}" if where.startswith("cell") else where


def _number(word: str) -> int | None:
    word = word.lower()
    return int(word) if word.isdigit() else NUMBERS.get(word)


def check_counts(c: Course, docs) -> list[Problem]:
    out = []
    numbers = "|".join(NUMBERS)
    for file, where, text in docs:
        for m in re.finditer(rf"\b({numbers}|\d+)\s+notebooks\b", text, re.I):
            n = _number(m.group(1))
            if n is not None and n >= 4 and n != len(c.aids):
                out.append(Problem(file, _at(where, text, m.start()), m.group(0),
                                   f"the course has {len(c.aids)} notebooks ({c.aids[0]}..{c.aids[-1]})"))
    return out


def check_notebook_tables(c: Course) -> list[Problem]:
    """A table whose first column lists notebooks (by number or id) lists all of them."""
    out = []
    numbers = [a[:2] for a in c.aids]
    sources = []
    for aid in c.aids:
        for i, cell in enumerate(_nb("notebooks", aid)["cells"]):
            if cell["cell_type"] == "markdown":
                sources.append((f"notebooks/{aid}/{aid}.ipynb", f"cell {i}", _src(cell)))
    for rel in ["README.md", "autograder/notes/README.md", "autograder/notes/WORKSHOP.md"]:
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            sources.append((rel, "", f.read()))
    for file, where, text in sources:
        lines = text.split("\n")
        for h, _ in measured._tables(lines):
            rows = measured._table_rows(lines, h)
            firsts = [measured._cells(lines[i])[0].strip("`*[] ") for i in rows]
            listed = [f[:2] for f in firsts if re.match(r"^\d\d(_\w+)?$", f)]
            if len(listed) < 6 or len(listed) < len(firsts) - 1:
                continue                     # not a table of the notebooks
            if sorted(set(listed)) != numbers:
                loc = f"{where} line {h + 1}".strip() if where else f"line {h + 1}"
                out.append(Problem(file, loc, "lists notebooks " + ", ".join(listed),
                                   f"the course's notebooks are {', '.join(numbers)}"))
    return out


def check_capstone(c: Course, docs) -> list[Problem]:
    out = []
    pattern = re.compile(r"(?<![:.\d])\b(\d\d)\b[\s|`*(),·]{0,4}capstone|"
                         r"capstone[\s|`*(),:·]{0,4}\b(\d\d)\b(?![\w:.])", re.I)
    for file, where, text in docs:
        for m in pattern.finditer(text):
            n = m.group(1) or m.group(2)
            if n != c.capstone and n in {a[:2] for a in c.aids} | {"07", "09"}:
                out.append(Problem(file, _at(where, text, m.start()), m.group(0),
                                   f"the capstone is {c.capstone} ({c.capstone}_capstone)"))
    return out


def check_ids(c: Course, docs) -> list[Problem]:
    out = []
    numbers = {a[:2] for a in c.aids}
    for file, where, text in docs:
        for m in re.finditer(r"\b(\d\d_[a-z][a-z0-9_]*[a-z0-9])\b", text):
            token = m.group(1)
            # an id, an id with a suffix (07_overlap_alt) or a prefix of one (pytest -k 08_acc)
            if not any(token == a or token.startswith(a + "_") or a.startswith(token) for a in c.aids):
                out.append(Problem(file, _at(where, text, m.start()), token,
                                   f"no notebook has this id (they are {', '.join(c.aids)})"))
        for m in re.finditer(r"\bnotebooks?\s+(\d\d)\b(?:\s*[–-]\s*(\d\d)\b)?", text, re.I):
            for n in filter(None, m.groups()):
                if n not in numbers:
                    out.append(Problem(file, _at(where, text, m.start()), m.group(0),
                                       f"there is no notebook {n}"))
    notes = {os.path.splitext(os.path.basename(p))[0]
             for p in glob.glob(os.path.join(ROOT, "autograder", "notes", "[0-9][0-9]_*.md"))}
    for aid in sorted(set(c.aids) - notes):
        out.append(Problem("autograder/notes", f"{aid}.md", aid, "the notebook has no instructor notes"))
    for name in sorted(notes - set(c.aids)):
        out.append(Problem("autograder/notes", f"{name}.md", name, "notes for a notebook that does not exist"))
    return out


def _cell_points(c: Course, aid: str, g: str):
    """Points of grade_id g: of notebook aid's cell when the file is aid's notes, else of any
    notebook's cell of that id (grade_ids are unique per notebook, not across the course)."""
    if (aid, g) in c.cell_points:
        return c.cell_points[(aid, g)][1]
    if any(a == aid for a, _ in c.cell_points):
        return None
    found = {pts for (a, gid), (_, pts) in c.cell_points.items() if gid == g}
    return found.pop() if len(found) == 1 else None


def check_grade_ids_and_points(c: Course) -> list[Problem]:
    out = []
    prefixes = {g.split("-")[0] for g in c.grade_ids}
    files = ["README.md", "autograder/README.md"] + sorted(
        os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "autograder", "notes", "*.md")))
    for rel in files:
        aid = os.path.splitext(os.path.basename(rel))[0]
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            lines = f.read().split("\n")
        for n, line in enumerate(lines, 1):
            for m in re.finditer(r"`([a-z0-9]+(?:-[a-z0-9]+)+)`", line):
                g = m.group(1)
                if g.split("-")[0] in prefixes and g not in c.grade_ids:
                    out.append(Problem(rel, f"line {n}", g, "no notebook has this grade_id"))
            m = re.search(r"Graded cells \((\d+) points?\)", line)
            if m and aid in c.points and int(m.group(1)) != c.points[aid]:
                out.append(Problem(rel, f"line {n}", m.group(0), f"{aid}'s cells carry {c.points[aid]:g} points"))
            m = re.search(r"Rubric for `([\w-]+)` \((\d+(?:\.\d+)?) points?", line)
            pts = _cell_points(c, aid, m.group(1)) if m else None
            if pts is not None and float(m.group(2)) != pts:
                out.append(Problem(rel, f"line {n}", m.group(0), f"the cell carries {pts:g} points"))
        for h, header in measured._tables(lines):
            if header[:2] != ["grade_id", "points"]:
                continue
            for i in measured._table_rows(lines, h):
                cells = measured._cells(lines[i])
                g = cells[0].strip("`")
                pts = _cell_points(c, aid, g)
                if pts is not None and cells[1] != f"{pts:g}":
                    out.append(Problem(rel, f"line {i + 1}", f"{g} | {cells[1]}",
                                       f"the cell carries {pts:g} points"))
    # notes/README: the points column and the total
    rel = "autograder/notes/README.md"
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        lines = f.read().split("\n")
    for h, header in measured._tables(lines):
        if "points" not in header:
            continue
        col = header.index("points")
        for i in measured._table_rows(lines, h):
            cells = measured._cells(lines[i])
            aid = measured._aid_of(cells[1], c.aids) if len(cells) > 1 else None
            if aid and cells[col] != f"{c.points[aid]:g}":
                out.append(Problem(rel, f"line {i + 1}", f"points {cells[col]}",
                                   f"{aid}'s cells carry {c.points[aid]:g} points"))
    for n, line in enumerate(lines, 1):
        m = re.search(r"Total: (\d+) points", line)
        if m and int(m.group(1)) != sum(c.points.values()):
            out.append(Problem(rel, f"line {n}", m.group(0), f"the notebooks carry {sum(c.points.values()):g}"))
        if m:
            for part in re.finditer(r"(\d+) for (\d\d)(?:[–-](\d\d))?", line):
                lo, hi = part.group(2), part.group(3) or part.group(2)
                want = sum(p for a, p in c.points.items() if lo <= a[:2] <= hi)
                if int(part.group(1)) != want:
                    out.append(Problem(rel, f"line {n}", part.group(0), f"those notebooks carry {want:g}"))
    # a notebook's "(it also counts for one point)" before its graded cell
    for aid in c.aids:
        cells = _nb("notebooks", aid)["cells"]
        for i, cell in enumerate(cells):
            if cell["cell_type"] != "markdown":
                continue
            m = re.search(r"counts? for (\w+) points?", _src(cell))
            nxt = next((x for x in cells[i + 1:i + 3] if _meta(x).get("grade")), None)
            if m and nxt is not None and _number(m.group(1)) != _meta(nxt).get("points"):
                out.append(Problem(f"notebooks/{aid}/{aid}.ipynb", f"cell {i}", m.group(0),
                                   f"the next graded cell ({_meta(nxt)['grade_id']}) carries "
                                   f"{_meta(nxt).get('points'):g} points"))
    return out


def check_text_against_checks(c: Course, notebooks: dict | None = None) -> list[Problem]:
    """Numbers a notebook's text states that its code decides: the late rank's delay.

    Args:
        notebooks: {id: cells}, the release copies by default.
    """
    out = []
    for aid in c.aids:
        cells = notebooks[aid] if notebooks is not None else _nb("notebooks", aid)["cells"]
        code = "\n".join(_src(x) for x in cells if x["cell_type"] == "code")
        sleeps = {float(s) for s in re.findall(r"time\.sleep\(\s*(\d+(?:\.\d+)?)\s*\)", code)}
        for i, cell in enumerate(cells):
            if cell["cell_type"] != "markdown":
                continue
            text = _src(cell)
            for m in re.finditer(r"(\d+(?:\.\d+)?)\s*(ms|s) late\b", text):
                secs = float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)
                if sleeps and secs not in sleeps:
                    out.append(Problem(f"notebooks/{aid}/{aid}.ipynb", _at(f"cell {i}", text, m.start()),
                                       m.group(0), f"the notebook's probe sleeps "
                                       f"{', '.join(f'{s:g} s' for s in sorted(sleeps))}"))
    return out


def check_readme_sections(docs) -> list[Problem]:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        headings = [l.lstrip("#").strip() for l in f if l.startswith("#")]
    out = []
    for file, where, text in docs:
        for m in re.finditer(r"""README(?:\.md)?,? ['"“]([^'"”]+)['"”]""", text):
            if not any(h.startswith(m.group(1)) for h in headings):
                out.append(Problem(file, _at(where, text, m.start()), m.group(0),
                                   "README has no such section"))
    return out


def _blocks(lines: list[str]) -> list[tuple[int, str]]:
    """(first line, text) of each paragraph or list item of a markdown file."""
    out: list[list] = []
    for n, line in enumerate(lines, 1):
        starts = re.match(r"^\s*([-*]|\d+\.)\s", line) or not out or not lines[n - 2].strip()
        if not line.strip():
            continue
        if starts:
            out.append([n, line])
        else:
            out[-1][1] += " " + line.strip()
    return [(n, t) for n, t in out]


def check_run_times() -> list[Problem]:
    out = [Problem("docs/measured.json", "", p.split(": ", 1)[0], p.split(": ", 1)[-1])
           for p in measured.problems()]
    duration = re.compile(r"\b\d+(?:\.\d+)?\s?(?:s|min)\b")
    for path in sorted(glob.glob(os.path.join(ROOT, "autograder", "notes", "[0-9][0-9]_*.md"))):
        rel = os.path.relpath(path, ROOT)
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        for n, text in _blocks(lines):
            low = text.lower()
            if any(w in low for w in ("run time", "top to bottom", "cell by cell")) and \
                    duration.search(text) and "measured.json" not in text:
                out.append(Problem(rel, f"line {n}", "run time",
                                   f"{text.strip()[:90]!r}...: run times come from docs/measured.json "
                                   f"(WORKSHOP's measured table); point there instead"))
    return out


def all_problems() -> list[Problem]:
    c, docs = course(), documents()
    return (check_counts(c, docs) + check_notebook_tables(c) + check_capstone(c, docs) +
            check_ids(c, docs) + check_grade_ids_and_points(c) + check_text_against_checks(c) +
            check_readme_sections(docs) + check_run_times())


def _known(p: Problem) -> tuple | None:
    return next((k for k in KNOWN if k[1] == p.file and k[2] in f"{p.item} {p.message}"), None)


@pytest.fixture(scope="module")
def problems():
    return all_problems()


def test_the_text_agrees_with_the_course(problems):
    new = [p for p in problems if _known(p) is None]
    assert not new, (f"{len(new)} stale or inconsistent item(s) (fix the text, or, if another "
                     f"engineer is fixing it, add it to KNOWN with its finding id):\n"
                     + "\n".join(map(str, new)))


def test_known_items_still_fail(problems, capsys):
    """Never fails: prints the KNOWN entries no problem needs any more (the integrator deletes them)."""
    used = {_known(p) for p in problems}
    done = [k for k in KNOWN if k not in used]
    with capsys.disabled():
        for k in done:
            print(f"\nKNOWN entry no longer needed (fixed): {k}")


# --- the checks catch what they are for ---------------------------------------------------------

def test_the_checks_catch_the_review_findings():
    c = Course(["00_setup", "05_zero3", "07_overlap", "10_capstone"], {}, {}, set(), "10")
    docs = [("n.ipynb", "cell 0", "Intro.\nOver eight notebooks you build ...\n| 07 | capstone | a GPT |"),
            ("notes.md", "line 3", "With the capstone (07) it is one of the longest;"),
            ("a.md", "line 1", "Only the written answers (06 `three-x-explanation`, 07 `capstone-feynman`)"),
            ("b.md", "line 2", "see notebooks/09_capstone and notebook 08, then `05_zero3`"),
            ("c.md", "line 4", 'as in (README, "Beyond two machines")')]
    found = check_counts(c, docs) + check_capstone(c, docs) + check_ids(c, docs) + check_readme_sections(docs)
    items = {p.item for p in found}
    assert {"eight notebooks", "07 | capstone", "capstone (07", "07 `capstone", "09_capstone",
            "notebook 08", 'README, "Beyond two machines"'} <= items, items
    where = {p.item: p.where for p in found}
    assert where["eight notebooks"] == "cell 0 line 2" and where["07 | capstone"] == "cell 0 line 3"
    fine = [("d.md", "line 1", "the three notebooks 05-07; 13:00–14:00 | capstone | 10_capstone; "
                               "notebook 07 and `07_overlap_alt.ipynb`; (README, \"Beyond one machine\")")]
    assert not (check_counts(c, fine) + check_capstone(c, fine) + check_readme_sections(fine)
                + [p for p in check_ids(c, fine) if p.file == "d.md"])
    probe = {"07_overlap": [{"cell_type": "markdown", "source": "the last rank starts 0.4 s late"},
                            {"cell_type": "code", "source": "time.sleep(1.5)"}],
             "00_setup": [], "05_zero3": [], "10_capstone": []}
    (late,) = check_text_against_checks(c, probe)
    assert late.item == "0.4 s late" and "1.5 s" in late.message
    probe["07_overlap"][0]["source"] = "the last rank starts 1500 ms late"
    assert check_text_against_checks(c, probe) == []


def test_run_times_render_from_the_measured_source():
    m = {"measured": "2026-12-02", "run": {"00_setup": {"seconds": 14.6, "load": 4.3},
                                          "02_data_parallelism": {"seconds": 118.7, "load": 5.0}},
         "grade": {"00_setup": {"seconds": 29.2}}, "class": {"size": 20, "jobs2_speedup": 1.24}}
    aids = ["00_setup", "02_data_parallelism"]
    readme = ("| # | notebook | runs in (2 cores) | GPU |\n|---|---|---|---|\n"
              "| 00 | `00_setup` | ~20 s | optional |\n| 02 | `02_data_parallelism` | < 1 min | no |\n")
    assert measured.render_readme(readme, m, aids).split("\n")[:4] == [
        "| # | notebook | runs in (2 cores, busy; 2026-12-02) | GPU |", "|---|---|---|---|",
        "| 00 | `00_setup` | 15 s | optional |", "| 02 | `02_data_parallelism` | 2.0 min | no |"]
    workshop = ("| notebook | solution run top to bottom (busy) | `make grade`, one submission |\n|---|---|---|\n"
                "| 00_setup | 1 s | 2 s |\n| 02_data_parallelism | 1 s | 2 s |\n\n"
                "| notebook | JOBS=1 (derived) | JOBS=2 (derived) |\n|---|---|---|\n| 00_setup | 1 min | 1 min |\n")
    lines = measured.render_workshop(workshop, m, aids).split("\n")
    assert lines[2] == "| 00_setup | 14.6 s (load 4.3) | 29.2 s |"
    assert lines[3] == "| 02_data_parallelism | 118.7 s (load 5.0) | not measured |"   # no grade time
    assert lines[7] == "| 00_setup | 10 min | 8 min |"          # 20 x 29.2 s, and / 1.24
    assert measured.runs_in(None) == "not measured"


def test_a_measurement_is_recorded_with_its_date_and_source(tmp_path):
    timings = tmp_path / "notebook_run_s.json"
    timings.write_text(json.dumps({"00_setup": {"seconds": 12.34, "load": 2.5}}))
    m = measured.from_timings({"run": {}, "grade": {}}, str(timings))
    assert m["run"]["00_setup"] == {"seconds": 12.3, "load": 2.5}
    # make test's runs now leave the test cells' checks out: never README's "runs in".
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"00_setup": {"seconds": 5.0, "test_cells": "definitions only"}}))
    with pytest.raises(SystemExit, match="--only notebooks"):
        measured.from_timings({"run": {}, "grade": {}}, str(partial))
    assert re.match(r"\d{4}-\d\d-\d\d$", m["measured"]) and "test_notebooks" in m["how"]["run"]
    bench = tmp_path / "results.json"
    bench.write_text(json.dumps({"notebooks": {"00_setup": {"execute_s": 9.87}},
                                 "autograde": {"00_setup": {"reference_s": 20.04}},
                                 "autograde_sandboxed": True}))
    m = measured.from_bench(m, str(bench))
    assert m["run"]["00_setup"]["seconds"] == 9.9 and m["grade"]["00_setup"] == {"seconds": 20.0}
    assert "sandboxed: True" in m["how"]["grade"]
    grading = tmp_path / "grading_s.json"
    grading.write_text(json.dumps({"ref/03_zero1": {"seconds": 31.26, "load": 3.0},
                                   "blank/03_zero1": {"seconds": 9.0, "load": 3.0},
                                   "e2e-1 make grade (4 submissions)": {"seconds": 200.0}}))
    m = measured.from_grading(m, str(grading))
    assert m["grade"]["03_zero1"] == {"seconds": 31.3, "load": 3.0} and set(m["grade"]) == {"00_setup", "03_zero1"}
    assert "test_grading_e2e" in m["how"]["grade"]


def test_a_part_measured_another_day_keeps_its_own_date(tmp_path):
    """Recording today's grading times leaves the run column dated the day the runs were measured."""
    m = {"measured": "2026-01-01", "commit": "abc1234", "run": {"00_setup": {"seconds": 10.0, "load": 2.0}},
         "grade": {}, "stamps": {"run": {"measured": "2026-01-01", "commit": "abc1234"}}}
    bench = tmp_path / "results.json"
    bench.write_text(json.dumps({"autograde": {"00_setup": {"reference_s": 7.0}}, "autograde_sandboxed": True}))
    m = measured.from_bench(m, str(bench))
    today = datetime.date.today().isoformat()
    assert measured.dated(m, "run") == "2026-01-01" and measured.dated(m, "grade") == today
    assert m["stamps"]["grade"]["measured"] == today and "class" not in m["stamps"]
    table = ("| notebook | solution run top to bottom (busy, 2020-01-01) | `make grade`, one submission (idle, 2020-01-01) |\n"
             "|---|---|---|\n| 00_setup | x | y |")
    header = measured.render_workshop(table, m, ["00_setup"]).split("\n")[0]
    assert header == (f"| notebook | solution run top to bottom (busy, 2026-01-01) | "
                      f"`make grade`, one submission (idle, {today}) |")
    # A file from before per-part stamps: every part takes the file's date.
    assert measured.dated({"measured": "2025-05-05"}, "run") == "2025-05-05"
