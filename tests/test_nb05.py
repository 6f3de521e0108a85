"""05_zero3: the graded cells pass on the solution, fail on the stubs, and catch the bug classes.

The notebook has four graded parts, each with a self-check cell and a hidden-test cell:
A ShardedUnit, B ZeRO3ForwardModule, C ZeRO3Module (backward), D ZeRO3Adam (tested on the given
zerocourse ShardHolder), and one cell that trains C + D together. Each bug fixture injects one bug
into the reference solution and runs only the graded cells it must break (`only=`), to keep the
launches few.
"""
import pytest

from tests.harness import grade_cells, score, assert_full_marks, assert_stubs_fail

AID = "05_zero3"
UNIT, FWD, BWD, ADAM = "zero3-unit", "zero3-forward", "zero3-backward", "zero3-adam"
A_CHECK, A_HIDDEN = "zero3-unit-check", "zero3-unit-hidden"
B_CHECK, B_HIDDEN = "zero3-forward-check", "zero3-forward-hidden"
C_CHECK, C_HIDDEN = "zero3-backward-check", "zero3-backward-hidden"
D_CHECK, D_HIDDEN = "zero3-adam-check", "zero3-adam-hidden"
TRAIN = "zero3-train-hidden"
ALL = [A_CHECK, A_HIDDEN, B_CHECK, B_HIDDEN, C_CHECK, C_HIDDEN, D_CHECK, D_HIDDEN, TRAIN]
TOTAL = 20


def test_solution_gets_full_marks():
    assert_full_marks(AID, TOTAL, cells=ALL)


def test_every_graded_cell_fails_on_the_stubs():
    assert_stubs_fail(AID, cells=ALL, total=TOTAL)


RS = ("dist.reduce_scatter_single(shard_grad, flat_grad, op=dist.ReduceOp.SUM)\n"
      "        shard_grad /= unit.world_size")
BUGS = {
    # bug: (edits, cells that must fail)
    # -- A: the unit
    "shard = floor(numel / N): no padding, elements lost": (
        [(UNIT, "self.shard_numel = math.ceil(self.numel / self.world_size)",
          "self.shard_numel = self.numel // self.world_size")], [A_CHECK, A_HIDDEN]),
    "padding at the front of the flat vector (wrong shard bounds)": (
        [(UNIT, "self.slices, offset = [], 0",
          "self.slices, offset = [], self.shard_numel * self.world_size - self.numel")], [A_CHECK, A_HIDDEN]),
    "gather never freed": (
        [(UNIT, "        self.flat.untyped_storage().resize_(0)\n", "        pass\n")],
        [A_CHECK, B_CHECK, C_CHECK]),
    "gather reuses the first gathered copy (ignores updated shards)": (
        [(UNIT, "        if self.gathered():\n            return\n        self.flat.untyped_storage().resize_(self.nbytes)\n"
                "        with torch.no_grad():\n            dist.all_gather_single(self.flat, self.shard.to(self.flat.dtype))",
          "        if self.gathered():\n            return\n        self.flat.untyped_storage().resize_(self.nbytes)\n"
          "        if not hasattr(self, 'cache'):\n            with torch.no_grad():\n"
          "                dist.all_gather_single(self.flat, self.shard.to(self.flat.dtype))\n"
          "            self.cache = self.flat.clone()\n        self.flat.copy_(self.cache)")],
        [A_CHECK, TRAIN]),
    "frozen parameters counted as trainable": (
        [(UNIT, "if p.requires_grad and max(a, lo) < min(b, hi)]", "if max(a, lo) < min(b, hi)]")],
        [A_CHECK, TRAIN]),
    # -- B: the forward
    "does not free after forward": (
        [(FWD, "        for unit in units:\n            unit.free()\n", "        pass\n")], [B_CHECK, C_CHECK]),
    "gathers the whole model at once": (
        [(FWD, "        for unit in units:\n            unit.gather()\n",
          "        for unit in self.units:\n            unit.gather()\n")], [B_CHECK, C_CHECK]),
    "a tied weight's second owner does not gather its unit": (
        [(FWD, "self.needs[mod] = list(dict.fromkeys(unit_of[p] for p in own))",
          "self.needs[mod] = [unit_of[p] for p in new]")], [B_CHECK]),
    # -- C: the backward
    "does not re-gather in backward": (
        [(BWD, "                for unit in units:\n                    unit.gather()\n",
          "                for unit in units:\n")], [C_CHECK, TRAIN]),
    "each rank keeps its local gradient (no reduction)": (
        [(BWD, RS, "shard_grad.copy_(flat_grad.chunk(unit.world_size)[unit.rank])")], [C_CHECK, C_HIDDEN]),
    "reduce-scatter without averaging (sum)": (
        [(BWD, "        shard_grad /= unit.world_size\n", "")], [C_CHECK, C_HIDDEN, TRAIN]),
    "all-reduce of the full gradient instead of reduce-scatter": (
        [(BWD, RS, "dist.all_reduce(flat_grad)\n        flat_grad /= unit.world_size\n"
                   "        shard_grad.copy_(flat_grad.chunk(unit.world_size)[unit.rank])")], [C_CHECK, C_HIDDEN]),
    "full gradients not freed after the reduce-scatter": (
        [(BWD, "        for p in unit.params:\n            p.grad = None                                  # free the full gradients\n",
          "")], [C_CHECK, C_HIDDEN]),
    "tied weight in two units (updated twice)": (
        [(FWD, "new = [p for p in own if p not in unit_of]", "new = own")], [TRAIN]),
    # -- D: the optimizer
    "Adam without bias correction": (
        [(ADAM, "bias_correction1 = 1 - beta1 ** self.step_count\n        bias_correction2 = 1 - beta2 ** self.step_count",
          "bias_correction1 = 1.0\n        bias_correction2 = 1.0")], [D_CHECK, D_HIDDEN]),
    "Adam state for the full unit instead of the shard": (
        [(ADAM, "self.exp_avg = [torch.zeros_like(m) for m in self.master]\n"
                "        self.exp_avg_sq = [torch.zeros_like(m) for m in self.master]",
          "self.exp_avg = [torch.zeros(m.numel() * dist.get_world_size()) for m in self.master]\n"
          "        self.exp_avg_sq = [torch.zeros(m.numel() * dist.get_world_size()) for m in self.master]"),
         (ADAM, "            for a, b in unit.trainable_ranges:",
          "            m, v = m[:master.numel()], v[:master.numel()]\n            for a, b in unit.trainable_ranges:")],
        [D_HIDDEN]),
    "weight decay moves frozen elements (ranges ignored)": (
        [(ADAM, "            for a, b in unit.trainable_ranges:", "            for a, b in [(0, master.numel())]:")],
        [D_HIDDEN]),
    "step does not write the master back into the shard": (
        [(ADAM, "            unit.shard.copy_(master)                           # the shard, in its own dtype\n", "")],
        [D_CHECK, D_HIDDEN]),
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
        (BWD, "flat_grad = torch.zeros(unit.shard_numel * unit.world_size, dtype=unit.flat.dtype)",
         "flat_grad = torch.zeros(unit.shard_numel * unit.world_size, dtype=torch.float32)"),
        (BWD, "shard_grad = torch.empty(unit.shard_numel, dtype=unit.flat.dtype)",
         "shard_grad = torch.empty(unit.shard_numel, dtype=torch.float32)"),
    ],
    # The shard kept only as the fp32 master (4Ψ/N at rest), cast when gathered; the optimizer
    # updates it in place (no second copy): valid, the total stays <= 16Ψ/N.
    "shard kept only as the fp32 master, cast when gathered": [
        (UNIT, "self.shard = self.flat[lo:hi].clone()", "self.shard = self.flat[lo:hi].to(torch.float32, copy=True)"),
        (ADAM, "self.master = [u.shard.detach().to(torch.float32, copy=True) for u in self.units]",
         "self.master = [u.shard if u.shard.dtype == torch.float32 else u.shard.float() for u in self.units]"),
    ],
    # Frozen parameters' zero gradient slots reduce-scattered too, frozen-only units included,
    # as FSDP does: the reduce-scatter moves Ψ_all elements, the upper bound.
    "frozen parameters' zero gradient slots reduce-scattered too (FSDP-style)": [
        (BWD, "        if all(p.grad is None for p in unit.params):\n            return\n", ""),
        (BWD, "            if unit.n_trainable and self._ready.get(unit, 0) < unit.n_trainable:",
         "            if self._ready.get(unit, 0) < unit.n_trainable or not unit.n_trainable:"),
    ],
    "list all_gather, zero_grad zeroes in place": [
        (UNIT, "dist.all_gather_single(self.flat, self.shard.to(self.flat.dtype))",
         "dist.all_gather(list(self.flat.chunk(self.world_size)), self.shard.to(self.flat.dtype))"),
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
    (UNIT, "self.params = list(params)", "self.params = list(params)\n        self.shapes = [p.shape for p in self.params]"),
    (UNIT, "return self.flat.untyped_storage().nbytes() > 0", "return self.params[0].numel() > 0"),
    (UNIT, "self.flat.untyped_storage().resize_(self.nbytes)\n        with torch.no_grad():\n"
           "            dist.all_gather_single(self.flat, self.shard.to(self.flat.dtype))",
     "flat = torch.empty(self.shard_numel * self.world_size, dtype=self.shard.dtype)\n"
     "        dist.all_gather_single(flat, self.shard)\n"
     "        for p, s, (a, b) in zip(self.params, self.shapes, self.slices):\n"
     "            p.data = flat[a:b].view(s)"),
    (UNIT, "        self.flat.untyped_storage().resize_(0)\n",
     "        self.flat = torch.empty(0, dtype=self.shard.dtype)\n"
     "        for p in self.params:\n            p.data = torch.empty(0, dtype=self.shard.dtype)\n"),
    (BWD, "dtype=unit.flat.dtype)  # [shard*N]", "dtype=unit.shard.dtype)  # [shard*N]"),
    (BWD, "shard_grad = torch.empty(unit.shard_numel, dtype=unit.flat.dtype)",
     "shard_grad = torch.empty(unit.shard_numel, dtype=unit.shard.dtype)"),
]


def test_data_swap_that_keeps_weights_alive_in_saved_tensors_is_caught():
    results = grade_cells(AID, edits=SWAP_DATA, only=[A_CHECK, C_CHECK])
    assert results[A_CHECK] is None, results           # the unit alone looks right...
    assert results[C_CHECK] is not None and "forward left alive" in results[C_CHECK], results


@pytest.mark.parametrize("alt", list(VALID))
def test_valid_alternatives_get_full_marks(alt):
    assert_full_marks(AID, TOTAL, edits=VALID[alt])


def test_part_d_does_not_need_parts_a_to_c():
    """A learner who wrote only ZeRO3Adam gets D's points: its tests use the given ShardHolder."""
    results = grade_cells(AID, release=True, solutions={ADAM: _reference_cell(ADAM)},
                          only=[D_CHECK, D_HIDDEN, A_CHECK])
    assert results[D_CHECK] is None and results[D_HIDDEN] is None, results
    assert results[A_CHECK] is not None, results


def _reference_cell(gid):
    from tests.fixtures.make_submission import load, source, strip_markers
    for cell in load("solutions", AID)["cells"]:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == gid:
            return strip_markers(source(cell))
    raise KeyError(gid)


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


def test_end_of_backward_helper_runs_after_backward():
    """zerocourse.hooks.call_at_end_of_backward: fn runs once, after every gradient is in."""
    import torch
    from zerocourse.hooks import call_at_end_of_backward
    w = torch.nn.Parameter(torch.ones(3))
    seen = []
    w.register_post_accumulate_grad_hook(lambda p: seen.append("grad"))
    y = (w * 2).sum()
    y.register_hook(lambda g: call_at_end_of_backward(lambda: seen.append("end")) or g)
    y.backward()
    assert seen == ["grad", "end"], seen
