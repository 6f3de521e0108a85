"""The device rule's proxy (zerocourse/devices.py): under ZEROCOURSE_DEVICE_PROXY=1 a tensor created in a
rank without the rank's device lands on `meta` and fails loudly, as it would on a GPU under NCCL;
torch's own tensors (optimizer step counters) and code under `with torch.device(d)` are left alone.

One launch per behaviour class would cost a second each on a busy machine: every probe runs in
one 1-rank launch and reports what happened, and the assertions read the report.
"""
import os

import pytest
import torch

from zerocourse import launch
from zerocourse.launch import RankError


def _probe(rank, world_size):
    """Each case as (name, device of the result or the error's first line)."""
    import torch.distributed as dist
    import torch.nn as nn
    from zerocourse import rank_device
    from zerocourse.models import ToyModel, lm_loss, make_toy_batch

    out = {}

    def case(name, fn):
        try:
            out[name] = str(fn())
        except Exception as e:  # noqa: BLE001 - the error is the result
            out[name] = "error: " + str(e).splitlines()[0]

    d = rank_device()
    case("zeros", lambda: torch.zeros(2).device)
    case("zeros on the device", lambda: torch.zeros(2, device=d).device)
    case("linear", lambda: nn.Linear(2, 2).weight.device)
    case("linear on the device", lambda: nn.Linear(2, 2, device=d).weight.device)

    def in_context():
        with torch.device(d):
            return torch.zeros(1).device
    case("in a device context", in_context)

    def adam():
        p = nn.Parameter(torch.ones(3, device=d))
        opt = torch.optim.Adam([p])
        p.sum().backward()
        opt.step()
        return p.device
    case("torch.optim.Adam", adam)

    def in_hook():
        seen = []
        p = nn.Parameter(torch.ones(3, device=d))
        p.register_post_accumulate_grad_hook(lambda q: seen.append(torch.empty(1).device))
        (p * 2).sum().backward()
        return seen[0]
    case("in a post-accumulate-grad hook", in_hook)
    case("tensor of a tensor", lambda: torch.tensor(torch.ones(2, device=d)).device)
    case("all_reduce of a device-less tensor", lambda: dist.all_reduce(torch.zeros(4)))
    case("all_reduce on the device", lambda: dist.all_reduce(torch.zeros(4, device=d)) or d)

    def toy(device):
        torch.manual_seed(0)
        m = ToyModel(device=device)
        x, y = make_toy_batch(4, 8, 16, seed=1, device=d)
        return round(lm_loss(m(x), y).item(), 6)
    case("ToyModel on the device", lambda: toy(d))
    case("ToyModel without a device", lambda: toy(None))
    return out


@pytest.fixture(scope="module")
def probes():
    saved = os.environ.get("ZEROCOURSE_DEVICE_PROXY")
    try:
        found = {}
        for mode in ("0", "1"):
            os.environ["ZEROCOURSE_DEVICE_PROXY"] = mode
            found[mode] = launch(_probe, 1)[0]
        return found
    finally:
        if saved is None:
            os.environ.pop("ZEROCOURSE_DEVICE_PROXY", None)
        else:
            os.environ["ZEROCOURSE_DEVICE_PROXY"] = saved


def test_without_the_proxy_gloo_accepts_everything(probes):
    off = probes["0"]
    assert all(not v.startswith("error") for v in off.values()), off
    assert off["ToyModel on the device"] == off["ToyModel without a device"]


def test_tensors_created_without_a_device_land_on_meta(probes):
    on = probes["1"]
    assert on["zeros"] == "meta" and on["linear"] == "meta", on
    assert on["in a post-accumulate-grad hook"] == "meta", on     # autograd runs hooks modeless
    assert on["ToyModel without a device"].startswith("error"), on


def test_what_chose_its_device_is_left_alone(probes):
    on, off = probes["1"], probes["0"]
    for name in ("zeros on the device", "linear on the device", "in a device context",
                 "torch.optim.Adam", "tensor of a tensor", "all_reduce on the device"):
        assert on[name] == "cpu", (name, on[name])
    assert on["ToyModel on the device"] == off["ToyModel on the device"]   # same values


def test_a_collective_names_the_tensor_and_both_devices(probes):
    msg = probes["1"]["all_reduce of a device-less tensor"]
    assert msg.startswith("error: all_reduce: argument 0 (float32[4]) is on meta, but this rank's device is cpu"), msg


def test_results_come_back_on_the_cpu():
    from zerocourse.devices import to_cpu
    value = {"a": [torch.ones(2), (torch.zeros(1),)], "b": 3}
    back = to_cpu(value)
    assert back["b"] == 3 and back["a"][1][0].device.type == "cpu"
    with pytest.raises(RuntimeError, match=r"returned a tensor on meta \(float32\[2\]\)"):
        to_cpu([torch.ones(2, device="meta")])


def test_auto_stays_on_gloo_and_says_why_where_gpus_exist(monkeypatch, capsys):
    import importlib
    zl = importlib.import_module("zerocourse.launch")   # the module (the package exports the function)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(zl, "_BACKEND_NOTE_SHOWN", False)
    assert zl.pick_backend("auto", 2) == "gloo"
    assert "make test-gpu" in capsys.readouterr().err
    assert zl.pick_backend("nccl", 2) == "nccl"
    monkeypatch.setattr(zl, "NCCL_VERIFIED", True)
    assert zl.pick_backend("auto", 2) == "nccl"
    with pytest.raises(ValueError, match="one GPU per rank"):
        zl.pick_backend("nccl", 8)


def test_modules_scripted_at_import_load_under_the_proxy():
    """torch.distributed.optim TorchScript-compiles functions at import, and TorchScript cannot
    compile a Python wrapper: the proxy's factories are registered as the builtin ops they wrap
    (03's ZeroRedundancyOptimizer comparison failed in its ranks without). A fresh interpreter:
    no fork server preloaded the module."""
    import subprocess
    import sys
    code = ("from zerocourse.devices import install_proxy\n"
            "install_proxy()\n"
            "from torch.distributed.optim import ZeroRedundancyOptimizer\n"
            "import torch\n"
            "print(torch.zeros(1).device)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "meta", proc.stdout + proc.stderr[-2000:]
