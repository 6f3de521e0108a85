"""What went over the wire: a tracer for torch.distributed collectives.

`CommTracer` is a context manager used inside a rank. It sits below
torch.distributed (a TorchDispatchMode sees every `c10d::*` op, whoever calls
it: the learner's `dist.all_reduce`, DDP's C++ reducer, FSDP), so code cannot
hide a collective from it by calling torch through another name.

For every collective and point-to-point call it records the op, dtype, numel,
the full-tensor bytes S, and the bytes THIS rank sends under the ring model:

    all_reduce       2 (N-1)/N * S      S = bytes of the tensor reduced
    reduce_scatter     (N-1)/N * S      S = bytes of the full (unscattered) input
    all_gather         (N-1)/N * S      S = bytes of the full (gathered) output
    all_to_all         (N-1)/N * S      S = bytes of this rank's input
    broadcast        S, or 0            pipelined ring from src: every rank but the
                                        last one in ring order forwards S
    reduce             (N-1)/N * S      ring reduce-scatter, then chunks to dst
    gather           S/N or 0           every rank but dst sends its input
    scatter          (N-1)/N * S or 0   src sends every chunk but its own
    send             S                  recv sends 0, barrier sends 0

Usage inside a rank:

    with CommTracer() as tracer:
        train_step(...)
    tracer.summary()   # {"calls": {...}, "sent_bytes": ..., "by_op": {...}}

The summary is a plain dict, so a rank can return it through `launch`.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

# c10d op name (as the dispatcher sees it) -> the course's name for it.
_OP_NAMES = {
    "allreduce_": "all_reduce",
    "allreduce_coalesced_": "all_reduce",
    "broadcast_": "broadcast",
    "_allgather_base_": "all_gather",
    "allgather_": "all_gather",
    "allgather_coalesced_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather",
    "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "alltoall_": "all_to_all",
    "alltoall_base_": "all_to_all",
    "reduce_": "reduce",
    "gather_": "gather",
    "scatter_": "scatter",
    "send": "send",
    "recv_": "recv",
    "recv_any_source_": "recv",
    "barrier": "barrier",
    "monitored_barrier_": "barrier",
}


def ring_bytes_sent(op: str, full_bytes: float, world_size: int, rank: int = 0, root: int = 0) -> float:
    """Bytes one rank sends for one collective under the ring model.

    Args:
        op: the course's op name ("all_reduce", "all_gather", ...).
        full_bytes: S, the bytes of the full tensor (see the module docstring).
        world_size: N, ranks in the group.
        rank: this rank's rank in the group (matters for broadcast/gather/scatter).
        root: src/dst rank of a rooted collective.
    """
    n = world_size
    if n <= 1 or op in ("barrier", "recv"):
        return 0.0
    if op == "all_reduce":
        return 2 * (n - 1) / n * full_bytes
    if op in ("all_gather", "reduce_scatter", "all_to_all", "reduce"):
        return (n - 1) / n * full_bytes
    if op == "broadcast":
        # Pipelined ring starting at root: everyone but the last in line forwards.
        return 0.0 if (rank - root) % n == n - 1 else float(full_bytes)
    if op == "gather":
        return 0.0 if rank == root else full_bytes / n
    if op == "scatter":
        return (n - 1) / n * full_bytes if rank == root else 0.0
    if op == "send":
        return float(full_bytes)
    raise ValueError(f"unknown op {op!r}; expected one of {sorted(set(_OP_NAMES.values()))}")


@dataclass
class CommRecord:
    """One traced call, as seen by one rank."""
    op: str                 # course name: all_reduce, all_gather, reduce_scatter, ...
    dtype: str              # e.g. "torch.bfloat16"
    numel: int              # elements of the full tensor S describes
    full_bytes: int         # S
    sent_bytes: float       # ring-model bytes this rank sends
    world_size: int         # N of the group used
    t_start: float          # perf_counter() when the call was issued
    t_end: float            # when it returned (async ops: when it was enqueued)
    label: str = ""         # the tracer's current mark (e.g. "forward layer 2")


def _tensors(x) -> list[torch.Tensor]:
    """Flatten tensors out of a (nested) list/tuple argument."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _tensors(item)]
    return []


def _nbytes(ts: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def _group_of(args) -> tuple[int, int]:
    """(world_size, rank) of the process group passed to a c10d op."""
    for a in args:
        if isinstance(a, torch.ScriptObject):
            try:
                pg = dist.ProcessGroup.unbox(a)
                return pg.size(), pg.rank()
            except Exception:  # not a process group (e.g. a ReduceOp): keep looking
                continue
    return dist.get_world_size(), dist.get_rank()


def describe_call(opname: str, args) -> dict | None:
    """Parse one c10d op's arguments into {op, dtype, numel, full_bytes, sent_bytes, world_size}.

    Args:
        opname: the dispatcher's op name without namespace (e.g. "allreduce_").
        args: the positional arguments the op received.
    Returns None for ops that are not communication.
    """
    op = _OP_NAMES.get(opname)
    if op is None:
        return None
    n, rank = _group_of(args)
    root = 0
    if op in ("all_gather", "gather"):
        full = _tensors(args[0])             # outputs hold the full result
    elif op in ("reduce_scatter", "scatter"):
        full = _tensors(args[1])             # inputs hold the full tensor
    elif op == "all_to_all":
        full = _tensors(args[1])
    elif op == "barrier":
        full = []
    else:                                    # all_reduce, broadcast, reduce, send, recv
        full = _tensors(args[0])
    if op == "broadcast":
        root = int(args[2])
    elif op == "reduce":
        root = int(args[3])
    elif op in ("gather", "scatter"):
        root = int(args[3])
    if op == "gather" and rank != root:
        # Non-root ranks pass no outputs: S is N times their input.
        full = _tensors(args[1]) * n
    if op == "scatter" and rank != root:
        full = _tensors(args[0]) * n
    s = _nbytes(full)
    dtype = str(full[0].dtype) if full else ""
    return dict(op=op, dtype=dtype, numel=sum(t.numel() for t in full), full_bytes=s,
                sent_bytes=ring_bytes_sent(op, s, n, rank, root), world_size=n)


class CommTracer(TorchDispatchMode):
    """Record every collective and point-to-point call made while active.

    Args:
        include_barrier: also record barriers (they move no data).
    """

    def __init__(self, include_barrier: bool = False):
        super().__init__()
        self.records: list[CommRecord] = []
        self.include_barrier = include_barrier
        self._label = ""

    def mark(self, label: str) -> None:
        """Tag the following records with `label` (for timelines)."""
        self._label = label

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace != "c10d":
            return func(*args, **kwargs)
        info = describe_call(func._opname, args)
        t0 = time.perf_counter()
        out = func(*args, **kwargs)
        if info is not None and (info["op"] != "barrier" or self.include_barrier):
            self.records.append(CommRecord(**info, t_start=t0, t_end=time.perf_counter(),
                                           label=self._label))
        return out

    # ---- summaries -------------------------------------------------------
    @property
    def sent_bytes(self) -> float:
        """Total ring-model bytes this rank sent while tracing."""
        return sum(r.sent_bytes for r in self.records)

    def calls(self) -> dict[str, int]:
        """Number of calls per op, e.g. {"all_reduce": 1}."""
        out: dict[str, int] = {}
        for r in self.records:
            out[r.op] = out.get(r.op, 0) + 1
        return out

    def summary(self) -> dict:
        """A picklable summary: calls and bytes per op, plus every record as a dict."""
        by_op: dict[str, dict] = {}
        for r in self.records:
            d = by_op.setdefault(r.op, {"calls": 0, "full_bytes": 0, "sent_bytes": 0.0})
            d["calls"] += 1
            d["full_bytes"] += r.full_bytes
            d["sent_bytes"] += r.sent_bytes
        return {"calls": self.calls(), "sent_bytes": self.sent_bytes, "by_op": by_op,
                "records": [asdict(r) for r in self.records]}
