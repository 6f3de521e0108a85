"""The rank's device: one rule for every tensor a cell, a test or an instrument creates.

    device = rank_device()          # inside a rank: cuda:<rank> under NCCL, cpu under gloo
    model = ToyModel(device=device)                   # built on it (same values on every device)
    inputs, targets = make_toy_batch(..., device=device)
    flat = torch.zeros(n, device=device)              # or torch.zeros_like / t.new_zeros(...)

The rule: inside a rank, every tensor is created ON the rank's device (a `device=` argument, a
`*_like`/`new_*` of a tensor already there, or code under `with torch.device(device):`), and every
model and batch is moved there. NCCL takes CUDA tensors only, so a tensor created without a
device (on the CPU) fails the first collective it reaches on a GPU machine, and an operation that
mixes it with CUDA tensors fails too. Under gloo (CPU) nothing fails, which is why the course has
a proxy that makes those mistakes loud on a laptop:

    ZEROCOURSE_DEVICE_PROXY=1      (read by `launch` at each launch; `make test` sets it for the
                                    reference solutions, the course's cells and its tests)

In a rank under the proxy, a tensor created without a device by code outside torch (a notebook
cell, a test, zerocourse, or a torch.nn layer built there) lands on the `meta` device, which holds
no data and which no collective accepts: the same code that would fail on a GPU fails here, with
"... is on meta ...". Tensors torch creates for itself (the optimizers' step counters, which stay on
the CPU on a GPU machine too) are left alone.

Collectives check their tensors (`check_collective_devices`, called by the launcher's watch on
every torch.distributed call): a tensor on another device than the rank's gets an error that
names the call, the argument and both devices, instead of NCCL's "Tensors must be CUDA and dense".
"""
from __future__ import annotations

import functools
import os
import sys

import torch

# The rank's device, set by the rank itself (zerocourse._rank) once its process group exists.
_RANK_DEVICE: torch.device | None = None

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
# torch's own layers take a `device=`: what they create without one, the caller forgot.
_TORCH_LAYERS = os.path.join(_TORCH_DIR, "nn", "modules") + os.sep


def rank_device() -> torch.device:
    """The device of this rank: cuda:<local rank> under NCCL, cpu under gloo (and outside ranks).

    Returns:
        a torch.device. Create every tensor of a rank on it; move models and batches to it.
    """
    return _RANK_DEVICE if _RANK_DEVICE is not None else torch.device("cpu")


# Factory functions whose device follows their data when the data is a tensor.
_FOLLOW_DATA = {"tensor", "as_tensor", "asarray"}


def _proxied(name: str, fn):
    """torch.<name>, sending a tensor created without a device by code outside torch to meta."""
    follow = name in _FOLLOW_DATA

    @functools.wraps(fn)
    def factory(*args, **kwargs):
        if kwargs.get("device") is None and not (follow and args and isinstance(args[0], torch.Tensor)) \
                and not _in_device_context():
            caller = sys._getframe(1).f_code.co_filename
            if not caller.startswith(_TORCH_DIR) or caller.startswith(_TORCH_LAYERS):
                kwargs["device"] = "meta"
        return fn(*args, **kwargs)

    factory._zc_proxied = fn
    # TorchScript resolves torch.<name> by attribute and cannot compile this wrapper: it is
    # registered as the builtin op fn stands for (modules such as torch.distributed.optim script
    # functions at import, in a rank under the proxy too; scripted code is torch's own).
    op = torch.jit._builtins._find_builtin(fn)
    if op is not None:
        torch.jit._builtins._register_builtin(factory, op)
    return factory


def _in_device_context() -> bool:
    """True inside `with torch.device(d):` (that code chose its device)."""
    if not torch._C._len_torch_function_stack():
        return False
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._device import DeviceContext
    return any(isinstance(m, DeviceContext) for m in _get_current_function_mode_stack())


def install_proxy() -> None:
    """Tensors created without a device by code outside torch go to `meta` (see the module doc).

    Which call decides: the frame that called the factory function. A notebook cell, a test or
    zerocourse calling torch.zeros(n) is redirected; so is torch.nn.Linear(4, 4) called from
    there (its parameters are created in torch/nn/modules with the caller's device=None).
    torch.optim, torch.distributed, torch.utils, ... calling torch.tensor(0.0) are not: those
    tensors stay on the CPU on a GPU machine too. The factory functions themselves are wrapped
    (not a TorchFunctionMode, whose stack is empty while autograd runs hooks and backward
    functions, and a GPU machine's CPU default applies there too).
    """
    from torch.utils._device import _device_constructors
    for fn in _device_constructors():
        name = fn.__name__
        if getattr(torch, name, None) is fn:
            setattr(torch, name, _proxied(name, fn))


def enter_rank(device: torch.device, proxy: bool) -> None:
    """Called once by a rank after joining its process group: record its device, and under the
    proxy make the tensors created without a device land on `meta` (for the rank's whole life)."""
    global _RANK_DEVICE
    _RANK_DEVICE = torch.device(device)
    if proxy:
        install_proxy()


def _tensors(value, where: str):
    if isinstance(value, torch.Tensor):
        yield where, value
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            if isinstance(v, torch.Tensor):
                yield f"{where}[{i}]", v
            elif isinstance(v, (list, tuple)):       # all_gather's list of lists
                yield from _tensors(v, f"{where}[{i}]")


def _describe(t: torch.Tensor) -> str:
    return f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}"


def check_collective_devices(name: str, args: tuple, kwargs: dict) -> None:
    """Raise a clear error when a collective gets a tensor that is not on the rank's device.

    Args:
        name: the torch.distributed function (e.g. "all_reduce").
        args, kwargs: its arguments.
    Raises:
        RuntimeError naming the call, the argument, its shape and device, and the rank's device.
    """
    if _RANK_DEVICE is None:
        return
    want = _RANK_DEVICE
    items = [(f"argument {i}", a) for i, a in enumerate(args)] + \
            [(f"argument {k}=", v) for k, v in kwargs.items()]
    for where, value in items:
        for label, t in _tensors(value, where):
            dev = t.device
            if dev.type == want.type and (dev.index is None or want.index is None or dev.index == want.index):
                continue
            why = ("a tensor created without device= lands on 'meta' under the course's device "
                   "check (ZEROCOURSE_DEVICE_PROXY=1), as it would land on the CPU on a GPU machine"
                   if dev.type == "meta" else
                   "NCCL takes tensors on the rank's GPU only" if want.type == "cuda" else
                   "gloo here runs on the CPU")
            raise RuntimeError(
                f"{name}: {label} ({_describe(t)}) is on {dev}, but this rank's device is {want}: "
                f"{why}. Create it with device=zerocourse.rank_device() (or torch.zeros_like / "
                f"t.new_zeros from a tensor already there), or move it with .to(device).")


def to_cpu(value):
    """A rank's return value with every tensor on the CPU (plain containers walked), so results
    come back to the notebook the same from a GPU rank as from a CPU one."""
    if isinstance(value, torch.Tensor):
        if value.device.type == "meta":
            raise RuntimeError(
                f"the rank returned a tensor on meta ({_describe(value)}): under the course's device "
                f"check a tensor created without device= lands there (on a GPU machine it would be "
                f"on the CPU). Create it with device=zerocourse.rank_device().")
        return value.cpu() if value.device.type != "cpu" else value
    if type(value) in (list, tuple):
        return type(value)(to_cpu(v) for v in value)
    if type(value) is dict:
        return {k: to_cpu(v) for k, v in value.items()}
    return value
