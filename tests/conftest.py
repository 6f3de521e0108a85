"""Session-wide setup of the suite: where its time goes, and how the two xdist workers share it.

- tests/timeline.py records every test's worker, start and end (artifacts/timings/); `make test`
  prints each part's wall time at the end (tests/run_parts.py).
- The parallel part of `make test` runs `-n 2 --dist loadgroup`, scheduled by GroupScheduling
  below: a work unit is a group of tests that run in one process, in order, and each unit goes
  to whichever worker is free, in collection order. The groups (group_of):
  * a file whose tests share module fixtures (one `make grade` of many submissions, a server)
    is one unit, as `--dist loadfile` made every file;
  * in a SPLIT file every test stands alone (a notebook run top to bottom, a fixture graded
    in-process) and is a unit of its own, so one long file no longer keeps one worker busy
    while the other idles;
  * a test that names its group (pytest.mark.xdist_group) keeps it: test_grading_e2e's parts.
  The workers collect, order the units longest first (LPT) by tests/durations.json (the seconds
  measured per test: `python tests/timeline.py --estimates tests/durations.json` after a run; a
  test not in it counts as its file's mean there, else DEFAULT_S), and write each test's group
  to a file the controller's scheduler reads: so the units left at the end are short, and so is
  the wait of the first worker done. Stale estimates cost balance, never correctness: a group's
  tests stay together and in order.
  (Why not xdist's own loadgroup: with pytest 9 its renaming of node ids to "id@group" no longer
  takes effect, and every test became a unit of its own, module fixtures run on both workers.)
"""
from __future__ import annotations

import fnmatch
import json
import os
import tempfile
from collections import defaultdict

import pytest

from tests import timeline

HERE = os.path.dirname(os.path.abspath(__file__))
DURATIONS = os.path.join(HERE, "durations.json")
# Files whose tests are independent of each other (no module fixture worth sharing).
SPLIT = ["test_notebooks.py", "test_alternatives.py", "test_nb*.py"]
DEFAULT_S = 10.0
_GROUPS_KEY = "zerocourse_groups"          # workerinput: where the workers write the groups


def pytest_configure(config) -> None:
    timeline.pytest_configure(config)
    if config.pluginmanager.hasplugin("xdist") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Controller(), "zerocourse-groups")


def _split(path: str) -> bool:
    return any(fnmatch.fnmatch(os.path.basename(path), pat) for pat in SPLIT)


def group_of(item) -> str | None:
    """The group of a test: its own mark's, its file's, or None (a unit of its own)."""
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


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items) -> None:
    path = getattr(config, "workerinput", {}).get(_GROUPS_KEY)
    if not path:                            # not a worker of GroupScheduling: collection order
        return
    groups = [group_of(item) for item in items]
    mine = f"{path}.{config.workerinput.get('workerid', 'w')}"
    with open(mine, "w") as f:              # every worker collects the same: any one will do
        json.dump({it.nodeid: g for it, g in zip(items, groups) if g is not None}, f)
    os.replace(mine, path)
    items[:] = lpt_order(items, groups, _estimates())


class _Controller:
    """The controller's side: where the workers write the groups, and the scheduler."""

    def __init__(self):
        fd, self.path = tempfile.mkstemp(prefix="zerocourse-groups-", suffix=".json")
        os.close(fd)
        os.unlink(self.path)

    def pytest_configure_node(self, node) -> None:
        if node.config.getoption("dist") == "loadgroup":
            node.workerinput[_GROUPS_KEY] = self.path

    def pytest_xdist_make_scheduler(self, config, log):
        if config.getoption("dist") != "loadgroup":
            return None
        from xdist.scheduler import LoadScopeScheduling

        path = self.path

        class GroupScheduling(LoadScopeScheduling):
            """xdist's load-scope scheduling with tests/conftest.py's groups as the scopes, in the
            workers' (longest first) order."""

            def __init__(self, config, log=None):
                super().__init__(config, log)
                config.option.loadscopereorder = False     # keep the workers' LPT order
                self._groups = None

            def _split_scope(self, nodeid: str) -> str:
                if self._groups is None:
                    try:
                        with open(path) as f:
                            self._groups = json.load(f)
                    except (OSError, ValueError):
                        self._groups = {}
                return self._groups.get(nodeid, nodeid)

        return GroupScheduling(config, log)

    def pytest_unconfigure(self, config) -> None:
        try:
            os.unlink(self.path)
        except OSError:
            pass
