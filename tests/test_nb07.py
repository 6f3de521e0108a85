"""07_capstone: the auto-graded self-test passes on the solution, fails on the stubs and wrong answers."""
import pytest

from tests.harness import assert_bug_caught, assert_full_marks, assert_stubs_fail

AID = "07_capstone"
AUTO = 5  # auto-graded points (Q1 3 + Q2 1 + Q3 1); the Feynman answer (4) is graded by hand


def test_solution_gets_full_marks():
    assert_full_marks(AID, AUTO)


def test_every_graded_cell_fails_on_the_stubs():
    assert_stubs_fail(AID)


WRONG = {
    "ZeRO-2 shards only optimizer state": (
        [("capstone-q1", "2 * psi + 14 * psi / n", "4 * psi + 12 * psi / n")], ["capstone-q1-test"]),
    "ZeRO-1 shards everything": (
        [("capstone-q1", "4 * psi + 12 * psi / n", "16 * psi / n")], ["capstone-q1-test"]),
    "forgot the 64 ranks": (
        [("capstone-q2", "80e9 * 64 / 16 / 1e9", "80e9 / 16 / 1e9")], ["capstone-q2-test"]),
    "ZeRO-1/2 gather in forward": (
        [("capstone-q3", "{3}", "{1, 2, 3}")], ["capstone-q3-test"]),
}


@pytest.mark.parametrize("bug", list(WRONG))
def test_wrong_answer_is_caught(bug):
    edits, must_fail = WRONG[bug]
    assert_bug_caught(AID, edits, None, must_fail)
