import math

import pytest
import torch

from zerocourse.models import GPTConfig, TinyGPT, ToyModel, lm_loss, make_toy_batch

SMALL = GPTConfig(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_embd=16)


def unique_numel(tensors):
    # Independent of model.parameters(): dedupe by storage address.
    by_ptr = {t.data_ptr(): t.numel() for t in tensors}
    return sum(by_ptr.values())


def gpt_param_formula(c):
    C, V = c.n_embd, c.vocab_size
    per_block = 2 * (2 * C) + (C * 3 * C + 3 * C) + (C * C + C) + (C * 4 * C + 4 * C) + (4 * C * C + C)
    return V * C + c.block_size * C + c.n_layer * per_block + 2 * C + (0 if c.tie_weights else V * C)


# -- ToyModel -----------------------------------------------------------------

def test_toy_param_counts():
    m = ToyModel()
    total = sum(p.numel() for p in m.parameters())
    trainable = sum(p.numel() for p in m.parameters() if p.requires_grad)
    # embed (tied with head) 16*16, fc1 16*23 + 23, fc2 23*16, frozen scale 16
    assert total == 16 * 16 + 16 * 23 + 23 + 23 * 16 + 16 == 1031
    assert trainable == total - 16 == 1015
    assert total == unique_numel(m.state_dict().values())  # state_dict lists the tied weight twice
    for n in (total, trainable):
        assert n % 2 and n % 3 and n % 4, n
    mu = ToyModel(unused=True)
    total_u = sum(p.numel() for p in mu.parameters())
    trainable_u = sum(p.numel() for p in mu.parameters() if p.requires_grad)
    assert (total_u, trainable_u) == (1037, 1021)
    for n in (total_u, trainable_u):
        assert n % 2 and n % 3 and n % 4, n


def test_toy_tied_weight_is_one_parameter():
    m = ToyModel()
    assert m.head.weight is m.embed.weight
    assert len(m.state_dict()) == len(list(m.parameters())) + 1  # tied weight has two names


def test_toy_has_three_param_owners_of_different_sizes():
    sizes = [sum(p.numel() for p in mod.parameters(recurse=False))
             for mod in ToyModel().modules() if list(mod.parameters(recurse=False))]
    assert len(set(sizes)) >= 3


def test_toy_frozen_param_is_used_but_gets_no_grad():
    torch.manual_seed(0)
    m = ToyModel(unused=True)
    x, y = make_toy_batch(2, 5, 16, seed=0)
    frozen = [p for p in m.parameters() if not p.requires_grad]
    assert len(frozen) == 1
    before = m(x)
    with torch.no_grad():
        frozen[0].mul_(2.0)
    assert not torch.allclose(before, m(x))  # really used in forward
    lm_loss(m(x), y).backward()
    assert frozen[0].grad is None
    assert m.unused.grad is None  # never used in forward
    for name, p in m.named_parameters():
        if p.requires_grad and name != "unused":
            assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_toy_model_deterministic():
    torch.manual_seed(3)
    a = ToyModel(unused=True)
    torch.manual_seed(3)
    b = ToyModel(unused=True)
    torch.manual_seed(4)
    c = ToyModel(unused=True)
    for (n, p), q, r in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(p, q), n
    assert not torch.equal(a.embed.weight, c.embed.weight)


# -- the ZeRO-3 rule: a parameter is used only in the forward of its owner --------------

def poison_outside_owner(model):
    """NaN every parameter except while the module that owns it directly runs forward."""
    real = {p: p.detach().clone() for p in model.parameters()}
    for p in real:
        p.data.fill_(float("nan"))

    def pre(mod, args):
        for p in mod.parameters(recurse=False):
            p.data.copy_(real[p])

    def post(mod, args, out):
        for p in mod.parameters(recurse=False):
            p.data.fill_(float("nan"))

    for mod in model.modules():
        if list(mod.parameters(recurse=False)):
            mod.register_forward_pre_hook(pre)
            mod.register_forward_hook(post)


@pytest.mark.parametrize("make", [lambda: ToyModel(unused=True), lambda: TinyGPT(SMALL),
                                  lambda: TinyGPT(GPTConfig(**{**SMALL.__dict__, "tie_weights": False}))])
def test_params_only_used_in_owner_forward(make):
    torch.manual_seed(0)
    model = make()
    vocab = model.vocab_size if isinstance(model, ToyModel) else model.config.vocab_size
    x, _ = make_toy_batch(2, 8, vocab, seed=1)
    expected = model(x)
    poison_outside_owner(model)
    got = model(x)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


# -- TinyGPT ------------------------------------------------------------------------------

@pytest.mark.parametrize("config", [GPTConfig(), SMALL, GPTConfig(tie_weights=False),
                                    GPTConfig(n_layer=3, n_embd=48, n_head=3, bias=False)])
def test_gpt_param_count(config):
    m = TinyGPT(config)
    n = sum(p.numel() for p in m.parameters())
    if config.bias:
        assert n == gpt_param_formula(config)
    else:  # no Linear / LayerNorm biases: remove them from the formula
        C, L = config.n_embd, config.n_layer
        assert n == gpt_param_formula(config) - L * (2 * C + 3 * C + C + 4 * C + C) - C
    assert n == unique_numel(m.state_dict().values())
    assert (m.lm_head.weight is m.wte.weight) == config.tie_weights


def test_gpt_default_and_small_sizes():
    assert sum(p.numel() for p in TinyGPT(GPTConfig()).parameters()) == 108_288
    assert 1_000 < sum(p.numel() for p in TinyGPT(SMALL).parameters()) < 10_000
    big = GPTConfig(vocab_size=64, block_size=128, n_layer=4, n_head=4, n_embd=256)
    assert 1_000_000 < gpt_param_formula(big) < 10_000_000


def test_gpt_is_causal():
    torch.manual_seed(0)
    m = TinyGPT(SMALL)
    x, _ = make_toy_batch(2, 10, 32, seed=0)
    x2 = x.clone()
    x2[:, 6:] = (x2[:, 6:] + 5) % 32  # change the future
    a, b = m(x), m(x2)
    assert torch.equal(a[:, :6], b[:, :6])
    assert not torch.allclose(a[:, 6:], b[:, 6:])


def test_gpt_deterministic():
    x, _ = make_toy_batch(2, 8, 32, seed=0)
    torch.manual_seed(5)
    a = TinyGPT(SMALL)(x)
    torch.manual_seed(5)
    b = TinyGPT(SMALL)(x)
    assert torch.equal(a, b)


@pytest.mark.parametrize("make, vocab", [(lambda: ToyModel(unused=True), 16), (lambda: TinyGPT(SMALL), 32)])
def test_bf16_forward_backward(make, vocab):
    torch.manual_seed(0)
    model = make()
    x, y = make_toy_batch(3, 8, vocab, seed=2)
    ref = model(x)
    model = model.to(torch.bfloat16)
    logits = model(x)
    assert logits.shape == (3, 8, vocab) and logits.dtype == torch.bfloat16
    torch.testing.assert_close(logits.float(), ref, rtol=0.05, atol=0.05)
    lm_loss(logits, y).backward()
    for name, p in model.named_parameters():
        assert p.dtype == torch.bfloat16
        if p.requires_grad and name != "unused":
            assert p.grad.dtype == torch.bfloat16 and torch.isfinite(p.grad).all(), name


def test_generate_shape_and_greedy():
    torch.manual_seed(0)
    m = TinyGPT(SMALL)
    idx, _ = make_toy_batch(2, 12, 32, seed=0)
    out = m.generate(idx, max_new_tokens=8, generator=torch.Generator().manual_seed(0))
    assert out.shape == (2, 20) and out.dtype == torch.long
    assert torch.equal(out[:, :12], idx) and out.min() >= 0 and out.max() < 32
    again = m.generate(idx, max_new_tokens=8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out, again)
    # top_k=1 is greedy decoding; the oracle re-runs the model by hand (context cropped to 16).
    greedy = m.generate(idx, max_new_tokens=8, top_k=1)
    ref = idx
    with torch.no_grad():
        for _ in range(8):
            ref = torch.cat([ref, m(ref[:, -16:])[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(greedy, ref)


# -- loss and batch -----------------------------------------------------------------------

def test_lm_loss_matches_manual_cross_entropy():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 7, generator=g)
    targets = torch.randint(0, 7, (2, 5), generator=g)
    logp = logits - logits.exp().sum(-1, keepdim=True).log()
    manual = -logp.gather(-1, targets[..., None]).mean()
    torch.testing.assert_close(lm_loss(logits, targets), manual)
    assert lm_loss(logits.bfloat16(), targets).dtype == torch.float32


def test_make_toy_batch():
    x, y = make_toy_batch(4, 6, 16, seed=7)
    assert x.shape == y.shape == (4, 6) and x.dtype == y.dtype == torch.long
    assert torch.equal(y, (x + 1) % 16)
    x2, y2 = make_toy_batch(4, 6, 16, seed=7)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not torch.equal(x, make_toy_batch(4, 6, 16, seed=8)[0])
    assert x.min() >= 0 and x.max() < 16


def test_toy_model_can_learn_toy_batch():
    torch.manual_seed(0)
    m = ToyModel()
    x, y = make_toy_batch(8, 8, 16, seed=0)
    first = lm_loss(m(x), y).item()
    assert abs(first - math.log(16)) < 0.5
    for _ in range(7):  # plain gradient descent: the rule (t + 1) % V is learnable per token
        loss = lm_loss(m(x), y)
        m.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in m.parameters():
                if p.grad is not None:
                    p -= 2.0 * p.grad
    assert lm_loss(m(x), y).item() < first / 2
