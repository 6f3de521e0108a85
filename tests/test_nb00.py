"""00_setup: the graded cells pass on the solution, fail on the stubs, and catch the bugs."""
import pytest

from tests.harness import grade_cells, assert_bug_caught, assert_full_marks, assert_stubs_fail

AID = "00_setup"


def test_solution_gets_full_marks():
    assert_full_marks(AID, 7)


def test_every_graded_cell_fails_on_the_stubs():
    assert_stubs_fail(AID)


BUGS = {
    "no collective": ([("setup-sum-of-ranks", "dist.all_reduce(t)\n", "")],
                      ["setup-sum-of-ranks-check", "setup-sum-of-ranks-hidden"]),
    "two all_reduces (right answer, wrong structure)": (
        [("setup-sum-of-ranks", "dist.all_reduce(t)\n",
          "dist.all_reduce(t)\n    t /= world_size\n    dist.all_reduce(t)\n")],
        ["setup-sum-of-ranks-hidden"]),
    "returns the tensor, not a number": ([("setup-sum-of-ranks", "return int(t.item())", "return t")],
                                         ["setup-sum-of-ranks-check", "setup-sum-of-ranks-hidden"]),
    "sum instead of mean": ([("setup-global-mean", "return out / dist.get_world_size()", "return out")],
                            ["setup-global-mean-check", "setup-global-mean-hidden"]),
    "reduces the input in place": (
        [("setup-global-mean", "out = local.clone(memory_format=torch.contiguous_format)", "out = local")],
        ["setup-global-mean-check", "setup-global-mean-hidden"]),
    "collective on rank 0 only": (
        [("setup-global-mean", "dist.all_reduce(out)",
          "if dist.get_rank() == 0:\n        dist.all_reduce(out)")],
        ["setup-global-mean-check", "setup-global-mean-hidden"]),
}


@pytest.mark.parametrize("bug", list(BUGS))
def test_bug_is_caught(bug):
    edits, must_fail = BUGS[bug]
    assert_bug_caught(AID, edits, None, must_fail)


VALID = {
    "AVG all-reduce": [("setup-global-mean", "dist.all_reduce(out)\n    return out / dist.get_world_size()",
                        "dist.all_reduce(out, op=dist.ReduceOp.AVG)\n    return out")],
    "float result, contiguous() then clone": [
        ("setup-sum-of-ranks", "return int(t.item())", "return t.item()"),
        ("setup-global-mean", "local.clone(memory_format=torch.contiguous_format)",
         "local.contiguous().clone()")],
}


@pytest.mark.parametrize("alt", list(VALID))
def test_valid_alternatives_get_full_marks(alt):
    results = grade_cells(AID, edits=VALID[alt])
    assert all(err is None for err in results.values()), results


def test_self_check_catches_a_tensor_result():
    """The visible check alone (hidden tests removed) rejects a tensor, as the hidden tests do."""
    assert_bug_caught(AID, [("setup-sum-of-ranks", "return int(t.item())", "return t")],
                      ["setup-sum-of-ranks-check"], ["setup-sum-of-ranks-check"], visible_only=True)


def test_plain_keeps_plain_data_and_describes_the_rest():
    """checks.plain: what test helpers return from ranks must decode with weights_only=True."""
    import numpy as np
    import torch
    from zerocourse.checks import plain
    assert plain(3) == 3 and plain(None) is None and plain("x") == "x"
    assert plain(np.float32(3.0)) == 3.0 and type(plain(np.float32(3.0))) is float   # as the grader
    assert plain(np.array([1.0])).startswith("<ndarray")
    got = plain({"a": [torch.ones(2, requires_grad=True), np.int64(2)]})
    assert not got["a"][0].requires_grad and got["a"][1].startswith("<int64")
