"""09_train_it_for_real: the graded cells pass on the solution, fail on the stubs, catch the bugs.

Three graded parts, written for the ZeRO-3 in use (the reference: the course's stand-in): A
clip_grad_norm_sharded (self-check, hidden), B save/load_sharded_checkpoint (self-check, hidden
resharding, hidden interop with DCP + FSDP2), C ShardedGradScaler (self-check, hidden). Each bug
fixture injects one bug into the reference solution and runs only the graded cells it must break
(`only=`); the valid variants keep full marks on the cells they touch. Own designs (another
ZeRO-3, other styles) are in tests/fixtures/alternatives/09_train_it_for_real/.
"""
import pytest

from tests.harness import assert_bug_caught, assert_full_marks, assert_stubs_fail

AID = "09_train_it_for_real"
CLIP, CKPT, SCALER = "clip", "ckpt", "scaler"
A_CHECK, A_HIDDEN = "clip-check", "clip-hidden"
B_CHECK, B_RESHARD, B_TORCH = "ckpt-check", "ckpt-reshard-hidden", "ckpt-interop-hidden"
C_CHECK, C_HIDDEN = "scaler-check", "scaler-hidden"
ALL = [A_CHECK, A_HIDDEN, B_CHECK, B_RESHARD, B_TORCH, C_CHECK, C_HIDDEN]
TOTAL = 22


def test_solution_gets_full_marks():
    # The reference runs under the device proxy (every tensor of a rank on its device).
    assert_full_marks(AID, TOTAL, cells=ALL)


def test_every_graded_cell_fails_on_the_stubs():
    assert_stubs_fail(AID, cells=ALL, total=TOTAL)


SUM_ONCE = "        dist.all_reduce(squares)                     # one number per rank: sum of squares\n"
REAL_CLIP = "        real = min(width, max(0, shard.numel - rank * width))     # the rest is padding (NaN)\n"
ONCE = "        if id(shard) in seen or shard.grad is None:        # a tied weight once; frozen: no grad\n"
SAVE_STATE = ("            for key, tensor in optimizer.state(shard).items():    # master, exp_avg, exp_avg_sq\n"
              "                entry[key] = tensor[:real].detach().cpu().clone()\n")
LOAD_COPY = ("            for key, target in targets.items():\n"
             "                target[a - lo:b - lo] = stored[key][a - start:b - start]\n")
OVERLAP = ("            a, b = max(start, lo), min(end, hi)\n"
           "            if a >= b:\n"
           "                continue                                         # nothing of mine in it\n")
AGREE = "        dist.all_reduce(found, dist.ReduceOp.MAX)      # one flag for all: skip together\n"

BUGS = {
    # bug: (edits, cells run, cells that must fail[, cells that must pass])
    "A: local norm only (each rank clips with its own shards' norm)": (
        [(CLIP, SUM_ONCE, "")], [A_CHECK], [A_CHECK]),
    "A: padding counted in the norm": (
        [(CLIP, REAL_CLIP, "        real = width\n")], [A_CHECK], [A_CHECK]),
    "A: a tied weight counted twice (once per name)": (
        [(CLIP, ONCE, "        if shard.grad is None:\n")], [A_CHECK], [A_CHECK]),
    "A: one all-reduce per shard (right norm, N collectives)": (
        [(CLIP, SUM_ONCE, ""),
         (CLIP, "            squares += g.float().pow(2).sum()\n",
          "            part = g.float().pow(2).sum()\n            dist.all_reduce(part)\n            squares += part\n")],
        [A_CHECK], [A_CHECK]),
    "A: the clip applied on rank 0's shards only": (
        [(CLIP, "    for g in pieces:\n        g.mul_(factor.to(g.dtype))\n",
          "    for g in (pieces if rank == 0 else []):\n        g.mul_(factor.to(g.dtype))\n")], [A_CHECK], [A_CHECK]),
    "A: the norm AFTER clipping returned": (
        [(CLIP, "    return total\n", "    return total * factor\n")], [A_CHECK], [A_CHECK]),
    "A: the inf norm all-reduced with SUM": (
        [(CLIP, "        dist.all_reduce(total, dist.ReduceOp.MAX)\n", "        dist.all_reduce(total)\n")],
        [A_HIDDEN], [A_HIDDEN]),
    "A: the factor not clamped at 1 (small gradients scaled up)": (
        [(CLIP, ".clamp(max=1.0)", "")], [A_HIDDEN], [A_HIDDEN]),
    "B: moments not saved (fresh zeros after the load)": (
        [(CKPT, SAVE_STATE, '            entry["master"] = optimizer.state(shard)["master"][:real].detach().cpu().clone()\n'),
         (CKPT, LOAD_COPY, "            for key, target in targets.items():\n                if key in stored:\n"
                           "                    target[a - lo:b - lo] = stored[key][a - start:b - start]\n")],
        [B_CHECK], [B_CHECK]),
    "B: master not saved (rebuilt from the parameter: harmless in fp32, not in bf16)": (
        [(CKPT, "            for key, tensor in optimizer.state(shard).items():",
          "            for key, tensor in list(optimizer.state(shard).items())[1:]:"),
         (CKPT, "                target[a - lo:b - lo] = stored[key][a - start:b - start]\n",
          '                target[a - lo:b - lo] = stored[key if key in stored else "param"][a - start:b - start]\n')],
        [B_CHECK], [B_CHECK]),
    "B: step count not restored": (
        [(CKPT, '    optimizer.step_count = int(index["step"])\n', "")], [B_CHECK], [B_CHECK]),
    "B: resharding off by the padding (a shard starts at rank·(numel // N))": (
        [(CKPT, "        lo = rank * width\n", "        lo = rank * (shard.numel // dist.get_world_size())\n")],
        [B_CHECK], [B_CHECK]),
    "B: loading at M with N's shard bounds (each rank takes its old file's chunk)": (
        [(CKPT, OVERLAP, '            if fname != f"rank{rank}.pt":\n                continue\n'
                         '            a, b, lo = start, min(end, start + width), start\n')],
        [B_CHECK], [B_CHECK]),
    "B: rank 0 gathers every rank's shard and writes all the files": (
        [(CKPT, '    torch.save(mine, os.path.join(path, f"rank{rank}.pt"))\n',
          "    everyone = [None] * world_size\n    dist.all_gather_object(everyone, mine)\n"
          "    if rank == 0:\n        for r, part in enumerate(everyone):\n"
          '            torch.save(part, os.path.join(path, f"rank{r}.pt"))\n')],
        [B_CHECK], [B_CHECK]),
    "B: every file read at load": (
        [(CKPT, "    opened, seen = {}, set()\n",
          '    opened = {f: torch.load(os.path.join(path, f), weights_only=True)\n'
          '              for e in index["params"].values() for f, _, _ in e["chunks"]}\n    seen = set()\n')],
        [B_CHECK], [B_CHECK]),
    "B: padding saved (a chunk's tensors longer than its range)": (
        [(CKPT, '        entry = {"param": shard.value[:real].detach().cpu().clone()}\n',
          '        entry = {"param": shard.value.detach().cpu().clone()}\n')], [B_CHECK], [B_CHECK]),
    "B: frozen parameters left out of the files": (
        [(CKPT, "        if real == 0:\n            continue\n",
          "        if real == 0 or not shard.requires_grad:\n            continue\n")], [B_CHECK], [B_CHECK]),
    "C: found-inf not agreed (each rank skips or steps alone)": (
        [(SCALER, AGREE, "")], [C_CHECK], [C_CHECK]),
    "C: found-inf all-reduced, but each rank decides on its own flag (ranks diverge)": (
        [(SCALER, AGREE, "        mine = bool(found.item())\n" + AGREE),
         (SCALER, "        self._found = bool(found.item())\n", "        self._found = mine\n")], [C_CHECK], [C_CHECK]),
    "C: padding counted in the inf check (NaN: every step skipped)": (
        [(SCALER, "                g = shard.grad[:min(width, max(0, shard.numel - rank * width))]\n",
          "                g = shard.grad\n")], [C_CHECK], [C_CHECK]),
    "C: gradients never unscaled (weight decay shows it)": (
        [(SCALER, "                g.mul_(inv)\n", "")], [C_CHECK], [C_CHECK]),
    "C: the growth count not reset after a skipped step": (
        [(SCALER, "            self._scale *= self._backoff\n            self._good = 0\n",
          "            self._scale *= self._backoff\n")], [C_CHECK], [C_CHECK]),
    "C: step() returns None, as torch's GradScaler.step does": (
        [(SCALER, "        return not self._found\n", "        return None\n")], [C_CHECK], [C_CHECK]),
    "C: scale() returns the loss unscaled": (
        [(SCALER, "        return loss * self._scale\n", "        return loss\n")], [C_CHECK], [C_CHECK]),
}


@pytest.mark.parametrize("name", list(BUGS))
def test_bug_is_caught(name):
    edits, only, must_fail, *must_pass = BUGS[name]
    assert_bug_caught(AID, edits, only=only, must_fail=must_fail, must_pass=must_pass[0] if must_pass else ())


VALID = {
    "A: one all_gather of the local sums instead of an all-reduce": (
        [(CLIP, SUM_ONCE, "        everyone = squares.new_zeros(dist.get_world_size())\n"
                          "        dist.all_gather_single(everyone, squares.reshape(1))\n"
                          "        squares = everyone.sum()\n")], [A_CHECK, A_HIDDEN]),
    "A: sums in fp64": (
        [(CLIP, "        squares = torch.zeros((), dtype=torch.float32, device=device)\n",
          "        squares = torch.zeros((), dtype=torch.float64, device=device)\n"),
         (CLIP, "            squares += g.float().pow(2).sum()\n", "            squares += g.double().pow(2).sum()\n"),
         (CLIP, "        total = squares.sqrt()\n", "        total = squares.sqrt().float()\n")], [A_CHECK]),
    "B: files named by rank and world size, loaded with mmap": (
        [(CKPT, 'f"rank{r}.pt"', 'f"r{r}-of-{world_size}.pt"'),
         (CKPT, 'os.path.join(path, f"rank{rank}.pt")', 'os.path.join(path, f"r{rank}-of-{world_size}.pt")'),
         (CKPT, "opened[fname] = torch.load(os.path.join(path, fname), weights_only=True)",
          "opened[fname] = torch.load(os.path.join(path, fname), weights_only=True, mmap=True)")], [B_CHECK]),
    "C: found-inf agreed with one all_gather, unscaled by division": (
        [(SCALER, AGREE, "        flags = found.new_zeros(dist.get_world_size())\n"
                         "        dist.all_gather_single(flags, found)\n        found = flags.max().reshape(1)\n"),
         (SCALER, "                g.mul_(inv)\n", "                g.div_(self._scale)\n")], [C_CHECK]),
}


@pytest.mark.parametrize("name", list(VALID))
def test_valid_variant_gets_full_marks(name):
    edits, only = VALID[name]
    assert_full_marks(AID, edits=edits, only=only, cells=only)
