"""Sharded checkpoints: the course's format (notebook 09), and its conversion to and from DCP.

The course's format. A checkpoint is a folder. It describes every parameter of the model
(keyed by its name in `model.named_parameters()`: a tied parameter once, under its first
name; frozen parameters included) as the FLATTENED parameter, cut into chunks: 1-D ranges
[start, end) of its `numel` elements, each stored in one file. Every element of every parameter
is in exactly one chunk; padding is never stored.

    <path>/index.pt     torch.save of {"step": int,      # optimizer steps taken so far
                                       "params": {name: {"shape": tuple of ints,
                                                         "chunks": [(file, start, end), ...]}}}
    <path>/<file>       torch.save of {name: {"param": Tensor[end - start],
                                              "master": ..., "exp_avg": ..., "exp_avg_sq": ...}}
                        for the chunks stored in that file; 1-D tensors on the CPU. "param" is
                        the parameter's value in the model's dtype, "master"/"exp_avg"/
                        "exp_avg_sq" the optimizer's fp32 state of a trainable parameter
                        (absent for a frozen one).

Notebook 09's save writes one data file per rank (each rank writes only what it holds) and one
index; its load reads the index, then only the files whose chunks overlap what the rank holds
now. Both are the learner's. This module holds what is not an exercise:

    read_index(path) -> dict                    the index, checked (ValueError naming the problem)
    format_problems(path) -> list[str]          what in a folder breaks the format (empty: none)
    to_dcp(src, dst)                            course format -> a torch.distributed.checkpoint
    from_dcp(src, dst, names=None)              a DCP checkpoint (FSDP2's keys) -> course format
    fsdp2_save(model, optim, path)              FSDP2 -> DCP, the usual way (a collective)
    fsdp2_load(model, optim, path)              DCP -> FSDP2 at any world size (a collective)

Why a conversion, and which. DCP (torch.distributed.checkpoint) stores each tensor as chunks that
are boxes in the tensor's own shape (offsets and sizes per dimension) and reshards at load:
its planner intersects the boxes a rank asks for with the boxes stored and reads only those. FSDP2
shards each parameter along dim 0, so its chunks are row blocks. A ZeRO flat layout cuts a
parameter anywhere, mid-row: a range [start, end) of a row-major tensor is not one box, but at
most 2·ndim − 1 of them (a partial row, full rows, a partial row; recursively for more
dimensions), each contiguous in memory. `to_dcp` re-describes every stored chunk as those boxes
(no data is re-cut or merged: DCP's planner does every resharding), under FSDP2's keys:
"model.<name>" (the fp32 master where there is one, else the parameter) and
"optim.state.<name>.{exp_avg, exp_avg_sq, step}". `from_dcp` does the reverse for a checkpoint
whose chunks are contiguous ranges (FSDP2's row blocks are): each stored box becomes one
(file, start, end) chunk, in a file per DCP storage file; "param" and "master" both come from
"model.<name>". Hyper-parameters (lr, betas, ...) are not stored: the optimizer that loads is
built with its own (same) ones.
"""
from __future__ import annotations

import math
import os

import torch

__all__ = ["INDEX", "read_file", "read_index", "format_problems", "range_boxes", "to_dcp",
           "from_dcp", "fsdp2_save", "fsdp2_load"]

INDEX = "index.pt"
_STATE = ("master", "exp_avg", "exp_avg_sq")


# ---- the course's format --------------------------------------------------------------------

def read_file(folder: str, name: str):
    """One file of a checkpoint folder, as plain data (torch.load with weights_only=True)."""
    with open(os.path.join(folder, name), "rb") as f:
        return torch.load(f, weights_only=True)


def read_index(path: str) -> dict:
    """The checkpoint's index, with its structure checked.

    Args:
        path: the checkpoint folder.
    Raises:
        ValueError: naming what is missing or malformed, and where.
    """
    file = os.path.join(path, INDEX)
    if not os.path.isfile(file):
        raise ValueError(f"no {INDEX} in {path!r}: the save must write the index there")
    try:
        index = read_file(path, INDEX)
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same clear message
        raise ValueError(f"{file} is not a torch.save file of plain data: {type(e).__name__}: {e}") from None
    if not isinstance(index, dict) or set(index) != {"step", "params"}:
        raise ValueError(f"{file}: expected a dict with keys 'step' and 'params', got "
                         f"{sorted(index) if isinstance(index, dict) else type(index).__name__}")
    if not isinstance(index["step"], int) or isinstance(index["step"], bool):
        raise ValueError(f"{file}: 'step' must be an int, got {index['step']!r:.60}")
    if not isinstance(index["params"], dict):
        raise ValueError(f"{file}: 'params' must be a dict {{name: {{'shape', 'chunks'}}}}")
    for name, entry in index["params"].items():
        where = f"{file}: params[{name!r}]"
        if not isinstance(entry, dict) or not {"shape", "chunks"} <= set(entry):
            raise ValueError(f"{where} must be a dict with 'shape' and 'chunks'")
        try:
            numel = math.prod(int(s) for s in entry["shape"])
            chunks = [(str(f), int(a), int(b)) for f, a, b in entry["chunks"]]
        except (TypeError, ValueError):
            raise ValueError(f"{where}: 'shape' is a tuple of ints, 'chunks' a list of "
                             f"(file, start, end)") from None
        covered = sorted((a, b) for _, a, b in chunks)
        position = 0
        for a, b in covered:
            if a != position or b <= a:
                raise ValueError(f"{where}: chunks {covered} must cover [0, {numel}) exactly once, "
                                 f"without gaps or overlaps (padding is not stored)")
            position = b
        if position != numel:
            raise ValueError(f"{where}: chunks end at {position}, the parameter has {numel} elements")
    return index


def format_problems(path: str) -> list:
    """What in the folder `path` breaks the course's format; [] when nothing does.

    Checks the index, that every file it names exists and holds, for each chunk, tensors of
    the chunk's length. It says nothing about the VALUES (only a load can tell)."""
    try:
        index = read_index(path)
    except ValueError as e:
        return [str(e)]
    problems, files = [], {}
    for name, entry in index["params"].items():
        for fname, a, b in entry["chunks"]:
            if fname not in files:
                try:
                    files[fname] = read_file(path, fname)
                except Exception as e:  # noqa: BLE001
                    files[fname] = None
                    problems.append(f"{fname} (named in the index) cannot be read: {type(e).__name__}")
            data = files[fname]
            if data is None:
                continue
            stored = data.get(name) if isinstance(data, dict) else None
            if not isinstance(stored, dict) or "param" not in stored:
                problems.append(f"{fname} has no {{'param': ...}} entry for {name!r}")
                continue
            for key, t in stored.items():
                if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.numel() != b - a:
                    problems.append(f"{fname}[{name!r}][{key!r}]: expected a 1-D tensor of "
                                    f"{b - a} elements (chunk [{a}, {b})), got "
                                    f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    return problems


# ---- DCP: flat ranges as boxes ----------------------------------------------------------------

def range_boxes(shape, start: int, end: int) -> list:
    """The boxes [(offsets, sizes)] that make up elements [start, end) of a row-major tensor.

    Each box is contiguous in the flattened tensor, and the boxes come in order, so that box i
    is the next prod(sizes_i) elements. A 0-dim tensor is one box ((), ())."""
    shape = tuple(int(s) for s in shape)
    if start >= end:
        return []
    if not shape:
        return [((), ())]
    row = math.prod(shape[1:])                       # elements in one index of dim 0
    first, head = divmod(start, row)
    last, tail = divmod(end, row)

    def inside(i, a, b):                             # part of the single index i of dim 0
        return [((i,) + o, (1,) + s) for o, s in range_boxes(shape[1:], a, b)]
    if first == last:
        return inside(first, head, tail)
    boxes = []
    if head:
        boxes += inside(first, head, row)
        first += 1
    if last > first:
        boxes.append(((first,) + (0,) * (len(shape) - 1), (last - first,) + shape[1:]))
    if tail:
        boxes += inside(last, 0, tail)
    return boxes


def _box_as_range(shape, offsets, sizes):
    """(start, end) of a box that is contiguous in the flattened tensor; None if it is not."""
    shape, offsets, sizes = tuple(shape), tuple(offsets), tuple(sizes)
    d = next((i for i, s in enumerate(sizes) if s != 1), len(sizes))
    if any(sizes[j] != shape[j] for j in range(d + 1, len(shape))):
        return None
    start = 0
    for o, s in zip(offsets, shape):
        start = start * s + o
    return start, start + math.prod(sizes)


def _chunks_class():
    """A tensor subclass DCP accepts: a global tensor of which this process holds some boxes.

    DCP's planner asks a state-dict value for its chunks (__create_chunk_list__), its write items
    (__create_write_items__) and the tensor behind one chunk (__get_tensor_shard__); DTensor
    answers the same three. Defined lazily so that importing zerocourse does not import DCP."""
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
    from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

    class Chunks(torch.Tensor):
        @staticmethod
        def __new__(cls, size, boxes):
            sample = boxes[0][1]
            r = torch.Tensor._make_wrapper_subclass(cls, torch.Size(size), dtype=sample.dtype,
                                                    device=sample.device)
            r._boxes = [(torch.Size(o), t) for o, t in boxes]
            return r

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            raise NotImplementedError(f"zerocourse.checkpoint chunks hold boxes for DCP only ({func})")

        def __create_chunk_list__(self):
            return [ChunkStorageMetadata(offsets=o, sizes=t.size()) for o, t in self._boxes]

        def __create_write_items__(self, fqn, obj):
            return [WriteItem(index=MetadataIndex(fqn, o, i), type=WriteItemType.SHARD,
                              tensor_data=TensorWriteData(
                                  chunk=ChunkStorageMetadata(offsets=o, sizes=t.size()),
                                  properties=TensorProperties(dtype=t.dtype), size=self.size()))
                    for i, (o, t) in enumerate(self._boxes)]

        def __get_tensor_shard__(self, index):
            for o, t in self._boxes:
                if o == index.offset:
                    return t
            raise ValueError(f"no chunk at {index.offset} of {index.fqn}")

    return Chunks


def _as_boxes(shape, start, flat):
    """[(offsets, view of flat)] for the range [start, start + len(flat)) of `shape`."""
    out, used = [], 0
    for offsets, sizes in range_boxes(shape, start, start + flat.numel()):
        n = math.prod(sizes)
        out.append((offsets, flat[used:used + n].view(sizes)))
        used += n
    return out


def to_dcp(src: str, dst: str) -> None:
    """Write the course checkpoint `src` as a DCP checkpoint `dst` (one process, no resharding).

    Keys as FSDP2's state dicts flattened by DCP: "model.<name>", "optim.state.<name>.exp_avg",
    "....exp_avg_sq", "....step". Load it with fsdp2_load (or dcp.load) at any world size."""
    import torch.distributed.checkpoint as dcp
    Chunks = _chunks_class()
    index = read_index(src)
    files = {}
    boxes: dict[str, list] = {}
    shapes: dict[str, tuple] = {}
    for name, entry in index["params"].items():
        shape = tuple(entry["shape"])
        for fname, a, b in entry["chunks"]:
            if fname not in files:
                files[fname] = read_file(src, fname)
            stored = files[fname][name]
            value = stored.get("master", stored["param"])       # the fp32 master if trainable
            pieces = {"model." + name: value}
            if "exp_avg" in stored:
                pieces["optim.state." + name + ".exp_avg"] = stored["exp_avg"]
                pieces["optim.state." + name + ".exp_avg_sq"] = stored["exp_avg_sq"]
            for key, flat in pieces.items():
                boxes.setdefault(key, []).extend(_as_boxes(shape, a, flat.contiguous()))
                shapes[key] = shape
    state = {key: Chunks(shapes[key], b) for key, b in boxes.items() if b}
    for name in index["params"]:
        if "optim.state." + name + ".exp_avg" in state:
            state["optim.state." + name + ".step"] = torch.tensor(float(index["step"]), device="cpu")
    dcp.save(state, checkpoint_id=dst, no_dist=True)


def from_dcp(src: str, dst: str, names=None) -> None:
    """Write the DCP checkpoint `src` (FSDP2's keys) in the course's format at `dst`.

    Args:
        src: a DCP folder whose "model.<name>" chunks are contiguous ranges (FSDP2's are).
        dst: the course checkpoint folder to write.
        names: parameter names to keep (default: every "model.<name>"); pass the model's
            named_parameters() names to drop the second name of a tied weight.
    """
    import torch.distributed.checkpoint as dcp
    Chunks = _chunks_class()
    meta = dcp.FileSystemReader(src).read_metadata()
    keys = meta.state_dict_metadata
    if names is None:
        names = [k[len("model."):] for k in keys if k.startswith("model.")]
    step = None
    request, plan = {}, []            # DCP key -> Chunks to fill; (name, key, file, start, buffer)
    for name in names:
        if "model." + name not in keys:
            raise ValueError(f"{src}: no 'model.{name}' in the checkpoint (keys: "
                             f"{sorted(k for k in keys if k.startswith('model.'))[:6]}...)")
        md = keys["model." + name]
        wanted = ["model." + name] + [f"optim.state.{name}.{s}" for s in ("exp_avg", "exp_avg_sq")
                                      if f"optim.state.{name}.{s}" in keys]
        for key in wanted:
            boxes = []
            for chunk in keys[key].chunks:
                span = _box_as_range(md.size, chunk.offsets, chunk.sizes)
                if span is None:
                    raise ValueError(f"{src}: chunk {tuple(chunk.offsets)}+{tuple(chunk.sizes)} of {key} "
                                     f"is not a contiguous range of the flattened tensor")
                buf = torch.empty(tuple(chunk.sizes), dtype=keys[key].properties.dtype, device="cpu")
                boxes.append((tuple(chunk.offsets), buf))
                stored_in = meta.storage_data[_metadata_index(key, chunk.offsets)].relative_path
                plan.append((name, key, stored_in, span, buf))
            request[key] = Chunks(md.size, boxes)
        step_key = f"optim.state.{name}.step"
        if step_key in keys and step is None:
            request[step_key] = torch.zeros((), device="cpu")
            step = step_key
    dcp.load(request, checkpoint_id=src, no_dist=True)
    os.makedirs(dst, exist_ok=True)
    out_files: dict[str, dict] = {}
    params = {name: {"shape": tuple(int(s) for s in keys["model." + name].size), "chunks": []}
              for name in names}
    for name, key, stored_in, (a, b), buf in plan:
        fname = "from_" + os.path.splitext(stored_in)[0].strip("_") + ".pt"
        entry = out_files.setdefault(fname, {}).setdefault(name, {})
        flat = buf.reshape(-1).clone()
        if key.startswith("model."):
            entry["param"] = flat
            if f"optim.state.{name}.exp_avg" in keys:
                entry["master"] = flat.float().clone()
            params[name]["chunks"].append((fname, a, b))
        else:
            entry[key.rsplit(".", 1)[1]] = flat
    # a chunk of the model key and of its moments share offsets: all land in one entry
    out_files[INDEX] = {"step": int(request[step].item()) if step else 0, "params": params}
    for fname, content in out_files.items():
        target = os.path.join(dst, fname)
        torch.save(content, target)


def _metadata_index(fqn, offsets):
    from torch.distributed.checkpoint.metadata import MetadataIndex
    return MetadataIndex(fqn, offsets)


# ---- FSDP2 through DCP ------------------------------------------------------------------------

def _fsdp2_target(model, optim):
    """(state dict of tensors for dcp.load, param_groups, aliases): FSDP2's model and optimizer
    state, the second name of a tied weight left out (DCP stores it once per name otherwise)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    msd = get_model_state_dict(model)
    osd = get_optimizer_state_dict(model, optim)
    first = {id(p): n for n, p in model.named_parameters()}
    aliases = {n: first[id(p)] for n, p in model.named_parameters(remove_duplicate=False)
               if first[id(p)] != n}
    model_sd = {k: v for k, v in msd.items() if k not in aliases}
    return {"model": model_sd, "optim": {"state": osd["state"]}}, osd["param_groups"], aliases


def fsdp2_save(model, optim, path: str) -> None:
    """Save an FSDP2 model and its optimizer with DCP (a collective: every rank calls it)."""
    import torch.distributed.checkpoint as dcp
    state, _, _ = _fsdp2_target(model, optim)
    dcp.save(state, checkpoint_id=path)


def fsdp2_load(model, optim, path: str) -> None:
    """Load a DCP checkpoint (FSDP2's keys, any world size) into an FSDP2 model and optimizer.

    Only tensors are read (model.*, optim.state.*): the optimizer keeps its own param_groups."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict
    state, groups, aliases = _fsdp2_target(model, optim)
    dcp.load(state, checkpoint_id=path)
    model_sd = dict(state["model"])
    model_sd.update({alias: model_sd[name] for alias, name in aliases.items()})
    set_model_state_dict(model, model_sd)
    set_optimizer_state_dict(model, optim, {"state": state["optim"]["state"], "param_groups": groups})
