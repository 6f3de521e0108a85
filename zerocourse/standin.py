"""A stand-in ZeRO-3 for notebook 09, for learners who do not bring their own (05 or 07).

Notebook 09's exercises (clipping, checkpoints, loss scaling) are written FOR a ZeRO-3: they read
its gradient shards, its fp32 master and Adam moments. A learner uses their own ZeRO-3 from 05/07
(pasted into 09), or this one. It is deliberately NOT a design any notebook asks for, and it
would fail 05's tests: it keeps ZeRO-3's state sharded at rest, but in flight it behaves like
plain data parallelism. The whole model is all-gathered when forward starts and stays gathered
until backward ends (no unit is gathered just in time), and the full gradients are averaged by
ONE all-reduce of every gradient at once (no reduce-scatter) before each rank keeps its slice.
Simple, correct, and so a bug found with it is the exercise's.

    zero3 = StandInZeRO3(model)          # inside a rank; model identical on all ranks
    opt = StandInAdam(zero3, lr=1e-3)
    lm_loss(zero3(x), y).backward()      # shards' gradients are ready when backward returns
    opt.step(); opt.zero_grad()
    zero3.gather_full_params()           # {name: full tensor}, a collective

The layout, what the exercises read (notebook 09 states it too):
- `zero3.named_shards()` yields `(name, shard)` for EVERY name of every parameter, in
  `model.named_parameters(remove_duplicate=False)` order: a tied parameter appears under each of
  its names, the same Shard object each time. Frozen parameters are sharded too.
- A parameter of `numel` elements is flattened and cut into N slices of `ceil(numel / N)`
  elements; rank r holds the slice that starts at element `r * ceil(numel / N)` of the flattened
  parameter. Slots past `numel` (at the end of the last ranks' slices) are padding.
- `shard.shape`, `shard.numel`: the full parameter's shape and number of elements.
  `shard.value`: this rank's slice, a 1-D tensor of `ceil(numel / N)` elements in the model's
  dtype. `shard.grad`: its averaged gradient (same length, same dtype) after backward, or None
  (frozen parameters, or before backward); its padding slots hold NaN: they are not gradients.
  `shard.requires_grad`: False for a frozen parameter.
- `StandInAdam(zero3, lr, betas, eps, weight_decay)`: Adam with an fp32 master (torch.optim.Adam's
  semantics: zerocourse.optim.MixedPrecisionAdam on the slices). `opt.module` is the StandInZeRO3,
  `opt.step_count` the number of steps taken (an int you may set), and `opt.state(shard)` the
  dict {"master", "exp_avg", "exp_avg_sq"} of a trainable shard: fp32 tensors as long as
  `shard.value`, to read or to change IN PLACE. After a change of "master", the model sees it
  once `shard.value` holds it too (copy it there).
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn as nn

from zerocourse.hooks import call_at_end_of_backward
from zerocourse.optim import MixedPrecisionAdam

__all__ = ["Shard", "StandInZeRO3", "StandInAdam"]


class Shard:
    """This rank's slice of one parameter (see the module docstring for the layout).

    Args:
        param: the model's Parameter (its full value, identical on every rank).
        name: its first name in the model.
        world_size: number of ranks N.
        rank: this rank.
    """

    def __init__(self, param: nn.Parameter, name: str, world_size: int, rank: int):
        self.param, self.name = param, name
        self.shape, self.numel = tuple(param.shape), param.numel()
        self.requires_grad = param.requires_grad
        per_rank = math.ceil(self.numel / world_size)
        self._first = rank * per_rank                        # element of the flattened param
        # How many of this rank's slots hold real elements (0 on a rank past the end).
        self._real = max(0, min(per_rank, self.numel - self._first))
        value = param.detach().new_zeros(per_rank)           # [per_rank], padding stays 0 here
        value[:self._real] = param.detach().flatten()[self._first:self._first + self._real]
        # A leaf tensor, so that an optimizer can own it and its .grad (the gradient slice).
        self.value = nn.Parameter(value, requires_grad=self.requires_grad)

    @property
    def grad(self):
        """The averaged gradient of this slice (padding slots NaN), or None."""
        return self.value.grad

    def _set_grad(self, full_flat):
        """Keep this rank's part of the averaged full gradient; padding becomes NaN."""
        grad = torch.full_like(self.value, float("nan"))
        grad[:self._real] = full_flat[self._first:self._first + self._real]
        self.value.grad = grad

    def __repr__(self):
        return (f"Shard({self.name!r}, shape={self.shape}, {self.value.numel()} slots"
                f"{', frozen' if not self.requires_grad else ''})")


class StandInZeRO3(nn.Module):
    """ZeRO-3's state at rest, data parallelism in flight (the module docstring says why).

    Args:
        module: the model, identical on every rank (inside a rank of zerocourse.launch);
            its parameters are replaced IN PLACE by empty tensors between steps.
    """

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        world_size, rank = dist.get_world_size(), dist.get_rank()
        self._world_size = world_size
        by_param: dict[int, Shard] = {}
        self._names: list[tuple[str, Shard]] = []
        for name, p in module.named_parameters(remove_duplicate=False):
            if id(p) not in by_param:
                by_param[id(p)] = Shard(p, name, world_size, rank)
            self._names.append((name, by_param[id(p)]))
        self._shards = list(by_param.values())              # distinct, in first-name order
        self._gathered = False
        self._release()
        module.register_forward_pre_hook(self._before_forward)
        module.register_forward_hook(self._after_forward)

    def named_shards(self):
        """(name, Shard) for every name of every parameter (a tied one under each name)."""
        return iter(list(self._names))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    # ---- the whole model, gathered and released --------------------------------------------
    @torch.no_grad()
    def _gather(self):
        if self._gathered:
            return
        for shard in self._shards:
            piece = shard.value.detach().to(shard.param.dtype)
            everyone = piece.new_empty(piece.numel() * self._world_size)    # [per_rank * N]
            dist.all_gather_single(everyone, piece.contiguous())
            shard.param.data = everyone[:shard.numel].view(shard.shape)
        self._gathered = True

    def _release(self):
        for shard in self._shards:
            shard.param.data = shard.param.data.new_empty(0)
            shard.param.grad = None
        self._gathered = False

    def _before_forward(self, module, args):
        self._gather()

    def _after_forward(self, module, args, output):
        if torch.is_grad_enabled() and isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(self._backward_started)
        else:
            self._release()                                  # no backward will follow

    def _backward_started(self, grad):
        call_at_end_of_backward(self._after_backward)
        return grad

    @torch.no_grad()
    def _after_backward(self):
        # Every trainable gradient, concatenated per dtype, averaged by ONE all-reduce; then
        # each shard keeps its slice and the full parameters and gradients are released.
        by_dtype: dict[torch.dtype, list[Shard]] = {}
        for shard in self._shards:
            if shard.requires_grad and shard.param.grad is not None:
                by_dtype.setdefault(shard.param.grad.dtype, []).append(shard)
        for shards in by_dtype.values():
            everything = torch.cat([s.param.grad.reshape(-1) for s in shards])   # [sum numel]
            dist.all_reduce(everything)                      # SUM
            everything.mul_(1.0 / self._world_size)
            for s, part in zip(shards, everything.split([s.numel for s in shards])):
                s._set_grad(part)
        self._release()

    @torch.no_grad()
    def gather_full_params(self) -> dict:
        """{name: full parameter copy}, keyed as module.named_parameters(); a collective."""
        out = {}
        for shard in self._shards:
            piece = shard.value.detach().to(shard.param.dtype)
            everyone = piece.new_empty(piece.numel() * self._world_size)
            dist.all_gather_single(everyone, piece.contiguous())
            out[shard.name] = everyone[:shard.numel].view(shard.shape).clone()
        return out


class StandInAdam:
    """Adam on a StandInZeRO3's slices: an fp32 master and moments for each trainable shard.

    Args:
        zero3: the StandInZeRO3.
        lr, betas, eps, weight_decay: as torch.optim.Adam (weight decay as L2 in the gradient).
    """

    def __init__(self, zero3: StandInZeRO3, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        self.module = zero3
        self._trainable = [s for s in zero3._shards if s.requires_grad]
        self._adam = MixedPrecisionAdam([s.value for s in self._trainable], lr=lr, betas=betas,
                                        eps=eps, weight_decay=weight_decay)
        self._state = {id(s): {"master": self._adam.master[i], "exp_avg": self._adam.exp_avg[i],
                               "exp_avg_sq": self._adam.exp_avg_sq[i]}
                       for i, s in enumerate(self._trainable)}

    @property
    def step_count(self) -> int:
        """Steps taken so far (Adam's bias correction uses it)."""
        return self._adam.step_count

    @step_count.setter
    def step_count(self, value: int) -> None:
        self._adam.step_count = int(value)

    def state(self, shard: Shard) -> dict:
        """{"master", "exp_avg", "exp_avg_sq"}: fp32, as long as shard.value (change in place)."""
        if id(shard) not in self._state:
            raise KeyError(f"{shard!r} has no optimizer state: it is frozen, or not a shard of "
                           f"this optimizer's module")
        return self._state[id(shard)]

    def step(self) -> None:
        """One Adam step on every trainable slice that has a gradient (padding included: its
        values mean nothing and are never gathered into the model)."""
        self._adam.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._adam.zero_grad(set_to_none=set_to_none)
