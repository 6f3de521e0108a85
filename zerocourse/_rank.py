"""What runs inside each rank process started by `zerocourse.launch`.

The launcher's fork server imports this module (and so torch) once; every
rank is then a fork of that clean server, which is why a launch costs about a
fork and not an `import torch` per rank. Nothing here runs a torch op before
the fork, so no OpenMP thread pool is inherited.

A rank talks to the launcher over one pipe (a multiprocessing Connection) in
framed bytes, never pickle on the launcher's side of trust: each message is one
`send_bytes` of a kind byte and a payload (see KINDS). The launcher in a grader's
trusted kernel decodes only bytes, UTF-8, JSON and `torch.load(weights_only=True)`.
"""
from __future__ import annotations

import base64
import ctypes
import datetime
import faulthandler
import functools
import io
import json
import linecache
import os
import selectors
import signal
import sys
import threading
import traceback

import cloudpickle
import torch
import torch.distributed as dist


def _disable_dynamo_lazily(fn=None, recursive: bool = True):
    """torch._disable_dynamo without importing torch._dynamo until something else does.

    Every TorchDispatchMode subclass (the comm tracer, memory trackers) wraps its
    __torch_dispatch__ this way, and the first call imports torch._dynamo and sympy:
    ~1.2 s idle, ~5 s under load. The fork server imports them once (torch.optim needs
    them in every rank: launch._context), but a kernel that only imports zerocourse
    need not. Before torch._dynamo is imported nothing is being compiled, so there is
    nothing to disable: call fn.
    """
    if fn is None:
        return functools.partial(_disable_dynamo_lazily, recursive=recursive)
    disabled = _disable_dynamo(fn, recursive)

    @functools.wraps(fn)
    def inner(*args, **kwargs):
        if "torch._dynamo" in sys.modules:
            return disabled(*args, **kwargs)
        return fn(*args, **kwargs)
    return inner


_disable_dynamo, torch._disable_dynamo = torch._disable_dynamo, _disable_dynamo_lazily
import zerocourse.comm  # noqa: E402,F401 - after the patch: its tracer is a TorchDispatchMode
from zerocourse.devices import check_collective_devices, enter_rank, to_cpu  # noqa: E402

# Message kinds (first byte of each message) and their payloads:
KINDS = {
    b"o": "stdout bytes, captured at fd level (C++ prints too)",
    b"e": "stderr bytes",
    b"c": "UTF-8 text: a torch.distributed call this rank just entered",
    b"r": "cloudpickled zerocourse.report(...) values (dropped by a trusted launcher)",
    b"x": "JSON error: type, message, traceback, in_call (str), joining (bool); in normal "
          "mode also exception (base64 cloudpickle)",
    b"v": "the return value: cloudpickle, or torch.save bytes when the launcher is trusted",
    b"m": "UTF-8 label: zerocourse.footprint.mark(); the rank waits for the launcher's b'k' "
          "(it measured the rank from outside)",
}
# Seconds a rank waits for the launcher to measure it at a mark.
MARK_TIMEOUT = 60.0
# Largest message the launcher accepts (a bigger one is that rank's failure).
MAX_MESSAGE = 256 * 2**20
# Key every rank adds 1 to once its process group exists; fn runs when it reaches world_size.
_JOINED = "zerocourse/joined"

# Bytes of output forwarded per stream before the rest is dropped (counted).
OUTPUT_LIMIT = int(os.environ.get("ZEROCOURSE_OUTPUT_LIMIT", 200_000))

# Public torch.distributed calls whose entry is reported to the launcher, so a
# deadlock report can say which collective each rank was stuck in.
# (Not isend/irecv: torch's P2POp checks `op in [isend, irecv]` by identity, so a wrapped
# isend would break batch_isend_irecv; batch_isend_irecv itself is watched.)
_WATCHED = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "all_gather_single",
            "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "all_to_all",
            "all_to_all_single", "reduce", "gather", "scatter", "send", "recv", "barrier",
            "all_gather_object", "broadcast_object_list", "batch_isend_irecv")


# This process's channel to the launcher while it runs as a rank (None elsewhere);
# zerocourse.progress.report sends through it.
_CHANNEL = None


class _Channel:
    """A thread-safe sender of framed messages over the launcher's Connection."""

    def __init__(self, conn):
        self.conn = conn
        self.lock = threading.Lock()

    def send(self, msg: tuple) -> None:
        """Send ("out", stream, bytes), ("enter", text), ("report", bytes), ("error", dict)
        or ("result", bytes) as one framed message."""
        kind = msg[0]
        if kind == "out":
            data = (b"o" if msg[1] == "stdout" else b"e") + msg[2]
        elif kind == "enter":
            data = b"c" + msg[1].encode("utf-8", "replace")
        elif kind == "report":
            data = b"r" + msg[1]
        elif kind == "error":
            data = b"x" + json.dumps(msg[1]).encode()
        elif kind == "mark":
            data = b"m" + msg[1].encode("utf-8", "replace")
        else:
            data = b"v" + msg[1]
        with self.lock:
            try:
                self.conn.send_bytes(data)
            except (OSError, ValueError):
                pass  # launcher gone: nothing left to tell

    def mark(self, label: str) -> None:
        """Ask the launcher to measure this rank now, and wait until it has (see
        zerocourse.footprint). Only the thread that marks reads this connection."""
        self.send(("mark", label))
        try:
            if not self.conn.poll(MARK_TIMEOUT):
                raise TimeoutError(f"the launcher did not measure this rank within {MARK_TIMEOUT:g} s")
            self.conn.recv_bytes(16)
        except (OSError, EOFError) as e:
            raise RuntimeError(f"the launcher is gone ({e})") from None


def _forward_output(chan: _Channel, fds: dict[int, str]) -> None:
    """Read the rank's stdout/stderr pipes and forward them, capped at OUTPUT_LIMIT."""
    sel = selectors.DefaultSelector()
    for fd, name in fds.items():
        sel.register(fd, selectors.EVENT_READ, name)
    sent = {name: 0 for name in fds.values()}
    dropped = {name: 0 for name in fds.values()}
    open_fds = len(fds)
    while open_fds:
        for key, _ in sel.select():
            data = os.read(key.fd, 65536)
            if not data:
                sel.unregister(key.fd)
                os.close(key.fd)
                open_fds -= 1
                continue
            name = key.data
            room = OUTPUT_LIMIT - sent[name]
            if room > 0:
                chan.send(("out", name, data[:room]))
                sent[name] += min(room, len(data))
            dropped[name] += max(0, len(data) - max(room, 0))
    for name, n in dropped.items():
        if n:
            chan.send(("out", name, f"\n... output truncated: {n} more bytes dropped "
                                    f"(limit {OUTPUT_LIMIT} bytes per stream per rank)\n".encode()))


def _capture_output(chan: _Channel) -> threading.Thread:
    """Point fds 1 and 2 at pipes read by a forwarding thread."""
    fds = {}
    for fd, name in ((1, "stdout"), (2, "stderr")):
        r, w = os.pipe()
        os.dup2(w, fd)
        os.close(w)
        fds[r] = name
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
    t = threading.Thread(target=_forward_output, args=(chan, fds), daemon=True, name="zc-output")
    t.start()
    return t


def _describe_args(args) -> str:
    parts = []
    for a in args:
        if isinstance(a, torch.Tensor):
            parts.append(f"{str(a.dtype).replace('torch.', '')}{list(a.shape)}")
        elif isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
            parts.append(f"[{len(a)} tensors]")
    return ", ".join(parts)


# The watched call this rank is inside ("" when none): an error raised there, after a peer
# returned, is the evidence for the launcher's "collective on only some ranks" hint.
_IN_CALL = ""


def _watch_collectives(chan: _Channel) -> None:
    """Wrap torch.distributed's public calls to report each entry to the launcher."""
    counter = [0]

    def wrap(name, fn):
        def watched(*args, **kwargs):
            global _IN_CALL
            counter[0] += 1
            _IN_CALL = f"{name}({_describe_args(args)}) [call #{counter[0]}]"
            chan.send(("enter", _IN_CALL))
            check_collective_devices(name, args, kwargs)
            out = fn(*args, **kwargs)
            _IN_CALL = ""                   # left normally (an exception keeps it set)
            return out
        watched.__wrapped__ = fn
        watched._zc_watched = True
        watched.__name__ = fn.__name__
        watched.__doc__ = fn.__doc__
        return watched

    for name in _WATCHED:
        fn = getattr(dist, name, None)
        if fn is not None and not getattr(fn, "_zc_watched", False):
            setattr(dist, name, wrap(name, fn))


def _die_with_the_launcher() -> None:
    """No rank outlives the process that launched it (a kernel killed hard, a closed laptop).

    Three ties: (1) a thread waits on the launcher's sentinel pipe and exits when it
    closes; (2) we drop our copy of the fork server's "alive" pipe, so the server
    exits when the launcher dies; (3) PR_SET_PDEATHSIG kills us when the server does.
    """
    import multiprocessing.forkserver as forkserver
    from multiprocessing import parent_process
    from multiprocessing.connection import wait

    parent = parent_process()
    if parent is not None and getattr(parent, "sentinel", None) is not None:
        def watch():
            wait([parent.sentinel])
            os._exit(1)
        threading.Thread(target=watch, daemon=True, name="zc-parent-watch").start()
    alive = getattr(forkserver._forkserver, "_forkserver_alive_fd", None)
    if alive is not None:
        try:
            os.close(alive)
        except OSError:
            pass
        forkserver._forkserver._forkserver_alive_fd = None
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
        except Exception:
            pass


def rename_cells(text: str, cell_names: dict[str, str]) -> str:
    """Replace notebook cell file names by their 'Cell In[n]' names."""
    for fname, label in cell_names.items():
        text = text.replace(f'File "{fname}"', label).replace(fname, label)
    return text


def _error_info(exc: BaseException, cell_names: dict[str, str], trusted: bool) -> dict:
    """What the launcher needs to show exc: plain strings (and, unless trusted, the pickle)."""
    te = traceback.TracebackException.from_exception(exc)
    # Hide the launcher's own frames: the learner's code is what matters.
    te.stack = traceback.StackSummary.from_list(
        [f for f in te.stack if not f.filename.endswith(os.path.join("zerocourse", "_rank.py"))])
    tb = "".join(te.format())
    try:
        message = str(exc)
    except Exception:                      # a learner's __str__ that raises
        message = f"<{type(exc).__name__} whose message cannot be shown>"
    info = {"type": type(exc).__name__, "message": message,
            "traceback": rename_cells(tb, cell_names), "in_call": _IN_CALL}
    if not trusted:            # a learner's kernel gets the exception's own class back
        try:
            info["exception"] = base64.b64encode(cloudpickle.dumps(exc)).decode()
        except Exception:
            pass
    return info


def _encode_result(result, rank: int, trusted: bool) -> bytes:
    """The return value as bytes: torch.save for a trusted launcher (it loads with
    weights_only=True), cloudpickle otherwise (any picklable object)."""
    result = to_cpu(result)            # results come back on the CPU, from a GPU rank too
    try:
        if trusted:
            buf = io.BytesIO()
            torch.save(result, buf)
            return buf.getvalue()
        return cloudpickle.dumps(result)
    except Exception as e:
        raise TypeError(f"the return value of rank {rank} ({type(result).__name__}) cannot be "
                        f"pickled back to the notebook: {e}. Return plain Python values or "
                        f"tensors.") from None


def _join(spec: dict, rank: int) -> None:
    """Form the process group, then wait until every rank has formed it.

    The rendezvous store is a file in the launch's private temporary folder, not a TCPStore:
    its server listens with backlog -1, which a sandboxed network stack (gVisor) turns into
    a queue so short that ranks connecting at once wait out a SYN retransmit (~5 s).
    Without the wait, a rank whose fn returns at once tears its group down while a
    peer is still inside gloo's connectFullMesh, which then fails ("Connection closed
    by peer"): under load, the learner would see an error no code of theirs caused.
    """
    world_size, timeout = spec["world_size"], datetime.timedelta(seconds=spec["coll_timeout"])
    device = None
    if spec["backend"] == "nccl":
        torch.cuda.set_device(rank)    # one machine: the local rank is the rank
        device = torch.device("cuda", rank)
    store = dist.FileStore(spec["store"], world_size)
    store.set_timeout(timeout)
    kwargs = {"device_id": device} if device is not None else {}
    dist.init_process_group(spec["backend"], store=store, rank=rank, world_size=world_size,
                            timeout=timeout, **kwargs)
    if store.add(_JOINED, 1) == world_size:
        store.set(_JOINED + "/all", b"1")
    store.wait([_JOINED + "/all"])



def rank_main(spec: dict, rank: int, conn) -> None:
    """Entry point of one rank (the target of the forked process).

    Args:
        spec: what every rank shares: payload (cloudpickled fn, args, kwargs), world_size,
            backend, store (file path), collective timeout, cwd, sys_path, cell sources and
            names, trusted (encode the result for torch.load(weights_only=True)).
        rank: this process's rank.
        conn: write end of the pipe to the launcher.
    """
    os.setpgid(0, 0)           # own process group: the launcher kills rank + any children at once
    _die_with_the_launcher()
    global _CHANNEL
    chan = _CHANNEL = _Channel(conn)
    out_thread = _capture_output(chan)
    if spec.get("stack_fds"):          # the rank host: a pipe only the launcher reads
        stack_file = os.fdopen(spec["stack_fds"][rank], "w", closefd=False)
    else:
        stack_file = open(os.path.join(spec["tmpdir"], f"stack-{rank}.txt"), "w")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    torch.set_num_threads(1)   # N ranks share the laptop's cores
    os.chdir(spec["cwd"])
    sys.path[:] = spec["sys_path"]
    for fname, lines in spec["sources"].items():
        linecache.cache[fname] = (sum(map(len, lines)), None, lines, fname)
    cell_names = spec["cell_names"]

    # Ranks talk over loopback only (the fork server's environment is frozen at its
    # start, so set it here rather than in the kernel).
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo0" if sys.platform == "darwin" else "lo")
    world_size, trusted = spec["world_size"], spec.get("trusted", False)
    joining = True             # True until every rank has joined (no user code has run)
    try:
        if rank in spec.get("fail_join", ()):   # tests: a rendezvous that fails under load
            raise RuntimeError("Gloo connectFullMesh failed with [simulated by a test]")
        _join(spec, rank)
        _watch_collectives(chan)
        enter_rank(torch.device("cuda", rank) if spec["backend"] == "nccl" else torch.device("cpu"),
                   proxy=spec.get("device_proxy", False))
        joining = False
        # Measured from outside before any of the payload's code exists in this process.
        from zerocourse.footprint import START, return_freed_memory
        return_freed_memory()
        chan.mark(START)
        fn, args, kwargs = cloudpickle.loads(spec["payload"])
        result = fn(rank, world_size, *args, **kwargs)
        msg = ("result", _encode_result(result, rank, trusted))
    except BaseException as exc:  # noqa: BLE001 - SystemExit/KeyboardInterrupt are reported too
        msg = ("error", dict(_error_info(exc, cell_names, trusted), joining=joining))
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass
    # Flush and close our ends of the output pipes so the forwarder sees EOF and
    # sends every byte before the result message.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    out_thread.join(timeout=2.0)
    chan.send(msg)
    conn.close()


def hosted_rank_main(spec: dict, rank: int, conn, creds: dict, sentinel_fd: int) -> None:
    """A rank forked by the rank host (zerocourse/rank_host.py): shed everything of the host,
    become the rank's own user, then run as any rank.

    Before anything of the payload is unpickled: every file descriptor but this rank's own
    is closed (the host's socket to the verdict kernel, the other ranks' pipes), the rank
    joins its memory cgroup, and, when the host runs as root, it takes its own uid and the
    launch's gid (which drops every capability), sets no_new_privs and dies with the host.

    Args:
        spec: as rank_main's.
        rank: this rank.
        conn: the rank's end of its connection to the host.
        creds: {"uid": int|None, "gid": int|None, "cgroup": str|None, "host_pid": int,
                "nofile": int}.
        sentinel_fd: the pipe whose closing tells the host this process ended.
    """
    import resource
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__    # the host's point at its socket
    keep = {0, 1, 2, conn.fileno(), spec["stack_fds"][rank], sentinel_fd}
    for fd in [int(f) for f in os.listdir("/proc/self/fd")]:
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    if creds.get("cgroup"):
        with open(os.path.join(creds["cgroup"], "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    libc = ctypes.CDLL(None, use_errno=True)
    os.umask(0o007)                  # the launch's rendezvous store is shared by its group
    if creds.get("uid") is not None:
        gid = creds["gid"]
        os.setgroups([gid])
        os.setresgid(gid, gid, gid)
        os.setresuid(creds["uid"], creds["uid"], creds["uid"])    # every capability goes
        if os.getuid() != creds["uid"] or os.geteuid() != creds["uid"]:
            os._exit(70)
    libc.prctl(38, 1, 0, 0, 0)                 # PR_SET_NO_NEW_PRIVS
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)     # PR_SET_PDEATHSIG (a uid change cleared it)
    if os.getppid() != creds["host_pid"]:      # the host died before that: go too
        os._exit(1)
    linecache.clearcache()           # the host's (source lines its warnings showed): not the rank's
    # Its HOME and temporary files: the launch's folder (the host's /tmp is not the ranks').
    os.environ["HOME"] = os.environ["TMPDIR"] = spec["tmpdir"]
    import tempfile
    tempfile.tempdir = None
    n = creds.get("nofile", 256)
    resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))      # bounds what socket buffers hold
    if creds.get("uid") is not None:
        resource.setrlimit(resource.RLIMIT_NPROC, (128, 128))   # processes + threads of the rank
    rank_main(spec, rank, conn)
