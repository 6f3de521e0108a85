"""07_overlap: the graded cells pass on the solution, fail on the stubs, and catch the bug classes.

Three graded parts, each a self-check cell and a hidden-test cell: A allreduce_time (the α–β
time of a ring all-reduce, derived from the ring's steps; no launch), B OverlappedDP (buckets
all-reduced asynchronously during backward; graded through p.grad, CommTracer and test-side hooks
only), C ZeRO3PrefetchModule (the schedule of a prefetching ZeRO-3; graded through
gather_full_grads(), gather_full_params(), zero_grad(), GatherTracker, PeakTracker, CommTracer and
test-side hooks only). Each bug fixture injects one bug into the reference solution and runs only
the graded cells it must break (`only=`); valid variants keep full marks on the cells they touch.
Own designs unlike the reference live in tests/fixtures/alternatives/07_overlap/ (tests/
test_alternatives.py grades them on every cell).
"""
import json

import pytest

import tests.harness as harness
from tests.harness import assert_bug_caught, assert_full_marks, assert_stubs_fail, grade_cells

AID = "07_overlap"
COST, DP, PF = "overlap-cost", "overlap-dp", "overlap-prefetch"
A_CHECK, A_HIDDEN = "overlap-cost-check", "overlap-cost-hidden"
B_CHECK, B_HIDDEN = "overlap-dp-check", "overlap-dp-hidden"
C_CHECK, C_HIDDEN = "overlap-prefetch-check", "overlap-prefetch-hidden"
ALL = [A_CHECK, A_HIDDEN, B_CHECK, B_HIDDEN, C_CHECK, C_HIDDEN]
TOTAL = 18


def test_solution_gets_full_marks():
    """The reference, every graded cell, under the device proxy (tensors without a device: meta)."""
    assert_full_marks(AID, TOTAL, cells=ALL)


def test_every_graded_cell_fails_on_the_stubs():
    assert_stubs_fail(AID, cells=ALL, total=TOTAL)


STEPS = "steps = 2 * (world_size - 1)"
CLOSE_BEFORE = ("            if bucket and (size + nbytes > bucket_bytes or p.dtype != bucket[0].dtype):\n"
                "                buckets.append(bucket)                       # close it before it overflows\n"
                "                bucket, size = [], 0\n"
                "            bucket.append(p)\n"
                "            size += nbytes\n")
TRAINABLE = "params = [p for p in module.parameters() if p.requires_grad][::-1]"
ASYNC = "work = dist.all_reduce(flat, async_op=True)"
CAT = "flat = torch.cat([g.reshape(-1) for g in grads])"
WRITE_BACK = ("                    if p.grad is not None:                   # no gradient: p.grad stays None\n"
              "                        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))\n")
AHEAD = "range(i, i + step * (prefetch + 1), step)"

BUGS = {
    # bug: (edits, cells run, cells that must fail)
    "A: one message step too many (2N−1 instead of 2(N−1))": (
        [(COST, STEPS, "steps = 2 * world_size - 1")], [A_CHECK], [A_CHECK]),
    "A: only the reduce-scatter phase counted (N−1 steps)": (
        [(COST, STEPS, "steps = world_size - 1")], [A_CHECK], [A_CHECK]),
    "A: bandwidth term without the 1/N (2(N−1)·S·β)": (
        [(COST, "steps / world_size * nbytes * beta", "steps * nbytes * beta")], [A_CHECK], [A_CHECK]),
    "B: the last bucket is never flushed (its gradients stay local)": (
        [(DP, "        if bucket:\n            buckets.append(bucket)\n", "")], [B_CHECK], [B_CHECK]),
    "B: wait() missing: the buffer is read before the all-reduce completed": (
        [(DP, "                work.wait()\n", "")], [B_CHECK], [B_CHECK]),
    "B: gradients averaged twice (ReduceOp.AVG, then / N)": (
        [(DP, ASYNC, "work = dist.all_reduce(flat, op=dist.ReduceOp.AVG, async_op=True)")], [B_CHECK], [B_CHECK]),
    "B: one all-reduce per parameter (no buckets)": (
        [(DP, "if bucket and (size + nbytes > bucket_bytes or p.dtype != bucket[0].dtype):", "if bucket:")],
        [B_CHECK], [B_CHECK]),
    "B: all-reduces only after backward (hooks do nothing: no overlap)": (
        [(DP, "            ready[bucket_of[p]] += 1\n", "            return\n")], [B_CHECK], [B_CHECK]),
    "B: blocking all-reduce inside the hook (no async_op)": (
        [(DP, ASYNC, ASYNC + "\n            work.wait()")], [B_CHECK], [B_CHECK]),
    "B: bucket order differs across ranks (sizes mismatch in the all-reduces)": (
        [(DP, TRAINABLE, TRAINABLE + "\n        if dist.get_rank() % 2:\n            params = params[::-1]")],
        [B_CHECK], [B_CHECK]),
    "B: buckets over bucket_bytes (a bucket closes once it reaches the cap)": (
        [(DP, CLOSE_BEFORE, "            bucket.append(p)\n            size += nbytes\n"
                            "            if size >= bucket_bytes:\n"
                            "                buckets.append(bucket)\n                bucket, size = [], 0\n")],
        [B_CHECK], [B_CHECK]),
    "B: a parameter larger than bucket_bytes joins the open bucket": (
        [(DP, "if bucket and (size + nbytes > bucket_bytes or p.dtype != bucket[0].dtype):",
          "if bucket and nbytes <= bucket_bytes and size + nbytes > bucket_bytes:")], [B_CHECK], [B_CHECK]),
    "B: bf16 gradients all-reduced in fp32, buckets sized in bf16 bytes (twice bucket_bytes on the wire)": (
        [(DP, CAT, "flat = torch.cat([g.reshape(-1).float() for g in grads])")], [B_HIDDEN], [B_HIDDEN]),
    "B: a never-used parameter's None gradient becomes zeros": (
        [(DP, WRITE_BACK, "                    p.grad = flat[offset:offset + p.numel()].view_as(p).clone()\n")],
        [B_HIDDEN], [B_HIDDEN]),
    "B: frozen parameters bucketed (zeros all-reduced for them)": (
        [(DP, TRAINABLE, "params = list(module.parameters())[::-1]"),
         (DP, "        for p in params:\n            p.register_post_accumulate_grad_hook(grad_ready)\n",
          "        for p in params:\n            if p.requires_grad:\n"
          "                p.register_post_accumulate_grad_hook(grad_ready)\n")], [B_HIDDEN], [B_HIDDEN]),
    "B: frozen parameters bucketed and hooked (crashes on requires_grad=False)": (
        [(DP, TRAINABLE, "params = list(module.parameters())[::-1]")], [B_HIDDEN], [B_HIDDEN]),
    "C: backward prefetches in forward order (the wrong unit)": (
        [(PF, AHEAD, "range(i, i + prefetch + 1)")], [C_CHECK], [C_CHECK]),
    "C: the previous unit is never freed (prefetched units pile up)": (
        [(PF, "                uses[prev].free()\n", "                pass\n")], [C_CHECK], [C_CHECK]),
    "C: no prefetch (each unit gathered just in time)": (
        [(PF, "                unit.start_gather()                             # prefetch: returns at once\n",
          "                pass\n")], [C_CHECK], [C_CHECK]),
    "C: units still gathered after backward (no final free)": (
        [(PF, "                unit.free()\n            ready.clear()", "            ready.clear()")],
        [C_CHECK], [C_CHECK]),
    "C: a unit reduce-scattered at its first gradient (the others come later)": (
        [(PF, "if ready[unit] == unit.n_trainable:", "if ready[unit] == 1:")], [C_CHECK], [C_CHECK]),
    "C: zero_grad() forgets nothing (step 1 adds step 0's gradients)": (
        [(PF, "            unit.grad_shard = None\n", "            pass\n")], [C_CHECK], [C_CHECK]),
    "C: gather_full_params() leaves the units gathered": (
        [(PF, "            out.update({p: p.detach().clone() for p in unit.params})\n            unit.free()\n",
          "            out.update({p: p.detach().clone() for p in unit.params})\n")], [C_CHECK], [C_CHECK]),
    "C: gather_full_grads() gives frozen parameters a zero gradient": (
        [(PF, "return {name: out[p] for name, p in self.module.named_parameters() if p.requires_grad}",
          "return {name: out[p] if p.requires_grad else torch.zeros(p.shape, dtype=p.dtype, device=p.device)\n"
          "                for name, p in self.module.named_parameters()}")], [C_HIDDEN], [C_HIDDEN]),
}


@pytest.mark.parametrize("name", list(BUGS))
def test_bug_is_caught(name):
    edits, only, must_fail = BUGS[name]
    assert_bug_caught(AID, edits, only=only, must_fail=must_fail)


VALID = {
    "B: ReduceOp.AVG, no division": (
        [(DP, ASYNC, "work = dist.all_reduce(flat, op=dist.ReduceOp.AVG, async_op=True)"),
         (DP, "                flat /= world_size\n", "")], [B_HIDDEN]),
    "B: fp32 buckets for bf16 gradients, sized in fp32 bytes": (
        [(DP, "nbytes = p.numel() * p.element_size()", "nbytes = p.numel() * 4"),
         (DP, CAT, "flat = torch.cat([g.reshape(-1).float() for g in grads])")], [B_HIDDEN]),
    "C: the root stays gathered from the end of forward into backward (FSDP2's root)": (
        [(PF, "            uses[-1].free()\n", "")], [C_CHECK]),
}


@pytest.mark.parametrize("name", list(VALID))
def test_valid_variant_gets_full_marks(name):
    edits, only = VALID[name]
    assert_full_marks(AID, edits=edits, only=only, cells=only)


def test_device_proxy_catches_a_learner_buffer_without_device():
    """A learner-style device bug (bucket buffers preallocated in __init__ without device=) is
    silent on gloo/CPU but fails under the proxy, as it would under NCCL."""
    bug = [(DP, "bucket_of = {p: i for i, b in enumerate(buckets) for p in b}\n",
            "bucket_of = {p: i for i, b in enumerate(buckets) for p in b}\n"
            "        flats = [torch.zeros(sum(p.numel() for p in b), dtype=b[0].dtype) for b in buckets]\n"),
           (DP, CAT, "flat = flats[len(started)]\n"
                     "            torch.cat([g.reshape(-1) for g in grads], out=flat)")]
    results = grade_cells(AID, edits=bug, only=[B_CHECK], device_proxy=True)
    assert results[B_CHECK] is not None and "meta" in results[B_CHECK], results


def test_device_proxy_catches_a_course_cell_without_device(monkeypatch):
    """The same for the course's own given Unit: its gather buffer allocated without a device."""
    real_load = harness.load

    def load(kind, aid):
        nb = real_load(kind, aid)
        if aid == AID:
            nb = json.loads(json.dumps(nb))
            for cell in nb["cells"]:
                src = "".join(cell["source"])
                if src.startswith("class Unit:"):
                    old = "self.shard.new_empty(self.world_size * self.shard.numel())"
                    assert old in src
                    cell["source"] = src.replace(
                        old, "torch.empty(self.world_size * self.shard.numel(), dtype=self.shard.dtype)")
        return nb

    monkeypatch.setattr(harness, "load", load)
    results = grade_cells(AID, only=[C_CHECK], device_proxy=True)
    assert results[C_CHECK] is not None and "is on meta" in results[C_CHECK], results
