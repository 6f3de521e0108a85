"""10_capstone: the auto-graded self-test passes on the solution, fails on the stubs and wrong answers."""
import pytest

from tests.harness import assert_bug_caught, assert_full_marks, assert_stubs_fail

AID = "10_capstone"
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


VALID = {
    "factored formulas (other float rounding)": (
        "    return float([16 * psi, (4 + 12 / n) * psi, (2 + 14 / n) * psi, 16 / n * psi][stage])\n"),
    "if/elif with integer-friendly order": (
        "    if stage == 0:\n        return 16.0 * psi\n    if stage == 1:\n"
        "        return psi * (4 * n + 12) / n\n    if stage == 2:\n"
        "        return psi * (2 * n + 14) / n\n    return psi * 16 / n\n"),
}


@pytest.mark.parametrize("alt", list(VALID))
def test_valid_alternative_gets_full_marks(alt):
    body = VALID[alt]
    src = 'def bytes_per_rank(stage, psi, n):\n    """Per-rank model-state bytes."""\n' + body
    assert_full_marks(AID, solutions={"capstone-q1": src}, only=["capstone-q1-test"])


@pytest.mark.parametrize("bug", list(WRONG))
def test_wrong_answer_is_caught(bug):
    edits, must_fail = WRONG[bug]
    assert_bug_caught(AID, edits, None, must_fail)


# The self-checks alone (hidden tests removed, as the learner runs them) must catch these: a
# self-check that approves what the grader then fails is worse than none.
SELF_CHECK = {
    "wrong stage-2 formula (gradients not sharded)": (
        [("capstone-q1", "2 * psi + 14 * psi / n", "4 * psi + 12 * psi / n")], ["capstone-q1-test"]),
    "wrong stage-1 formula": (
        [("capstone-q1", "4 * psi + 12 * psi / n", "2 * psi + 14 * psi / n")], ["capstone-q1-test"]),
    "Q2 in parameters instead of billions": (
        [("capstone-q2", "80e9 * 64 / 16 / 1e9", "80e9 * 64 / 16")], ["capstone-q2-test"]),
}


@pytest.mark.parametrize("bug", list(SELF_CHECK))
def test_self_check_catches(bug):
    edits, must_fail = SELF_CHECK[bug]
    assert_bug_caught(AID, edits, must_fail, must_fail, visible_only=True)


@pytest.mark.parametrize("answer", ["set([3])", "[3]", "(3,)"])
def test_q3_plain_containers_get_full_marks(answer):
    assert_full_marks(AID, solutions={"capstone-q3": f"answer_gathers_params = {answer}\n"},
                      only=["capstone-q3-test"])


def test_learner_facing_code_never_uses_solutions():
    """The handout has no solutions/: the capstone and 06's measured section load siblings only."""
    import json
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    for aid in (AID, "06_communication_bill"):
        nb = json.loads((root / "notebooks" / aid / f"{aid}.ipynb").read_text())
        code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
        assert "solutions" not in code, aid
        assert 'Path("..") / ' in code, aid               # the sibling notebooks, as the capstone
    assert "solutions" not in (root / "zerocourse" / "train.py").read_text().split('"""', 2)[2]
