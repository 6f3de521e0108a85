"""08_accumulation_and_activations: the graded cells pass on the solution (under the device
proxy), fail on the stubs, catch the bugs (the checkpointing ones in the visible self-check
alone: no ✅ for a bug the text forbids), give full marks to valid alternatives, and the learner
copy does not spell out the derived formulas.

Bug fixtures run only the graded cells a bug can reach (`only=`), to keep the launches few: the
accumulation and checkpointing bugs run their self-check (one launch each), the others need no
launch at all.
"""
import json
import os
import re

import pytest

from tests.harness import (ROOT, assert_bug_caught, assert_full_marks, assert_stubs_fail, grade_cells,
                           score)

AID = "08_accumulation_and_activations"

STEP = ["acc-step-check", "acc-step-hidden"]
BYTES = ["acc-bytes-check", "acc-bytes-hidden"]
ACT = ["act-bytes-check", "act-bytes-hidden"]
CKPT = ["ckpt-check", "ckpt-hidden"]
TOTAL = 17

FINAL_REDUCE = """    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= world_size
"""


def test_solution_gets_full_marks():
    assert_full_marks(AID, TOTAL, cells=STEP + BYTES + ACT + CKPT)


def test_every_graded_cell_fails_on_the_stubs():
    assert_stubs_fail(AID, cells=STEP + BYTES + ACT + CKPT, total=TOTAL)


SELF_STEP = ["acc-step-check"]
SELF_CKPT = ["ckpt-check"]
BUGS = {
    # bug: (edits, cells to run, cells that must fail, cells that must pass)
    "all-reduces after every micro-batch (no no_sync; right numbers, k times the traffic)": (
        [("acc-step", "        total = total + loss.detach()\n",
          "        total = total + loss.detach()\n    " + FINAL_REDUCE.replace("\n    ", "\n        ")),
         ("acc-step", "    # Once per step, after the last backward (the no_sync idea): sum over ranks, "
                      "divide by N.\n" + FINAL_REDUCE, "")],
        SELF_STEP, SELF_STEP, []),
    "gradients summed over micro-batches, not averaged": (
        [("acc-step", "(loss / k).backward()", "loss.backward()")], SELF_STEP, SELF_STEP, []),
    "averaged over ranks twice (ReduceOp.AVG, then / N)": (
        [("acc-step", "dist.all_reduce(p.grad)", "dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)")],
        SELF_STEP, SELF_STEP, []),
    "not averaged over ranks (sum)": (
        [("acc-step", "            p.grad /= world_size\n", "")], SELF_STEP, SELF_STEP, []),
    "zero_grad between micro-batches (keeps only the last)": (
        [("acc-step", "        (loss / k).backward()", "        optimizer.zero_grad()\n        (loss / k).backward()")],
        SELF_STEP, SELF_STEP, []),
    "returns the last micro-batch's loss": (
        [("acc-step", "return total / k", "return loss.detach()")], SELF_STEP, SELF_STEP, []),
    "ZeRO-2 bytes without the per-micro-batch reduce-scatter (k ignored)": (
        [("acc-bytes", "2: (k + 1) * ring", "2: 2 * ring")], BYTES, BYTES, []),
    "ZeRO-3 bytes once per step": (
        [("acc-bytes", "3: 3 * k * ring", "3: 3 * ring")], BYTES, BYTES, []),
    "no ValueError for micro_batches < 1": (
        [("acc-bytes", "if micro_batches < 1:", "if False:")], BYTES, ["acc-bytes-hidden"],
        ["acc-bytes-check"]),
    "activation formula missing the attention term (logsumexp)": (
        [("act-bytes", "    per_token += 4 * n_head", "    pass")], ACT, ACT, []),
    "activation formula with the T×T attention matrix (math attention, not flash)": (
        [("act-bytes", "per_token += 4 * n_head", "per_token += 4 * n_head + n_head * seq_len * b")],
        ACT, ACT, []),
    "logsumexp counted in the block's dtype": (
        [("act-bytes", "per_token += 4 * n_head", "per_token += b * n_head")], ACT, ACT, []),
    "attention output counted twice (17 C instead of 16 C)": (
        [("act-bytes", "16 * n_embd * b", "17 * n_embd * b")], ACT, ACT, []),
    "LayerNorm statistics forgotten": (
        [("act-bytes", "    per_token += 2 * 2 * b", "    pass")], ACT, ACT, []),
    "checkpointing that keeps activations (the un-checkpointed call's output is used)": (
        [("ckpt-blocks", "            return checkpoint(inner, x, use_reentrant=False)",
          "            checkpoint(inner, x, use_reentrant=False)\n            return inner(x)")],
        SELF_CKPT, SELF_CKPT, []),
    "checkpoints only the attention (the MLP keeps its activations)": (
        [("ckpt-blocks", "    for block in model.h:\n        inner = block.forward",
          "    for block in [b.attn for b in model.h]:\n        inner = block.forward")],
        SELF_CKPT, SELF_CKPT, []),
    "late-binding closure (every block runs the last block's forward)": (
        [("ckpt-blocks", "def forward(x, inner=inner):", "def forward(x):")], SELF_CKPT, SELF_CKPT, []),
    "use_reentrant=True (the text forbids it: a frozen embedding loses the blocks' gradients)": (
        [("ckpt-blocks", "inner, x, use_reentrant=False)", "inner, x, use_reentrant=True)")],
        SELF_CKPT, SELF_CKPT, []),
}


@pytest.mark.parametrize("bug", list(BUGS))
def test_bug_is_caught(bug):
    edits, only, must_fail, must_pass = BUGS[bug]
    # A checkpointing bug must already fail the visible self-check (it has no hidden part).
    assert_bug_caught(AID, edits, only, must_fail, must_pass, visible_only=only == SELF_CKPT)


CLASS_PATCH_CKPT = '''
def checkpoint_blocks(model):
    """Patches the Block CLASS: every TinyGPT in the process is checkpointed, not only `model`."""
    if not getattr(Block, "_checkpointed", False):
        plain_forward = Block.forward

        def forward(self, x):
            return checkpoint(plain_forward, self, x, use_reentrant=False)
        Block.forward = forward
        Block._checkpointed = True
    return model
'''

WRAPPER_CKPT = '''
class CheckpointedBlock(nn.Module):
    def __init__(self, block):
        super().__init__()
        self.block = block                  # its parameters become h.<i>.block.<name>

    def forward(self, x):
        return checkpoint(self.block, x, use_reentrant=False)


def checkpoint_blocks(model):
    for i in range(len(model.h)):
        model.h[i] = CheckpointedBlock(model.h[i])
    return model
'''

# Whole answers the text forbids (COURSE_DESIGN §2: only the model passed in; the same
# parameters under the same state_dict keys): the self-check alone must fail them.
FORBIDDEN = {
    "patches the Block class (every TinyGPT in the process checkpointed)": CLASS_PATCH_CKPT,
    "a wrapper module that renames the parameters (h.0.block.ln_1.weight)": WRAPPER_CKPT,
}


@pytest.mark.parametrize("bug", list(FORBIDDEN))
def test_forbidden_checkpointing_fails_the_self_check(bug):
    results = grade_cells(AID, solutions={"ckpt-blocks": FORBIDDEN[bug]}, only=SELF_CKPT,
                          visible_only=True)
    assert results["ckpt-check"] is not None, results
    earned, total = score(AID, results)
    assert earned < total


def _learner_text(aid):
    with open(os.path.join(ROOT, "notebooks", aid, f"{aid}.ipynb"), encoding="utf-8") as f:
        return "\n".join("".join(c["source"]) for c in json.load(f)["cells"])


# The derived answers, as the text or a comment would spell them (issue 27: derive, don't
# transcribe): the bill's per-stage multipliers and the block's per-token count.
ANSWER_SPELLINGS = [r"\(k\s*\+\s*1\)\s*[·*]?\s*R", r"\b3\s*[·*]?\s*k\s*[·*]?\s*R\b", r"\b2R\b",
                    r"16\s*[·*]\s*(C|n_embd)\s*[·*]\s*b", r"4\s*[·*]?\s*b\s*\+\s*4\s*[·*]?\s*a",
                    r"32 instead of 34", r"\(k\s*\+\s*1\)\s*/\s*2", r"3k\s*/\s*2"]


def test_learner_copy_does_not_spell_out_the_derived_formulas():
    text = _learner_text(AID)
    found = [p for p in ANSWER_SPELLINGS if re.search(p, text)]
    assert not found, found


HOOKED_STEP = '''
def dp_accumulate_step(model, optimizer, micro_batches, loss_fn):
    """A no_sync-like flag: a post-accumulate-grad hook all-reduces during the LAST backward."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    k = len(micro_batches)
    sync = {"on": False}

    def hook(p):
        if sync["on"]:
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)

    handles = [p.register_post_accumulate_grad_hook(hook) for p in model.parameters()
               if p.requires_grad]
    losses = []
    try:
        for i, (inputs, targets) in enumerate(micro_batches):
            sync["on"] = i == k - 1
            x, y = inputs.chunk(world_size)[rank], targets.chunk(world_size)[rank]
            loss = loss_fn(model(x), y)
            (loss / k).backward()
            losses.append(loss.detach())
    finally:
        for h in handles:
            h.remove()
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)
    return torch.stack(losses).mean()
'''

FLAT_STEP = '''
def dp_accumulate_step(model, optimizer, micro_batches, loss_fn):
    """Unscaled losses, then one flat all-reduce with ReduceOp.AVG and a division by k."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    losses = []
    for inputs, targets in micro_batches:
        b = inputs.size(0) // world_size
        loss = loss_fn(model(inputs[rank * b:(rank + 1) * b]), targets[rank * b:(rank + 1) * b])
        loss.backward()
        losses.append(loss.item())
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.AVG)
    flat /= len(micro_batches)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
    optimizer.step()
    optimizer.zero_grad()
    return torch.tensor(sum(losses) / len(losses))
'''

FRACTION_BYTES = '''
def accumulation_comm_bytes(stage, num_params, world_size, micro_batches, bytes_per_element=2):
    if stage not in range(4) or world_size < 1 or micro_batches < 1:
        raise ValueError("bad arguments")
    collectives = {0: 2, 1: 2, 2: micro_batches + 1, 3: 3 * micro_batches}[stage]
    return collectives * Fraction(num_params * (world_size - 1), world_size) * bytes_per_element
'''

LISTED_ACT = '''
def activation_bytes(batch, seq_len, n_embd, n_head, bytes_per_element=2):
    B, T, C, a, b = batch, seq_len, n_embd, n_head, bytes_per_element
    saved = [B * T * C * b,              # ln_1 input
             2 * B * T * b,              # ln_1 mean, rstd
             B * T * C * b,              # c_attn input
             3 * B * T * C * b,          # qkv
             B * a * T * 4,              # logsumexp, fp32
             B * T * C * b,              # attention output (= c_proj input)
             B * T * C * b,              # ln_2 input
             2 * B * T * b,              # ln_2 mean, rstd
             B * T * C * b,              # c_fc input
             4 * B * T * C * b,          # gelu input
             4 * B * T * C * b]          # c_proj input
    return sum(saved)
'''


VALID = {
    "no_sync-like flag with post-accumulate-grad hooks, ReduceOp.AVG, chunk": (
        {"acc-step": HOOKED_STEP}, STEP),
    "one flat all-reduce with ReduceOp.AVG, grads divided by k after; Fraction bytes": (
        {"acc-step": FLAT_STEP, "acc-bytes": FRACTION_BYTES}, ["acc-step-check"] + BYTES),
    "activation bytes as a list of tensors": ({"act-bytes": LISTED_ACT}, ACT),
}


@pytest.mark.parametrize("alt", list(VALID))
def test_valid_alternatives_get_full_marks(alt):
    solutions, only = VALID[alt]
    assert_full_marks(AID, solutions=solutions, only=only)
