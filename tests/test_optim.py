import copy

import pytest
import torch

from zerocourse.models import GPTConfig, TinyGPT, ToyModel, lm_loss, make_toy_batch
from zerocourse.optim import MixedPrecisionAdam

SMALL = GPTConfig(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_embd=16)


def backward(model, vocab, seed):
    x, y = make_toy_batch(4, 8, vocab, seed=seed)
    lm_loss(model(x), y).backward()


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
@pytest.mark.parametrize("make, vocab", [(lambda: ToyModel(), 16), (lambda: TinyGPT(SMALL), 32)])
def test_fp32_matches_torch_adam_bit_for_bit(make, vocab, weight_decay):
    torch.manual_seed(0)
    ours = make()
    ref = copy.deepcopy(ours)
    initial = copy.deepcopy(ours)
    kw = dict(lr=1e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=weight_decay)
    opt = MixedPrecisionAdam(ours.parameters(), **kw)
    ref_opt = torch.optim.Adam(ref.parameters(), foreach=False, **kw)
    for step in range(5):
        for model, o in ((ours, opt), (ref, ref_opt)):
            backward(model, vocab, seed=step)
            o.step()
            o.zero_grad()
        for (name, p), q in zip(ours.named_parameters(), ref.parameters()):
            assert torch.equal(p, q), f"step {step}: {name} differs by {(p - q).abs().max()}"
    moved = [not torch.equal(p, q) for p, q in zip(ours.parameters(), initial.parameters())]
    assert moved == [p.requires_grad for p in ours.parameters()]  # trained ones moved, frozen did not


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_bf16_master_follows_torch_adam_on_fp32_copies(weight_decay):
    """Oracle: torch.optim.Adam on independent fp32 tensors fed the bf16 gradients, upcast."""
    torch.manual_seed(0)
    model = TinyGPT(SMALL).to(torch.bfloat16)
    trainable = [p for p in model.parameters() if p.requires_grad]
    oracle = [p.detach().float().clone().requires_grad_() for p in trainable]
    opt = MixedPrecisionAdam(model.parameters(), lr=3e-3, weight_decay=weight_decay)
    ref_opt = torch.optim.Adam(oracle, lr=3e-3, weight_decay=weight_decay, foreach=False)
    for step in range(5):
        backward(model, 32, seed=step)
        for p, o in zip(trainable, oracle):
            o.grad = p.grad.float()
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        for i, (p, o) in enumerate(zip(trainable, oracle)):
            master = opt.master[i]
            assert master.dtype == torch.float32 and p.dtype == torch.bfloat16
            assert torch.equal(master, o.detach()), f"step {step}, tensor {i}"
            assert torch.equal(p, master.to(torch.bfloat16)), f"step {step}, tensor {i}"
            assert opt.exp_avg[i].dtype == opt.exp_avg_sq[i].dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_frozen_and_unused_params_untouched_with_weight_decay(dtype):
    torch.manual_seed(0)
    model = ToyModel(unused=True).to(dtype)
    frozen = model.scale.scale.detach().clone()
    unused = model.unused.detach().clone()
    fc1 = model.fc1.weight.detach().clone()
    opt = MixedPrecisionAdam(model.parameters(), lr=1e-2, weight_decay=0.5)
    assert all(p.requires_grad for p in opt.params)
    assert sum(p.numel() for p in opt.params) == 1021  # the frozen scale has no state
    for step in range(3):
        backward(model, 16, seed=step)
        assert model.unused.grad is None
        opt.step()
        opt.zero_grad()
    assert torch.equal(model.scale.scale, frozen)
    assert torch.equal(model.unused, unused)  # grad None: not decayed either
    assert not torch.equal(model.fc1.weight, fc1)
    i = next(i for i, p in enumerate(opt.params) if p is model.unused)
    assert opt.exp_avg[i].abs().sum() == 0 and opt.exp_avg_sq[i].abs().sum() == 0


def test_tied_weight_updated_once_per_step():
    torch.manual_seed(0)
    model = ToyModel()
    twice = copy.deepcopy(model)
    # A hand-made list repeating the tied weight must still update it once.
    opt = MixedPrecisionAdam(model.parameters(), lr=1e-2)
    opt2 = MixedPrecisionAdam(list(twice.parameters()) + [twice.head.weight, twice.embed.weight], lr=1e-2)
    assert len(opt2.params) == len(opt.params)
    before = model.embed.weight.detach().clone()
    backward(model, 16, seed=0)
    backward(twice, 16, seed=0)
    g = model.embed.weight.grad.clone()
    opt.step()
    opt2.step()
    # Adam's first step moves each weight by lr * g / (|g| + eps): about lr, never 2 * lr.
    delta = (model.embed.weight - before).abs()
    moved = g.abs() > 1e-4
    assert moved.sum() > 100
    torch.testing.assert_close(delta[moved], torch.full_like(delta[moved], 1e-2), rtol=1e-3, atol=0)
    assert torch.equal(twice.embed.weight, model.embed.weight)
    assert model.head.weight is model.embed.weight


def test_zero_grad_modes():
    model = ToyModel()
    opt = MixedPrecisionAdam(model.parameters())
    backward(model, 16, seed=0)
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and p.grad.abs().sum() == 0 for p in opt.params)
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_one_step_counter():
    model = ToyModel()
    opt = MixedPrecisionAdam(model.parameters())
    for step in range(3):
        backward(model, 16, seed=step)
        opt.step()
    assert opt.step_count == 3


@pytest.mark.parametrize("kwargs", [dict(lr=-1e-3), dict(eps=-1.0), dict(betas=(1.0, 0.999)),
                                    dict(betas=(0.9, -0.1)), dict(weight_decay=-0.1)])
def test_invalid_arguments(kwargs):
    with pytest.raises(ValueError):
        MixedPrecisionAdam(ToyModel().parameters(), **kwargs)


def test_invalid_params():
    with pytest.raises(ValueError, match="empty"):
        MixedPrecisionAdam([])
    with pytest.raises(TypeError):
        MixedPrecisionAdam(torch.nn.Parameter(torch.ones(3)))
    MixedPrecisionAdam(ToyModel().parameters(), lr=0.0, betas=(0.0, 0.0), eps=0.0)  # edges are valid
