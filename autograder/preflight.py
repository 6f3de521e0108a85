"""Before the first submission: can this machine grade at all? (else: stop, saying why)

A grader that cannot start its kernels gives every learner 0 with "nbgrader autograde
failed". `check(...)` is run by grade.py once per grading run, beside its first nbgrader
call: it starts one kernel of each role the way grading does (sandboxed where grading is)
and one 2-rank launch from the verdict kernel (through its rank host), and raises
SystemExit with the cause when something does not work:

- the interpreter's path is not visible inside the sandbox (a .venv that is a symbolic
  link, an interpreter outside the folders the sandbox shows);
- `zerocourse` imports from a folder the sandbox does not show (an editable install from
  another checkout), or from another copy than this checkout's;
- a kernel does not start, or the verdict kernel's launch does not come back.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
_PROBE = ("import json, sys, zerocourse; print('ZC-PROBE ' + json.dumps({'prefix': sys.prefix, "
          "'zerocourse': zerocourse.__file__}))")


def _where_zerocourse() -> str:
    """The zerocourse/__init__.py this .venv's interpreter imports (outside any sandbox)."""
    proc = subprocess.run([sys.executable, "-s", "-P", "-c", _PROBE], cwd="/", capture_output=True,
                          text=True, timeout=120) if sys.version_info >= (3, 11) else \
        subprocess.run([sys.executable, "-s", "-c", _PROBE], cwd="/", capture_output=True, text=True,
                       timeout=120)
    for line in proc.stdout.splitlines():
        if line.startswith("ZC-PROBE "):
            return json.loads(line[9:])["zerocourse"]
    raise SystemExit(f"grading cannot start: {sys.executable} cannot import zerocourse "
                     f"({proc.stderr.strip()[-500:]}); run `make setup` in {ROOT}")


def _sandboxed_probe(env: dict) -> None:
    from autograder.sandbox_kernel import bwrap_command, kernel_env, python_flags, readonly_paths
    cmd = bwrap_command([sys.executable, *python_flags(), "-c", _PROBE], env, "learner")
    proc = subprocess.run(cmd, env=kernel_env(os.environ), capture_output=True, text=True, timeout=120)
    for line in proc.stdout.splitlines():
        if line.startswith("ZC-PROBE "):
            return
    shown = readonly_paths(ROOT, "learner")
    err = proc.stderr.strip()
    if "execvp" in err or "No such file" in err or not os.path.realpath(sys.executable).startswith(
            tuple(p + os.sep for p in shown)):
        raise SystemExit(
            f"grading cannot start: the interpreter {sys.executable} is not visible inside the "
            f"grading sandbox (it resolves to {os.path.realpath(sys.executable)}; the sandbox "
            f"shows {shown}). Is .venv a symbolic link? Make it a real folder (`make setup` in "
            f"{ROOT}), or grade without the sandbox (ZEROCOURSE_SANDBOX=0, trusted work only).\n{err[-800:]}")
    raise SystemExit(f"grading cannot start: zerocourse does not import inside the grading "
                     f"sandbox, which shows only {shown}:\n{err[-1500:]}")


def check(env: dict, sandbox: bool) -> float:
    """Start a learner and a verdict kernel as grading does, and launch 2 ranks from the
    verdict kernel; returns the seconds it took, or raises SystemExit naming the cause.

    Args:
        env: the grading environment of one submission (grade.kernel_env's), its folders made.
        sandbox: whether grading runs sandboxed.
    """
    t0 = time.monotonic()
    mine = os.path.join(ROOT, "zerocourse", "__init__.py")
    found = _where_zerocourse()
    if os.path.realpath(found) != os.path.realpath(mine):
        raise SystemExit(f"grading cannot start: {sys.executable} imports zerocourse from "
                         f"{os.path.dirname(found)}, not from this checkout ({ROOT}/zerocourse); "
                         f"its kernels would run another copy of the course (or none, inside the "
                         f"sandbox). Run `make setup` in {ROOT}: each checkout needs its own .venv")
    if sandbox:
        _sandboxed_probe(env)
    _kernels(env, sandbox)
    return time.monotonic() - t0


def _kernels(env: dict, sandbox: bool) -> None:
    from jupyter_client import KernelManager
    from jupyter_client.kernelspec import KernelSpecManager
    full = dict(os.environ, **env)
    ksm = KernelSpecManager(kernel_dirs=[os.path.join(env["JUPYTER_PATH"], "kernels")])
    code = {"python3": "import zerocourse\nprint('ZC-OK', zerocourse.__file__)\n",
            "zc-verdict": ("import autograder.verdict as _v\nfrom zerocourse import launch\n"
                           "def _two(rank, world_size):\n"
                           "    import torch, torch.distributed as dist\n"
                           "    t = torch.ones(1)\n    dist.all_reduce(t)\n    return int(t.item())\n"
                           "print('ZC-OK', launch(_two, 2))\n")}
    ips = {"python3": env.get("ZEROCOURSE_KERNEL_IPC"), "zc-verdict": env.get("ZEROCOURSE_VERDICT_IPC")}
    managers, logs = {}, {}
    try:
        for name in ("python3", "zc-verdict"):
            km = KernelManager(kernel_name=name, kernel_spec_manager=ksm,
                               connection_file=os.path.join(env["JUPYTER_RUNTIME_DIR"],
                                                            f"preflight-{name}.json"))
            if sandbox and ips[name]:
                km.transport, km.ip = "ipc", ips[name]
            logs[name] = tempfile.TemporaryFile()
            km.start_kernel(env=full, extra_arguments=["--HistoryManager.enabled=False"],
                            stdout=subprocess.DEVNULL, stderr=logs[name])
            managers[name] = km
        for name, km in managers.items():
            kc = km.client()
            kc.start_channels()
            out = []
            try:
                kc.wait_for_ready(timeout=120)
                reply = kc.execute_interactive(
                    code[name], timeout=180,
                    output_hook=lambda m: out.append(m["content"].get("text", "") +
                                                     m["content"].get("evalue", "")))
            except Exception as e:  # noqa: BLE001 - said below
                out.append(f"{type(e).__name__}: {e}")
                reply = None
            finally:
                kc.stop_channels()
            text = "".join(out)
            role = "learner" if name == "python3" else "verdict"
            if reply is None or reply["content"].get("status") != "ok" or "ZC-OK" not in text:
                logs[name].seek(0)
                err = logs[name].read().decode("utf-8", "replace")[-1500:]
                raise SystemExit(f"grading cannot start: the {role} kernel "
                                 f"({'sandboxed' if sandbox else 'not sandboxed'}) failed its "
                                 f"check{' (one 2-rank launch through its rank host)' if role == 'verdict' else ''}:"
                                 f"\n{text[-1500:]}\n{err}")
    finally:
        for km in managers.values():
            try:
                km.shutdown_kernel(now=True)
            except Exception:  # noqa: BLE001
                pass
        for f in logs.values():
            f.close()
