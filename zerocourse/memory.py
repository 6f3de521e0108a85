"""What a rank holds: bytes of model states, and peaks of memory inside a region.

    measure_state_bytes(model, optimizer=None, by_dtype=False) -> dict bytes held now, by category:
        {"params", "grads", "optimizer", "other", "total"} (by_dtype: and per dtype in each)
    format_bytes(n) -> str                              1500000 -> "1.50 MB" (decimal, GB = 10**9)
    PeakTracker()                                       with PeakTracker() as mem: ...
        .current_bytes  bytes allocated inside the region and still alive
        .peak_bytes     the most that were ever alive at once
        .timeline       [(event_index, live_bytes, label)], one entry per op, free or mark
        .mark(label)    add a named point to the timeline
        .reset_peak()   peak_bytes = current_bytes (e.g. to measure only the backward)

Both count bytes the way an allocator does: per STORAGE, not per tensor. A view (a slice of a
flat buffer, a transpose, p.data) shares its base's storage and costs nothing more, so counting
tensor.numel() * element_size() would count shared memory twice. We count each distinct
untyped_storage() once, with its nbytes(). RSS would be useless here: it is dominated by the
Python and torch runtime (the first torch.optim import alone adds ~66 MB).

measure_state_bytes does not know where an optimizer keeps its state: learners write their own and
may store it in lists, dicts keyed by parameter, one flat tensor, nested objects or even on the
model. So it walks every object reachable from the model and the optimizer and collects the
tensors it finds. Each storage goes to the first matching category, in priority order:
    params     storages of model.parameters()
    grads      storages of p.grad for those parameters
    optimizer  any other storage reachable from the optimizer
    other      any other storage reachable from the model (buffers, a ZeRO-3 module's shards, ...)
The walk follows attributes (__dict__, __slots__), lists, tuples, dicts (keys and values), sets,
a tensor's .grad and its Python attributes. It does not enter functions, classes, Python modules
or unknown iterables (iterating a generator would consume it), nor closures of hooks.

PeakTracker is a TorchDispatchMode: it sees every aten op run inside the region. A tensor
returned by an op whose storage is not one of the op's inputs is a new allocation; we keep a weak
reference to its storage, whose callback subtracts the bytes when the storage is freed (del,
p.data = new_tensor, going out of scope, p.grad = None). Views and in-place ops return an input's
storage, so they add nothing. Storage.resize_ is not an op, so while a tracker is active it is
wrapped to see storages grow and shrink (FSDP-style freeing). The mode composes with other
TorchDispatchModes (e.g. the comm tracer) nested inside or outside it.

Tensors autograd saves for backward are storages like any other: read current_bytes at the end of
a forward and it counts the activations AND every full weight a saved view still holds (e.g. the
W.t() that F.linear saved of a p.data that was later swapped for an empty tensor). The same forward
of an unsharded model gives the activations alone; the difference is what a ZeRO-3 kept gathered.
"""
import collections
import functools
import types
import weakref

import torch
from torch.utils._python_dispatch import (TorchDispatchMode, is_traceable_wrapper_subclass,
                                          is_traceable_wrapper_subclass_type)
from torch.utils._pytree import tree_flatten

# -----------------------------------------------------------------------------
# storages


def _storages(t):
    """The untyped storages behind a tensor (several for a wrapper subclass such as DTensor)."""
    if is_traceable_wrapper_subclass(t):
        inner_names, _ = t.__tensor_flatten__()
        inner = (getattr(t, name) for name in inner_names)
        return [st for x in inner if isinstance(x, torch.Tensor) for st in _storages(x)]
    if t.layout != torch.strided or t.device.type == "meta":
        return []  # sparse or shape-only tensors: no plain storage to count
    try:
        return [t.untyped_storage()]
    except (RuntimeError, NotImplementedError):
        return []  # e.g. functorch's batched tensors have no storage of their own


def _storage_key(st):
    # Two views of one buffer share a storage; two storage objects with the same data_ptr
    # and size are the same memory. 0-byte storages (freed or empty tensors) hold nothing.
    n = st.nbytes()
    return (st.data_ptr(), n) if n > 0 else None


# -----------------------------------------------------------------------------
# measure_state_bytes

# Objects the walk never enters: atoms, and things that lead to the whole interpreter.
_ATOMS = (str, bytes, bytearray, int, float, complex, bool, type(None), range, slice,
          torch.dtype, torch.device, torch.Size, torch.Generator, torch.UntypedStorage)
_OPAQUE = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
           types.CodeType, types.FrameType, types.GeneratorType, functools.partial,
           weakref.ReferenceType, weakref.ProxyType)
_CONTAINERS = (list, tuple, set, frozenset, collections.deque)


def _reachable_tensors(root, max_depth=100):
    """Every tensor reachable from root, each once (cycle-safe, depth-limited, iterative)."""
    seen = set()
    stack = [(root, 0)]
    while stack:
        obj, depth = stack.pop()
        if id(obj) in seen or depth > max_depth or isinstance(obj, _ATOMS + _OPAQUE):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            yield obj
            children = list(getattr(obj, "__dict__", {}).values())  # e.g. p.shard = ...
            if obj.is_leaf and obj.grad is not None:                # .grad of a non-leaf warns
                children.append(obj.grad)
        elif isinstance(obj, dict):
            children = list(obj.keys()) + list(obj.values())
        elif isinstance(obj, _CONTAINERS):
            children = list(obj)
        else:
            children = list(getattr(obj, "__dict__", {}).values())
            for cls in type(obj).__mro__:
                slots = cls.__dict__.get("__slots__", ())
                for name in [slots] if isinstance(slots, str) else slots:
                    if name not in ("__dict__", "__weakref__") and hasattr(obj, name):
                        children.append(getattr(obj, name))
        stack.extend((child, depth + 1) for child in children)


def measure_state_bytes(model, optimizer=None, by_dtype=False):
    """Bytes of the storages reachable from model and optimizer, each storage counted once.

    Args:
        model: an nn.Module (its parameters, their grads, and anything else it references).
        optimizer: any object (a torch optimizer, MixedPrecisionAdam, a learner's ZeRO optimizer).
        by_dtype: also split every category by the dtype of the first tensor seen on each storage
            (e.g. to tell a ZeRO optimizer's bf16 gradient shard from its fp32 state).

    Returns:
        {"params": int, "grads": int, "optimizer": int, "other": int, "total": int}, and with
        by_dtype, "by_dtype": {category: {"torch.bfloat16": int, ...}}.
    """
    counted = {}  # storage key -> (category, dtype), first category wins

    def add(tensors, category):
        for t in tensors:
            for st in _storages(t):
                key = _storage_key(st)
                if key is not None and key not in counted:
                    counted[key] = (category, str(t.dtype))

    params = list(model.parameters())
    add(params, "params")
    add([p.grad for p in params if p.grad is not None], "grads")
    if optimizer is not None:
        add(_reachable_tensors(optimizer), "optimizer")
    add(_reachable_tensors(model), "other")

    result = dict.fromkeys(["params", "grads", "optimizer", "other"], 0)
    split = {category: {} for category in result}
    for (_, nbytes), (category, dtype) in counted.items():
        result[category] += nbytes
        split[category][dtype] = split[category].get(dtype, 0) + nbytes
    result["total"] = sum(result.values())
    if by_dtype:
        result["by_dtype"] = split
    return result


def format_bytes(n):
    """A human-readable byte count in decimal units: 1500000 -> '1.50 MB' (GB = 10**9).

    Args:
        n: number of bytes (int or float).
    """
    sign, n = ("-" if n < 0 else ""), abs(n)
    if n < 1000:
        return f"{sign}{n:g} B"
    for unit in ["kB", "MB", "GB", "TB", "PB"]:
        n /= 1000
        if n < 1000 or unit == "PB":
            return f"{sign}{n:.2f} {unit}"


# -----------------------------------------------------------------------------
# PeakTracker

# Storage.resize_ bypasses the dispatcher, so active trackers wrap it (and unwrap it when the
# last one exits). FSDP-style code frees a gathered buffer with storage.resize_(0).
_ACTIVE_TRACKERS = []
_original_resize = torch.UntypedStorage.resize_


def _tracked_resize(st, size):
    before = st.nbytes()
    result = _original_resize(st, size)
    for tracker in list(_ACTIVE_TRACKERS):
        tracker._on_resize(st, before)
    return result


class PeakTracker(TorchDispatchMode):
    """Tracks bytes of tensor storages allocated inside a region and still alive.

    After the region, current_bytes keeps falling as the region's tensors die: what is left
    is what the region allocated and kept (e.g. optimizer state created by the first step).

        with PeakTracker() as mem:
            loss_fn(model(x), y).backward()
            mem.mark("backward done")
        print(format_bytes(mem.peak_bytes))

    On a CUDA rank the caching allocator is read too, as a second measurement of the same
    region: cuda_peak_bytes = torch.cuda.max_memory_allocated() during the region minus what was
    allocated when it began (None when the rank's device is the CPU). It counts every allocation of the process on
    that GPU (NCCL's buffers, the allocator's rounding), so it is at least peak_bytes.
    """

    def __init__(self):
        super().__init__()
        self.current_bytes = 0
        self.peak_bytes = 0
        self.cuda_peak_bytes = None     # set on leaving the region, on a CUDA rank only
        self._cuda_start = None
        self.timeline = []   # [(event_index, live_bytes, label)]
        self._live = {}      # id(storage) -> [weakref, baseline_nbytes, counted_nbytes]
        self._active = False

    # -- public API -----------------------------------------------------------

    def mark(self, label):
        """Add a named point (label) at the current live bytes to the timeline."""
        self._event(str(label))

    def reset_peak(self):
        """Forget the peak so far: from now on peak_bytes >= current_bytes only."""
        self.peak_bytes = self.current_bytes

    # -- the region -----------------------------------------------------------

    def __enter__(self):
        if not _ACTIVE_TRACKERS:
            torch.UntypedStorage.resize_ = _tracked_resize
        _ACTIVE_TRACKERS.append(self)
        self._active = True
        from zerocourse.devices import rank_device
        device = rank_device()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            self._cuda_start = (device, torch.cuda.memory_allocated(device))
        return super().__enter__()

    def __exit__(self, *exc):
        if self._cuda_start is not None:
            device, start = self._cuda_start
            self.cuda_peak_bytes = torch.cuda.max_memory_allocated(device) - start
        self._active = False
        _ACTIVE_TRACKERS.remove(self)
        if not _ACTIVE_TRACKERS:
            torch.UntypedStorage.resize_ = _original_resize
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(is_traceable_wrapper_subclass_type(t) for t in types):
            return NotImplemented  # let DTensor & co. unwrap; we then see the ops on the local tensors
        # Sizes of the inputs' storages before the op: an in-place op or a view returns one of
        # them (no new memory); only a resize_ can make one grow.
        inputs = {}
        for x in tree_flatten((args, kwargs))[0]:
            for st in (_storages(x) if isinstance(x, torch.Tensor) else
                       [x] if isinstance(x, torch.UntypedStorage) else []):
                inputs[id(st)] = st.nbytes()
        out = func(*args, **kwargs)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                for st in _storages(t):
                    self._see(st, baseline=inputs.get(id(st), 0))
        self._event(str(func))
        return out

    # -- bookkeeping ----------------------------------------------------------

    def _see(self, st, baseline):
        """Count st's growth beyond `baseline` bytes (0 for a storage allocated in the region)."""
        entry = self._live.get(id(st))
        if entry is None:
            if st.nbytes() <= baseline:
                return  # a pre-existing storage that did not grow: not ours
            # The callback runs when the storage is freed, before its id can be reused.
            ref = weakref.ref(st, functools.partial(self._on_free, id(st)))
            entry = self._live[id(st)] = [ref, baseline, 0]
        counted = max(0, st.nbytes() - entry[1])
        self._add(counted - entry[2])
        entry[2] = counted

    def _on_resize(self, st, before):
        self._see(st, baseline=before)
        if self._active:
            self._event("resize_")

    def _on_free(self, key, _ref):
        entry = self._live.pop(key, None)
        if entry is not None and entry[2] > 0:
            self._add(-entry[2])
            if self._active:
                self._event("free")

    def _add(self, nbytes):
        self.current_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.current_bytes)

    def _event(self, label):
        self.timeline.append((len(self.timeline), self.current_bytes, label))


# The meter's name before notebook 01's formula took it back (learners' earlier copies import it).
model_state_bytes = measure_state_bytes
