"""`make check NOTEBOOK=...`: run a notebook the way the grader does, before submitting.

    python autograder/check.py my-notebooks/03_zero1/03_zero1.ipynb

The same execution as `make grade` (autograder/split_execute.py): your cells in one
kernel, the graded test cells in a verdict kernel, the grader's cell timeout, the
sandbox where it is available (as root with bubblewrap), and the grader's scoring rule
(a test cell scores unless it raises; output on stderr never costs points). The test
cells are the course's (from notebooks/), whatever your copy holds; the hidden tests
are not included. It prints each graded cell's ✅/❌ messages in full, then a table of
what each would score, and exits 1 when any autograded point would be lost.
"""
from __future__ import annotations

import argparse
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


def cell_score(cell) -> float:
    """The grader's rule for a test cell: all points unless it raised."""
    points = float(_meta(cell).get("points", 0))
    return 0.0 if any(o.get("output_type") == "error" for o in cell.get("outputs", [])) else points


def check(path: str, sandbox: bool | None = None) -> int:
    """Run the notebook at `path` as the grader does; print the report; return the exit code."""
    import nbformat
    from traitlets.config import Config
    from autograder.grade import kernel_env
    from autograder.split_execute import SplitExecute, release_notebook

    path = os.path.abspath(path)
    aid = os.path.splitext(os.path.basename(path))[0]
    try:
        release = release_notebook(aid)
    except FileNotFoundError:
        print(f"❌ {path}: the course has no assignment {aid!r}; check the notebook's file name "
              f"(it must stay <assignment>.ipynb, e.g. 03_zero1.ipynb)")
        return 2
    try:
        with open(path, encoding="utf-8") as f:
            nb = nbformat.reads(f.read(), as_version=4)
    except Exception as e:  # noqa: BLE001 - anything unreadable
        print(f"❌ {path} is not a readable notebook: {type(e).__name__}: {str(e)[:200]}")
        return 2
    missing = restore_tests(nb, release)
    if sandbox is None:
        sandbox = os.geteuid() == 0 and shutil.which("bwrap") is not None and \
            os.environ.get("ZEROCOURSE_SANDBOX", "1") != "0"
    from autograder.resources import UserBlock
    users = UserBlock.reserve(1) if sandbox else UserBlock(None, None)
    base = tempfile.mkdtemp(prefix="zcck-")
    env = kernel_env(base, sandbox, users.slot(0))
    os.environ.update(env, NBGRADER_EXECUTION="validate", ZEROCOURSE_ASSIGNMENT=aid)
    c = Config()
    c.Execute.timeout = int(os.environ.get("ZEROCOURSE_CELL_TIMEOUT", 150))
    if sandbox:
        c.KernelManager.transport, c.KernelManager.ip = "ipc", env["ZEROCOURSE_KERNEL_IPC"]
    t0 = time.monotonic()
    print(f"running {os.path.relpath(path)} as the grader does "
          f"({'sandboxed' if sandbox else 'no sandbox'}; cell timeout {c.Execute.timeout} s) ...",
          flush=True)
    try:
        ep = SplitExecute(config=c)
        ep.kernel_output = subprocess.DEVNULL        # their start-up banners are noise here
        ep.preprocess(nb, {"metadata": {"path": os.path.dirname(path)},
                           "nbgrader": {"assignment": aid}})
    finally:
        shutil.rmtree(base, ignore_errors=True)
        users.release()
    took = time.monotonic() - t0
    rows, lost = [], 0.0
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
        print(f"\n── {gid} ({got:g}/{points:g})")
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                print(out.get("text", "").rstrip())
            elif out.get("output_type") == "error":
                print(f"{out.get('ename')}: {out.get('evalue')}")
        rows.append((gid, f"{got:g}/{points:g}", points))
    for gid in missing:
        rows.append((gid, "MISSING: the cell was deleted (0 points)", 0))
        lost += 1
    width = max([len(r[0]) for r in rows] + [10])
    print(f"\n{'graded cell':<{width}}  would score")
    for gid, verdict, _ in rows:
        print(f"{gid:<{width}}  {verdict}")
    print(f"\n{'✅ every autograded point' if not lost else f'❌ {lost:g} autograded point(s) lost'}"
          f" (visible tests only: the grader also runs hidden ones) in {took:.0f} s")
    return 1 if lost else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook")
    parser.add_argument("--no-sandbox", action="store_true")
    args = parser.parse_args()
    return check(args.notebook, sandbox=False if args.no_sandbox else None)


if __name__ == "__main__":
    sys.exit(main())
