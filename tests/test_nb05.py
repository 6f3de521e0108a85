"""05_zero3: the graded cells pass on the solution, fail on the stubs, and catch the bug classes.

Each bug fixture injects one bug into the reference solution and runs only the graded cells it
must break (`only=`), to keep the launches few.
"""
import pytest

from tests.harness import grade_cells, score, assert_full_marks, assert_stubs_fail

AID = "05_zero3"
MOD, ADAM = "zero3-module", "zero3-adam"
CHECK, TRAIN, MEM, COMM = "zero3-module-check", "zero3-train-hidden", "zero3-memory-hidden", "zero3-comm-hidden"
ALL = [CHECK, TRAIN, MEM, COMM]
TOTAL = 17


def test_solution_gets_full_marks():
    assert_full_marks(AID, TOTAL, cells=ALL)


def test_every_graded_cell_fails_on_the_stubs():
    assert_stubs_fail(AID, cells=ALL, total=TOTAL)


RS = ("dist.reduce_scatter_single(shard_grad, flat_grad, op=dist.ReduceOp.SUM)\n"
      "        shard_grad /= self.world_size")
PRE_GATHER = "            for unit in units:\n                unit.gather()\n            if torch.is_grad_enabled():"
BUGS = {
    # bug: (edits, cells that must fail)
    "gathers everything at construction and keeps it": (
        [(MOD, "self.flat.untyped_storage().resize_(0)", "pass")], [CHECK, MEM]),
    "does not free after forward": (
        [(MOD, "        def post_forward(mod, args, output):\n            for unit in units:\n"
               "                unit.free()\n", "        def post_forward(mod, args, output):\n")], [MEM]),
    "gathers the whole model at once": (
        [(MOD, PRE_GATHER, "            for unit in self.units:\n                unit.gather()\n"
                           "            if torch.is_grad_enabled():")], [MEM]),
    "does not re-gather in backward": (
        [(MOD, "                        for unit in units:\n                            unit.gather()\n",
          "                        for unit in units:\n")], [CHECK, TRAIN]),
    "each rank steps with its local gradient": (
        [(MOD, RS, "shard_grad.copy_(flat_grad.chunk(self.world_size)[self.rank])")], [CHECK, TRAIN, COMM]),
    "reduce-scatter without averaging": (
        [(MOD, "        shard_grad /= self.world_size\n", "")], [TRAIN]),
    "all-reduce of the full gradient instead of reduce-scatter": (
        [(MOD, RS, "dist.all_reduce(flat_grad)\n        flat_grad /= self.world_size\n"
                   "        shard_grad.copy_(flat_grad.chunk(self.world_size)[self.rank])")], [COMM]),
    "a unit used twice is gathered only at its first use": (
        [(MOD, PRE_GATHER, "            for unit in units:\n                if not getattr(unit, 'seen', False):\n"
                           "                    unit.gather()\n                unit.seen = True\n"
                           "            if torch.is_grad_enabled():"),
         (MOD, "        self._pending.clear()", "        self._pending.clear()\n"
                                                 "        for u in self.units:\n            u.seen = False")],
        [CHECK, TRAIN]),
    "tied weight in two units (updated twice)": (
        [(MOD, "new = [p for p in own if p not in unit_of]", "new = own")], [CHECK, TRAIN]),
    "weight decay moves frozen parameters": (
        [(MOD, "if p.requires_grad and max(a, lo) < min(b, hi)]", "if max(a, lo) < min(b, hi)]")], [TRAIN]),
}


@pytest.mark.parametrize("bug", list(BUGS))
def test_bug_is_caught(bug):
    edits, must_fail = BUGS[bug]
    results = grade_cells(AID, edits=edits, only=must_fail)
    failed = {g for g, err in results.items() if err is not None}
    assert set(must_fail) <= failed, (bug, results)
    earned, total = score(AID, results)
    assert earned < total


VALID = {
    "gradients reduce-scattered in fp32": [
        (MOD, "flat_grad = torch.zeros(self.shard_numel * self.world_size, dtype=self.flat.dtype)",
         "flat_grad = torch.zeros(self.shard_numel * self.world_size, dtype=torch.float32)"),
        (MOD, "shard_grad = torch.empty(self.shard_numel, dtype=self.flat.dtype)",
         "shard_grad = torch.empty(self.shard_numel, dtype=torch.float32)"),
    ],
    # The shard kept only as the fp32 master (4Ψ/N at rest), cast to bf16 when gathered; the
    # optimizer updates it in place (no second copy): valid, the total stays <= 16Ψ/N.
    "shard kept only as the fp32 master, cast when gathered": [
        (MOD, "self.shard = self.flat[lo:hi].clone()", "self.shard = self.flat[lo:hi].to(torch.float32, copy=True)"),
        (MOD, "dist.all_gather_single(self.flat, self.shard)",
         "dist.all_gather_single(self.flat, self.shard.to(self.flat.dtype))"),
        (ADAM, "self.master = [u.shard.float() if u.shard.dtype != torch.float32 else u.shard.clone()\n"
               "                       for u in self.units]", "self.master = [u.shard for u in self.units]"),
        (ADAM, "            unit.shard.copy_(master)             # the shard, in the parameters' dtype\n", ""),
    ],
    # Frozen parameters in the flat buffers (the reference already flattens them with the
    # trainable ones) AND their zero gradient slots reduce-scattered too, frozen-only units
    # included, as FSDP does: the reduce-scatter moves Ψ_all elements, the upper bound.
    "frozen parameters' zero gradient slots reduce-scattered too (FSDP-style)": [
        (MOD, "        if all(g is None for g in grads):\n            return\n", ""),
        (MOD, "            if unit.n_trainable and self._ready.get(unit, 0) < unit.n_trainable:",
         "            if self._ready.get(unit, 0) < unit.n_trainable or not unit.n_trainable:"),
    ],
    "list all_gather, zero_grad zeroes in place": [
        (MOD, "dist.all_gather_single(self.flat, self.shard)",
         "dist.all_gather(list(self.flat.chunk(self.world_size)), self.shard)"),
        (ADAM, "            unit.grad_shard = None",
         "            if unit.grad_shard is not None:\n                unit.grad_shard.zero_()"),
    ],
}


# A ZeRO-3 that swaps p.data for a new full tensor (and back to an empty one) instead of resizing
# the storage saves no memory: F.linear saved W.t() for backward, a view that keeps the full
# tensor of that moment alive until backward, so at the end of forward about the whole model is
# alive. Its parameter slots look empty, so only counting what autograd saved (PeakTracker over
# the forward, against the unsharded model's forward) sees it. The contract: a bug.
SWAP_DATA = [
    (MOD, "self.name = name", "self.name = name\n        self.shapes = [p.shape for p in params]"),
    (MOD, "return self.flat.untyped_storage().nbytes() > 0", "return self.params[0].numel() > 0"),
    (MOD, "self.flat.untyped_storage().resize_(self.nbytes)\n        with torch.no_grad():\n"
          "            dist.all_gather_single(self.flat, self.shard)",
     "flat = torch.empty(self.shard_numel * self.world_size, dtype=self.shard.dtype)\n"
     "        dist.all_gather_single(flat, self.shard)\n"
     "        for p, s, (a, b) in zip(self.params, self.shapes, self.slices):\n"
     "            p.data = flat[a:b].view(s)"),
    (MOD, "self.flat.untyped_storage().resize_(0)",
     "self.flat = torch.empty(0, dtype=self.shard.dtype)\n"
     "        for p in self.params:\n            p.data = torch.empty(0, dtype=self.shard.dtype)"),
]


def test_data_swap_that_keeps_weights_alive_in_saved_tensors_is_caught():
    results = grade_cells(AID, edits=SWAP_DATA, only=[MEM])
    assert results[MEM] is not None and "forward left alive" in results[MEM], results


@pytest.mark.parametrize("alt", list(VALID))
def test_valid_alternatives_get_full_marks(alt):
    assert_full_marks(AID, TOTAL, edits=VALID[alt])


def test_peak_tracker_counts_weights_kept_alive_by_saved_tensors():
    """The instrument behind the check: a full weight swapped out of p.data, but held by the
    W.t() autograd saved, is still counted; resizing the gathered storage to 0 frees it."""
    import torch
    import torch.nn.functional as F
    from zerocourse.memory import PeakTracker

    def forward_live(free):
        w = torch.nn.Parameter(torch.empty(0))
        x = torch.randn(8, 64, requires_grad=True)
        with PeakTracker() as mem:
            full = torch.randn(64, 64)              # the gathered weight: 16,384 B
            w.data = full
            y = F.linear(x, w)                      # saves x and a view w.t() for backward
            free(w, full)
            del full
            return mem.current_bytes, y

    def swap(w, full):
        w.data = torch.empty(0)

    def resize(w, full):
        full.untyped_storage().resize_(0)

    (swapped, _), (resized, _) = forward_live(swap), forward_live(resize)
    assert swapped - resized == 64 * 64 * 4, (swapped, resized)
