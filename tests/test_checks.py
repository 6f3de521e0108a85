"""zerocourse.checks: messages say what was expected, what came, where, and a hint."""
import pytest
import torch

from zerocourse.checks import check_close, check_equal, check_raises, check_true, check_type


def test_messages_name_expected_got_rank_and_hint():
    with pytest.raises(AssertionError) as e:
        check_equal("sum", 5, 6, rank=2, hint="all_reduce")
    assert str(e.value) == "❌ sum (rank 2): expected 6, got 5\n   Hint: all_reduce"


def test_tensor_closeness_reports_the_worst_element():
    exp = torch.zeros(2, 3)
    got = exp.clone()
    got[1, 2] = 0.5
    with pytest.raises(AssertionError, match=r"max \|got - expected\| = 0.5 at index \(1, 2\)"):
        check_close("grad", got, exp, atol=1e-3)
    with pytest.raises(AssertionError, match=r"expected shape \(2, 3\), got \(3, 2\)"):
        check_close("grad", got.t(), exp)
    with pytest.raises(AssertionError, match="expected dtype"):
        check_close("grad", exp.double(), exp)
    check_close("grad", exp + 1e-4, exp, atol=1e-3)
    check_close("n", 1.0 + 1e-9, 1.0, rtol=1e-6)
    with pytest.raises(AssertionError, match="expected a number"):
        check_close("n", None, 1.0)


def test_raises_and_true_and_type():
    check_raises("bad", ValueError, int, "x")
    with pytest.raises(AssertionError, match="nothing was raised"):
        check_raises("bad", ValueError, int, "3")
    with pytest.raises(AssertionError, match="does not mention 'world'"):
        check_raises("bad", ValueError, int, "x", match="world")
    with pytest.raises(AssertionError, match="expected ValueError, got TypeError"):
        check_raises("bad", ValueError, int, None)
    with pytest.raises(AssertionError, match="❌ cond"):
        check_true(False, "cond")
    with pytest.raises(AssertionError, match="expected a int, got str"):
        check_type("n", "3", int)


def test_check_close_calls_tensor_methods_through_the_class():
    """A tensor whose own attributes replace its methods (`t.detach = torch.Tensor`, a wrong
    answer made to compare as nothing) is judged by its values (issue 25, item 3)."""
    wrong = torch.zeros(3)
    wrong.detach = torch.Tensor
    wrong.double = lambda: torch.ones(3, dtype=torch.float64)
    with pytest.raises(AssertionError, match="3 of 3 elements off"):
        check_close("global_mean", wrong, torch.ones(3))
