"""Which FULL (gathered) parameters exist right now, and how many bytes they hold: a ZeRO-3 meter.

    slots = parameter_slots(model)     # BEFORE wrapping: the full shapes of every parameter
    zero3 = ZeRO3Module(model)         # (an implementation may shrink p.data to 0 elements)
    full_param_bytes(model, slots) -> (bytes, count)   a one-off look, e.g. between two steps

    with GatherTracker(model, slots) as g:   # inside a rank, around forward / backward / step
        loss = loss_fn(zero3_model(x), y); g.mark("forward done")
        loss.backward();                   g.mark("backward done")
    g.peak_bytes, g.peak_count        the most full-parameter bytes (and parameters) alive at once
    g.timeline                        [(index, seconds, bytes, names, label)], one per sample
    g.unit_bytes()                    {module name: bytes of the parameters it owns directly}

What counts as "materialized". parameter_slots(module) records every parameter SLOT of the
module: (submodule, attribute name, full shape, bytes); take it BEFORE the model is sharded (without
`slots`, the tracker records them when it is created, and shapes already shrunk would be wrong). At each sample it looks at what each slot
holds NOW: `submodule._parameters[name]`, or a plain tensor attribute of that name (implementations
that delete the Parameter and set a view in its place, as FSDP1 does). It does not remember the
Parameter objects: a ZeRO-3 implementation may swap `p.data`, resize storages, or put new
Parameters in the slots. A slot holds a full parameter when its tensor has the parameter's full
shape AND its storage has at least the parameter's bytes (a 0-byte storage, a shard, an empty
placeholder or an expanded scalar do not count). Bytes are summed per STORAGE, each storage once:
a tied weight (one tensor in two slots) or several views of one flat buffer count once, with the
buffer's whole size (padding included).

When it samples. It is a TorchDispatchMode: before and after every aten op run inside the region
(forward, backward, optimizer step, collectives), plus at every mark(). Between ops only Python
runs, so this sees every state the parameters are in when an op could use them.

Limits (what it does not see):
- Full copies kept OUTSIDE the parameter slots are not counted: a private cache of gathered
  tensors (pair it with zerocourse.memory.measure_state_bytes, which counts everything reachable
  from the model and the optimizer), and tensors autograd saved for backward (a p.data swap leaves
  the slots empty while a saved W.t() keeps the full weight alive: pair it with
  zerocourse.memory.PeakTracker around the forward, which counts every storage the forward
  allocated and left alive, saved tensors included, and compare with the unsharded forward).
- With world_size 1 a shard is the whole parameter: "full" and "shard" cannot be told apart.
- Parameters created after parameter_slots() (new slots) are not watched; full shapes are those
  recorded then.
- The wrapped model must be the tracked object itself (a deep copy is a different model).
- Backward ops run on autograd's thread on GPU builds; on CPU they run in the calling thread and
  are seen. The mode is per-thread, so ops in other threads (e.g. an async prefetch thread) are
  missed, though their effects are seen at the next sample.
"""
from __future__ import annotations

import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["GatherTracker", "full_param_bytes", "parameter_slots"]


def parameter_slots(module):
    """[(qualified name, submodule, attribute, shape, nbytes)] of every parameter slot.

    A tied weight appears once per owner (e.g. "embed.weight" and "head.weight").
    """
    slots = []
    for mod_name, mod in module.named_modules(remove_duplicate=False):
        for attr, p in mod._parameters.items():
            if p is not None:
                name = f"{mod_name}.{attr}" if mod_name else attr
                slots.append((name, mod, attr, tuple(p.shape), p.numel() * p.element_size()))
    return slots


def _slot_tensor(mod, attr):
    t = mod._parameters.get(attr)
    if t is None:
        t = mod.__dict__.get(attr)
    return t if isinstance(t, torch.Tensor) else None


def _sample(slots):
    """(bytes, names) of the full parameters the slots hold now, storages counted once."""
    seen, total, names = set(), 0, []
    for name, mod, attr, shape, nbytes in slots:
        t = _slot_tensor(mod, attr)
        if t is None or tuple(t.shape) != shape or t.layout != torch.strided or t.device.type == "meta":
            continue
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            continue
        if st.nbytes() < nbytes or st.nbytes() == 0:
            continue
        names.append(name)
        key = (st.data_ptr(), st.nbytes())
        if key not in seen:
            seen.add(key)
            total += st.nbytes()
    return total, names


def _count(names):
    return len(names)      # slots holding a full parameter (a tied weight fills two)


def full_param_bytes(module, slots=None):
    """(bytes, count): full parameters the module's slots hold now (count = slots holding one).

    Args:
        module: the model (the original, sharded in place).
        slots: parameter_slots(module) taken before sharding (default: taken now).
    """
    total, names = _sample(slots if slots is not None else parameter_slots(module))
    return total, _count(names)


class GatherTracker(TorchDispatchMode):
    """Samples the bytes of full parameters alive at every aten op inside the region.

    Args:
        module: the model whose parameters are sharded (the ORIGINAL module, wrapped in place).
        slots: parameter_slots(module) taken BEFORE sharding (default: taken now).
        keep_timeline: record one timeline entry per sample (set False for long runs).
    """

    def __init__(self, module, slots=None, keep_timeline=True):
        super().__init__()
        self.module = module
        self.slots = slots if slots is not None else parameter_slots(module)
        self.keep_timeline = keep_timeline
        self.timeline = []       # [(index, seconds since enter, bytes, names tuple, label)]
        self.peak_bytes = 0
        self.peak_count = 0
        self.current_bytes = 0
        self.current_count = 0
        self.samples = 0
        self._t0 = time.perf_counter()
        self._last_names = ()

    def unit_bytes(self):
        """{module name: bytes of the parameters it owns directly} (a ZeRO-3 unit each), full sizes."""
        out = {}
        for name, mod, attr, shape, nbytes in self.slots:
            mod_name = name.rsplit(".", 1)[0] if "." in name else "<root>"
            out[mod_name] = out.get(mod_name, 0) + nbytes
        return out

    def sample(self, label=""):
        total, names = _sample(self.slots)
        names = tuple(names)
        if names == self._last_names:
            names = self._last_names      # share one tuple while nothing changes
        self._last_names = names
        self.current_bytes, self.current_count = total, _count(names)
        self.peak_bytes = max(self.peak_bytes, total)
        self.peak_count = max(self.peak_count, self.current_count)
        if self.keep_timeline:
            self.timeline.append((self.samples, time.perf_counter() - self._t0, total, names, label))
        self.samples += 1
        return total

    def mark(self, label):
        """Sample now, with a label in the timeline (e.g. "forward done")."""
        return self.sample(str(label))

    def reset_peak(self):
        self.peak_bytes, self.peak_count = self.current_bytes, self.current_count

    def __enter__(self):
        self._t0 = time.perf_counter()
        out = super().__enter__()
        self.sample("enter")
        return out

    def __exit__(self, *exc):
        self.sample("exit")
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        label = str(func.overloadpacket.__name__) if hasattr(func, "overloadpacket") else str(func)
        self.sample(label)
        out = func(*args, **(kwargs or {}))
        self.sample(label)
        return out
