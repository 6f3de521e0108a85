"""`make grade` end to end on 00_setup: correct, partial, deadlocking, blank, broken files."""
import csv
import html
import re
import os
import subprocess
import time

import pytest

from tests.fixtures.make_submission import load, replace_in, solution_as_submission, write

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AID = "00_setup"
COLLECTIVE_TIMEOUT = 5   # seconds; the deadlock fixture waits this long per graded cell


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    subs = tmp_path_factory.mktemp("submissions")
    out = tmp_path_factory.mktemp("graded")
    write(solution_as_submission(AID), subs, "alice", AID)             # correct
    nb = solution_as_submission(AID)                                    # forgot to divide
    replace_in(nb, "setup-global-mean", "return out / dist.get_world_size()", "return out")
    write(nb, subs, "bob", AID)
    write(load("notebooks", AID), subs, "carol", AID)                   # blank release copy
    nb = solution_as_submission(AID)                                    # deadlocks everywhere
    replace_in(nb, "setup-sum-of-ranks", "dist.all_reduce(t)",
               "dist.broadcast(t, 0) if rank == 0 else dist.all_reduce(t)")
    replace_in(nb, "setup-global-mean", "dist.all_reduce(out)",
               "dist.broadcast(out, 0) if dist.get_rank() == 0 else dist.all_reduce(out)")
    write(nb, subs, "dave", AID)
    write("{not json", subs, "erin", AID)
    write(solution_as_submission(AID), subs, "frank", "99_unknown")
    t0 = time.monotonic()
    env = dict(os.environ, ZEROCOURSE_COLLECTIVE_TIMEOUT=str(COLLECTIVE_TIMEOUT))
    proc = subprocess.run(["make", "-s", "grade", f"SUBMISSIONS={subs}", f"OUT={out}"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900)
    took = time.monotonic() - t0
    print(proc.stdout, proc.stderr[-3000:], f"make grade took {took:.1f} s", sep="\n")
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out / "grades.csv") as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    return rows, out, subs


def test_scores(graded):
    rows, _, _ = graded
    assert float(rows["alice"]["score"]) == 7 == float(rows["alice"]["max_score"])
    assert float(rows["bob"]["score"]) == 3          # sum_of_ranks right, global_mean wrong
    assert float(rows["carol"]["score"]) == 0
    assert float(rows["dave"]["score"]) == 0
    assert float(rows["erin"]["score"]) == 0 and "not valid JSON" in rows["erin"]["status"]
    assert rows["frank"]["assignment_id"] == "99_unknown"
    assert "unknown assignment id" in rows["frank"]["status"]


def test_deadlocking_submission_ends_within_its_timeouts(graded):
    rows, _, _ = graded
    # 4 graded cells, each ends at the first collective timeout, plus kernel and nbgrader overhead.
    assert float(rows["dave"]["seconds"]) < 4 * (COLLECTIVE_TIMEOUT + 5) + 40


def _text(path):
    return html.unescape(re.sub(r"<[^>]+>", "", path.read_text()))


def test_feedback_hides_hidden_tests(graded):
    rows, out, _ = graded
    for student in ("alice", "bob", "carol", "dave"):
        text = _text(out / "feedback" / student / AID / f"{AID}.html")
        assert "def sum_of_ranks" in text
        assert "BEGIN HIDDEN TESTS" not in text
        assert "for n in (1, 3, 4):" not in text          # a line only the hidden tests have
    # What a learner does see for a failed hidden test: the check's message and its hint.
    bob = _text(out / "feedback" / "bob" / AID / f"{AID}.html")
    assert "❌ global_mean on" in bob and "Hint:" in bob


def test_submissions_are_left_untouched(graded):
    _, _, subs = graded
    assert sorted(os.listdir(subs)) == ["alice", "bob", "carol", "dave", "erin", "frank"]
    assert (subs / "erin" / AID / f"{AID}.ipynb").read_text() == "{not json"
