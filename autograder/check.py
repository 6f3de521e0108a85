"""`make check NOTEBOOK=...`: run a notebook the way the grader does, before submitting.

    python autograder/check.py my-notebooks/03_zero1/03_zero1.ipynb
    python autograder/check.py my-notebooks/07_overlap/07_overlap_alt.ipynb      # any name
    python autograder/check.py attempt.ipynb --assignment 07_overlap

The same execution as `make grade` (autograder/split_execute.py): your cells in one
kernel, the graded test cells in a verdict kernel, the grader's cell timeout, the
sandbox where it is available (as root with bubblewrap), and the grader's scoring rule
(a test cell scores unless it raises; output on stderr never costs points). The test
cells are the course's (from notebooks/), whatever your copy holds; the hidden tests
are not included. It prints each graded cell's ✅/❌ messages in full, then a table of
what each would score, and exits 1 when any autograded point would be lost.

The assignment is found from the notebook's cells (their nbgrader grade_ids, matched against
the course's release copies), so a second attempt under another file name works; `--assignment`
names it outright. A test cell whose visible part can only check the format (it printed
zerocourse.checks.format_only's "☑ ..." line and no ✅) is listed as "not checked here": its
points are shown apart and never counted in "every autograded point" (the hidden tests decide
them).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def _src(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def restore_tests(nb: dict, release: dict) -> list[str]:
    """Put the course's test cells back (by grade_id); returns the ids missing from nb."""
    course = {_meta(c).get("grade_id"): c for c in release["cells"]
              if _meta(c).get("grade") and not _meta(c).get("solution")}
    seen = set()
    for cell in nb["cells"]:
        gid = _meta(cell).get("grade_id")
        if gid in course and gid not in seen:
            cell["source"] = _src(course[gid])
            cell["metadata"]["nbgrader"] = dict(course[gid]["metadata"]["nbgrader"])
            cell["cell_type"] = "code"
            seen.add(gid)
        elif gid in seen:                       # a copied test cell: a plain cell now
            del cell["metadata"]["nbgrader"]
    return [g for g in course if g not in seen]


def release_dir() -> str:
    """Where the course's release copies are: ZEROCOURSE_RELEASE_DIR or notebooks/."""
    from autograder.split_execute import ROOT
    return os.environ.get("ZEROCOURSE_RELEASE_DIR") or os.path.join(ROOT, "notebooks")


def _grade_ids(nb: dict) -> set[str]:
    return {_meta(c).get("grade_id") for c in nb.get("cells", []) if _meta(c).get("grade_id")}


def find_assignment(nb: dict, path: str, explicit: str | None = None) -> tuple[str | None, str]:
    """(the assignment `nb` is a copy of, how it was told) or (None, why it cannot be told).

    Args:
        nb: the learner's notebook (a dict).
        path: its file name: `<assignment>.ipynb` decides only when the cells cannot.
        explicit: --assignment, which wins when the course has it.
    """
    base = release_dir()
    known = sorted(d for d in os.listdir(base) if os.path.exists(os.path.join(base, d, f"{d}.ipynb")))
    if explicit:
        if explicit in known:
            return explicit, "--assignment"
        return None, f"the course has no assignment {explicit!r} (--assignment); it has {', '.join(known)}"
    mine = _grade_ids(nb)
    overlap = {}
    for aid in known:
        with open(os.path.join(base, aid, f"{aid}.ipynb"), encoding="utf-8") as f:
            n = len(mine & _grade_ids(json.load(f)))
        if n:
            overlap[aid] = n
    stem = os.path.splitext(os.path.basename(path))[0]
    if overlap:
        best = max(overlap.values())
        top = sorted(a for a, n in overlap.items() if n == best)
        if len(top) == 1:
            return top[0], "its graded cells" + ("" if top[0] == stem else f" (the file is named {stem!r})")
        if stem in top:
            return stem, "its file name"
        return None, (f"its graded cells belong to several assignments ({', '.join(top)}); "
                      f"name one with --assignment")
    if stem in known:
        return stem, "its file name"
    return None, (f"none of its cells is a graded cell of the course (were they deleted, or is it "
                  f"another file?) and its name {stem!r} is no assignment; name one with "
                  f"--assignment ({', '.join(known)})")


def cell_score(cell) -> float:
    """The grader's rule for a test cell: all points unless it raised."""
    points = float(_meta(cell).get("points", 0))
    return 0.0 if any(o.get("output_type") == "error" for o in cell.get("outputs", [])) else points


def format_only(cell) -> bool:
    """Did the visible run print only format-only lines (☑ ..., no ✅) and no error?"""
    from zerocourse.checks import FORMAT_ONLY
    if any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
        return False
    lines = [l.strip() for o in cell.get("outputs", []) if o.get("output_type") == "stream"
             for l in o.get("text", "").splitlines()]
    return any(l.startswith(FORMAT_ONLY) for l in lines) and not any(l.startswith("✅") for l in lines)


def check(path: str, sandbox: bool | None = None, assignment: str | None = None) -> int:
    """Run the notebook at `path` as the grader does; print the report; return the exit code."""
    import nbformat
    from traitlets.config import Config
    from autograder.grade import kernel_env
    from autograder.split_execute import SplitExecute, release_notebook

    path = os.path.abspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            nb = nbformat.reads(f.read(), as_version=4)
    except Exception as e:  # noqa: BLE001 - anything unreadable
        print(f"❌ {path} is not a readable notebook: {type(e).__name__}: {str(e)[:200]}")
        return 2
    aid, how = find_assignment(nb, path, assignment)
    if aid is None:
        print(f"❌ {path}: which assignment is it? {how}")
        return 2
    release = release_notebook(aid)
    missing = restore_tests(nb, release)
    if sandbox is None:
        sandbox = os.geteuid() == 0 and shutil.which("bwrap") is not None and \
            os.environ.get("ZEROCOURSE_SANDBOX", "1") != "0"
    base = tempfile.mkdtemp(prefix="zcck-")
    env = kernel_env(base, sandbox)
    os.environ.update(env, NBGRADER_EXECUTION="validate", ZEROCOURSE_ASSIGNMENT=aid)
    c = Config()
    c.Execute.timeout = int(os.environ.get("ZEROCOURSE_CELL_TIMEOUT", 150))
    if sandbox:
        c.KernelManager.transport, c.KernelManager.ip = "ipc", env["ZEROCOURSE_KERNEL_IPC"]
    t0 = time.monotonic()
    print(f"running {os.path.relpath(path)} (assignment {aid}, from {how}) as the grader does "
          f"({'sandboxed' if sandbox else 'no sandbox'}; cell timeout {c.Execute.timeout} s) ...",
          flush=True)
    try:
        ep = SplitExecute(config=c)
        ep.kernel_output = subprocess.DEVNULL        # their start-up banners are noise here
        ep.preprocess(nb, {"metadata": {"path": os.path.dirname(path)},
                           "nbgrader": {"assignment": aid}})
    finally:
        shutil.rmtree(base, ignore_errors=True)
    took = time.monotonic() - t0
    rows, lost, checked, unchecked = [], 0.0, 0.0, 0.0
    for cell in nb.cells:
        m = _meta(cell)
        if not m.get("grade"):
            continue
        gid, points = m.get("grade_id"), float(m.get("points", 0))
        if m.get("solution"):
            rows.append((gid, "graded by hand", points))
            continue
        got = cell_score(cell)
        lost += points - got
        if format_only(cell):
            unchecked += points
            verdict = f"not checked here: {points:g} point(s), format only (the hidden tests decide)"
        else:
            checked += points
            verdict = f"{got:g}/{points:g}"
        print(f"\n── {gid} ({verdict.split(' (')[0]})")
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                print(out.get("text", "").rstrip())
            elif out.get("output_type") == "error":
                print(f"{out.get('ename')}: {out.get('evalue')}")
        rows.append((gid, verdict, points))
    for gid in missing:
        rows.append((gid, "MISSING: the cell was deleted (0 points)", 0))
        lost += 1
    width = max([len(r[0]) for r in rows] + [10])
    print(f"\n{'graded cell':<{width}}  would score")
    for gid, verdict, _ in rows:
        print(f"{gid:<{width}}  {verdict}")
    if lost:
        summary = f"❌ {lost:g} autograded point(s) lost"
    elif unchecked:
        summary = f"✅ {checked:g} autograded point(s) checked here, none lost"
    else:
        summary = "✅ every autograded point"
    print(f"\n{summary} (visible tests only: the grader also runs hidden ones) in {took:.0f} s")
    if unchecked:
        print(f"☑ {unchecked:g} more point(s) not checked here: those cells can only check the "
              f"format; correctness is in the hidden tests")
    return 1 if lost else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook", help="your notebook, under any file name")
    parser.add_argument("--assignment", help="the assignment it is (default: found from its cells)")
    parser.add_argument("--no-sandbox", action="store_true")
    args = parser.parse_args()
    return check(args.notebook, sandbox=False if args.no_sandbox else None,
                 assignment=args.assignment)


if __name__ == "__main__":
    sys.exit(main())
