"""10_capstone: the auto-graded self-test passes on the solution, fails on the stubs and wrong
answers; a visible check that sees only the format never prints a ✅; the learner copy gives no
formula of Q1 away; the picture's fallback numbers are measured."""
import json
import os
import re

import pytest

from tests.harness import ROOT, assert_bug_caught, assert_full_marks, assert_stubs_fail, grade_cells

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


# Issue 27: "Q2 = 5 and Q3 = {0, 1, 2} got ✅ every autograded point". Their visible checks can
# only see the format: they pass, print the format-only mark, and never a ✅.
FORMAT_ONLY = {
    "capstone-q2-test": ("capstone-q2", "answer_max_psi_billion = 5\n"),
    "capstone-q3-test": ("capstone-q3", "answer_gathers_params = {0, 1, 2}\n"),
}


@pytest.mark.parametrize("cell", list(FORMAT_ONLY))
def test_format_only_checks_print_no_tick(cell, capsys):
    answer_cell, src = FORMAT_ONLY[cell]
    visible = grade_cells(AID, solutions={answer_cell: src}, only=[cell], visible_only=True)
    out = capsys.readouterr().out
    assert visible[cell] is None, visible                     # the format is right
    assert "☑" in out and "format only" in out and "✅" not in out, out
    graded = grade_cells(AID, solutions={answer_cell: src}, only=[cell])
    assert graded[cell] is not None, graded                   # the hidden tests see the answer


def _learner_code_and_text():
    with open(os.path.join(ROOT, "notebooks", AID, f"{AID}.ipynb"), encoding="utf-8") as f:
        return "\n".join("".join(c["source"]) for c in json.load(f)["cells"])


# Q1's formulas as code or text would spell them (G1: paper_bytes was Q1's answer).
Q1_SPELLINGS = [r"paper_bytes", r"12\s*\*\s*psi\s*/\s*n", r"14\s*\*\s*psi\s*/\s*n",
                r"4\s*Ψ\s*\+\s*12\s*Ψ\s*/\s*n", r"2\s*Ψ\s*\+\s*14\s*Ψ\s*/\s*n", r"2\+14/N",
                r"16\s*Ψ\s*/\s*n\b"]


def test_learner_copy_gives_no_q1_formula_away():
    text = _learner_code_and_text()
    assert not [p for p in Q1_SPELLINGS if re.search(p, text)]


@pytest.mark.timeout(300)
def test_course_measured_is_what_the_course_implementations_hold():
    """The picture's fallback (COURSE_MEASURED) is `families` measured on the course's reference
    implementations of every stage (the versions the capstone tries first), rank 0 of 4: one
    launch. Without the device proxy: the stages' reference solutions are 03-07's."""
    from zerocourse import launch
    from zerocourse.loader import load_notebook
    sol = os.path.join(ROOT, "solutions")
    cap = load_notebook(os.path.join(sol, AID, f"{AID}.ipynb"))
    impls = {}
    for stage, versions in cap.STAGE_VERSIONS.items():
        what, notebooks = versions[0]
        names = {}
        for nb_id, wanted in notebooks.items():
            mod = load_notebook(os.path.join(sol, nb_id, f"{nb_id}.ipynb"), names=wanted)
            names.update({n: getattr(mod, n) for n in wanted})
        impls[stage] = cap.Impl(what, names)
    saved = os.environ.get("ZEROCOURSE_DEVICE_PROXY")
    os.environ["ZEROCOURSE_DEVICE_PROXY"] = "0"
    try:
        per_rank = launch(cap._bytes_rank, cap.COURSE_MEASURED["n"], impls, timeout=240)
    finally:
        if saved is None:
            os.environ.pop("ZEROCOURSE_DEVICE_PROXY", None)
        else:
            os.environ["ZEROCOURSE_DEVICE_PROXY"] = saved
    for stage in range(4):
        psi, fam = per_rank[0][stage]
        assert psi == cap.COURSE_MEASURED["psi"]
        assert fam == cap.COURSE_MEASURED[stage], (stage, fam)
    # and the families are the paper's, exactly (Ψ divisible by 4: no padding)
    psi, n = cap.COURSE_MEASURED["psi"], 4
    paper = {0: (2, 2, 12), 1: (2, 2, 12 / n), 2: (2, 2 / n, 12 / n), 3: (2 / n, 2 / n, 12 / n)}
    for stage, per_param in paper.items():
        got = tuple(cap.COURSE_MEASURED[stage][f] / psi for f in ("params", "grads", "optimizer"))
        assert got == per_param, (stage, got)
