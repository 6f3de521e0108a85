"""Session-wide setup of the suite: where its time goes, and how the two xdist workers share it.

- tests/timeline.py records every test's worker, start and end (artifacts/timings/); `make test`
  prints each part's wall time at the end (tests/run_parts.py).
- The parallel part of `make test` runs `-n 2 --dist loadgroup --no-loadscope-reorder`: a work
  unit is a group of tests that run in one process, in order, and each unit goes to whichever
  worker is free, in collection order. Here (group_of):
  * a file whose tests share module fixtures (one `make grade` of many submissions, a server)
    is one unit, as `--dist loadfile` made every file;
  * in a SPLIT file every test stands alone (a notebook run top to bottom, a fixture graded
    in-process) and is a unit of its own, so one long file no longer keeps one worker busy
    while the other idles;
  * a test that names its group (pytest.mark.xdist_group) keeps it: test_grading_e2e's parts.
  Units are ordered longest first (LPT) by tests/durations.json, the seconds measured per test
  (`python tests/timeline.py --estimates tests/durations.json` after a run; a test not in it
  counts as its file's mean there, else DEFAULT_S), so the units left at the end are short and
  the idle tail of the first worker done is short too. Stale estimates cost balance, never
  correctness: groups keep their tests together and in order.
"""
from __future__ import annotations

import fnmatch
import json
import os
from collections import defaultdict

import pytest

from tests import timeline

HERE = os.path.dirname(os.path.abspath(__file__))
DURATIONS = os.path.join(HERE, "durations.json")
# Files whose tests are independent of each other (no module fixture worth sharing).
SPLIT = ["test_notebooks.py", "test_alternatives.py", "test_nb*.py"]
DEFAULT_S = 10.0


def pytest_configure(config) -> None:
    timeline.pytest_configure(config)


def _split(path: str) -> bool:
    return any(fnmatch.fnmatch(os.path.basename(path), pat) for pat in SPLIT)


def group_of(item) -> str | None:
    """The xdist group of a test: its own mark's, its file's, or None (a unit of its own)."""
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        return mark.args[0] if mark.args else mark.kwargs.get("name", "default")
    path = item.nodeid.split("::", 1)[0]
    return None if _split(path) else path


def _estimates() -> dict[str, float]:
    try:
        with open(DURATIONS) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def lpt_order(items: list, groups: list, known: dict[str, float]) -> list:
    """The items, their groups kept together and in order, the longest group first.

    Args:
        items: collected test items (anything with .nodeid).
        groups: each item's group (None: a unit of its own).
        known: nodeid -> measured seconds.
    """
    per_file: dict[str, list[float]] = defaultdict(list)
    for nodeid, s in known.items():
        per_file[timeline.file_of(nodeid)].append(s)

    def guess(nodeid: str) -> float:
        if nodeid in known:
            return known[nodeid]
        same = per_file.get(timeline.file_of(nodeid))
        return sum(same) / len(same) if same else DEFAULT_S

    units: dict[object, list] = {}
    for i, (item, g) in enumerate(zip(items, groups)):
        units.setdefault(g if g is not None else ("own", i), []).append(item)
    cost = {key: sum(guess(timeline.base_nodeid(it.nodeid)) for it in unit)
            for key, unit in units.items()}
    order = sorted(units, key=lambda key: -cost[key])           # stable: ties keep collection order
    return [it for key in order for it in units[key]]


@pytest.hookimpl(tryfirst=True)          # before xdist's own hook, which reads the group marks
def pytest_collection_modifyitems(session, config, items) -> None:
    if config.getoption("dist", "no") != "loadgroup":
        return
    groups = []
    for item in items:
        g = group_of(item)
        if g is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(g))
        groups.append(g)
    items[:] = lpt_order(items, groups, _estimates())
