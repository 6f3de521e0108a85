"""The course's two models, a loss and a toy batch.

ToyModel   a tiny token model with the three parameter kinds that break naive sharding code:
           a TIED weight (embedding and output head share one Parameter), a FROZEN parameter
           (requires_grad=False, used in forward) and, optionally, an UNUSED one (its grad stays None).
TinyGPT    a readable nanoGPT-style decoder, from a few thousand to a few million parameters.
lm_loss    the course's loss_fn: loss = lm_loss(model(inputs), targets).
make_toy_batch  a deterministic (inputs, targets) batch of token ids.

Both models follow one rule that ZeRO-3 relies on: every parameter is used only inside the forward
of the module that owns it directly (self.wpe(pos), never self.wpe.weight in a parent), so forward
hooks on modules see every use. Both are built in fp32 (deterministic under torch.manual_seed), have
no buffers, and run in bf16 after model.to(torch.bfloat16).

Devices (zerocourse.devices): `ToyModel(device=d)`, `TinyGPT(config, device=d)` and
`make_toy_batch(..., device=d)` compute their values on the CPU and then move them to d, so the
same seed gives the same model and batch on every device (a GPU's random generator differs from
the CPU's). Without a device they land where a tensor created without one lands (the CPU,
or 'meta' in a rank under the course's device check).
"""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


def _target(device):
    """`device`, or where a tensor created without a device lands here (see zerocourse.devices)."""
    return torch.device(device) if device is not None else torch.empty(0).device


# -----------------------------------------------------------------------------
# ToyModel

class FrozenScale(nn.Module):
    """Multiplies its input by a fixed per-channel scale that is never trained.

    Args:
        dim: number of channels (size of the last input dimension).
    """

    def __init__(self, dim):
        super().__init__()
        # A Parameter (not a buffer) on purpose: it shows up in model.parameters() with
        # requires_grad=False, like a frozen layer in fine-tuning. Optimizers must skip it.
        scale = 1.0 + 0.5 * torch.cos(torch.arange(dim, dtype=torch.float32))
        self.scale = nn.Parameter(scale, requires_grad=False)

    def forward(self, x):
        return x * self.scale


class ToyModel(nn.Module):
    """A tiny token model: embed -> residual MLP -> frozen scale -> tied head.

    Default sizes give 1031 unique parameters (1015 trainable, 16 frozen): numbers that are
    not divisible by 2, 3 or 4, so sharding them over 2, 3 or 4 ranks always needs padding.
    With unused=True, 6 more trainable parameters (1037 unique, 1021 trainable).

    Args:
        vocab_size: number of token ids.
        dim: embedding width.
        hidden: width of the MLP's hidden layer.
        unused: if True, add a trainable Parameter that forward never uses (its .grad stays None).
        device: where the parameters live (values computed on the CPU, then moved; see above).
    """

    def __init__(self, vocab_size=16, dim=16, hidden=23, unused=False, device=None):
        super().__init__()
        target = _target(device)
        with torch.device("cpu"):
            self._build(vocab_size, dim, hidden, unused)
        self.to(target)

    def _build(self, vocab_size, dim, hidden, unused):
        self.vocab_size = vocab_size
        self.embed = nn.Embedding(vocab_size, dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim, bias=False)
        self.scale = FrozenScale(dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)
        # Small init so the initial loss is about log(vocab_size), as in nanoGPT.
        for w in (self.embed.weight, self.fc1.weight, self.fc2.weight):
            nn.init.normal_(w, mean=0.0, std=0.2)
        nn.init.zeros_(self.fc1.bias)
        # Weight tying: the head's weight IS the embedding's Parameter (one tensor, two owners).
        self.head.weight = self.embed.weight
        if unused:
            self.unused = nn.Parameter(torch.randn(6) * 0.2)

    def forward(self, idx):
        x = self.embed(idx)                         # (B, T, C)
        x = x + self.fc2(F.gelu(self.fc1(x)))       # (B, T, C)
        x = self.scale(x)                           # (B, T, C)
        return self.head(x)                         # (B, T, V)


def make_toy_batch(batch_size, seq_len, vocab_size, seed, device=None):
    """A deterministic batch for ToyModel: random tokens, target = next id in a cycle.

    The target of token t is (t + 1) % vocab_size, a per-token rule ToyModel can learn,
    so a few optimizer steps visibly lower the loss.

    Args:
        batch_size: number of sequences B.
        seq_len: tokens per sequence T.
        vocab_size: token ids are drawn from [0, vocab_size).
        seed: the same seed always gives the same batch.
        device: where the batch lives (drawn on the CPU, then moved: the same on every device).

    Returns:
        (inputs, targets): two int64 tensors of shape (B, T).
    """
    target = _target(device)
    g = torch.Generator().manual_seed(seed)
    inputs = torch.randint(0, vocab_size, (batch_size, seq_len), generator=g, device="cpu")  # (B, T)
    targets = (inputs + 1) % vocab_size                                                    # (B, T)
    return inputs.to(target), targets.to(target)


def lm_loss(logits, targets):
    """Mean cross entropy of next-token logits, computed in fp32.

    Args:
        logits: (B, T, V) float tensor (any float dtype; upcast to fp32 for a stable softmax).
        targets: (B, T) int64 tensor of token ids.
    """
    V = logits.size(-1)
    return F.cross_entropy(logits.float().reshape(-1, V), targets.reshape(-1))


# -----------------------------------------------------------------------------
# TinyGPT (after nanoGPT, https://github.com/karpathy/nanoGPT, without the loss inside)

@dataclass
class GPTConfig:
    """Size of a TinyGPT. The defaults give 108,288 parameters (tied head counted once).

    Args:
        block_size: longest context, in tokens.
        vocab_size: number of token ids.
        n_layer: number of transformer blocks.
        n_head: attention heads per block (must divide n_embd).
        n_embd: embedding width.
        dropout: dropout probability (0 keeps training deterministic).
        bias: whether Linear and LayerNorm layers have biases.
        tie_weights: whether lm_head shares its weight with the token embedding wte.
    """
    block_size: int = 64
    vocab_size: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.0
    bias: bool = True
    tie_weights: bool = True


class CausalSelfAttention(nn.Module):

    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0, "n_head must divide n_embd"
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)                     # 3 x (B, T, C)
        # split the channels into heads: (B, T, C) -> (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(                           # (B, nh, T, hs)
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)              # (B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))       # (B, T, C)


class Block(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class TinyGPT(nn.Module):
    """A GPT decoder: token + position embeddings, n_layer blocks, final LayerNorm, lm_head.

    forward(idx) returns logits only; the loss is lm_loss(logits, targets).

    Args:
        config: a GPTConfig.
        device: where the parameters live (values computed on the CPU, then moved).
    """

    def __init__(self, config, device=None):
        super().__init__()
        target = _target(device)
        with torch.device("cpu"):
            self._build(config)
        self.to(target)

    def _build(self, config):
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            # One Parameter, two owners: model.parameters() yields it once.
            self.lm_head.weight = self.wte.weight
        self.apply(self._init_weights)
        # GPT-2's scaled init of the projections that write into the residual stream.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx):
        B, T = idx.size()
        assert T <= self.config.block_size, f"sequence of {T} tokens > block_size {self.config.block_size}"
        pos = torch.arange(T, dtype=torch.long, device=idx.device)  # (T,)
        x = self.drop(self.wte(idx) + self.wpe(pos))                 # (B, T, C)
        for block in self.h:
            x = block(x)                                             # (B, T, C)
        x = self.ln_f(x)                                             # (B, T, C)
        return self.lm_head(x)                                       # (B, T, V)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        """Sample max_new_tokens tokens after the context idx.

        Args:
            idx: (B, T) int64 context.
            max_new_tokens: how many tokens to append.
            temperature: divides the logits; < 1 is more greedy.
            top_k: if given, sample only among the top_k most likely tokens.
            generator: optional torch.Generator for reproducible samples.

        Returns:
            (B, T + max_new_tokens) int64 tensor.
        """
        for _ in range(max_new_tokens):
            idx_cond = idx[:, -self.config.block_size:]             # (B, <=block)
            logits = self(idx_cond)[:, -1, :].float() / temperature  # (B, V)
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("inf")
            probs = F.softmax(logits, dim=-1)                        # (B, V)
            idx_next = torch.multinomial(probs, num_samples=1, generator=generator)  # (B, 1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx
