"""Grade a notebook's cells in-process: the fast path for bug fixtures.

An nbgrader autograde costs a kernel, imports and a gradebook per submission
(~20 s). A bug fixture only needs: the notebook's imports and definitions, the
learner's solution cells (with the bug injected), and the graded test cells
WITH their hidden tests (as the autograder restores them). `grade_cells` runs
exactly that, in a fresh namespace in this process, and returns which graded
cells passed: the same rule nbgrader applies (a test cell passes iff it raises
nothing). End-to-end autograding through `make grade` is tested separately.

Convention this relies on (see autograder/README.md): graded test cells use only
imports and definitions from earlier cells, never values computed by demo cells.

Per process, what does not change between calls is done once: each notebook is read and parsed
once (keyed by its file's size and mtime), each definitions-only cell and each cell's code is
compiled once. Every call still executes into a fresh namespace: nothing a fixture defines or
patches reaches the next call.
"""
from __future__ import annotations

import ast
import functools
import os
import re
import traceback

from tests.fixtures.make_submission import load as _load_fresh, source, strip_markers
from zerocourse.loader import _cell_code, _keep

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# In-process, fixtures and tests share one interpreter: a fixture that replaced the course's
# checks must fail the cell, as it cannot under `make grade` (split grading).
GUARD = '__import__("zerocourse.integrity", fromlist=["_"]).assert_untampered(globals())\n'


_HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS.*?^[ \t]*### END HIDDEN TESTS[ \t]*\n?", re.M | re.S)


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


@functools.lru_cache(maxsize=64)
def _load_cached(kind: str, aid: str, stamp: tuple) -> dict:
    return _load_fresh(kind, aid)


def load(kind: str, aid: str) -> dict:
    """The parsed notebook, read once per process while the file is unchanged. Shared between
    calls: read it, never modify it (make_submission.load gives a copy of your own)."""
    st = os.stat(os.path.join(ROOT, kind, aid, f"{aid}.ipynb"))
    return _load_cached(kind, aid, (st.st_size, st.st_mtime_ns))


@functools.lru_cache(maxsize=4096)
def _compiled(src: str, filename: str):
    return compile(src, filename, "exec")


def graded_cells(nb: dict) -> dict[str, float]:
    """grade_id -> points of every graded code cell."""
    return {_meta(c)["grade_id"]: float(_meta(c).get("points", 0)) for c in nb["cells"]
            if c["cell_type"] == "code" and _meta(c).get("grade")}


@functools.lru_cache(maxsize=4096)
def _definitions_only(src: str) -> str:
    tree = ast.parse(_cell_code(src))
    tree.body = [s for s in tree.body if _keep(s)]
    return ast.unparse(tree)


def grade_cells(aid: str, solutions: dict[str, str] | None = None,
                edits: list[tuple[str, str, str]] = (), only: list[str] | None = None,
                release: bool = False, visible_only: bool = False,
                device_proxy: bool = False) -> dict[str, str | None]:
    """Run an assignment's graded cells in-process with the given solution cells.

    Args:
        aid: assignment id.
        solutions: grade_id -> source replacing that solution cell (else the reference one).
        edits: (grade_id, old, new) replacements injected into the reference cells (bugs).
        only: graded cells to run (default: all); solution cells and definitions always run.
        release: start from the learner's release copy (stubs) instead of the solutions.
        visible_only: run the graded cells without their hidden tests (the self-check the learner
            sees), e.g. to prove that a self-check catches what the hidden tests catch.
        device_proxy: run every launch under ZEROCOURSE_DEVICE_PROXY=1 (zerocourse/devices.py):
            a tensor created in a rank without the rank's device lands on `meta` and fails, as
            it would on a GPU under NCCL. The reference solutions and the course's cells must pass so.
    Returns:
        grade_id -> None if the cell passed, else the error text.
    """
    saved = os.environ.get("ZEROCOURSE_DEVICE_PROXY")
    os.environ["ZEROCOURSE_DEVICE_PROXY"] = "1" if device_proxy else "0"
    try:
        return _grade_cells(aid, solutions, edits, only, release, visible_only)
    finally:
        if saved is None:
            os.environ.pop("ZEROCOURSE_DEVICE_PROXY", None)
        else:
            os.environ["ZEROCOURSE_DEVICE_PROXY"] = saved


def _grade_cells(aid, solutions, edits, only, release, visible_only) -> dict[str, str | None]:
    sol = load("solutions", aid)
    cells = sol["cells"]
    results: dict[str, str | None] = {}
    ns: dict = {"__name__": "__main__"}
    rel_cells = {(_meta(c).get("grade_id")): c for c in load("notebooks", aid)["cells"]} if release else {}
    edits = list(edits)
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "code":
            continue
        meta = _meta(cell)
        gid = meta.get("grade_id")
        src = strip_markers(source(cell))
        if meta.get("solution"):
            if release:
                src = source(rel_cells[gid])
            if solutions and gid in solutions:
                src = solutions[gid]
        for egid, old, new in edits:
            if egid == gid:
                if old not in src:
                    raise ValueError(f"fixture edit {old!r} not found in cell {gid!r}")
                src = src.replace(old, new, 1)
        if meta.get("grade"):
            if only is not None and gid not in only:
                continue
            if visible_only:
                src = _HIDDEN.sub("", src)
            src = GUARD + src
            try:
                exec(_compiled(src, f"<{aid} cell {gid}>"), ns)
                results[gid] = None
            except BaseException as e:  # noqa: BLE001 - any failure fails the cell, as in nbgrader
                results[gid] = "".join(traceback.format_exception_only(type(e), e)).strip()
            continue
        if not meta.get("solution"):
            src = _definitions_only(src)
        # Solution cells run whole (they may be anything); a failure there surfaces in the tests.
        try:
            exec(_compiled(src, f"<{aid} cell {i}>"), ns)
        except Exception as e:  # noqa: BLE001
            ns.setdefault("__errors__", []).append(f"cell {i}: {type(e).__name__}: {e}")
    return results


def score(aid: str, results: dict[str, str | None]) -> tuple[float, float]:
    """(points earned, points possible) for the graded cells in results."""
    pts = graded_cells(load("solutions", aid))
    return (sum(pts[g] for g, err in results.items() if err is None),
            sum(pts[g] for g in results))


def assert_bug_caught(aid: str, edits, only, must_fail, must_pass=(), visible_only=False) -> dict:
    """Inject a bug fixture and check that it fails `must_fail`, spares `must_pass`, loses points
    (with visible_only, in the self-checks alone: the learner sees the ❌ before submitting)."""
    results = grade_cells(aid, edits=edits, only=only, visible_only=visible_only)
    failed = {g for g, err in results.items() if err is not None}
    assert set(must_fail) <= failed, (edits, results)
    assert not set(must_pass) & failed, (edits, results)
    earned, total = score(aid, results)
    assert earned < total, (edits, results)
    return results


def assert_full_marks(aid: str, total: float | None = None, cells: list[str] | None = None,
                      **fixture) -> dict:
    """Every graded cell run passes (the solution, or a valid alternative given as `fixture`:
    solutions=, edits=, only=); with `total`, the score is (total, total), else full and > 0;
    with `cells`, exactly those graded cells ran. The reference solution itself (no solutions=
    or edits=) runs under the device proxy: every tensor on the rank's device."""
    fixture.setdefault("device_proxy", not fixture.get("solutions") and not fixture.get("edits"))
    results = grade_cells(aid, **fixture)
    if cells is not None:
        assert set(results) == set(cells), results
    assert all(err is None for err in results.values()), results
    earned, possible = score(aid, results)
    if total is not None:
        assert (earned, possible) == (total, total), results
    else:
        assert earned == possible > 0, results
    return results


def assert_stubs_fail(aid: str, cells: list[str] | None = None, total: float | None = None) -> dict:
    """Every graded cell fails on the learner's release copy (the stubs): the score is 0."""
    results = grade_cells(aid, release=True)
    if cells is not None:
        assert set(results) == set(cells), results
    assert all(err is not None for err in results.values()), results
    earned, possible = score(aid, results)
    assert earned == 0 and (total is None or possible == total), results
    return results
