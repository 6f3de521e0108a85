"""Notebook 09's rows of `make bench` (`--only real`): clipping and checkpoints, ours vs torch's.

Ours: 09_train_it_for_real's reference (loaded from solutions/ with the notebook loader):
clip_grad_norm_sharded, save_sharded_checkpoint, load_sharded_checkpoint on the course's
stand-in ZeRO-3 (zerocourse.standin). Torch's: FSDP2 (`fully_shard` on each TinyGPT block and on
the root, torch.optim.Adam) with `torch.nn.utils.clip_grad_norm_` on its DTensor gradients and a
DCP save / load of its model and optimizer state dicts (zerocourse.checkpoint.fsdp2_save/_load).
Same fp32 TinyGPT as bench_stages, same N (2 and 4 gloo ranks), one process group per N: the
two sides are measured in the same run, alternating, each call after a barrier; median of
`repeats` calls on rank 0 (the slowest rank decides a collective's time anyway). Every save goes
to a fresh folder; every load reads the first one. "bytes" is what the folder holds on disk.

Rows: {"N", "part" ("clip" | "save" | "load"), "ours_ms", "torch_ms", "ratio" (ours / torch),
       "ours_bytes", "torch_bytes" (save rows only)}.
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time

import torch

from zerocourse.launch import launch

NOTEBOOK = "09_train_it_for_real"
NAMES = ["clip_grad_norm_sharded", "save_sharded_checkpoint", "load_sharded_checkpoint"]
PARTS = ("clip", "save", "load")


def _folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


def _real_job(rank, world_size, nb, root, repeats):
    """Median ms of clip, save and load, ours and torch's, on rank 0 (other ranks return None)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from zerocourse import checkpoint
    from zerocourse.models import GPTConfig, TinyGPT, lm_loss, make_toy_batch
    from zerocourse.standin import StandInAdam, StandInZeRO3

    cfg = GPTConfig(vocab_size=64, block_size=64, n_layer=2, n_head=4, n_embd=64, bias=False)
    x, y = make_toy_batch(16, 64, 64, seed=1)
    k = len(x) // world_size
    xs, ys = x[rank * k:(rank + 1) * k], y[rank * k:(rank + 1) * k]

    def trained(ours: bool):
        torch.manual_seed(0)
        model = TinyGPT(cfg)
        if ours:
            model = StandInZeRO3(model)
            opt = StandInAdam(model, lr=1e-3)
        else:
            mesh = init_device_mesh("cpu", (world_size,))
            for block in model.h:
                fully_shard(block, mesh=mesh)
            fully_shard(model, mesh=mesh)
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        lm_loss(model(xs), ys).backward()              # one step: the optimizer has its state
        opt.step()
        opt.zero_grad()
        lm_loss(model(xs), ys).backward()              # and gradients to clip
        return model, opt

    sides = {"ours": trained(True), "torch": trained(False)}
    calls = {
        "ours": {"clip": lambda m, o, p: nb.clip_grad_norm_sharded(m, 1.0),
                 "save": lambda m, o, p: nb.save_sharded_checkpoint(m, o, p),
                 "load": lambda m, o, p: nb.load_sharded_checkpoint(m, o, p)},
        "torch": {"clip": lambda m, o, p: torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0),
                  "save": lambda m, o, p: checkpoint.fsdp2_save(m, o, p),
                  "load": lambda m, o, p: checkpoint.fsdp2_load(m, o, p)},
    }
    times = {(side, part): [] for side in sides for part in PARTS}
    for i in range(repeats + 1):                       # the first round warms up
        for part in PARTS:
            for side, (model, opt) in sides.items():
                folder = os.path.join(root, f"{side}-{i if part == 'save' else 0}")
                dist.barrier()
                t0 = time.perf_counter()
                calls[side][part](model, opt, folder)
                dist.barrier()
                if i:
                    times[side, part].append(time.perf_counter() - t0)
    if rank:
        return None
    out = {part: {side: 1e3 * statistics.median(times[side, part]) for side in sides} for part in PARTS}
    out["bytes"] = {side: _folder_bytes(os.path.join(root, f"{side}-1")) for side in sides}
    return out


def bench_real(world_sizes=(2, 4), repeats: int = 5) -> list[dict]:
    """The rows of the module docstring, for each N."""
    from zerocourse.loader import load_notebook
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    nb = load_notebook(os.path.join(root, "solutions", NOTEBOOK, f"{NOTEBOOK}.ipynb"), names=NAMES)
    rows = []
    for n in world_sizes:
        with tempfile.TemporaryDirectory(prefix="zc-bench-real-") as tmp:
            r = launch(_real_job, n, nb, tmp, repeats, timeout=900)[0]
        for part in PARTS:
            row = {"N": n, "part": part, "ours_ms": round(r[part]["ours"], 3),
                   "torch_ms": round(r[part]["torch"], 3),
                   "ratio": round(r[part]["ours"] / r[part]["torch"], 3)}
            if part == "save":
                row.update(ours_bytes=r["bytes"]["ours"], torch_bytes=r["bytes"]["torch"])
            rows.append(row)
            print(f"  N={n} {part}: ours {row['ours_ms']:.2f} ms, torch {row['torch_ms']:.2f} ms, "
                  f"ratio {row['ratio']:.2f}", flush=True)
    return rows


def print_real(rows: list[dict]) -> None:
    """The table `make bench` prints."""
    print("\nreal (09: clip + sharded checkpoints; ours: the reference on the stand-in, torch: FSDP2 "
          "clip_grad_norm_ + DCP; fp32 TinyGPT, median ms on rank 0)")
    print(f"{'N':>2} {'part':>5} {'ours ms':>8} {'torch ms':>9} {'ratio':>6} {'ours B':>9} {'torch B':>9}")
    for r in rows:
        extra = (f" {r['ours_bytes']:>9,} {r['torch_bytes']:>9,}" if "ours_bytes" in r else "")
        print(f"{r['N']:>2} {r['part']:>5} {r['ours_ms']:>8.2f} {r['torch_ms']:>9.2f} {r['ratio']:>6.2f}{extra}")
