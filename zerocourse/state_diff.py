"""Which tensors a region of code created or changed in an object: a probe that knows no names.

    snap = StateSnapshot(zero3)           # inside a rank, before forward + backward
    loss_fn(zero3(x), y).backward()
    new = snap.changed(zero3)             # [tensor]: copies of what backward created or wrote

Why. A ZeRO-3's gradient shards may live anywhere: a `grad_shard` per unit, the `.grad` of shard
Parameters registered on the wrapper, one flat tensor for the whole model, a dict keyed by name.
A test that reads one attribute fails every design but the one it was written for. This probe
reads none: it walks every object reachable from the roots, as
`zerocourse.memory.measure_state_bytes` does (attributes, __slots__, lists, tuples, dicts, sets, a
tensor's .grad and its Python attributes; not closures, globals, functions or modules), and
fingerprints every floating-point tensor it finds. `changed()` returns what is new since the
snapshot: a tensor whose storage was not there before, or whose values differ. The caller then
compares VALUES (e.g. with the gradients of a single-process run), never positions or names, so
any layout is accepted.

What it does not see (the same limits as the memory meter, on purpose: what one cannot see, the
other cannot count):
- tensors kept only in closures, globals or hook functions: keep a module's state on objects;
- a tensor overwritten with exactly the values it had ("unchanged");
- integer and bool tensors, 0-byte (freed) storages, and views that reach past a storage that was
  shrunk (a freed gathered buffer): they hold no values.
A storage freed and allocated again at the same address with other values counts as changed.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from zerocourse.memory import _reachable_tensors

__all__ = ["StateSnapshot"]


def _holds_values(t: torch.Tensor) -> bool:
    """A strided floating tensor whose elements all lie inside a non-empty storage."""
    if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.numel() == 0:
        return False
    if is_traceable_wrapper_subclass(t) or t.layout != torch.strided or t.device.type == "meta":
        return False
    try:
        nbytes = t.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError):
        return False
    last = t.storage_offset() + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
    return nbytes >= (last + 1) * t.element_size()


def _key(t: torch.Tensor) -> tuple:
    st = t.untyped_storage()
    return (st.data_ptr(), st.nbytes(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


def _tensors(roots):
    """(key, tensor) of every floating tensor reachable from roots, each view once."""
    seen = set()
    for t in _reachable_tensors(tuple(roots)):
        if _holds_values(t):
            k = _key(t)
            if k not in seen:
                seen.add(k)
                yield k, t


class StateSnapshot:
    """The values of every floating tensor reachable from `roots`, taken now.

    Args:
        *roots: the objects to watch (e.g. a ZeRO-3 module, an optimizer).
    """

    def __init__(self, *roots):
        with torch.no_grad():
            self._before = {k: t.detach().clone() for k, t in _tensors(roots)}

    @torch.no_grad()
    def changed(self, *roots) -> list[torch.Tensor]:
        """Copies of the floating tensors reachable from roots that are new or hold other values
        than at the snapshot (each view once, on its own device)."""
        out = []
        for k, t in _tensors(roots):
            old = self._before.get(k)
            if old is None or not torch.equal(old, t.detach()):
                out.append(t.detach().clone())
        return out
