"""`make grade` end to end: the bad-submission battery, the sandbox, feedback, no leftovers.

One `make grade` run grades every fixture below (correct, partial, blank, broken and
hostile submissions of 00_setup, the cheapest notebook) and the tests assert each
expected score, that each finished within 60 s, that nothing was left running, that
the sandbox held (each property is tried by a submission) and that feedback hides
the hidden tests. Timeouts are shortened for the run (see ENV) so hangs cost seconds.
"""
import html
import json
import os
import re
import time

import pytest

from tests.fixtures.make_submission import (ROOT, cell_by_id, load, make_grade, replace_in,
                                            solution_as_submission, write)
from tests.proc_util import descendants

# One `make grade` of the whole battery, two submissions at a time (JOBS=2: most cases wait on
# a timeout, so they overlap well; ~8 min alone with JOBS=1, more beside another pytest worker).
pytestmark = pytest.mark.timeout(1800)

AID = "00_setup"
ENV = {"ZEROCOURSE_COLLECTIVE_TIMEOUT": "3", "ZEROCOURSE_TIMEOUT": "10",
       "ZEROCOURSE_CELL_TIMEOUT": "40", "JOBS": "2"}
SUM, MEAN = "setup-sum-of-ranks", "setup-global-mean"
MEAN_TESTS = ("setup-global-mean-check", "setup-global-mean-hidden")


def _sol(*edits):
    nb = solution_as_submission(AID)
    for gid, old, new in edits:
        if old is None:                                # append to the cell
            cell = cell_by_id(nb, gid)
            cell["source"] = "".join(cell["source"]) + new
        else:
            replace_in(nb, gid, old, new)
    return nb


def _before(gid, code):
    """Insert code at the top of a solution cell (before its def)."""
    name = "def sum_of_ranks" if gid == SUM else "def global_mean"
    return (gid, name, code + "\n" + name)


def _after(gid, code):
    """Append code at the end of a solution cell (after its def)."""
    return (gid, None, "\n\n" + code)


NO_DIVIDE = (MEAN, "return out / dist.get_world_size()", "return out")


def _edited_tests():
    nb = _sol(NO_DIVIDE)
    for gid in MEAN_TESTS:
        cell_by_id(nb, gid)["source"] = "print('all good')"
    return nb


def _deleted_test():
    nb = _sol()
    nb["cells"] = [c for c in nb["cells"]
                   if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") != MEAN_TESTS[1]]
    return nb


def _added_cells():
    nb = _sol()
    extra = [{"cell_type": "markdown", "metadata": {}, "source": "My notes."},
             {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
              "source": "def my_helper(x):\n    return 2 * x\nprint(my_helper(21))"}]
    nb["cells"][3:3] = extra
    return nb


def _sandbox_probe(out, subs):
    """Tries every sandbox property; sabotages sum_of_ranks if any one does not hold."""
    secrets = [os.path.join(ROOT, "solutions", AID, f"{AID}.ipynb"),
               os.path.join(ROOT, "tests", "test_nb00.py"),
               os.path.join(out, "gradebook.db"),
               os.path.join(subs, "alice", AID, f"{AID}.ipynb")]
    probe = f"""
import json, os, socket
_report = {{"read": [], "wrote": [], "net": sorted(n for _, n in socket.if_nameindex())}}
for _p in {secrets!r}:
    try:
        open(_p, "rb").read(1)
        _report["read"].append(_p)
    except OSError:
        pass
for _p in ({os.path.join(ROOT, "zerocourse", "evil.py")!r}, {os.path.join(out, "evil.txt")!r}):
    try:
        open(_p, "w").write("x")
        _report["wrote"].append(_p)
    except OSError:
        pass
print("SANDBOX-REPORT " + json.dumps(_report))
"""
    return _sol(_before(SUM, probe),
                (SUM, "return int(t.item())",
                 "return int(t.item()) if not (_report['read'] or _report['wrote'] or "
                 "_report['net'] != ['lo']) else -1"))


FORK_BOMB = """
import os, time
_kids = 0
while True:
    try:
        if os.fork() == 0:
            time.sleep(3600)
            os._exit(0)
        _kids += 1
    except OSError:
        break
print(f"fork bomb stopped after {_kids} processes")
"""

# student -> (submission builder, expected score, text the status must contain)
BATTERY = {
    "correct": (lambda o, s: _sol(), 7, "graded"),
    "partial": (lambda o, s: _sol(NO_DIVIDE), 3, "graded"),
    "blank": (lambda o, s: load("notebooks", AID), 0, "graded"),
    "deadlock": (lambda o, s: _sol(
        (SUM, "dist.all_reduce(t)", "dist.broadcast(t, 0) if rank == 0 else dist.all_reduce(t)"),
        (MEAN, "dist.all_reduce(out)",
         "dist.broadcast(out, 0) if dist.get_rank() == 0 else dist.all_reduce(out)")), 0, "graded"),
    "some-ranks": (lambda o, s: _sol((MEAN, "dist.all_reduce(out)",
                                      "if dist.get_rank() == 0:\n        dist.all_reduce(out)")),
                   3, "graded"),
    "raises-on-rank": (lambda o, s: _sol((SUM, "t = torch.tensor", "if rank == 1:\n        raise "
                                          "ValueError('oops')\n    t = torch.tensor")), 4, "graded"),
    "os-exit-in-rank": (lambda o, s: _sol((MEAN, "dist.all_reduce(out)",
                                           "if dist.get_rank() == 1:\n        import os\n"
                                           "        os._exit(3)\n    dist.all_reduce(out)")),
                        3, "graded"),
    "sigabrt-size-mismatch": (lambda o, s: _sol((MEAN, "dist.all_reduce(out)",
                                                 "dist.all_reduce(torch.ones(2 + dist.get_rank()))\n"
                                                 "    dist.all_reduce(out)")), 3, "graded"),
    "kernel-infinite-loop": (lambda o, s: _sol(_before(SUM, "while True:\n    pass")), 4, "graded"),
    "rank-infinite-loop": (lambda o, s: _sol((MEAN, "dist.all_reduce(out)",
                                              "while dist.get_rank() == 0:\n        pass\n"
                                              "    dist.all_reduce(out)")), 3, "graded"),
    "sys-exit": (lambda o, s: _sol(_before(MEAN, "import sys\nsys.exit()")), 3, "graded"),
    # The crash costs its own cell (global_mean is never defined): the kernel restarts,
    # the cells before it run again, and the rest of the notebook is graded.
    "kernel-crash": (lambda o, s: _sol(_after(MEAN, "import os\nos.abort()")), 3, "graded"),
    "memory-bomb": (lambda o, s: _sol(_before(SUM, "_bomb = torch.empty(50 * 10**9 // 4)")),
                    4, "graded"),
    "output-flood": (lambda o, s: _sol(_after(MEAN, "for _ in range(1000):\n"
                                                    "    print('x' * 100_000)")), 7, "graded"),
    # The bomb runs in the learner's kernel, capped by the pids cgroup; the tests run in the
    # verdict kernel, so the (correct) functions keep their points.
    "fork-bomb": (lambda o, s: _sol(_after(MEAN, FORK_BOMB)), 7, "graded"),
    "edited-tests": (lambda o, s: _edited_tests(), 3, "graded"),
    "deleted-test": (lambda o, s: _deleted_test(), 4, "graded"),
    "added-cells": (lambda o, s: _added_cells(), 7, "graded"),
    "redefined-check": (lambda o, s: _sol(NO_DIVIDE, _after(
        MEAN, "def check_close(*args, **kwargs):\n    pass")), 3, "graded"),
    "patched-zerocourse": (lambda o, s: _sol(NO_DIVIDE, _after(
        MEAN, "import zerocourse.checks\nzerocourse.checks.check_close = lambda *a, **k: None\n"
              "check_close = zerocourse.checks.check_close")), 3, "graded"),
    "wrong-dtype": (lambda o, s: _sol((MEAN, "return out / dist.get_world_size()",
                                       "return (out / dist.get_world_size()).double()")), 3, "graded"),
    "wrong-shape": (lambda o, s: _sol((MEAN, "return out / dist.get_world_size()",
                                       "return (out / dist.get_world_size()).reshape(-1, 1)")),
                    3, "graded"),
    "returns-none": (lambda o, s: _sol((MEAN, "return out / dist.get_world_size()", "return None")),
                     3, "graded"),
    "sandbox-probe": (_sandbox_probe, 7, "graded"),
    "not-json": (lambda o, s: "{not json", 0, "not valid JSON"),
    "empty-file": (lambda o, s: "", 0, "empty file"),
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    subs = tmp_path_factory.mktemp("submissions")
    out = tmp_path_factory.mktemp("graded")
    for student, (build, _, _) in BATTERY.items():
        write(build(str(out), str(subs)), subs, student, AID)
    write(solution_as_submission(AID), subs, "wrong-id", "99_unknown")
    before = descendants(os.getpid())
    rows, took = make_grade(subs, out, ENV, timeout=1800)
    return rows, out, subs, before, took


@pytest.mark.parametrize("student", list(BATTERY))
def test_battery_scores(graded, student):
    rows, *_ = graded
    _, expected, status = BATTERY[student]
    row = rows[student]
    assert float(row["score"]) == expected, row
    assert status in row["status"], row
    assert float(row["max_score"]) == 7
    assert float(row["seconds"]) < 3 * float(ENV["ZEROCOURSE_CELL_TIMEOUT"]), row


def test_wrong_assignment_id_is_reported(graded):
    rows, *_ = graded
    assert rows["wrong-id"]["assignment_id"] == "99_unknown"
    assert "unknown assignment id" in rows["wrong-id"]["status"]
    assert float(rows["wrong-id"]["score"]) == 0


def test_sandbox_held(graded):
    """The probe could read no secret, write nothing outside its folder, and had no network."""
    _, out, _, _, _ = graded
    nb = json.loads((out / "autograded" / "sandbox-probe" / AID / f"{AID}.ipynb").read_text())
    text = "".join("".join(o.get("text", "")) for c in nb["cells"] for o in c.get("outputs", []))
    report = json.loads(re.search(r"SANDBOX-REPORT (\{.*\})", text).group(1))
    assert report == {"read": [], "wrote": [], "net": ["lo"]}
    assert not os.path.exists(os.path.join(ROOT, "zerocourse", "evil.py"))
    assert not (out / "evil.txt").exists()


def test_no_process_left_behind(graded):
    *_, before, _ = graded
    deadline = time.monotonic() + 20
    while descendants(os.getpid()) - before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert descendants(os.getpid()) - before == set()


def test_other_results_and_submissions_intact(graded):
    rows, out, subs, _, _ = graded
    assert sorted(os.listdir(subs)) == sorted(list(BATTERY) + ["wrong-id"])
    assert (subs / "not-json" / AID / f"{AID}.ipynb").read_text() == "{not json"
    assert (out / "gradebook.db").exists()
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{out / 'gradebook.db'}") as gb:
        assert gb.find_submission(AID, "correct").score == 7


def _text(path):
    return html.unescape(re.sub(r"<[^>]+>", "", path.read_text()))


def test_feedback_hides_hidden_tests(graded):
    _, out, _, _, _ = graded
    for student in ("correct", "partial", "blank", "deadlock"):
        text = _text(out / "feedback" / student / AID / f"{AID}.html")
        assert "def sum_of_ranks" in text
        assert "BEGIN HIDDEN TESTS" not in text
        assert "for n in (1, 3, 4):" not in text          # a line only the hidden tests have
    # What a learner does see for a failed hidden test: the check's message and its hint.
    partial = _text(out / "feedback" / "partial" / AID / f"{AID}.html")
    assert "❌ global_mean on" in partial and "Hint:" in partial


def test_battery_time(graded):
    *_, took = graded
    print(f"battery: {len(BATTERY) + 1} submissions graded in {took:.0f} s")
    assert took < 60 * (len(BATTERY) + 1)
