"""zerocourse.gather_tracker: bytes of full parameters, whatever way an implementation frees them."""
import torch
import torch.nn as nn

from zerocourse.gather_tracker import GatherTracker, full_param_bytes, parameter_slots
from zerocourse.models import ToyModel


def test_plain_model_counts_every_storage_once():
    model = ToyModel()                                   # tied embed/head: one storage
    nbytes = sum(p.numel() * 4 for p in model.parameters())
    got, count = full_param_bytes(model)
    assert got == nbytes
    assert count == 6                                    # slots: embed, fc1 x2, fc2, scale, head (tied)


def test_freed_parameters_do_not_count():
    model = ToyModel()
    w = model.fc1.weight
    before = full_param_bytes(model)[0]
    w.data = torch.empty(0)                              # .data swap
    assert full_param_bytes(model)[0] == before - w_bytes(23 * 16)
    flat = torch.zeros(23 + 100)                         # a view of a flat buffer, storage resized
    model.fc1.bias.data = flat[:23]
    assert full_param_bytes(model)[0] == before - w_bytes(23 * 16) - w_bytes(23) + w_bytes(123)
    flat.untyped_storage().resize_(0)
    assert full_param_bytes(model)[0] == before - w_bytes(23 * 16) - w_bytes(23)
    model.fc2.weight.data = torch.zeros(1).expand(16, 23)   # full shape, 4-byte storage: not full
    assert full_param_bytes(model)[1] == 3


def w_bytes(n):
    return 4 * n


def test_replaced_parameters_and_plain_attributes_are_seen():
    model = ToyModel()
    slots = parameter_slots(model)
    full = full_param_bytes(model)[0]
    del model.fc2._parameters["weight"]
    model.fc2.weight = torch.zeros(16, 23)               # a plain tensor in the slot (FSDP1 style)
    assert full_param_bytes(model, slots)[0] == full
    model.fc2.weight = torch.zeros(92)                   # a 1-D shard: not a full parameter
    assert full_param_bytes(model, slots)[0] == full - 4 * 16 * 23


def test_peak_and_timeline_over_a_region():
    lin = nn.Sequential(nn.Linear(8, 8, bias=False), nn.Linear(8, 8, bias=False))
    store = [p.detach().clone() for p in lin.parameters()]
    slots = parameter_slots(lin)                         # full shapes, before freeing
    for p in lin.parameters():
        p.data = torch.empty(0)
    with GatherTracker(lin, slots) as g:
        x = torch.randn(2, 8)
        for p, full in zip(lin.parameters(), store):
            p.data = full.clone()                        # gather one layer
            x = x @ p.t()
            p.data = torch.empty(0)                      # free it
        g.mark("done")
    assert g.peak_bytes == 8 * 8 * 4                     # one layer at a time
    assert g.current_bytes == 0
    assert g.timeline[-2][4] == "done" and g.timeline[-1][4] == "exit"
    assert any(e[3] == ("0.weight",) for e in g.timeline) and any(e[3] == ("1.weight",) for e in g.timeline)
    assert g.unit_bytes() == {"0": 256, "1": 256}
