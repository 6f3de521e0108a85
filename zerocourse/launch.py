"""Run a function on N ranks from a notebook cell and get the results back.

    def hello(rank, world_size):
        print("hi")                         # shows up as "[rank 0] hi" in the cell
        return rank * 10

    launch(hello, 4)                        # -> [0, 10, 20, 30]

How it works, and why:
- Ranks are forks of a *fork server* that imported torch once (multiprocessing's
  "forkserver" context preloading `zerocourse._rank`). A launch therefore costs a
  few forks (~0.1 s) instead of N `import torch`s, and ranks start clean: the
  kernel's state does not leak in, and no OpenMP pool is inherited (forking a
  kernel that already ran torch ops deadlocks in libgomp).
- `fn` and its arguments travel by value with cloudpickle, so functions and
  classes defined in the notebook work. The cells' source travels too, so a
  rank's traceback shows the learner's lines as "Cell In[n], line k".
- The rendezvous store is a file in the launch's private temporary folder
  (a FileStore): no port to race for, and no TCP server in the kernel. Every rank
  waits until all have joined before fn runs, so a rank that returns at once never
  tears down while a peer is still connecting.
- The launcher supervises: output is streamed live with a "[rank r]" prefix; the
  first rank to fail (a death is reported before the "connection closed" errors
  it causes on its peers) raises in the kernel and the others are killed; a
  deadlock or infinite loop ends at `timeout` with each unfinished rank's last
  collective and Python stack. Interrupts (Ctrl-C, nbgrader's cell timeout) kill
  every rank; no process is left behind.
"""
from __future__ import annotations

import base64
import builtins
import collections
import datetime
import io
import json
import math
import multiprocessing as mp
import multiprocessing.connection
import multiprocessing.spawn
import os
import pickle
import re
import shutil
import signal
import stat
import sys
import tempfile
import textwrap
import time
import types
import linecache

import cloudpickle

# Seconds a launch may take in all. Keep it below the notebook's per-cell limit
# (autograder/nbgrader_config.py sets Execute.timeout = 150).
DEFAULT_TIMEOUT = float(os.environ.get("ZEROCOURSE_TIMEOUT", 60))
# Seconds a collective may wait for its peers before gloo raises on that rank.
# Shorter than the launch timeout so a deadlock becomes an error that names the
# collective, inside the rank's own traceback.
DEFAULT_COLLECTIVE_TIMEOUT = float(os.environ.get("ZEROCOURSE_COLLECTIVE_TIMEOUT", 20))
# After the first failure, how long to wait for the reports of other ranks
# before picking the one to blame (a dead rank beats its peers' echo errors).
_GRACE_S = 0.5
# Error texts that are usually an echo of ANOTHER rank dying or leaving.
_ECHO = re.compile(r"Connection closed by peer|Connection reset|Broken pipe|closed by peer|"
                   r"ECONNRESET|EPIPE|SIGABRT received|Socket closed", re.I)


# A line of torch's C++ log (glog format: "[E1130 13:40:00.123 4242 ProcessGroupGloo.cpp:67] ...").
# Kept out of the cell: it repeats, in C++ terms, the error the rank raises in Python.
_CPP_LOG = re.compile(r"^\[[EWIF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [^\]]*:\d+\] ")
# Messages are wrapped to this width, so grading feedback shows them as the notebook did.
_WIDTH = 100
# Largest message a rank may send the launcher (a bigger one is that rank's failure).
_MAX_MESSAGE = 256 * 2**20
# Trusted mode (the grader's kernel sets ZEROCOURSE_TRUSTED=1; read at each launch): ranks run
# hostile code, so nothing they send is unpickled. Results come back through
# torch.load(weights_only=True); exceptions come back as RankError (and the builtin class of
# the same name when it is one of these); zerocourse.report messages are dropped.
_TRUSTED_EXCEPTIONS = ("ValueError", "TypeError", "KeyError", "IndexError", "AssertionError",
                       "NotImplementedError", "RuntimeError", "ZeroDivisionError",
                       "AttributeError", "NameError", "TimeoutError", "ArithmeticError",
                       "LookupError")


def trusted() -> bool:
    """True in the grader's trusted kernel (ZEROCOURSE_TRUSTED=1), read at each launch."""
    return os.environ.get("ZEROCOURSE_TRUSTED", "") == "1"


class RankError(RuntimeError):
    """A rank failed (raised, died, or did not finish). `.rank` names it."""

    def __init__(self, message: str, rank: int | None = None, remote_traceback: str = ""):
        super().__init__(message)
        self.rank = rank
        self.remote_traceback = remote_traceback

    def _render_traceback_(self) -> list[str]:
        """IPython's hook: the traceback without zerocourse.launch's frames (the learner's
        cell, then the message, which carries the rank's own traceback)."""
        import traceback
        tb = _without_launcher_frames(self.__traceback__)
        try:                               # (raising here would print IPython's own error)
            from IPython import get_ipython
            return get_ipython().InteractiveTB.structured_traceback(type(self), self, tb)
        except Exception:
            return traceback.format_exception(type(self), self, tb)


def _without_launcher_frames(tb):
    """A copy of traceback chain tb without this file's frames (nor IPython's run_code)."""
    frames = []
    while tb is not None:
        fname = tb.tb_frame.f_code.co_filename
        if fname != __file__ and not fname.endswith(os.path.join("IPython", "core",
                                                                 "interactiveshell.py")):
            frames.append(tb)
        tb = tb.tb_next
    out = None
    for t in reversed(frames):
        out = types.TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return out


class RankTimeoutError(RankError, TimeoutError):
    """Some ranks did not finish within the launch timeout."""


# --------------------------------------------------------------------------
# the fork server
# --------------------------------------------------------------------------
_ctx = None


# What the fork server imports once, so that no rank imports it again. torch._dynamo (with sympy)
# is what the first torch.optim optimizer of a rank imports: ~1.2 s per rank idle, 7–28 s per
# 4-rank launch on a loaded 2-core machine (measured: 28 s -> 0.75 s with it preloaded); FSDP2
# and DCP add 0.6 s once, instead of seconds in every rank of 05, 07, 09 and 10's comparisons;
# torch.distributed.optim (ZeroRedundancyOptimizer, TorchScript-compiled at import) likewise.
FORKSERVER_PRELOAD = ["zerocourse._rank", "torch._dynamo", "torch.distributed.fsdp",
                      "torch.distributed.checkpoint", "torch.distributed.optim"]


def forkserver_preload() -> list[str]:
    """What a fork server (or the rank host) preloads: FORKSERVER_PRELOAD, or with
    ZEROCOURSE_RANK_PRELOAD=light only zerocourse._rank (torch, torch.distributed).

    The rest buys nothing where no rank steps an optimizer, and costs ~2 CPU-s per server:
    grade.py asks for "light" for a notebook whose source never mentions optim (00_setup,
    graded most often), and its preflight does. A rank that needs more imports it itself."""
    if os.environ.get("ZEROCOURSE_RANK_PRELOAD", "full") == "light":
        return FORKSERVER_PRELOAD[:1]
    return list(FORKSERVER_PRELOAD)


def _context():
    """The forkserver context, preloading torch and what ranks import (forkserver_preload()) once."""
    global _ctx
    if _ctx is None:
        _ctx = mp.get_context("forkserver")
        _ctx.set_forkserver_preload(forkserver_preload())
    return _ctx


class _plain_main:
    """Start processes without re-importing the caller's __main__ in each rank.

    multiprocessing tells every child how to re-create the parent's __main__
    (in a Jupyter kernel: import ipykernel_launcher, ~0.5 s a rank). Ranks run
    a cloudpickled fn and need none of it, so drop that part of the message.
    """

    def __enter__(self):
        self._orig = mp.spawn.get_preparation_data

        def prep(name):
            data = self._orig(name)
            data.pop("init_main_from_name", None)
            data.pop("init_main_from_path", None)
            data.pop("main_path", None)
            return data

        mp.spawn.get_preparation_data = prep

    def __exit__(self, *exc):
        mp.spawn.get_preparation_data = self._orig


def warm_up() -> None:
    """Start the fork server now (it imports torch, ~2.5 s idle) so the first launch is fast.

    Called by `import zerocourse` inside a Jupyter kernel (see the end of this file): the
    server starts while the notebook goes on importing and building models.
    """
    from multiprocessing import forkserver
    _context()
    with _plain_main():
        forkserver.ensure_running()


# --------------------------------------------------------------------------
# argument checks and payload
# --------------------------------------------------------------------------
def _cell_sources() -> tuple[dict, dict]:
    """Source lines of notebook cells (files that exist only in linecache) and their names."""
    sources = {}
    for fname, entry in list(linecache.cache.items()):
        if len(entry) == 4 and entry[2] and not os.path.exists(fname):
            sources[fname] = list(entry[2])
    names = {}
    try:
        ip = get_ipython()  # noqa: F821 - defined inside IPython
        for fname, number in getattr(ip.compile, "_filename_map", {}).items():
            if fname in sources:
                names[fname] = f"Cell In[{number}]"
    except NameError:
        pass
    return sources, names


def _code_keep_filename(code: types.CodeType):
    """cloudpickle's code reducer, but keep co_filename (it writes "<dynamic-code>"),
    so a rank's traceback can point at the notebook cell the code came from."""
    cls, args = cloudpickle.cloudpickle._code_reduce(code)
    return cls, tuple(code.co_filename if isinstance(a, str) and a == "<dynamic-code>" else a
                      for a in args)


class _Pickler(cloudpickle.Pickler):
    dispatch_table = collections.ChainMap({types.CodeType: _code_keep_filename},
                                          cloudpickle.Pickler.dispatch_table)


def dumps(obj) -> bytes:
    """cloudpickle.dumps that keeps code file names (see _code_keep_filename)."""
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def _pickle_payload(fn, args, kwargs) -> bytes:
    """Pickle (fn, args, kwargs) by value, naming the value that cannot be pickled."""
    try:
        return dumps((fn, args, kwargs))
    except Exception as e:
        suspects = [("fn", fn)] + [(f"args[{i}]", a) for i, a in enumerate(args)] + \
                   [(f"kwargs[{k!r}]", v) for k, v in kwargs.items()]
        for name, value in suspects:
            try:
                cloudpickle.dumps(value)
            except Exception as inner:
                raise TypeError(f"launch: {name} ({type(value).__name__}) cannot be sent to the "
                                f"ranks: {inner}. Pass plain values, tensors or functions; create "
                                f"open files, locks, sockets or process groups inside fn.") from None
        raise TypeError(f"launch: cannot pickle fn and its arguments: {e}") from None


def _check_args(fn, world_size, backend, timeout) -> None:
    if not callable(fn):
        raise TypeError(f"launch: fn must be a function taking (rank, world_size, ...), "
                        f"got {type(fn).__name__}: {fn!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"launch: world_size must be an int >= 1, got {type(world_size).__name__} "
                        f"{world_size!r}")
    if world_size < 1:
        raise ValueError(f"launch: world_size must be >= 1, got {world_size}")
    if world_size > 64:
        raise ValueError(f"launch: world_size={world_size} is more processes than this course "
                         f"needs (max 64); ranks here are processes on one machine")
    if backend not in ("auto", "gloo", "nccl"):
        raise ValueError(f"launch: backend must be 'auto', 'gloo' or 'nccl', got {backend!r}")
    if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"launch: timeout must be a positive number of seconds, got {timeout!r}")


# True once `make test-gpu` has passed on a machine with one GPU per rank (the README says when
# and with which figures). Until then "auto" stays on gloo, and says so where GPUs are present.
NCCL_VERIFIED = False
_BACKEND_NOTE_SHOWN = False


def pick_backend(backend: str, world_size: int) -> str:
    """'auto' -> NCCL when there is one GPU per rank and the NCCL path is verified, else gloo.

    ZEROCOURSE_BACKEND=nccl|gloo in the environment decides for 'auto' instead: `make test-gpu`
    runs the notebooks' own `launch(fn, N)` calls on NCCL with it, before 'auto' may.
    """
    import torch
    if backend == "auto":
        backend = os.environ.get("ZEROCOURSE_BACKEND", "") or "auto"
        if backend not in ("auto", "gloo", "nccl"):
            raise ValueError(f"ZEROCOURSE_BACKEND must be 'gloo' or 'nccl' (or unset), got {backend!r}")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "nccl":
        if gpus < world_size:
            raise ValueError(f"launch: backend='nccl' needs one GPU per rank "
                             f"({world_size}), found {gpus}; use 'gloo'")
        return backend
    if backend == "gloo":
        return backend
    if gpus >= world_size and NCCL_VERIFIED:
        return "nccl"
    global _BACKEND_NOTE_SHOWN
    if gpus and not _BACKEND_NOTE_SHOWN:
        _BACKEND_NOTE_SHOWN = True
        why = (f"{gpus} GPU(s) for {world_size} ranks" if gpus < world_size else
               "the course's NCCL path is checked by a CPU proxy but has not passed `make test-gpu` "
               "on a GPU yet; launch(fn, N, backend='nccl') uses one GPU per rank")
        print(f"[launch] backend gloo (CPU ranks): {why}", file=sys.stderr)
    return "gloo"


# --------------------------------------------------------------------------
# supervision
# --------------------------------------------------------------------------
class _Rank:
    """The launcher's view of one rank."""

    def __init__(self, rank: int, proc, conn, on_report=None, trusted: bool = False,
                 meter=None, stack_fd: int | None = None, raw: bool = False):
        self.rank, self.proc, self.conn = rank, proc, conn
        self.on_report = on_report
        self.trusted = trusted
        self.meter = meter                 # zerocourse.footprint.RankMeter, measures at marks
        self.stack_fd = stack_fd           # the rank host: read end of the rank's stack pipe
        self.raw = raw                     # the rank host: results stay bytes (never decoded)
        self.cpp_log: list[str] = []       # torch's C++ log lines, held back from the cell
        self.result = None
        self.has_result = False
        self.error: dict | None = None     # from an ("error", info) message
        self.died: str | None = None       # set when the process ended without a message
        self.failed_at: float | None = None
        self.last_call = "no torch.distributed call entered yet"
        self.partial = {"stdout": "", "stderr": ""}
        self.conn_open = True

    @property
    def finished(self) -> bool:
        return self.has_result or self.error is not None or self.died is not None

    @property
    def failed(self) -> bool:
        return self.error is not None or self.died is not None


def _emit(r: _Rank, stream: str, text: str, final: bool = False) -> None:
    """Print complete lines with the rank prefix (partial lines wait for more)."""
    buf = r.partial[stream] + text
    lines = buf.split("\n")
    r.partial[stream] = "" if final else lines.pop()
    if final and lines and lines[-1] == "":
        lines.pop()
    out = sys.stdout if stream == "stdout" else sys.stderr
    if stream == "stderr":
        r.cpp_log += [line for line in lines if _CPP_LOG.match(line)][-20:]
        lines = [line for line in lines if not _CPP_LOG.match(line)]
    for line in lines:
        if len(line) > 2000:
            line = line[:2000] + f" ... [{len(line) - 2000} characters cut]"
        out.write(f"[rank {r.rank}] {line}\n")
    if lines:
        out.flush()


def _drain(r: _Rank) -> None:
    """Handle every message waiting on a rank's pipe."""
    while r.conn_open:
        try:
            if not r.conn.poll():
                return
            data = r.conn.recv_bytes(_MAX_MESSAGE)
        except (EOFError, OSError) as e:
            r.conn_open = False
            if isinstance(e, OSError) and "bad message length" in str(e):
                _malformed(r, f"a message over {_MAX_MESSAGE >> 20} MiB")
            elif not r.finished:
                # The pipe closed with nothing said: the rank died. Its exit status comes
                # through the fork server, which may lag under load; wait for it a moment.
                r.proc.join(timeout=3)
                r.died, r.failed_at = _death_text(r.proc.exitcode), time.monotonic()
            return
        try:
            report = _handle(r, data[:1], data[1:])
        except Exception as e:           # whatever a rank sends, the launcher stays up
            _malformed(r, f"{type(e).__name__}: {str(e)[:200]}")
            return
        if report is not None:           # runs in the kernel: progress bars, curves
            r.on_report(r.rank, report)


def _malformed(r: _Rank, why: str) -> None:
    """A rank sent what the protocol does not allow: it failed (and is no longer read)."""
    r.conn_open = False
    if not r.failed:
        r.has_result = False
        r.died = f"sent the launcher a malformed message ({why})"
        r.failed_at = time.monotonic()


# An error report's fields (JSON), and their types; "exception" (a str) only in normal mode.
_ERROR_FIELDS = {"type": str, "message": str, "traceback": str, "in_call": str, "joining": bool}


def _handle(r: _Rank, kind: bytes, payload: bytes):
    """Act on one message (see zerocourse._rank.KINDS); raises on a malformed one.

    Returns:
        the values of a report for on_report to draw (normal mode only), else None.
    """
    if kind in (b"o", b"e"):
        _emit(r, "stdout" if kind == b"o" else "stderr", payload.decode("utf-8", "replace"))
    elif kind == b"c":
        r.last_call = payload.decode("utf-8", "replace")[:300]
    elif kind == b"m":
        # Measured from here, while the rank waits: its own code cannot reach this process.
        if r.meter is not None:
            try:
                r.meter.on_mark(payload.decode("utf-8", "replace")[:200])
            except Exception:  # noqa: BLE001 - a mark not measured is missing, the rank goes on
                pass
        r.conn.send_bytes(b"k")
    elif kind == b"r":
        if r.on_report is not None and not r.trusted:
            return cloudpickle.loads(payload)
    elif kind == b"v":
        if r.finished:
            raise ValueError("a second result")
        r.result, r.has_result = payload, True
    elif kind == b"x":
        info = json.loads(payload.decode("utf-8"))
        if not (isinstance(info, dict) and set(info) <= set(_ERROR_FIELDS) | {"exception"}
                and all(isinstance(info.get(k), t) for k, t in _ERROR_FIELDS.items())
                and isinstance(info.get("exception", ""), str)):
            raise ValueError("an error report with unexpected fields")
        if r.has_result:
            raise ValueError("an error report after a result")
        if not r.failed:
            r.error, r.failed_at = info, time.monotonic()
    else:
        raise ValueError(f"unknown message kind {kind!r}")
    return None


def _death_text(exitcode) -> str:
    if exitcode is None:
        return "ended without reporting"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        why = {"SIGABRT": " (an abort: in torch.distributed usually tensors of different sizes "
                          "or dtypes in one collective on different ranks)",
               "SIGSEGV": " (a segmentation fault)",
               "SIGKILL": " (killed: out of memory, or a limit was hit)"}.get(name, "")
        return f"was killed by {name}{why}"
    return f"exited with code {exitcode} without returning (os._exit or a crash in native code)"


def _kill(ranks: list[_Rank]) -> None:
    """Kill every rank (and anything it started), then reap."""
    for r in ranks:
        pid = r.proc.pid
        if pid is None:
            continue
        for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
            try:
                kill()
            except (ProcessLookupError, PermissionError, OSError):
                pass
    for r in ranks:
        r.proc.join(timeout=5)
        try:
            r.conn.close()
        except OSError:
            pass


def _stack_of(r: _Rank, tmpdir: str, cell_names: dict, sources: dict) -> str:
    """Ask a live rank for its Python stack (faulthandler on SIGUSR1)."""
    path = os.path.join(tmpdir, f"stack-{r.rank}.txt")
    try:
        os.kill(r.proc.pid, signal.SIGUSR1)
    except OSError:
        return "(process gone)"
    text, last = "", None
    for _ in range(60):                      # up to 3 s: a busy machine delays the signal
        time.sleep(0.05)
        text = _read_pipe(r.stack_fd, text) if r.stack_fd is not None else _read_dump(path)
        if "most recent call first" in text and text == last:
            break                            # written, and no longer growing
        last = text
    return _format_stack(text, cell_names, sources, read_files=not r.trusted)


def _read_dump(path: str) -> str:
    """The rank's faulthandler file, read without trusting it: not through a link, never
    blocking (a FIFO), at most 1 MiB (a dump is a few kB)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return ""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        return os.read(fd, 1 << 20).decode("utf-8", "replace")
    finally:
        os.close(fd)


def _read_pipe(fd: int, text: str) -> str:
    """What the rank wrote so far into its stack pipe (the rank host's way: it opens no path
    a rank can write), appended to `text`, at most 1 MiB."""
    try:
        while len(text) < 1 << 20:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            text += chunk.decode("utf-8", "replace")
    except BlockingIOError:
        pass
    except OSError:
        pass
    return text


def _format_stack(text: str, cell_names: dict, sources: dict, read_files: bool = True) -> str:
    """Keep the main thread of a faulthandler dump, most recent call last, with source lines."""
    blocks = [b for b in text.split("\n\n") if b.strip()]
    main = [b for b in blocks if "_forward_output" not in b and "in watch" not in b]
    lines = (main[0] if main else text).strip().splitlines()[1:]
    out = []
    for line in reversed(lines):
        m = re.match(r'\s*File "(.+)", line (\d+) in (.+)', line)
        if not m:
            continue
        fname, lineno, func = m.group(1), int(m.group(2)), m.group(3)
        if "/multiprocessing/" in fname or fname == "<string>" or fname.startswith("<frozen") or \
                fname.endswith((os.path.join("zerocourse", "_rank.py"), os.path.join("zerocourse", "launch.py"),
                                os.path.join("zerocourse", "rank_host.py"))):
            continue                       # the launcher's frames (a hosted rank is a fork of it)
        where = cell_names.get(fname, f'File "{fname}"')
        out.append(f"  {where}, line {lineno}, in {func}")
        # The file names come from the rank: a trusted launcher shows only the cells' lines
        # (reading any file the rank names would show it, e.g. hidden tests, in feedback).
        src = sources.get(fname) or (linecache.getlines(fname) if read_files else [])
        if 0 < lineno <= len(src):
            out.append(f"    {src[lineno - 1].strip()}")
    return "\n".join(out) or "  (no Python frames: stuck in native code)"


def _status_lines(ranks: list[_Rank]) -> str:
    lines = []
    for r in ranks:
        if r.has_result:
            state = "returned"
        elif r.error is not None:
            state = f"raised {r.error['type']}"
        elif r.died is not None:
            state = r.died
        else:
            state = "was stopped"
        lines.append(f"  rank {r.rank}: {state}; last call: {r.last_call}")
    return "\n".join(lines)


def _blame(ranks: list[_Rank]) -> _Rank:
    """The rank that failed first, preferring real causes over echoes of a peer's death."""
    failed = sorted((r for r in ranks if r.failed), key=lambda r: r.failed_at)
    deaths = [r for r in failed if r.died is not None]
    causes = [r for r in failed if r.error is not None and not _ECHO.search(
        r.error["message"] + r.error["type"])]
    return (deaths or causes or failed)[0]


class _JoinFailed(Exception):
    """Every failed rank failed while joining the process group (no user code ran): retry."""

    def __init__(self, rank: int, message: str):
        super().__init__(message)
        self.rank = rank


# A rendezvous that failed for a transient reason (a loaded machine), not because of the code.
_TRANSIENT_JOIN = re.compile(r"connectFullMesh|Connection refused|Connection reset|timed out|"
                             r"Timeout|Socket", re.I)


def _raise_failure(ranks: list[_Rank], retry_join: bool = False) -> None:
    __tracebackhide__ = True
    failed = [x for x in ranks if x.failed]
    if retry_join and not any(x.has_result for x in ranks) and failed and all(
            x.error is not None and x.error.get("joining") and _TRANSIENT_JOIN.search(x.error["message"])
            for x in failed):
        first = min(failed, key=lambda x: x.failed_at)
        raise _JoinFailed(first.rank, first.error["message"])
    r = _blame(ranks)
    status = _status_lines(ranks)
    returned = [x.rank for x in ranks if x.has_result]
    hint = ""
    # The evidence for "a collective on only some ranks": a rank returned while a peer that
    # failed was inside a collective it had called (and failed with an echo of that exit).
    stranded = [x.rank for x in ranks if x.error and x.error.get("in_call")
                and _ECHO.search(x.error["message"])]
    if returned and stranded:
        hint = (f"\nHint: rank(s) {returned} returned while rank(s) {stranded} were still in a "
                f"collective:\nis a collective called on only some ranks (e.g. inside "
                f"`if rank == 0:`)?")
    if r.died is not None:
        log = "".join(f"\n  {line}" for line in r.cpp_log[-5:])
        raise RankError(_wrap(f"rank {r.rank} {r.died}."
                              + (f"\nIts last C++ log lines:{log}" if log else "")
                              + f"\nRanks:\n{status}{hint}"), rank=r.rank)
    info = r.error
    message = _wrap(f"rank {r.rank} failed with {info['type']}: {info['message']}\n"
                    f"--- traceback from rank {r.rank} ---\n{info['traceback'].rstrip()}\n"
                    f"--- ranks ---\n{status}{hint}")
    raise _as_original_type(info, message, r.rank, r.trusted)


def _wrap(text: str, width: int = _WIDTH) -> str:
    """Wrap long lines (gloo's one-line errors), keeping indentation, so the message reads the
    same in a notebook and in grading feedback."""
    out = []
    for line in text.splitlines():
        if len(line) <= width:
            out.append(line)
            continue
        indent = line[:len(line) - len(line.lstrip())]
        out += textwrap.wrap(line, width, initial_indent="", subsequent_indent=indent + "    ",
                             break_long_words=True, break_on_hyphens=False) or [line[:width]]
    return "\n".join(out)


def _as_original_type(info: dict, message: str, rank: int, trusted: bool = False) -> RankError:
    """A RankError that is also an instance of the rank's exception class when possible,
    so `except ValueError:` in the notebook catches a ValueError raised in a rank.

    Trusted mode unpickles nothing: the class is a builtin one named in _TRUSTED_EXCEPTIONS.
    """
    cls = None
    if trusted:
        if info["type"] in _TRUSTED_EXCEPTIONS:
            cls = getattr(builtins, info["type"])
    else:
        try:
            original = cloudpickle.loads(base64.b64decode(info["exception"])) \
                if info.get("exception") else None
        except Exception:
            original = None
        cls = type(original) if original is not None else None
    if cls is not None and issubclass(cls, Exception) and not issubclass(cls, RankError):
        try:
            both = type(cls.__name__, (RankError, cls), {"__module__": cls.__module__,
                                                         "__str__": RankError.__str__})
            err = both.__new__(both)
            RankError.__init__(err, message, rank, info["traceback"])
            return err
        except TypeError:
            pass
    return RankError(message, rank, info["traceback"])


def _decode_result(r: _Rank):
    """A rank's return value: cloudpickle in a learner's kernel; in the trusted kernel only
    plain data, rebuilt (zerocourse.plain.decode: values, tensors, Fractions)."""
    __tracebackhide__ = True
    if r.raw:                              # the rank host hands the bytes on, undecoded
        return r.result
    if not r.trusted:
        try:
            return cloudpickle.loads(r.result)
        except Exception as e:
            raise RankError(f"the return value of rank {r.rank} could not be unpickled in the "
                            f"notebook: {e}", rank=r.rank) from None
    from zerocourse.plain import decode
    try:
        return decode(r.result)
    except Exception as e:
        reason = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        raise RankError(_wrap(f"rank {r.rank} returned a value the grader cannot accept "
                              f"({reason}): return plain values (numbers, strings, tensors, "
                              f"lists, tuples, dicts)"), rank=r.rank) from None


def _supervise(ranks: list[_Rank], timeout: float, deadline: float, tmpdir: str, sources,
               cell_names, retry_join: bool = False, watch=None) -> list:
    """Follow the ranks until all returned (their results), one failed or the deadline passed.

    Args:
        watch: (waitable, callback) of the rank host: callback() when its socket to the
            verdict kernel is readable (a cancel raises out of here; the ranks are killed).
    """
    __tracebackhide__ = True
    by_sentinel = {r.proc.sentinel: r for r in ranks}
    by_conn = {r.conn: r for r in ranks}
    first_failure = None
    while True:
        waitables = [r.conn for r in ranks if r.conn_open] + \
                    [r.proc.sentinel for r in ranks if r.proc.exitcode is None]
        if watch is not None:
            waitables.append(watch[0])
        ready = mp.connection.wait(waitables, timeout=0.05) if waitables else []
        if watch is not None:
            if watch[0] in ready:
                watch[1]()
            if len(watch) > 2:
                watch[2]()
        for w in ready:
            if w in by_conn:
                _drain(by_conn[w])
        for w in ready:
            if w in by_sentinel:
                r = by_sentinel[w]
                r.proc.join(timeout=1)
                _drain(r)            # its last words may still be in the pipe
                if not r.finished:
                    r.died, r.failed_at = _death_text(r.proc.exitcode), time.monotonic()
        now = time.monotonic()
        if all(r.has_result for r in ranks):
            break
        if any(r.failed for r in ranks):
            first_failure = first_failure or now
            if all(r.finished for r in ranks) or now - first_failure > _GRACE_S:
                _flush_partials(ranks)
                _raise_failure(ranks, retry_join)
        if now > deadline:
            _flush_partials(ranks)
            _raise_timeout(ranks, timeout, tmpdir, sources, cell_names)
    _flush_partials(ranks)
    return [_decode_result(r) for r in ranks]


def _flush_partials(ranks: list[_Rank]) -> None:
    for r in ranks:
        _drain(r)
        for stream in ("stdout", "stderr"):
            if r.partial[stream]:
                _emit(r, stream, "", final=True)


def _raise_timeout(ranks, timeout, tmpdir, sources, cell_names) -> None:
    __tracebackhide__ = True
    stuck = [r for r in ranks if not r.finished]
    parts = []
    for r in stuck:
        parts.append(f"rank {r.rank} did not finish; last call: {r.last_call}\n"
                     f"  its Python stack (most recent call last):\n"
                     f"{_stack_of(r, tmpdir, cell_names, sources)}")
    done = [r.rank for r in ranks if r.has_result]
    hint = ("Hint: a rank stuck in a collective waits for peers that never call the same "
            "collective (different op, order or count on some ranks); a rank stuck elsewhere "
            "is in a loop that does not end.")
    raise RankTimeoutError(_wrap(
        f"launch timed out after {timeout:g} s: rank(s) {[r.rank for r in stuck]} did not finish"
        f"{f' (rank(s) {done} returned)' if done else ''}.\n" + "\n".join(parts) +
        f"\n--- ranks ---\n{_status_lines(ranks)}\n{hint}"), rank=stuck[0].rank)


# --------------------------------------------------------------------------
# the entry point
# --------------------------------------------------------------------------
def launch(fn, world_size: int, *args, backend: str = "auto", timeout: float | None = None,
           collective_timeout: float | None = None, on_report=None, **kwargs) -> list:
    """Run `fn(rank, world_size, *args, **kwargs)` on `world_size` ranks; return results in rank order.

    Each rank is a fresh process with a torch.distributed process group already
    initialised (gloo on CPU, or NCCL with one GPU per rank).

    Args:
        fn: a function (it may be defined in the notebook) taking (rank, world_size, ...).
        world_size: number of ranks, >= 1.
        *args, **kwargs: passed to fn on every rank (by value: each rank gets its own copy).
        backend: "auto" (gloo; NCCL with one GPU per rank once the NCCL path is verified,
            see NCCL_VERIFIED), "gloo" or "nccl". Inside a rank, zerocourse.rank_device()
            is the device to create tensors on; results come back on the CPU.
        timeout: seconds for the whole launch (default ZEROCOURSE_TIMEOUT or 60).
        collective_timeout: seconds a collective waits for its peers before failing
            (default ZEROCOURSE_COLLECTIVE_TIMEOUT or 20, capped at timeout / 2).
        on_report: called as on_report(rank, values) in the notebook, while the ranks run,
            for each `zerocourse.report(**values)` a rank makes (see zerocourse.progress).
    In the grader's trusted kernel (ZEROCOURSE_TRUSTED=1) nothing a rank sends is unpickled:
    results must be plain data (zerocourse.plain: values, tensors, Fractions), an exception
    keeps its class only if it is a common builtin one, on_report gets nothing; the verdict
    kernel's ranks run in the rank host, a sandbox and users of their own (zerocourse/rank_host.py).
    Every rank is measured from outside at its zerocourse.footprint.mark() calls: the figures
    of the last launch are zerocourse.footprint.last_launch().

    Raises:
        RankError: the first rank that failed (also an instance of its exception's class).
        RankTimeoutError: ranks that did not finish in time, with their last collective and stack.
    """
    __tracebackhide__ = True
    timeout = DEFAULT_TIMEOUT if timeout is None else timeout
    _check_args(fn, world_size, backend, timeout)
    if on_report is not None and not callable(on_report):
        raise TypeError(f"launch: on_report must be a function (rank, values) or None, got "
                        f"{type(on_report).__name__}")
    coll_timeout = collective_timeout or min(DEFAULT_COLLECTIVE_TIMEOUT, timeout / 2)
    backend = pick_backend(backend, world_size)
    payload = _pickle_payload(fn, args, kwargs)
    sources, cell_names = _cell_sources()
    spec = dict(payload=payload, world_size=world_size, backend=backend,
                coll_timeout=coll_timeout, cwd=os.getcwd(), sys_path=list(sys.path),
                sources=sources, cell_names=cell_names, trusted=trusted(),
                device_proxy=os.environ.get("ZEROCOURSE_DEVICE_PROXY", "") == "1")
    from zerocourse import rank_host
    host = rank_host.client() if spec["trusted"] else None
    if host is not None:                   # the grader's verdict kernel: ranks live elsewhere
        return host.launch(spec, timeout)
    return run_spec(spec, timeout, on_report)


def run_spec(spec: dict, timeout: float, on_report=None, hosted=None) -> list:
    """Start the ranks `spec` describes and supervise them (retrying a failed join); the part
    of `launch` that the rank host (zerocourse/rank_host.py) runs for the verdict kernel.

    Args:
        spec: what launch() built: payload, world_size, backend, coll_timeout, cwd, sys_path,
            sources, cell_names, trusted, device_proxy.
        timeout: seconds for the whole launch.
        on_report: see launch().
        hosted: the rank host's way of starting ranks (None: the fork server, as this user).
    Returns:
        the ranks' results (bytes, undecoded, when hosted).
    """
    __tracebackhide__ = True
    deadline = time.monotonic() + timeout
    world_size = spec["world_size"]
    for attempt in range(JOIN_ATTEMPTS):
        spec["fail_join"] = _FAIL_JOIN if attempt < _FAIL_JOIN_TIMES else ()
        try:
            return _launch_once(spec, world_size, timeout, deadline, on_report,
                                retry_join=attempt + 1 < JOIN_ATTEMPTS, hosted=hosted)
        except _JoinFailed as e:
            # Nothing of fn ran: start the ranks again (gloo's connect can fail on a machine
            # so loaded that a peer answers late).
            print(f"[launch] rank {e.rank} could not join the process group ({str(e)[:200]}); "
                  f"starting the ranks again", file=sys.stderr)
            time.sleep(0.5 * (attempt + 1))          # let a burst of load pass
        except RankError as failure:
            # The message carries the rank's own traceback; the launcher's frames would only
            # stand between it and the learner's cell (and RankError._render_traceback_ drops
            # this last one from what IPython shows).
            raise failure.with_traceback(None) from None


# Tries at forming the process group before the failure is reported as the rank's error.
JOIN_ATTEMPTS = 3
# Tests of the retry only: these ranks fail to join on the first _FAIL_JOIN_TIMES attempts.
_FAIL_JOIN: tuple = ()
_FAIL_JOIN_TIMES = 1


def _launch_once(spec: dict, world_size: int, timeout: float, deadline: float, on_report,
                 retry_join: bool, hosted=None) -> list:
    """One start of the ranks: a fresh store and fresh processes, supervised until `deadline`
    (time.monotonic()); `timeout` is the launch's whole budget, as the messages say it.
    Each rank is measured from here at its marks (zerocourse.footprint)."""
    __tracebackhide__ = True
    from zerocourse import _rank, footprint
    tmpdir = hosted.new_folder() if hosted is not None else tempfile.mkdtemp(prefix="zerocourse-launch-")
    spec = dict(spec, store=os.path.join(tmpdir, "store"), tmpdir=tmpdir)
    if hosted is not None:
        spec["cwd"] = tmpdir                # a hosted rank's cwd and HOME: the launch's folder
    ctx = hosted.context if hosted is not None else _context()
    ranks: list[_Rank] = []
    try:
        with _plain_main():
            for rank in range(world_size):
                mine, theirs = ctx.Pipe(duplex=True)     # results out, the launcher's acks in
                if hosted is not None:
                    proc, meter, stack_fd = hosted.start_rank(spec, rank, theirs)
                else:
                    proc = ctx.Process(target=_rank.rank_main, args=(spec, rank, theirs),
                                       name=f"zerocourse-rank{rank}", daemon=True)
                    proc.start()
                    meter, stack_fd = footprint.RankMeter(proc.pid), None
                theirs.close()
                ranks.append(_Rank(rank, proc, mine, on_report, spec["trusted"], meter=meter,
                                   stack_fd=stack_fd, raw=hosted is not None))
        return _supervise(ranks, timeout, max(deadline, time.monotonic() + 1.0), tmpdir,
                          spec["sources"], spec["cell_names"], retry_join,
                          watch=hosted.watch if hosted is not None else None)
    finally:
        # Runs on success, failure, KeyboardInterrupt and nbgrader's cell timeout alike.
        _kill(ranks)
        footprint._LAST = [r.meter.figures() for r in ranks if r.meter is not None]
        if hosted is not None:
            hosted.done(tmpdir, ranks)
        else:
            shutil.rmtree(tmpdir, ignore_errors=True)


# In a Jupyter kernel, start the fork server as soon as zerocourse is imported: it imports
# torch while the notebook goes on importing, so the first launch does not wait for it.
if "ipykernel" in sys.modules and os.environ.get("ZEROCOURSE_WARM_UP", "1") == "1" and \
        not os.environ.get("ZEROCOURSE_RANK_HOST_FD"):
    try:
        warm_up()
    except Exception:       # a launch will start it (and report why it cannot) later
        pass
