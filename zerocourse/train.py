"""Train TinyGPT on the course corpus with ZeRO stage 0-3, launched by torchrun.

The implementations are YOURS: the notebook given with --impl, else your copy that `make lab`
made, my-notebooks/<id>/<id>.ipynb (loaded by zerocourse.loader). Nothing falls back on the
course's solutions (a learner's handout has none):

    stage 0  02_data_parallelism   dp_train_step, shard_batch, broadcast_parameters
    stage 1  03_zero1              ZeRO1Adam
    stage 2  04_zero2              ZeRO2Adam
    stage 3  05_zero3              ZeRO3Module + ZeRO3Adam

One box, N processes (gloo on CPU; NCCL when every local rank has its own GPU):

    torchrun --standalone --nproc_per_node=4 -m zerocourse.train --stage 3 --steps 200
    torchrun --standalone --nproc_per_node=2 -m zerocourse.train --stage 1 \\
        --impl my-notebooks/03_zero1/03_zero1.ipynb

Several boxes: the same command on each, with --nnodes, --node_rank and a rendezvous
endpoint (see README, "Beyond one machine: torchrun").

Every rank builds the same model from the same seed (stage 0 also broadcasts rank 0's
parameters), draws the same GLOBAL batch from a generator seeded identically, and trains on
its 1/N slice of it. The model and the batches are on the rank's device
(`zerocourse.rank_device()`: the rank's GPU under NCCL), and so must every tensor your
implementation creates (the course's device rule; ZEROCOURSE_DEVICE_PROXY=1 checks it on CPU). Rank 0 prints the mean loss over ranks every --log-every steps and, at the
end, a sample of generated text. Exit status 0 on success.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from zerocourse.data import get_batch, load_dataset, load_tokenizer
from zerocourse.devices import enter_rank
from zerocourse.loader import load_notebook
from zerocourse.models import GPTConfig, TinyGPT, lm_loss

STAGES = {
    0: ("02_data_parallelism", ["dp_train_step", "shard_batch", "broadcast_parameters"]),
    1: ("03_zero1", ["ZeRO1Adam"]),
    2: ("04_zero2", ["ZeRO2Adam"]),
    3: ("05_zero3", ["ZeRO3Module", "ZeRO3Adam"]),
}
REPO = Path(__file__).resolve().parent.parent


def your_notebook(stage: int) -> Path:
    """my-notebooks/<id>/<id>.ipynb (the copy `make lab` made), from here or the course folder.

    Raises:
        FileNotFoundError: saying which notebook the stage needs and how to pass it.
    """
    nb_id = STAGES[stage][0]
    for base in (Path.cwd(), REPO):
        path = base / "my-notebooks" / nb_id / f"{nb_id}.ipynb"
        if path.exists():
            return path
    raise FileNotFoundError(f"stage {stage} needs your notebook {nb_id}: none at "
                            f"my-notebooks/{nb_id}/{nb_id}.ipynb; pass --impl path/to/your/{nb_id}.ipynb")


def load_impl(stage: int, impl: str | None):
    """The module holding the stage's names, from --impl or from your my-notebooks/ copy.

    Args:
        stage: 0-3.
        impl: a notebook path, or None for my-notebooks/<id>/<id>.ipynb.
    """
    path = Path(impl) if impl else your_notebook(stage)
    return load_notebook(str(path), names=STAGES[stage][1]), path


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stage", type=int, choices=sorted(STAGES), default=3)
    p.add_argument("--impl", default=None,
                   help="a notebook (.ipynb) or .py file defining the stage's names "
                        "(default: your my-notebooks/<id>/<id>.ipynb)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=32, help="GLOBAL batch (divisible by N)")
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-embd", type=int, default=64)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--sample-chars", type=int, default=200, help="0: no sample at the end")
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    return p.parse_args(argv)


def _load_py(path: Path, names):
    """--impl may also be a .py file (e.g. from `jupyter nbconvert --to script` or %%writefile)."""
    import types
    mod = types.ModuleType(f"impl_{path.stem}")
    mod.__file__ = str(path)
    exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), mod.__dict__)
    missing = [n for n in names if n not in mod.__dict__]
    if missing:
        raise ImportError(f"{path} does not define {missing}")
    return mod


def pick_backend(choice: str) -> str:
    if choice != "auto":
        return choice
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if torch.cuda.is_available() and torch.cuda.device_count() >= local_world:
        return "nccl"
    return "gloo"


def main(argv=None) -> int:
    args = parse_args(argv)
    if "RANK" not in os.environ:
        print("zerocourse.train runs under torchrun, e.g.\n"
              "  torchrun --standalone --nproc_per_node=2 -m zerocourse.train --stage 3",
              file=sys.stderr)
        return 2
    backend = pick_backend(args.backend)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    dist.init_process_group(backend)                     # env:// (RANK, WORLD_SIZE, MASTER_*)
    # The course's device rule (zerocourse.devices): every tensor of a rank is created on
    # rank_device(), which is this rank's GPU under NCCL. The default device stays the CPU, so a
    # tensor created without device= fails here as it would in the notebooks under NCCL; with
    # ZEROCOURSE_DEVICE_PROXY=1 it lands on 'meta' and fails on the CPU too.
    enter_rank(device, proxy=os.environ.get("ZEROCOURSE_DEVICE_PROXY", "") == "1")
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        return _train(args, rank, world, device, backend)
    except RuntimeError as e:
        if any(s in str(e) for s in _DEVICE_ERRORS):
            print(f"[rank {rank}] a tensor is on the wrong device ({str(e).splitlines()[0][:200]}).\n"
                  f"  The rule: inside a rank, create every tensor on zerocourse.rank_device() "
                  f"({device} here): device=..., torch.zeros_like(t) or t.new_zeros(...).",
                  file=sys.stderr, flush=True)
        raise
    finally:
        dist.destroy_process_group()


# What torch says when a tensor created without device= meets the rank's GPU (or, under the
# device proxy, when it is on 'meta').
_DEVICE_ERRORS = ("Tensors must be CUDA", "Expected all tensors to be on the same device",
                  "is on meta", "meta tensors", "incompatible tensor type")


def _train(args, rank, world, device, backend) -> int:
    log = print if rank == 0 else (lambda *a, **k: None)
    if args.batch_size % world:
        raise SystemExit(f"--batch-size {args.batch_size} is not divisible by {world} ranks")
    names = STAGES[args.stage][1]
    if args.impl and args.impl.endswith(".py"):
        impl, path = _load_py(Path(args.impl), names), Path(args.impl)
    else:
        impl, path = load_impl(args.stage, args.impl)
    tok = load_tokenizer()
    train = load_dataset("train")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    cfg = GPTConfig(block_size=args.block_size, vocab_size=tok.vocab_size, n_layer=args.n_layer,
                    n_head=args.n_head, n_embd=args.n_embd)
    torch.manual_seed(args.seed)                         # identical initial weights everywhere
    gpt = TinyGPT(cfg, device=device).to(dtype)          # computed on the CPU, moved: same values
    psi = sum(p.numel() for p in gpt.parameters())
    log(f"stage {args.stage} | {world} ranks ({backend}, {device.type}) | TinyGPT {psi:,} params "
        f"{args.dtype} | impl {path}")

    if args.stage == 0:
        from zerocourse.optim import MixedPrecisionAdam
        impl.broadcast_parameters(gpt)
        model = gpt
        opt = MixedPrecisionAdam(gpt.parameters(), lr=args.lr)
    elif args.stage == 1:
        model, opt = gpt, impl.ZeRO1Adam(gpt.parameters(), lr=args.lr)
    elif args.stage == 2:
        model, opt = gpt, impl.ZeRO2Adam(gpt.parameters(), lr=args.lr)
    else:
        model = impl.ZeRO3Module(gpt)
        opt = impl.ZeRO3Adam(model, lr=args.lr)

    gen = torch.Generator().manual_seed(args.seed + 1)   # same global batches on every rank
    per = args.batch_size // world
    losses, t0 = [], time.perf_counter()
    for step in range(1, args.steps + 1):
        x, y = get_batch(train, args.batch_size, args.block_size, generator=gen, device=device)
        if args.stage == 0:
            loss = impl.dp_train_step(model, opt, x, y, lm_loss)
        else:
            xs, ys = x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]
            loss = lm_loss(model(xs), ys)
            loss.backward()
            opt.step()
            opt.zero_grad()
        mean = loss.detach().float().reshape(1).clone()
        dist.all_reduce(mean)
        mean = mean.item() / world
        losses.append(mean)
        if not math.isfinite(mean):
            log(f"step {step}: loss is {mean}: stopping")
            return 1
        if step == 1 or step % args.log_every == 0 or step == args.steps:
            log(f"step {step:5d} | loss {mean:.4f} | {time.perf_counter() - t0:6.1f} s", flush=True)
    k = max(1, min(10, len(losses) // 4))
    first, last = sum(losses[:k]) / k, sum(losses[-k:]) / k
    log(f"done: {args.steps} steps in {time.perf_counter() - t0:.1f} s | "
        f"loss {first:.4f} -> {last:.4f} (mean of first/last {k})")
    if args.sample_chars > 0:
        # Every rank samples (ZeRO-3 gathers parameters collectively in each forward);
        # the same generator seed gives the same text everywhere, and rank 0 prints it.
        prompt = torch.tensor([tok.encode("The ")], device=device)
        sgen = torch.Generator(device=device).manual_seed(args.seed)
        with torch.no_grad():
            out = gpt.generate(prompt, args.sample_chars, temperature=0.8, generator=sgen)
        log("sample:\n" + tok.decode(out[0].cpu()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
