"""check_environment(): one ✅/❌ line per thing the course needs."""
from __future__ import annotations

import importlib
import os
import platform
import sys
import time


def _line(ok: bool | None, text: str) -> str:
    mark = {True: "✅", False: "❌", None: "ℹ️ "}[ok]
    return f"{mark} {text}"


def _ping(rank: int, world_size: int) -> tuple[int, str]:
    import torch
    import torch.distributed as dist
    from zerocourse.devices import rank_device
    t = torch.ones(1, device=rank_device())          # the rank's device: NCCL takes GPU tensors only
    dist.all_reduce(t)
    return int(t.item()), str(rank_device())


def backend_choice(world_size: int = 2) -> tuple[str, str]:
    """The backend `launch(fn, world_size)` picks by itself (backend="auto"), and why.

    Args:
        world_size: the number of ranks of the launch.
    Returns:
        ("gloo" or "nccl", one sentence saying why).
    """
    import contextlib
    import io

    import torch
    from zerocourse.launch import pick_backend
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    # pick_backend says its choice once on stderr where GPUs are present; this line says it here.
    with contextlib.redirect_stderr(io.StringIO()):
        backend = pick_backend("auto", world_size)
    if backend == "nccl":
        why = (f"{gpus} GPUs, one per rank, and the course's NCCL path has passed `make test-gpu`: "
               f"rank r creates its tensors on cuda:r")
    elif not gpus:
        why = "no GPU here, so CPU ranks over gloo: every notebook is written for this"
    elif gpus < world_size:
        why = (f"{gpus} GPU(s) for {world_size} ranks and NCCL needs one GPU per rank, so CPU ranks "
               f"over gloo")
    else:
        why = (f"{gpus} GPU(s) found, but the course's NCCL path is only checked on CPU (the device "
               f"proxy) until `make test-gpu` passes on a GPU, so CPU ranks over gloo; "
               f"launch(fn, N, backend='nccl') tries NCCL, one GPU per rank")
    return backend, why


def check_environment(launch_ranks: int = 2, verbose: bool = True) -> dict[str, bool | None]:
    """Print and return what works here: python, torch, gloo, NCCL/GPUs, widgets, launching ranks.

    Args:
        launch_ranks: ranks to start for the end-to-end check (0 skips it).
        verbose: print the lines.
    Returns:
        {item: True (works) / False (broken) / None (optional, absent)}; "backend_nccl" says
        whether launch() would pick NCCL (else gloo; the printed line says why).
    """
    results: dict[str, bool | None] = {}
    lines = []

    py_ok = sys.version_info >= (3, 10)
    results["python"] = py_ok
    lines.append(_line(py_ok, f"Python {platform.python_version()} (need >= 3.10)"))

    try:
        import torch
        import torch.distributed as dist
        torch_ok = torch.__version__.split("+")[0] == "2.13.0"
        results["torch"] = torch_ok
        lines.append(_line(torch_ok, f"torch {torch.__version__} (the course is tested on 2.13.0)"))
        gloo = dist.is_available() and dist.is_gloo_available()
        results["gloo"] = gloo
        lines.append(_line(gloo, "torch.distributed with gloo (CPU collectives)"))
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        nccl = dist.is_nccl_available() and gpus > 0
        results["nccl"] = True if nccl else None
        lines.append(_line(True if nccl else None,
                           f"NCCL available with {gpus} GPU(s)" if nccl else
                           "no GPU/NCCL: every notebook runs on CPU ranks with gloo"))
        backend, why = backend_choice(max(launch_ranks, 1))
        results["backend_nccl"] = backend == "nccl"
        lines.append(_line(None, f"launch() picks {backend}: {why}"))
    except Exception as e:  # torch missing or broken: nothing else can work
        results["torch"] = False
        lines.append(_line(False, f"torch cannot be imported: {e}. Run `make lab` or "
                                  f"`pip install -r requirements.txt`."))

    for mod, why in (("ipywidgets", "interactive calculators"), ("matplotlib", "figures"),
                     ("tqdm", "progress bars"), ("cloudpickle", "sending notebook code to ranks")):
        try:
            m = importlib.import_module(mod)
            results[mod] = True
            lines.append(_line(True, f"{mod} {getattr(m, '__version__', '')} ({why})"))
        except Exception as e:
            results[mod] = False
            lines.append(_line(False, f"{mod} missing ({why}): {e}"))

    if launch_ranks and os.environ.get("NBGRADER_EXECUTION"):
        # Under grading the learner's kernel launches nothing (demos skip themselves, the tests
        # launch from the grader's side), so this check would only start a fork server for
        # nothing: 8-9 s of every 00 submission. The grader checked its own launches first.
        results["launch"] = None
        lines.append(_line(None, "launch(): not checked under grading (the grader checks its "
                                 "own launches before the first submission)"))
    elif launch_ranks and results.get("gloo"):
        from zerocourse.launch import launch
        try:
            t0 = time.perf_counter()
            out = launch(_ping, launch_ranks, timeout=60)
            dt = time.perf_counter() - t0
            sums, devices = [s for s, _ in out], [d for _, d in out]
            ok = sums == [launch_ranks] * launch_ranks
            results["launch"] = ok
            lines.append(_line(ok, f"launch(): {launch_ranks} ranks started, all-reduced and "
                                   f"returned {sums} in {dt:.2f} s; rank_device() in the ranks: "
                                   f"{', '.join(devices)}"))
        except Exception as e:
            results["launch"] = False
            lines.append(_line(False, f"launch() failed: {type(e).__name__}: {e}"))
    if verbose:
        print("\n".join(lines))
    return results
