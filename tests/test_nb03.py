"""03_zero1: the graded cells pass on the solution, fail on the stubs, and catch the bugs.

Bug fixtures run only the graded cells a bug can reach (`only=`), to keep the launches few.
"""
import pytest

from tests.harness import assert_bug_caught, assert_full_marks, assert_stubs_fail

AID = "03_zero1"

BOUNDS = ["zero1-shard-bounds-check", "zero1-shard-bounds-hidden"]
ADAM = ["zero1-adam-check", "zero1-adam-hidden"]
MEM = ["zero1-memory-check", "zero1-memory-hidden"]
TOTAL = 14


def test_solution_gets_full_marks():
    assert_full_marks(AID, TOTAL, cells=BOUNDS + ADAM + MEM)


def test_every_graded_cell_fails_on_the_stubs():
    assert_stubs_fail(AID, cells=BOUNDS + ADAM + MEM, total=TOTAL)


SB = "zero1-shard-bounds"
ZA = "zero1-adam"
GATHER = ("        flat = torch.empty(self.padded, dtype=dtype)\n"
          "        dist.all_gather_single(flat, self.master.to(dtype))\n")
STATE = ("        self.master = flat[self.start:self.end].clone()   # clone: do not keep the full buffer alive\n"
         "        self.exp_avg = torch.zeros_like(self.master)\n"
         "        self.exp_avg_sq = torch.zeros_like(self.master)\n")
BUGS = {
    # bug: (edits, cells to run, cells that must fail, cells that must pass)
    "shard without padding (floor division)": (
        [(SB, "shard = -(-numel // world_size)", "shard = numel // world_size")],
        BOUNDS + ADAM, BOUNDS + ADAM, []),
    "off by one (end - 1)": (
        [(SB, "return rank * shard, (rank + 1) * shard", "return rank * shard, (rank + 1) * shard - 1")],
        BOUNDS, BOUNDS, []),
    "last slice clipped to numel": (
        [(SB, "return rank * shard, (rank + 1) * shard",
          "return min(rank * shard, numel), min((rank + 1) * shard, numel)")],
        BOUNDS, BOUNDS, []),
    "optimizer state kept for the full vector (trajectory right, memory wrong)": (
        [(ZA, STATE,
          "        self.full = [flat.clone(), torch.zeros_like(flat), torch.zeros_like(flat)]\n"
          "        self.master, self.exp_avg, self.exp_avg_sq = (t[self.start:self.end] for t in self.full)\n")],
        MEM + ["zero1-adam-check"], MEM, ["zero1-adam-check"]),
    "master slice kept as a view of the full fp32 buffer": (
        [(ZA, "flat[self.start:self.end].clone()", "flat[self.start:self.end]")],
        ["zero1-adam-check", "zero1-memory-check", "zero1-memory-hidden"], ["zero1-memory-hidden"],
        ["zero1-adam-check"]),
    "master kept in bf16 (the parameters' dtype)": (
        [(ZA, STATE,
          "        self.master = flat[self.start:self.end].to(self.params[0].dtype)\n"
          "        self.exp_avg = torch.zeros(self.end - self.start)\n"
          "        self.exp_avg_sq = torch.zeros(self.end - self.start)\n")],
        ADAM + MEM, ["zero1-adam-hidden"], ["zero1-adam-check"] + MEM),
    "bias correction: step counter never incremented": (
        [(ZA, "self.step_count += 1", "self.step_count = 1")], ADAM, ADAM, []),
    "bias correction: counter incremented after the update (t = 0, 1, ...)": (
        [(ZA, "        self.step_count += 1\n", ""),
         (ZA, "        # 3. all-gather", "        self.step_count += 1\n        # 3. all-gather")],
        ADAM, ADAM, []),
    "no all-gather: each rank writes back only its slice": (
        [(ZA, GATHER,
          "        flat = torch.zeros(self.padded, dtype=dtype)\n"
          "        flat[:self.numel] = torch.cat([p.detach().reshape(-1) for p in self.params])\n"
          "        flat[self.start:self.end] = self.master.to(dtype)\n")],
        ADAM, ADAM, []),
    "all-gathering the pre-update values": (
        [(ZA, GATHER, ""), (ZA, "        # 2. Adam on my slice, in fp32\n", GATHER)],
        ADAM, ADAM, []),
    "gradients summed, not averaged": (
        [(ZA, ".float() / self.world_size", ".float()")],
        ADAM, ["zero1-adam-hidden"], []),   # Adam is scale-invariant: only weight decay shows it
    "gradients not reduced at all": (
        [(ZA, "        dist.all_reduce(flat_grad)\n", "")], ADAM, ADAM, []),
    "decoupled (AdamW) weight decay": (
        [(ZA, "grad = grad.add(self.master, alpha=self.weight_decay)",
          "self.master.mul_(1 - self.lr * self.weight_decay)")],
        ADAM, ["zero1-adam-hidden"], ["zero1-adam-check"]),
    "frozen parameters updated too": (
        [(ZA, "if p.requires_grad and all(", "if all(")], ADAM, ["zero1-adam-hidden"], []),
    "dtype hard-coded to bf16": (
        [(ZA, "dtype = self.params[0].dtype", "dtype = torch.bfloat16")], ADAM, ADAM, []),
}


@pytest.mark.parametrize("bug", list(BUGS))
def test_bug_is_caught(bug):
    assert_bug_caught(AID, *BUGS[bug])


# Valid alternatives: reduce-scatter instead of all-reduce, gradients reduced in fp32, state in a
# dict, one cached bf16 all-gather buffer, a tensor step counter, list all_gather, zeroed grads.
REDUCE_SCATTER = '''
class ZeRO1Adam:
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        self.hp = dict(lr=lr, betas=betas, eps=eps, wd=weight_decay)
        seen, self.params = set(), []
        for p in params:
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                self.params.append(p)
        self.n, self.r = dist.get_world_size(), dist.get_rank()
        self.numel = sum(p.numel() for p in self.params)
        lo, hi = shard_bounds(self.numel, self.n, self.r)
        self.k = hi - lo
        dtype = self.params[0].dtype
        # cached between steps: ONE full-length buffer in the parameters' dtype (allowed)
        self.gather_buf = torch.zeros(self.k * self.n, dtype=dtype)
        self.gather_buf[:self.numel] = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.state = {"master": self.gather_buf[lo:hi].float().clone(),
                      "m": torch.zeros(self.k), "v": torch.zeros(self.k), "t": torch.tensor(0.0)}

    @torch.no_grad()
    def step(self):
        st, hp = self.state, self.hp
        st["t"] += 1
        grads = [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float()
                 for p in self.params]
        flat = torch.cat(grads + [torch.zeros(self.k * self.n - self.numel)])
        g = torch.empty(self.k)
        dist.reduce_scatter_single(g, flat)
        g /= self.n
        if hp["wd"]:
            g = g + hp["wd"] * st["master"]
        b1, b2 = hp["betas"]
        st["m"].mul_(b1).add_(g, alpha=1 - b1)
        st["v"].mul_(b2).addcmul_(g, g, value=1 - b2)
        t = st["t"].item()
        mhat = st["m"] / (1 - b1 ** t)
        vhat = st["v"] / (1 - b2 ** t)
        st["master"] -= hp["lr"] * mhat / (vhat.sqrt() + hp["eps"])
        dist.all_gather_single(self.gather_buf, st["master"].to(self.gather_buf.dtype))
        i = 0
        for p in self.params:
            p.copy_(self.gather_buf[i:i + p.numel()].view_as(p))
            i += p.numel()

    def zero_grad(self):
        for p in self.params:
            if p.grad is not None:
                p.grad.zero_()
'''
AVG_LIST_GATHER = '''
class ZeRO1Adam:
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        self.lr, (self.b1, self.b2), self.eps, self.wd = lr, betas, eps, weight_decay
        self.params = list(dict.fromkeys(p for p in params if p.requires_grad))
        self.ws, self.rank = dist.get_world_size(), dist.get_rank()
        numel = sum(p.numel() for p in self.params)
        self.lo, self.hi = shard_bounds(numel, self.ws, self.rank)
        full = torch.nn.utils.parameters_to_vector(self.params).detach().float()
        full = torch.cat([full, full.new_zeros(self.hi * 0 + (self.hi - self.lo) * self.ws - numel)])
        self.slots = [{"w": full[self.lo:self.hi].clone(), "exp_avg": None, "exp_avg_sq": None}]
        self.t = 0

    def step(self):
        with torch.no_grad():
            self.t += 1
            slot = self.slots[0]
            k = self.hi - self.lo
            g = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float()
                           for p in self.params])
            g = torch.cat([g, g.new_zeros(k * self.ws - g.numel())])
            dist.all_reduce(g, op=dist.ReduceOp.AVG)
            g = g[self.lo:self.hi] + self.wd * slot["w"]
            if slot["exp_avg"] is None:
                slot["exp_avg"], slot["exp_avg_sq"] = torch.zeros(k), torch.zeros(k)
            slot["exp_avg"].mul_(self.b1).add_((1 - self.b1) * g)
            slot["exp_avg_sq"].mul_(self.b2).add_((1 - self.b2) * g * g)
            denom = slot["exp_avg_sq"].sqrt() / (1 - self.b2 ** self.t) ** 0.5 + self.eps
            slot["w"].add_(-self.lr / (1 - self.b1 ** self.t) * slot["exp_avg"] / denom)
            pieces = [torch.empty(k, dtype=self.params[0].dtype) for _ in range(self.ws)]
            dist.all_gather(pieces, slot["w"].to(self.params[0].dtype))
            torch.nn.utils.vector_to_parameters(torch.cat(pieces)[:sum(p.numel() for p in self.params)],
                                                self.params)

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None
'''
FROZEN_IN_FLAT = '''
class ZeRO1Adam:
    # FSDP-style: ALL parameters in the flat buffer, frozen ones included (their gradient slots
    # are zero and their elements never updated), plus one cached bf16 all-gather buffer.
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        self.lr, self.betas, self.eps, self.wd = lr, betas, eps, weight_decay
        self.params = list(dict.fromkeys(params))
        self.n, rank = dist.get_world_size(), dist.get_rank()
        numel = sum(p.numel() for p in self.params)
        self.lo, self.hi = shard_bounds(numel, self.n, rank)
        self.full = torch.zeros((self.hi - self.lo) * self.n, dtype=self.params[0].dtype)
        self.full[:numel] = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.master = self.full[self.lo:self.hi].float()
        self.m, self.v = torch.zeros_like(self.master), torch.zeros_like(self.master)
        self.ranges, i = [], 0            # local ranges of trainable elements in my shard
        for p in self.params:
            a, b = max(i, self.lo), min(i + p.numel(), self.hi)
            if p.requires_grad and a < b:
                self.ranges.append((a - self.lo, b - self.lo))
            i += p.numel()
        self.t = 0

    @torch.no_grad()
    def step(self):
        self.t += 1
        b1, b2 = self.betas
        flat = torch.zeros_like(self.full)
        i = 0
        for p in self.params:
            if p.grad is not None:
                flat[i:i + p.numel()] = p.grad.reshape(-1)
            i += p.numel()
        g = torch.empty(self.hi - self.lo, dtype=flat.dtype)
        dist.reduce_scatter_single(g, flat)
        g = g.float() / self.n
        for a, b in self.ranges:
            gi = g[a:b] + self.wd * self.master[a:b]
            self.m[a:b].mul_(b1).add_(gi, alpha=1 - b1)
            self.v[a:b].mul_(b2).addcmul_(gi, gi, value=1 - b2)
            denom = self.v[a:b].sqrt() / math.sqrt(1 - b2 ** self.t) + self.eps
            self.master[a:b].addcdiv_(self.m[a:b], denom, value=-self.lr / (1 - b1 ** self.t))
        dist.all_gather_single(self.full, self.master.to(self.full.dtype))
        i = 0
        for p in self.params:
            p.copy_(self.full[i:i + p.numel()].view_as(p))
            i += p.numel()

    def zero_grad(self):
        for p in self.params:
            p.grad = None
'''
CEIL_BOUNDS = '''
def shard_bounds(numel, world_size, rank):
    shard = math.ceil(numel / world_size)
    start = shard * rank
    return (start, start + shard)
'''
VALID = {
    "reduce-scatter, fp32 grads, cached bf16 gather buffer, tensor step, zeroed grads": (
        {"zero1-adam": REDUCE_SCATTER}, ADAM + MEM),
    "AVG all-reduce, list all_gather, lazy state in a list of dicts": (
        {"zero1-adam": AVG_LIST_GATHER}, ADAM + MEM),
    "frozen parameters in the flat buffer (FSDP-style), cached bf16 gather buffer": (
        {"zero1-adam": FROZEN_IN_FLAT}, ADAM + MEM),
    "shard_bounds with math.ceil": ({"zero1-shard-bounds": CEIL_BOUNDS}, BOUNDS),
}


@pytest.mark.parametrize("alt", list(VALID))
def test_valid_alternatives_get_full_marks(alt):
    solutions, only = VALID[alt]
    assert_full_marks(AID, solutions=solutions, only=only)
