"""nbgrader calls forked from a process that imported nbgrader once per grading run.

Every `nbgrader autograde` used to be a new interpreter that first spent about 2 s of CPU
importing nbgrader (with jupyter_server, tornado, nbconvert, SQLAlchemy) before it graded
anything: 2.06 CPU-s measured, a sixth of 00's whole grading, paid again by each submission.
`run` forks the call instead, from multiprocessing's fork server with those modules
preloaded (started on the first call of a grading run, it lives as long as grade.py).

What the server is, and is not:
- it imports third-party modules and forks; it never reads a submission or runs course code
  (the course's modules read their settings at import, so they are imported by each call);
- each call is a fresh child: a session of its own (a timeout kills its whole group), the
  submission's cgroups joined before anything else (as SubmissionBox.cmd's shell does), then
  the call's environment, working folder, argv, and stdout/stderr to files of its own. What
  one call does reaches neither the server nor another call;
- the child runs nbgrader's own entry point (`nbgrader.apps.nbgraderapp.main`, what the
  `nbgrader` script runs), so a call behaves as the command did.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
import threading

# What `nbgrader autograde` imports before it grades (2.06 CPU-s of a fresh interpreter):
# third-party modules only. None of them reads a course setting at import.
PRELOAD = ["nbgrader.apps.nbgraderapp", "nbgrader.preprocessors", "nbclient", "jupyter_client",
           "nbformat", "sqlalchemy"]
# Bytes of a call's stdout (and of its stderr) kept for the grader's log.
LOG_BYTES = 8 << 20
_lock = threading.Lock()
_ctx = None


def enabled() -> bool:
    """Fork nbgrader calls (the default on Linux); ZEROCOURSE_NBGRADER_FORKS=0 runs the command."""
    return os.environ.get("ZEROCOURSE_NBGRADER_FORKS", "1") != "0" and \
        "forkserver" in mp.get_all_start_methods()


def _context():
    """multiprocessing's fork server, preloading PRELOAD. grade.py's process starts no other
    forkserver child (its kernels and ranks are other processes'), so the preload is ours."""
    global _ctx
    with _lock:
        if _ctx is None:
            ctx = mp.get_context("forkserver")
            ctx.set_forkserver_preload(PRELOAD)
            _ctx = ctx
        return _ctx


def warm() -> None:
    """Start the server now (it imports PRELOAD while the caller does other work)."""
    from multiprocessing import forkserver
    _context()
    forkserver.ensure_running()


def _child(args: list[str], env: dict, cwd: str, cgroup_procs: list[str], out_path: str,
           err_path: str) -> None:
    """In the forked child: become the `nbgrader *args` command, then exit with its status."""
    os.setsid()
    code = 1
    try:
        for procs in cgroup_procs:                 # first: everything below counts against them
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
        out = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        err = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.close(out)
        os.close(err)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        sys.argv = [os.path.join(os.path.dirname(sys.executable), "nbgrader"), *args]
        _alembic_head_in_process()
        from nbgrader.apps.nbgraderapp import main
        try:
            main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:                          # noqa: BLE001 - reported as the command's stderr
        import traceback
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _alembic_head_in_process() -> None:
    """A new gradebook records its schema's head revision, which nbgrader asks of an `alembic
    heads` subprocess: a fresh interpreter, 2.3 CPU-s per grading run. The same revision is
    read here from nbgrader's own migration scripts (0.2 s)."""
    import nbgrader.api
    from nbgrader import dbutil

    def head() -> str:
        from alembic.script import ScriptDirectory
        return ScriptDirectory(dbutil.ALEMBIC_DIR).get_current_head()
    nbgrader.api.get_alembic_version = head


def run(args: list[str], env: dict, cwd: str, timeout: float | None,
                  cgroups: list[str] = ()) -> subprocess.CompletedProcess:
    """`nbgrader *args` forked from the preloaded server; like subprocess.run(capture_output):
    each autograde, and grade.py's generate_assignment and generate_feedback.

    Args:
        args: the nbgrader subcommand and its arguments.
        env: the command's whole environment.
        cwd: its working folder (which holds the nbgrader_config.py to use).
        timeout: seconds before its process group is killed (raises subprocess.TimeoutExpired).
        cgroups: cgroup folders the call joins before it runs (a submission's box).
    """
    with tempfile.TemporaryDirectory(prefix="zcnbg-") as tmp:
        out_path, err_path = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        proc = _context().Process(target=_child, args=(
            list(args), dict(env), cwd, [os.path.join(c, "cgroup.procs") for c in cgroups],
            out_path, err_path))
        proc.start()
        try:
            proc.join(timeout)
            if proc.exitcode is None:
                raise subprocess.TimeoutExpired(["nbgrader", *args], timeout)
        finally:
            if proc.exitcode is None:
                _kill_group(proc.pid)
                proc.join(30)
        out, err = _read_capped(out_path), _read_capped(err_path)
    code = proc.exitcode if proc.exitcode is not None else -signal.SIGKILL
    return subprocess.CompletedProcess(["nbgrader", *args], code, out, err)


def _read_capped(path: str, keep: int = LOG_BYTES) -> str:
    """The file's text; past `keep` bytes only its first and last halves (the kernels inherit
    these files, and a learner's process can write to them up to its sandbox's file size)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size <= keep:
                data = f.read()
            else:
                head = f.read(keep // 2)
                f.seek(size - keep // 2)
                data = head + f"\n[grade.py: {size - keep} bytes of output left out]\n".encode() + f.read()
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace")


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)             # its session: nbgrader and what it started
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, signal.SIGKILL)           # not yet its own group
        except ProcessLookupError:
            pass
