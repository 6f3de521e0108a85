"""07_overlap: the graded cells pass on the solution, fail on the stubs, and catch the bug classes.

Three graded parts, each a self-check cell and a hidden-test cell: A allreduce_time (the α–β
formula, no launch), B OverlappedDP (buckets all-reduced asynchronously from post-accumulate-grad
hooks), C ZeRO3PrefetchModule (the schedule over the notebook's GIVEN Unit). Each bug fixture
injects one bug into the reference solution and runs only the graded cells it must break
(`only=`); valid variants must keep full marks on the cells they touch.
"""
import pytest

from tests.harness import assert_bug_caught, assert_full_marks, assert_stubs_fail

AID = "07_overlap"
COST, DP, PF = "overlap-cost", "overlap-dp", "overlap-prefetch"
A_CHECK, A_HIDDEN = "overlap-cost-check", "overlap-cost-hidden"
B_CHECK, B_HIDDEN = "overlap-dp-check", "overlap-dp-hidden"
C_CHECK, C_HIDDEN = "overlap-prefetch-check", "overlap-prefetch-hidden"
ALL = [A_CHECK, A_HIDDEN, B_CHECK, B_HIDDEN, C_CHECK, C_HIDDEN]
TOTAL = 18


def test_solution_gets_full_marks():
    assert_full_marks(AID, TOTAL, cells=ALL)


def test_every_graded_cell_fails_on_the_stubs():
    assert_stubs_fail(AID, cells=ALL, total=TOTAL)


CLOSE_BEFORE = ("            if bucket and (size + nbytes > bucket_bytes or p.dtype != bucket[0].dtype):\n"
                "                self.buckets.append(bucket)                # close it before it overflows\n"
                "                bucket, size = [], 0\n"
                "            bucket.append(p)\n"
                "            size += nbytes\n")
ASYNC = "work = dist.all_reduce(flat, async_op=True)"
AHEAD = "range(i, i + step * (self.prefetch + 1), step)"

BUGS = {
    # bug: (edits, cells run, cells that must fail)
    "A: one message step too many (2N−1 instead of 2(N−1))": (
        [(COST, "steps = 2 * (world_size - 1)", "steps = 2 * world_size - 1")], [A_CHECK], [A_CHECK]),
    "A: bandwidth term without the 1/N (2(N−1)·S·β)": (
        [(COST, "steps / world_size * nbytes * beta", "steps * nbytes * beta")], [A_CHECK], [A_CHECK]),
    "B: the last bucket is never flushed (its gradients stay local)": (
        [(DP, "        if bucket:\n            self.buckets.append(bucket)\n", "")], [B_CHECK], [B_CHECK]),
    "B: wait() missing: the buffer is read before the all-reduce completed": (
        [(DP, "            work.wait()\n", "")], [B_CHECK], [B_CHECK]),
    "B: gradients averaged twice (ReduceOp.AVG, then / N)": (
        [(DP, ASYNC, "work = dist.all_reduce(flat, op=dist.ReduceOp.AVG, async_op=True)")], [B_CHECK], [B_CHECK]),
    "B: one all-reduce per parameter (no buckets)": (
        [(DP, "if bucket and (size + nbytes > bucket_bytes or p.dtype != bucket[0].dtype):", "if bucket:")],
        [B_CHECK], [B_CHECK]),
    "B: all-reduces only after backward (hooks do nothing: no overlap)": (
        [(DP, "        self._ready[self.bucket_of[p]] += 1\n", "        return\n")], [B_CHECK], [B_CHECK]),
    "B: blocking all-reduce inside the hook (no async_op)": (
        [(DP, ASYNC, "work = dist.all_reduce(flat, async_op=True)\n        work.wait()")], [B_CHECK], [B_CHECK]),
    "B: bucket order differs across ranks (sizes mismatch in the all-reduces)": (
        [(DP, "params = [p for p in module.parameters() if p.requires_grad][::-1]",
          "params = [p for p in module.parameters() if p.requires_grad][::-1]\n"
          "        if dist.get_rank() % 2:\n            params = params[::-1]")], [B_CHECK], [B_CHECK]),
    "B: frozen parameters bucketed and hooked (crashes on requires_grad=False)": (
        [(DP, "params = [p for p in module.parameters() if p.requires_grad][::-1]",
          "params = list(module.parameters())[::-1]")], [B_HIDDEN], [B_HIDDEN]),
    "C: backward prefetches in forward order (the wrong unit)": (
        [(PF, AHEAD, "range(i, i + self.prefetch + 1)")], [C_CHECK], [C_CHECK]),
    "C: the previous unit is never freed (prefetched units pile up)": (
        [(PF, "            self.uses[prev].free()\n", "            pass\n")], [C_CHECK], [C_CHECK]),
    "C: no prefetch (each unit gathered just in time)": (
        [(PF, "            unit.start_gather()                                   # prefetch: returns at once\n",
          "            pass\n")], [C_CHECK], [C_CHECK]),
    "C: units still gathered after backward (no final free)": (
        [(PF, "                unit.reduce_scatter_grads()           # some parameter got no gradient\n            unit.free()\n",
          "                unit.reduce_scatter_grads()           # some parameter got no gradient\n")],
        [C_CHECK], [C_CHECK]),
    "C: a unit reduce-scattered at its first gradient (the others come later)": (
        [(PF, "if self._ready[unit] == unit.n_trainable:", "if self._ready[unit] == 1:")], [C_CHECK], [C_CHECK]),
}


@pytest.mark.parametrize("name", list(BUGS))
def test_bug_is_caught(name):
    edits, only, must_fail = BUGS[name]
    assert_bug_caught(AID, edits, only=only, must_fail=must_fail)


VALID = {
    "B: ReduceOp.AVG, no division": (
        [(DP, ASYNC, "work = dist.all_reduce(flat, op=dist.ReduceOp.AVG, async_op=True)"),
         (DP, "            flat /= self.world_size\n", "")], [B_CHECK, B_HIDDEN]),
    "B: a bucket closes once it reaches the cap (may exceed it by one parameter)": (
        [(DP, CLOSE_BEFORE, "            bucket.append(p)\n            size += nbytes\n"
                            "            if size >= bucket_bytes:\n"
                            "                self.buckets.append(bucket)\n                bucket, size = [], 0\n")],
        [B_CHECK, B_HIDDEN]),
    "B: fp32 buckets for bf16 gradients": (
        [(DP, "flat = torch.cat([g.reshape(-1) for g in grads])",
          "flat = torch.cat([g.reshape(-1).float() for g in grads])")], [B_HIDDEN]),
    "C: the root stays gathered from the end of forward into backward (FSDP2's root)": (
        [(PF, "        self.uses[-1].free()\n", "")], [C_CHECK]),
}


@pytest.mark.parametrize("name", list(VALID))
def test_valid_variant_gets_full_marks(name):
    edits, only = VALID[name]
    assert_full_marks(AID, edits=edits, only=only, cells=only)
