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


SUM_CELLS = ["setup-sum-of-ranks-check", "setup-sum-of-ranks-hidden"]
MEAN_CELLS = ["setup-global-mean-check", "setup-global-mean-hidden"]


def _cells_of(edits):
    """The graded cells of the exercises a fixture edits (only those run: fewer launches)."""
    return sorted({c for gid, _, _ in edits for c in (SUM_CELLS if "sum" in gid else MEAN_CELLS)})


@pytest.mark.parametrize("bug", list(BUGS))
def test_bug_is_caught(bug):
    edits, must_fail = BUGS[bug]
    assert_bug_caught(AID, edits, _cells_of(edits), must_fail)


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
    assert_full_marks(AID, edits=VALID[alt], only=_cells_of(VALID[alt]), cells=_cells_of(VALID[alt]))


DEVICELESS_SUM = """
def sum_of_ranks(rank, world_size):
    t = torch.tensor([rank + 1.0])         # a learner who forgets the device: fine on gloo
    dist.all_reduce(t)
    return t.item()
"""


def test_device_proxy_names_a_learner_tensor_without_device():
    """The device check (ZEROCOURSE_DEVICE_PROXY=1) turns a forgotten device into a clear error
    naming the call and the tensor, as NCCL would refuse it; without the check (how learners are
    graded on gloo) the same code gets full marks."""
    only = ["setup-sum-of-ranks-check"]
    err = grade_cells(AID, solutions={"setup-sum-of-ranks": DEVICELESS_SUM}, only=only,
                      device_proxy=True)[only[0]]
    assert err is not None and "all_reduce: argument 0 (float32[1]) is on meta" in err, err
    assert "device=zerocourse.rank_device()" in err, err
    assert_full_marks(AID, solutions={"setup-sum-of-ranks": DEVICELESS_SUM}, only=only, cells=only)


def test_env_check_names_the_backend_launch_picks(monkeypatch):
    import importlib
    import torch
    from zerocourse.env import backend_choice
    backend, why = backend_choice(2)
    assert backend == "gloo" and "no GPU" in why, why
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    backend, why = backend_choice(2)
    assert backend == "gloo" and "make test-gpu" in why and "backend='nccl'" in why, why
    backend, why = backend_choice(4)
    assert backend == "gloo" and "one GPU per rank" in why, why
    monkeypatch.setattr(importlib.import_module("zerocourse.launch"), "NCCL_VERIFIED", True)
    backend, why = backend_choice(2)
    assert backend == "nccl" and "cuda:r" in why, why


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


def test_the_environment_check_launches_nothing_under_grading(monkeypatch, capsys):
    """Under grading the learner's kernel launches nothing: the check says so instead of
    starting a fork server for nothing (8-9 s of every 00 submission)."""
    import importlib
    from zerocourse.env import check_environment
    launcher = importlib.import_module("zerocourse.launch")     # the module, not the function

    def no_launch(*args, **kwargs):
        raise AssertionError("check_environment launched ranks under grading")
    monkeypatch.setattr(launcher, "launch", no_launch)
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    results = check_environment()
    assert results["launch"] is None
    assert "not checked under grading" in capsys.readouterr().out
