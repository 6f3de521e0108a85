"""Run nbgrader commands with this course's configuration.

nbgrader finds `nbgrader_config.py` in the working directory and calls its own
tools (alembic) through PATH, so every call goes through `nbgrader(...)` here.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BIN = os.path.dirname(sys.executable)


def assignments() -> list[str]:
    """Assignment ids: the folders of solutions/ that hold <id>/<id>.ipynb."""
    src = os.path.join(ROOT, "solutions")
    return sorted(d for d in os.listdir(src)
                  if os.path.isfile(os.path.join(src, d, f"{d}.ipynb")))


def command_env(env: dict | None = None) -> dict:
    """The whole environment of an nbgrader call: ours, this .venv's bin first on PATH, `env`."""
    full_env = dict(os.environ)
    full_env["PATH"] = BIN + os.pathsep + full_env.get("PATH", "")
    full_env.update(env or {})
    return full_env


def nbgrader(*args: str, env: dict | None = None, timeout: float | None = None,
             cwd: str = HERE, wrap=None) -> subprocess.CompletedProcess:
    """Run `nbgrader *args` from `cwd` (which holds the nbgrader_config.py to use).

    Args:
        args: the nbgrader subcommand and its arguments.
        env: extra environment variables.
        timeout: seconds before the command is killed.
        cwd: folder whose nbgrader_config.py applies.
        wrap: argv -> argv that starts it elsewhere (e.g. inside a submission's cgroups).
    """
    full_env = command_env(env)
    # Its own session, so a timeout kills nbgrader AND the kernel it started.
    argv = [os.path.join(BIN, "nbgrader"), *args]
    proc = subprocess.Popen(wrap(argv) if wrap else argv, cwd=cwd, env=full_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
