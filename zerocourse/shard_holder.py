"""A stand-in for a ZeRO-3 module, to grade a ZeRO-3 optimizer when the learner's own is not ready.

Notebook 05 grades `ZeRO3Adam` with the learner's own `ZeRO3Module` first. If that one is not
working yet, part D is graded on this stand-in instead, so that a learner who is stuck on part C
can still earn part D. The stand-in offers the interface of the notebook's optional hint design
and nothing more: `holder.units`, a list of objects each with

    shard             this rank's elements of the unit's parameters (1-D, their dtype); the
                      optimizer updates it in place
    grad_shard        the mean over ranks of those elements' gradients, or None
    trainable_ranges  [(start, end)] positions of `shard` to update (frozen elements and
                      padding are out; empty for a unit of frozen parameters only)

It is deliberately NOT a ZeRO-3 and not any notebook's solution: every rank keeps the FULL model
(forward and backward are plain torch); its units are not modules but runs of up to three
consecutive Parameters of torch's `module.parameters()` (which lists a tied one once), so a unit
mixes trainable and frozen elements and ends with padding, as a ZeRO-3's units do; and rank r
holds the STRIDED elements r, r + N, r + 2N, ... of a unit's flattened parameters, not a
contiguous block. `sync_grads()` all-reduces the full gradients, `load_shards()` all-gathers the
updated shards back into the full parameters. It is correct and simple, so a bug found while
testing an optimizer on it is the optimizer's.

    holder = ShardHolder(model)                # inside a rank; model identical on all ranks
    opt = ZeRO3Adam(holder, lr=1e-3)
    loss_fn(model(x), y).backward()
    holder.sync_grads()                        # -> unit.grad_shard (accumulated); p.grad = None
    opt.step(); opt.zero_grad()
    holder.load_shards()                       # the new shards -> the full parameters
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

__all__ = ["HeldUnit", "ShardHolder"]

PARAMS_PER_UNIT = 3


class HeldUnit:
    """Rank r's strided elements r, r + N, ... of some parameters, flattened one after the other
    (the full parameters stay in the model).

    Args:
        params: distinct Parameters of one dtype (on the rank's device), the same on every rank.
        world_size: number of ranks N.
        rank: this rank.
    """

    def __init__(self, params, world_size: int, rank: int):
        self.params, self.world_size, self.rank = list(params), world_size, rank
        self.numel = sum(p.numel() for p in self.params)
        self.rows = -(-self.numel // world_size)                       # elements per rank, padded
        self.shard = self._mine([p.detach() for p in self.params]).clone()   # [rows], params' dtype
        # Flat element i lives at position i // N of rank i % N: a parameter that spans the
        # flat elements [a, b) is, on this rank, the positions ceil((a - r) / N) .. ceil((b - r) / N).
        self.trainable_ranges, a = [], 0
        for p in self.params:
            b = a + p.numel()
            lo, hi = -(-(a - rank) // world_size), -(-(b - rank) // world_size)
            if p.requires_grad and lo < hi:
                self.trainable_ranges.append((lo, hi))
            a = b
        self.grad_shard = None                                          # [rows] or None

    def _mine(self, tensors):
        """This rank's column of the tensors flattened in order, padded, laid out as [rows, N]."""
        flat = torch.cat([t.reshape(-1) for t in tensors])
        flat = F.pad(flat, (0, self.rows * self.world_size - self.numel))
        return flat.view(self.rows, self.world_size)[:, self.rank]


class ShardHolder:
    """Strided shards of the parameters of `module` for an optimizer; the full model stays.

    Args:
        module: an nn.Module identical on every rank (inside a rank of zerocourse.launch).
    """

    def __init__(self, module):
        self.module = module
        world_size, rank = dist.get_world_size(), dist.get_rank()
        params = list(module.parameters())
        self.units = [HeldUnit(params[i:i + PARAMS_PER_UNIT], world_size, rank)
                      for i in range(0, len(params), PARAMS_PER_UNIT)]

    @torch.no_grad()
    def sync_grads(self) -> None:
        """After backward: average the full gradients over ranks, add this rank's elements to
        grad_shard (as p.grad accumulates until zero_grad), drop the full gradients."""
        for unit in self.units:
            if all(p.grad is None for p in unit.params):
                continue
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in unit.params]
            flat = torch.cat([g.reshape(-1) for g in grads])
            # An all-reduce, not ZeRO's reduce-scatter: this holder is for testing optimizers.
            dist.all_reduce(flat)
            flat /= unit.world_size
            mine = unit._mine([flat]).clone()
            unit.grad_shard = mine if unit.grad_shard is None else unit.grad_shard + mine
            for p in unit.params:
                p.grad = None

    @torch.no_grad()
    def load_shards(self) -> None:
        """After the optimizer step: all-gather every shard back into its full parameters."""
        for unit in self.units:
            dtype = unit.params[0].dtype
            shard = unit.shard.to(dtype).contiguous()
            columns = shard.new_empty(unit.world_size * unit.rows)           # [N * rows]
            dist.all_gather_single(columns, shard)
            flat = columns.view(unit.world_size, unit.rows).t().reshape(-1)   # back to flat order
            a = 0
            for p in unit.params:
                p.copy_(flat[a:a + p.numel()].view(p.shape))
                a += p.numel()

    @torch.no_grad()
    def full_params(self) -> dict:
        """{name: a copy of the full parameter}, keyed as module.named_parameters()."""
        return {n: p.detach().clone() for n, p in self.module.named_parameters()}
