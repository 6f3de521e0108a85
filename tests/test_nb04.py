"""04_zero2: the graded cells pass on the solution, fail on the stubs, and catch the bugs.

Bug fixtures run only the graded cells a bug can reach (`only=`). "zero2-adam-check" defines the
helpers the hidden ZeRO2Adam cells use, so it is always run with them.

Why "padding not zeroed" is caught by the memory cell and not by the trajectories: Adam is
element-wise, so garbage in the padding of the flat gradient only ever reaches the padding of
the last rank's master/exp_avg/exp_avg_sq, which the all-gather copies nowhere: the parameters
stay right (the fixture asserts the trajectory cell still passes). What the garbage does corrupt
is the optimizer's state. The test ranks call torch.use_deterministic_algorithms(True), which
makes torch.empty return NaN-filled memory, and the memory cell requires every floating-point
tensor reachable from the optimizer to be finite.
"""
import pytest

from tests.harness import assert_bug_caught, assert_full_marks, assert_stubs_fail

AID = "04_zero2"

RSM = ["zero2-reduce-scatter-mean-check", "zero2-reduce-scatter-mean-hidden"]
CHECK = "zero2-adam-check"
TRAJ = "zero2-adam-trajectory-hidden"
MEM = "zero2-adam-memory-hidden"
COMM = "zero2-adam-comm-hidden"
ADAM = [CHECK, TRAJ, MEM, COMM]
TOTAL = 14

FREE = "        for p in self.params:\n            p.grad = None\n        # 3."
BUGS = {
    # bug: (edits, cells to run, cells that must fail, cells that must pass)
    "all-reduce instead of reduce-scatter (trajectory right, bytes wrong)": (
        [("zero2-reduce-scatter-mean", "dist.reduce_scatter_single(shard, flat.contiguous(), op=dist.ReduceOp.SUM)",
          "full = flat.clone()\n    dist.all_reduce(full)\n    r = dist.get_rank()\n"
          "    shard.copy_(full[r * shard.numel():(r + 1) * shard.numel()])")],
        RSM + [CHECK, TRAJ, COMM], RSM + [COMM], [CHECK, TRAJ]),
    "full gradients kept after the step (p.grad not freed)": (
        [("zero2-adam", FREE, "        # 3.")], ADAM, [CHECK, MEM], [TRAJ, COMM]),
    "full flat gradient kept in the optimizer": (
        [("zero2-adam", "del flat", "self.flat_grad = flat")], ADAM, [MEM], [CHECK, TRAJ, COMM]),
    "gradients freed only after the all-gather": (
        [("zero2-adam", FREE, "        # 3."),
         ("zero2-adam", "p.copy_(full[offset:offset + p.numel()].view_as(p))\n            offset += p.numel()\n",
          "p.copy_(full[offset:offset + p.numel()].view_as(p))\n            offset += p.numel()\n"
          "        for p in self.params:\n            p.grad = None\n")],
        ADAM, [MEM], [CHECK, TRAJ, COMM]),
    "reduce-scatter SUM without dividing by N": (
        [("zero2-reduce-scatter-mean", "shard /= world_size", "pass")],
        RSM + [CHECK, TRAJ], RSM + [CHECK, TRAJ], []),
    "wrong shard kept (rank r takes slice r+1)": (
        [("zero2-adam", "shard_bounds(self.numel, self.world_size, self.rank)",
          "shard_bounds(self.numel, self.world_size, (self.rank + 1) % self.world_size)")],
        [CHECK, TRAJ], [CHECK, TRAJ], []),
    "padding of the flat gradient not zeroed": (
        [("zero2-adam", "flat = torch.zeros(self.padded, dtype=dtype)",
          "flat = torch.empty(self.padded, dtype=dtype)")],
        ADAM, [MEM], [CHECK, TRAJ, COMM]),
    "padding of the master not zeroed": (
        [("zero2-adam", "flat = torch.zeros(self.padded, dtype=torch.float32)",
          "flat = torch.empty(self.padded, dtype=torch.float32)")],
        [CHECK, MEM], [MEM], [CHECK]),
    "frozen parameters in the flat vector (updated by weight decay)": (
        [("zero2-adam", "self.params = trainable_parameters(params)",
          "self.params = list(dict.fromkeys(params))")],
        [CHECK, TRAJ], [CHECK, TRAJ], []),
    "hard-coded bf16": (
        [("zero2-adam", "dtype = self.params[0].dtype", "dtype = torch.bfloat16")],
        [CHECK, TRAJ], [CHECK, TRAJ], []),
    "all-gather in fp32 whatever the params' dtype": (
        [("zero2-adam", "full = torch.empty(self.padded, dtype=dtype)",
          "full = torch.empty(self.padded, dtype=torch.float32)"),
         ("zero2-adam", "dist.all_gather_single(full, self.master.to(dtype))",
          "dist.all_gather_single(full, self.master)")],
        [CHECK, TRAJ, COMM], [COMM], [CHECK, TRAJ]),
    "no ValueError for an indivisible length": (
        [("zero2-reduce-scatter-mean", "if flat.numel() % world_size != 0:", "if False:")],
        RSM, ["zero2-reduce-scatter-mean-hidden"], ["zero2-reduce-scatter-mean-check"]),
}


def test_solution_gets_full_marks():
    assert_full_marks(AID, TOTAL, cells=RSM + ADAM)


def test_every_graded_cell_fails_on_the_stubs():
    assert_stubs_fail(AID, cells=RSM + ADAM, total=TOTAL)


@pytest.mark.parametrize("bug", list(BUGS))
def test_bug_is_caught(bug):
    assert_bug_caught(AID, *BUGS[bug])


# fp32 reduce-scatter with AVG under the old collective names, state in a dict, textbook Adam
# arithmetic, zero_grad that zeroes.
DICT_STATE = '''
import math

class ZeRO2Adam:
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        self.hp = dict(lr=lr, betas=betas, eps=eps, wd=weight_decay)
        self.params = []
        for p in params:
            if p.requires_grad and all(p is not q for q in self.params):
                self.params.append(p)
        self.n, r = dist.get_world_size(), dist.get_rank()
        self.total = sum(p.numel() for p in self.params)
        self.k = math.ceil(self.total / self.n)
        flat = torch.cat([p.detach().float().flatten() for p in self.params]
                         + [torch.zeros(self.k * self.n - self.total)])
        self.state = {"step": 0, "master": flat.chunk(self.n)[r].clone(),
                      "m": torch.zeros(self.k), "v": torch.zeros(self.k)}

    @torch.no_grad()
    def step(self):
        grads = [p.grad.float().flatten() for p in self.params]
        for p in self.params:
            p.grad = None
        flat = torch.cat(grads + [torch.zeros(self.k * self.n - self.total)])
        del grads
        g = torch.empty(self.k)
        dist.reduce_scatter_tensor(g, flat, op=dist.ReduceOp.AVG)
        del flat
        s = self.state
        s["step"] += 1
        t = s["step"]
        b1, b2 = self.hp["betas"]
        if self.hp["wd"]:
            g = g + self.hp["wd"] * s["master"]
        s["m"].mul_(b1).add_(g, alpha=1 - b1)
        s["v"].mul_(b2).addcmul_(g, g, value=1 - b2)
        mhat = s["m"] / (1 - b1 ** t)
        vhat = s["v"] / (1 - b2 ** t)
        s["master"] -= self.hp["lr"] * mhat / (vhat.sqrt() + self.hp["eps"])
        dtype = self.params[0].dtype
        out = torch.empty(self.k * self.n, dtype=dtype)
        dist.all_gather_into_tensor(out, s["master"].to(dtype))
        for p, piece in zip(self.params, out[:self.total].split([p.numel() for p in self.params])):
            p.copy_(piece.view_as(p))

    def zero_grad(self):
        for p in self.params:
            if p.grad is not None:
                p.grad.zero_()
'''

# Parameters become views of one flat (padded) buffer that the all-gather writes directly;
# fp32 gradient shard through the learner's reduce_scatter_mean; the step count as a tensor.
FLAT_VIEWS = '''
class ZeRO2Adam:
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        ps = []
        for p in params:
            if p.requires_grad and not any(p is q for q in ps):
                ps.append(p)
        self.ps, self.lr, self.betas, self.eps, self.wd = ps, lr, betas, eps, weight_decay
        self.N, self.r = dist.get_world_size(), dist.get_rank()
        self.numel = sum(p.numel() for p in ps)
        self.k = -(-self.numel // self.N)
        self.flat_params = torch.zeros(self.k * self.N, dtype=ps[0].dtype)
        o = 0
        for p in ps:
            self.flat_params[o:o + p.numel()].copy_(p.detach().flatten())
            p.data = self.flat_params[o:o + p.numel()].view_as(p)
            o += p.numel()
        self.master = self.flat_params[self.r * self.k:(self.r + 1) * self.k].float().clone()
        self.m = torch.zeros_like(self.master)
        self.v = torch.zeros_like(self.master)
        self.t = torch.zeros(())

    @torch.no_grad()
    def step(self):
        flat_grad = torch.zeros(self.k * self.N, dtype=torch.float32)
        o = 0
        for p in self.ps:
            flat_grad[o:o + p.numel()] = p.grad.flatten()
            p.grad = None
            o += p.numel()
        g = reduce_scatter_mean(flat_grad)
        del flat_grad
        self.t += 1
        t = float(self.t)
        if self.wd:
            g.add_(self.master, alpha=self.wd)
        self.m.lerp_(g, 1 - self.betas[0])
        self.v.mul_(self.betas[1]).addcmul_(g, g, value=1 - self.betas[1])
        denom = (self.v.sqrt() / (1 - self.betas[1] ** t) ** 0.5).add_(self.eps)
        self.master.addcdiv_(self.m, denom, value=-self.lr / (1 - self.betas[0] ** t))
        dist.all_gather_single(self.flat_params, self.master.to(self.flat_params.dtype))

    def zero_grad(self, set_to_none=True):
        for p in self.ps:
            p.grad = None
'''

# FSDP-style: ALL parameters in the flat buffer, frozen ones included (gradient slots zero, their
# elements never updated whatever the weight decay); an fp32 gradient shard kept between steps.
FROZEN_IN_FLAT = '''
class ZeRO2Adam:
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        self.lr, self.betas, self.eps, self.wd = lr, betas, eps, weight_decay
        self.params = list(dict.fromkeys(params))
        self.n, rank = dist.get_world_size(), dist.get_rank()
        self.numel = sum(p.numel() for p in self.params)
        self.lo, self.hi = shard_bounds(self.numel, self.n, rank)
        flat = torch.zeros((self.hi - self.lo) * self.n)
        flat[:self.numel] = torch.cat([p.detach().reshape(-1).float() for p in self.params])
        self.master = flat[self.lo:self.hi].clone()
        self.m, self.v = torch.zeros_like(self.master), torch.zeros_like(self.master)
        self.ranges, i = [], 0            # local ranges of trainable elements in my shard
        for p in self.params:
            a, b = max(i, self.lo), min(i + p.numel(), self.hi)
            if p.requires_grad and a < b:
                self.ranges.append((a - self.lo, b - self.lo))
            i += p.numel()
        self.t, self.grad_shard = 0, None

    @torch.no_grad()
    def step(self):
        self.t += 1
        b1, b2 = self.betas
        dtype = self.params[0].dtype
        flat = torch.zeros((self.hi - self.lo) * self.n, dtype=dtype)
        i = 0
        for p in self.params:
            if p.grad is not None:
                flat[i:i + p.numel()] = p.grad.reshape(-1)
                p.grad = None
            i += p.numel()
        self.grad_shard = reduce_scatter_mean(flat.float())
        del flat
        g = self.grad_shard
        for a, b in self.ranges:
            gi = g[a:b] + self.wd * self.master[a:b]
            self.m[a:b].mul_(b1).add_(gi, alpha=1 - b1)
            self.v[a:b].mul_(b2).addcmul_(gi, gi, value=1 - b2)
            denom = self.v[a:b].sqrt() / (1 - b2 ** self.t) ** 0.5 + self.eps
            self.master[a:b].addcdiv_(self.m[a:b], denom, value=-self.lr / (1 - b1 ** self.t))
        full = torch.empty((self.hi - self.lo) * self.n, dtype=dtype)
        dist.all_gather_single(full, self.master.to(dtype))
        i = 0
        for p in self.params:
            p.copy_(full[i:i + p.numel()].view_as(p))
            i += p.numel()

    def zero_grad(self):
        for p in self.params:
            p.grad = None
'''

LIST_RSM = '''
def reduce_scatter_mean(flat):
    n = dist.get_world_size()
    if flat.numel() % n:
        raise ValueError(f"cannot split {flat.numel()} elements over {n} ranks")
    out = torch.empty(flat.numel() // n, dtype=flat.dtype)
    dist.reduce_scatter_tensor(out, flat, op=dist.ReduceOp.AVG)
    return out
'''

VALID = {
    "fp32 AVG reduce-scatter, dict state, zeroing zero_grad": ({"zero2-adam": DICT_STATE}, ADAM),
    "params as views of the all-gather buffer, fp32 grad shard": ({"zero2-adam": FLAT_VIEWS}, ADAM),
    "frozen parameters in the flat buffer (FSDP-style), fp32 grad shard kept": (
        {"zero2-adam": FROZEN_IN_FLAT}, ADAM),
    "reduce_scatter_mean with AVG": ({"zero2-reduce-scatter-mean": LIST_RSM}, RSM + [CHECK, COMM]),
}


@pytest.mark.parametrize("alt", list(VALID))
def test_valid_alternatives_get_full_marks(alt):
    solutions, only = VALID[alt]
    assert_full_marks(AID, solutions=solutions, only=only)
