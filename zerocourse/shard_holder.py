"""A stand-in for a ZeRO-3 module, to test a ZeRO-3 optimizer on its own (notebook 05, part D).

ZeRO3Adam only needs the SHARDS: `zero3_module.units`, each with `.shard` (this rank's slice of
the unit's padded flat parameters), `.grad_shard` (the averaged gradient of that slice, or None)
and `.trainable_ranges` (the [(start, end)] positions of the shard that belong to trainable
parameters). ShardHolder gives
exactly that for any model, with none of ZeRO-3's memory savings: every rank keeps the FULL model
(forward and backward are plain torch), `sync_grads()` all-reduces the full gradients and slices
them, and `load_shards()` all-gathers the updated shards back into the full parameters. It is
correct and simple, so a bug found while testing an optimizer with it is the optimizer's.

    holder = ShardHolder(model)                # inside a rank; model identical on all ranks
    opt = ZeRO3Adam(holder, lr=1e-3)
    loss_fn(model(x), y).backward()
    holder.sync_grads()                        # -> unit.grad_shard; p.grad = None
    opt.step(); opt.zero_grad()
    holder.load_shards()                       # the new shards -> the full parameters
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

__all__ = ["HeldUnit", "ShardHolder"]


class HeldUnit:
    """The shard of one module's directly-owned parameters (the full ones stay in the model).

    Args:
        params: distinct Parameters of one dtype, in a fixed order (the same on every rank).
        world_size: number of ranks N.
        rank: this rank.
    """

    def __init__(self, params, world_size: int, rank: int):
        self.params = list(params)
        self.world_size, self.rank = world_size, rank
        self.numel = sum(p.numel() for p in self.params)
        self.shard_numel = math.ceil(self.numel / world_size)      # the padded layout of notebook 03
        lo, hi = rank * self.shard_numel, (rank + 1) * self.shard_numel
        flat = self._flat([p.detach() for p in self.params])       # [shard_numel * N]
        self.shard = flat[lo:hi].clone()                            # [shard_numel], params' dtype
        self.trainable_ranges, offset = [], 0                       # [(start, end)] in the shard
        for p in self.params:
            a, b = max(offset, lo), min(offset + p.numel(), hi)
            if p.requires_grad and a < b:
                self.trainable_ranges.append((a - lo, b - lo))
            offset += p.numel()
        self.grad_shard = None                                      # [shard_numel] or None

    def _flat(self, tensors):
        """The tensors flattened in order, padded with zeros to shard_numel * N elements."""
        flat = torch.cat([t.reshape(-1) for t in tensors])
        pad = self.shard_numel * self.world_size - flat.numel()
        return torch.cat([flat, flat.new_zeros(pad)])


class ShardHolder:
    """Shards of every unit of `module` for an optimizer; the full model stays on every rank.

    Args:
        module: an nn.Module identical on every rank (inside a rank of zerocourse.launch).

    Units as in notebook 05: every module that owns parameters directly, a tied parameter in its
    first owner's unit only.
    """

    def __init__(self, module):
        self.module = module
        world_size, rank = dist.get_world_size(), dist.get_rank()
        seen, self.units = set(), []
        for _, mod in module.named_modules():
            new = [p for p in mod.parameters(recurse=False) if id(p) not in seen]
            seen.update(id(p) for p in new)
            if new:
                self.units.append(HeldUnit(new, world_size, rank))

    @torch.no_grad()
    def sync_grads(self) -> None:
        """After backward: average the full gradients over ranks, keep this rank's slice as
        each unit's grad_shard (params' dtype), and drop the full gradients (p.grad = None)."""
        for unit in self.units:
            if all(p.grad is None for p in unit.params):
                continue
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in unit.params]
            flat = unit._flat(grads)                                 # [shard_numel * N]
            # An all-reduce, not ZeRO's reduce-scatter: this holder is for testing optimizers.
            dist.all_reduce(flat)
            flat /= unit.world_size
            k = unit.shard_numel
            unit.grad_shard = flat[unit.rank * k:(unit.rank + 1) * k].clone()
            for p in unit.params:
                p.grad = None

    @torch.no_grad()
    def load_shards(self) -> None:
        """After the optimizer step: all-gather every unit's shard into the full parameters."""
        for unit in self.units:
            shard = unit.shard.to(unit.params[0].dtype)
            flat = shard.new_empty(unit.shard_numel * unit.world_size)   # [shard_numel * N]
            dist.all_gather_single(flat, shard.contiguous())
            offset = 0
            for p in unit.params:
                p.copy_(flat[offset:offset + p.numel()].view(p.shape))
                offset += p.numel()

    @torch.no_grad()
    def full_params(self) -> dict:
        """{name: a copy of the full parameter}, keyed as module.named_parameters()."""
        return {n: p.detach().clone() for n, p in self.module.named_parameters()}
