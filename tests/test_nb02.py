"""02_data_parallelism: the graded cells pass on the solution, fail on the stubs, and catch the bugs.

Bug fixtures run only the graded cells a bug can reach (`only=`), to keep the launches few.
"""
import time

import pytest

from tests.harness import grade_cells, score, assert_bug_caught, assert_full_marks, assert_stubs_fail

AID = "02_data_parallelism"

SHARD = ["dp-shard-batch-check", "dp-shard-batch-hidden"]
BCAST = ["dp-broadcast-check", "dp-broadcast-hidden"]
AVG = ["dp-average-gradients-check", "dp-average-gradients-hidden"]
STEP = ["dp-train-step-check", "dp-train-step-hidden"]
TOTAL = 15


def test_solution_gets_full_marks():
    assert_full_marks(AID, TOTAL, cells=SHARD + BCAST + AVG + STEP)


def test_every_graded_cell_fails_on_the_stubs():
    assert_stubs_fail(AID, cells=SHARD + BCAST + AVG + STEP, total=TOTAL)


AVG_LOOP = "for p in model.parameters():\n        if p.grad is not None:"
BUGS = {
    # bug: (edits, cells to run, cells that must fail, cells that must pass)
    "no division by world size": (
        [("dp-average-gradients", "p.grad /= world_size", "pass")], AVG, AVG, []),
    "divides twice": (
        [("dp-average-gradients", "p.grad /= world_size",
          "p.grad /= world_size\n            p.grad /= world_size")], AVG, AVG, []),
    "all-reduces a clone": (
        [("dp-average-gradients", "dist.all_reduce(p.grad,", "dist.all_reduce(p.grad.clone(),")],
        AVG, AVG, []),
    "reduces only some parameters": (
        [("dp-average-gradients", "for p in model.parameters():",
          "for p in list(model.parameters())[2:]:")], AVG, AVG, []),  # skips the tied weight
    "strided sharding": (
        [("dp-shard-batch", "return batch[rank * shard:(rank + 1) * shard]",
          "return batch[rank::world_size]")],
        SHARD + STEP, SHARD + ["dp-train-step-hidden"], []),
    "no ValueError on an indivisible batch": (
        [("dp-shard-batch", "if size % world_size != 0:", "if False:")],
        SHARD, SHARD, []),
    "broadcast from rank 0 whatever src": (
        [("dp-broadcast-parameters", "src=src)", "src=0)")],
        BCAST, ["dp-broadcast-hidden"], ["dp-broadcast-check"]),
    "broadcast skipping frozen parameters (ranks' frozen weights differ)": (
        [("dp-broadcast-parameters", "            dist.broadcast(p.data, src=src)",
          "            if p.requires_grad:\n                dist.broadcast(p.data, src=src)")],
        BCAST, BCAST, []),
    "no zero_grad (gradients accumulate)": (
        [("dp-train-step", "    optimizer.zero_grad()\n", "")], STEP, STEP, []),
    "no division, seen through dp_train_step": (
        [("dp-average-gradients", "p.grad /= world_size", "pass")], STEP, STEP, []),
    # property 2: the parameters and the local loss are right, but every rank did the whole work
    "backward on the whole global batch on every rank": (
        [("dp-train-step", "    loss.backward()\n", "    loss_fn(model(inputs), targets).backward()\n")],
        STEP, STEP, []),
    # property 5 (and 3): the mean over ranks is not this rank's loss, and it costs a collective
    "returns the global loss (one more all-reduce)": (
        [("dp-train-step", "    return loss.detach()",
          "    out = loss.detach().clone()\n    dist.all_reduce(out, op=dist.ReduceOp.AVG)\n    return out")],
        STEP, STEP, []),
}


@pytest.mark.parametrize("bug", list(BUGS))
def test_bug_is_caught(bug):
    assert_bug_caught(AID, *BUGS[bug])


@pytest.mark.parametrize("where", ["average_gradients", "dp_train_step"])
def test_collective_on_some_ranks_is_a_clear_error_not_a_hang(where):
    if where == "average_gradients":
        edits = [("dp-average-gradients", "if p.grad is not None:",
                  "if p.grad is not None and dist.get_rank() == 0:")]
        only = ["dp-average-gradients-check"]
    else:
        edits = [("dp-train-step", "    average_gradients(model)\n",
                  "    if dist.get_rank() != 0:\n        average_gradients(model)\n")]
        only = ["dp-train-step-check"]
    t0 = time.monotonic()
    results = grade_cells(AID, edits=edits, only=only)
    assert time.monotonic() - t0 < 40
    err = results[only[0]]
    # launch raises a RankError that is also an instance of the rank's exception class, so the
    # cell's error reads "RuntimeError: rank r failed with ..." plus the launcher's diagnosis.
    assert err is not None and "failed with" in err and "only some ranks" in err, err
    assert score(AID, results)[0] == 0


FLAT_AVG = '''
def average_gradients(model):
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
'''
FLAT_BCAST = '''
def broadcast_parameters(model, src=0):
    params = list(model.parameters())
    flat = torch.nn.utils.parameters_to_vector(params).detach().clone()
    dist.broadcast(flat, src)
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(flat, params)
'''
AVG_OP = '''
def average_gradients(model):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
'''
CHUNK_STEP = '''
def dp_train_step(model, optimizer, inputs, targets, loss_fn):
    world_size = dist.get_world_size()
    if len(inputs) % world_size:
        raise ValueError(f"{len(inputs)} not divisible by {world_size}")
    x = inputs.chunk(world_size)[dist.get_rank()]
    y = targets.chunk(world_size)[dist.get_rank()]
    out = loss_fn(model(x), y)
    out.backward()
    average_gradients(model)
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)
    return out.detach().clone()
'''
TENSOR_SPLIT_SHARD = '''
def shard_batch(batch, rank, world_size):
    if batch.size(0) % world_size:
        raise ValueError(f"cannot split {batch.size(0)} examples over {world_size} ranks")
    return torch.tensor_split(batch, world_size)[rank]
'''
VALID = {
    "AVG all-reduce, tensor_split sharding": (
        {"dp-average-gradients": AVG_OP, "dp-shard-batch": TENSOR_SPLIT_SHARD},
        SHARD + AVG),
    "flat all-reduce and flat broadcast": (
        {"dp-average-gradients": FLAT_AVG, "dp-broadcast-parameters": FLAT_BCAST},
        BCAST + AVG + ["dp-train-step-check"]),
    "chunk sharding, zero_grad(set_to_none=False)": (
        {"dp-train-step": CHUNK_STEP}, STEP),
}


@pytest.mark.parametrize("alt", list(VALID))
def test_valid_alternatives_get_full_marks(alt):
    solutions, only = VALID[alt]
    assert_full_marks(AID, solutions=solutions, only=only)


# -- the device rule (issue 29): the proxy catches what NCCL would refuse ---------------------

def test_device_proxy_catches_a_course_cell_that_forgets_the_device():
    """A test helper that builds its model without the rank's device passes on gloo, and fails
    under the device check (ZEROCOURSE_DEVICE_PROXY=1), as it would under NCCL."""
    edits = [("dp-average-gradients-check", "model = ToyModel(unused=True, device=device)",
              "model = ToyModel(unused=True)")]
    only = ["dp-average-gradients-check"]
    err = grade_cells(AID, edits=edits, only=only, device_proxy=True)[only[0]]
    assert err is not None and "meta" in err, err
    assert grade_cells(AID, edits=edits, only=only)[only[0]] is None


DEVICELESS_FLAT_AVG = '''
def average_gradients(model):
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.zeros(sum(g.numel() for g in grads))          # forgot device=: the CPU on a GPU box
    offset = 0
    for g in grads:
        flat[offset:offset + g.numel()].copy_(g.reshape(-1))
        offset += g.numel()
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
'''


def test_device_proxy_names_the_tensor_of_a_learner_solution_that_forgets_the_device():
    """A learner's flat buffer created without device= gets full marks on gloo (learners are not
    graded on their device handling) and, under the device check, an error naming the call, the
    tensor and the fix instead of NCCL's "Tensors must be CUDA and dense"."""
    solutions = {"dp-average-gradients": DEVICELESS_FLAT_AVG}
    err = grade_cells(AID, solutions=solutions, only=AVG[:1], device_proxy=True)[AVG[0]]
    assert err is not None and "all_reduce: argument 0 (float32[1015]) is on meta" in err, err
    assert "device=zerocourse.rank_device()" in err, err
    assert_full_marks(AID, solutions=solutions, only=AVG, cells=AVG)


# -- what the learner sees ---------------------------------------------------------------------

def test_no_body_in_the_stub_and_the_skeleton_is_an_optional_fold():
    from tests.fixtures.make_submission import load, source
    cells = load("notebooks", AID)["cells"]
    stub = next(source(c) for c in cells if c["metadata"].get("nbgrader", {}).get("grade_id") == "dp-shard-batch")
    assert "batch[rank" not in stub and "rank * B" not in stub, stub
    fold = next(source(c) for c in cells if "a skeleton, if you want one" in source(c))
    assert fold.lstrip().startswith("<details>") and fold.rstrip().endswith("</details>")
    # the step's text gives properties, not the recipe: the recipe is only in the fold
    text = "".join(source(c) for c in cells if c["cell_type"] == "markdown" and "<details>" not in source(c))
    assert "then `optimizer.zero_grad()`" not in text


def test_show_fallback_is_one_line_of_information(capsys):
    from zerocourse.widgets import show_fallback
    line = show_fallback("the proof needs your dp_train_step", "its figure is skipped until it runs",
                         NotImplementedError())
    assert line == ("ℹ️ the proof needs your dp_train_step (not written yet): its figure is skipped "
                    "until it runs.")
    assert capsys.readouterr().out == line + "\n"
    boom = RuntimeError("rank 1 failed with ValueError: bad shapes\n--- traceback from rank 1 ---\n...")
    line = show_fallback("the suitcase needs your dp_train_step", "skipped", boom)
    assert "\n" not in line and "RuntimeError: rank 1 failed with ValueError: bad shapes" in line
    assert "traceback" not in line
