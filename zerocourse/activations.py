"""What autograd keeps for backward: bytes of saved tensors, measured from the outside.

`SavedTensorsMeter` is a context manager around a forward pass. Through
torch.autograd.graph.saved_tensors_hooks it sees every tensor an autograd node saves for its
backward, and counts each underlying STORAGE once (q, k and v saved as three views of one qkv
buffer cost one buffer). Parameters (and any tensor passed in `exclude`) are model state, not
activations: they are left out.

    with SavedTensorsMeter(exclude=model.parameters()) as meter:
        out = block(x)
    meter.bytes        # activation bytes this forward keeps alive for backward
    meter.records      # [(nbytes, shape, dtype)] one per storage, in the order saved

Caveat: torch.utils.checkpoint (use_reentrant=False) installs its own saved-tensor hooks inside
the checkpointed region, so a meter outside it sees nothing saved there; what checkpointing
really keeps (each region's inputs) is measured with zerocourse.memory.PeakTracker (bytes
allocated by a forward and still alive after it).

An instrument, not an answer: it measures; the notebooks derive the formula.
"""
from __future__ import annotations

import torch


class SavedTensorsMeter:
    """Bytes of tensors saved for backward while active, deduplicated by storage.

    Args:
        exclude: tensors (e.g. model.parameters()) whose storages are not activations.
    """

    def __init__(self, exclude=()):
        self._excluded = {t.untyped_storage().data_ptr() for t in exclude}
        self._seen: dict[int, tuple[int, tuple, str]] = {}
        self._hooks = None

    def _pack(self, t):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in self._excluded and ptr not in self._seen:
            self._seen[ptr] = (storage.nbytes(), tuple(t.shape), str(t.dtype))
        return t                                 # keep the tensor itself: we only look

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        return False

    @property
    def bytes(self) -> int:
        """Total bytes of the distinct storages saved for backward."""
        return sum(n for n, _, _ in self._seen.values())

    @property
    def records(self) -> list[tuple[int, tuple, str]]:
        """[(nbytes, shape, dtype)] per distinct storage, in the order first saved."""
        return list(self._seen.values())
