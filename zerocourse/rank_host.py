"""The rank host: where the grader's verdict kernel has its ranks run, out of its reach.

Under grading (autograder/sandbox_kernel.py), the verdict kernel runs the course's tests and
no learner code; the ranks of its launches do run learner code (it is what the tests test).
They used to be forks of a server inside the verdict kernel's sandbox, as its user: they
could write its folders, signal it, read what it read. Now each verdict kernel has a rank
host of its own, started beside it by sandbox_kernel.py in a third sandbox (its own PID,
network, IPC and UTS namespaces, a small tmpfs for /tmp, nothing of either kernel's folders):

    verdict kernel --(inherited socketpair: no path anyone could reach)--> rank host
        launch(fn, n) in trusted mode sends the launch: the pickled (fn, args, kwargs) as
        bytes (the verdict kernel never unpickles learner objects: they travel as bytes),
        and world size, backend, timeouts
    rank host: imports torch once, forks the ranks itself; each rank, before it unpickles
        anything, closes every descriptor but its own, joins its memory cgroup, becomes a
        user of its own (as root: base uid + rank, the launch's gid; every capability goes),
        sets no_new_privs and dies with the host. The host supervises them with the
        launcher's own code (zerocourse/launch.py: output streaming, first-failure blame,
        deadlock stacks, timeouts, join retries), never unpickles what a rank sends, never
        opens a path a rank can write (stack dumps come through pipes), and measures each
        rank from outside at its marks (zerocourse/footprint.py).
    back to the verdict kernel: output lines as they come; then the results as torch.save
        bytes (decoded there by zerocourse.plain), or the failure as text, and the figures.

Frames on the socket: an 8-byte big-endian length, one kind byte, a body:
    to the host      L  4-byte length + JSON header + payload bytes     a launch
                     C  (empty)                                         cancel it (Ctrl-C)
    to the verdict   o / e  UTF-8 text                                  ranks' stdout / stderr
                     R  JSON {"sizes": [...], "figures": [...]} + results  the ranks returned
                     F  JSON {"type", "builtin", "message", "rank", "timeout", "figures"}
                     X  JSON {"figures"}                                cancelled

    python -m zerocourse.rank_host --fd N [--uid-base U --gid G] [--memcg DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import struct
import sys
import tempfile
import threading
import time

ENV_FD = "ZEROCOURSE_RANK_HOST_FD"
MAX_FRAME = 1 << 30
_HEADER_KEYS = {"world_size": int, "backend": str, "coll_timeout": (int, float),
                "timeout": (int, float), "device_proxy": bool, "fail_join": list}


def send_frame(sock: socket.socket, kind: bytes, body: bytes = b"") -> None:
    sock.sendall(struct.pack(">Q", len(body) + 1) + kind + body)


def recv_frame(sock: socket.socket) -> tuple[bytes, bytes]:
    """(kind, body); EOFError when the other side closed."""
    n = struct.unpack(">Q", _exact(sock, 8))[0]
    if not 1 <= n <= MAX_FRAME:
        raise ValueError(f"a frame of {n} bytes")
    data = _exact(sock, n)
    return data[:1], data[1:]


def _exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError("the other side closed the connection")
        buf += chunk
    return bytes(buf)


# --------------------------------------------------------------------------
# the verdict kernel's side
# --------------------------------------------------------------------------
_CLIENT = None


def client():
    """The connection to this kernel's rank host (ZEROCOURSE_RANK_HOST_FD), or None."""
    global _CLIENT
    fd = os.environ.get(ENV_FD)
    if not fd:
        return None
    if _CLIENT is None:
        _CLIENT = Client(int(fd))
    return _CLIENT


class Client:
    """Sends launches to the rank host and turns its answers into what launch() returns."""

    def __init__(self, fd: int):
        self.sock = socket.socket(fileno=fd)
        self.lock = threading.Lock()
        self.broken = ""                   # why the host can no longer be used

    def launch(self, spec: dict, timeout: float) -> list:
        """Run `spec` (launch()'s) on the host; return the decoded results or raise as launch()."""
        __tracebackhide__ = True
        import importlib
        from zerocourse import footprint
        L = importlib.import_module("zerocourse.launch")
        header = {"world_size": spec["world_size"], "backend": spec["backend"],
                  "coll_timeout": float(spec["coll_timeout"]), "timeout": float(timeout),
                  "device_proxy": bool(spec["device_proxy"]), "fail_join": list(L._FAIL_JOIN)}
        head = json.dumps(header).encode()
        with self.lock:
            footprint._LAST = None
            if self.broken:
                raise L.RankError(f"the rank host of the grader is gone ({self.broken})")
            try:
                send_frame(self.sock, b"L", struct.pack(">I", len(head)) + head + spec["payload"])
                kind, body = self._answer(timeout + 30)
            except KeyboardInterrupt:
                # A cell timeout or Ctrl-C: the host kills the ranks, then says so.
                try:
                    send_frame(self.sock, b"C")
                    self._answer(15)
                except Exception:  # noqa: BLE001 - the interrupt is what matters
                    pass
                raise
            except (OSError, EOFError, ValueError, struct.error) as e:
                self.broken = f"{type(e).__name__}: {e}"
                self.sock.close()                  # it exits; no later launch waits on it
                raise L.RankError(f"the rank host of the grader stopped answering "
                                  f"({self.broken})") from None
        if kind == b"R":
            n = struct.unpack(">I", body[:4])[0]
            info = json.loads(body[4:4 + n])
            footprint._LAST = info.get("figures")
            results, at = [], 4 + n
            for rank, size in enumerate(info["sizes"]):
                r = L._Rank(rank, None, None, trusted=True)
                r.result = body[at:at + size]
                at += size
                results.append(L._decode_result(r))
            return results
        if kind == b"F":
            info = json.loads(body)
            footprint._LAST = info.get("figures")
            message, rank = str(info["message"]), info.get("rank")
            if info.get("timeout"):
                raise L.RankTimeoutError(message, rank=rank)
            builtin = info.get("builtin") if info.get("builtin") in L._TRUSTED_EXCEPTIONS else "RankError"
            raise L._as_original_type({"type": builtin, "traceback": ""}, message, rank,
                                      trusted=True).with_traceback(None) from None
        info = json.loads(body) if body else {}
        footprint._LAST = info.get("figures")
        raise L.RankError("the launch was cancelled")

    def _answer(self, timeout: float) -> tuple[bytes, bytes]:
        """Print the ranks' output until the host's final frame; return it."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise OSError(f"no answer within {timeout:g} s")
            self.sock.settimeout(left)
            kind, body = recv_frame(self.sock)
            if kind in (b"o", b"e"):
                out = sys.stdout if kind == b"o" else sys.stderr
                out.write(body.decode("utf-8", "replace"))
                out.flush()
                continue
            return kind, body


# --------------------------------------------------------------------------
# the host's side
# --------------------------------------------------------------------------
class _Cancelled(BaseException):
    """The verdict kernel cancelled the launch (or went away: `gone`)."""

    def __init__(self, gone: bool):
        super().__init__("cancelled")
        self.gone = gone


class _FrameStream:
    """sys.stdout / sys.stderr of the host: the launcher's prefixed lines go to the verdict."""

    def __init__(self, sock: socket.socket, kind: bytes, lock: threading.Lock):
        self.sock, self.kind, self.lock = sock, kind, lock

    def write(self, text: str) -> int:
        if text:
            with self.lock:
                try:
                    send_frame(self.sock, self.kind, text.encode("utf-8", "replace"))
                except OSError:
                    pass
        return len(text)

    def flush(self) -> None:
        pass


class Forked:
    """A rank forked by the host: what the launcher's supervision uses of a Process (pid,
    sentinel, exitcode, join), with nothing of multiprocessing in the child."""

    def __init__(self, target, args: tuple):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:                          # the rank: `w` closes when it exits
            code = 1
            try:
                os.close(r)
                target(*args, sentinel_fd=w)
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            except BaseException:  # noqa: BLE001 - its launcher hears of it from its pipe
                code = 1
            finally:
                os._exit(code)
        os.close(w)
        self.pid, self.sentinel, self._exitcode = pid, r, None

    @property
    def exitcode(self) -> int | None:
        if self._exitcode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return self._exitcode
            if pid:
                self._exitcode = os.waitstatus_to_exitcode(status)
                os.close(self.sentinel)
                self.sentinel = None
        return self._exitcode

    def join(self, timeout: float | None = None) -> None:
        from multiprocessing.connection import wait
        end = time.monotonic() + (timeout if timeout is not None else 3600)
        if self._exitcode is None and self.sentinel is not None:
            wait([self.sentinel], timeout)
        # The pipe closes a moment before the process can be reaped (the kernel closes its
        # files first): poll, never block (a rank may close the pipe and live on).
        end = min(end, time.monotonic() + 1.0)
        while self.exitcode is None and time.monotonic() < end:
            time.sleep(0.002)


class Hosted:
    """How the host starts ranks (the `hosted` of zerocourse.launch.run_spec)."""

    def __init__(self, sock: socket.socket, uid_base: int | None, gid: int | None,
                 memcg: str | None):
        import multiprocessing
        import types
        self.sock, self.uid_base, self.gid, self.memcg = sock, uid_base, gid, memcg
        self.context = types.SimpleNamespace(Pipe=multiprocessing.Pipe)   # the host forks
        self.watch = (sock, self._control, self.tick)
        self.meters: list = []
        self._seen = 0.0
        self.launches = 0
        self._pipes: list[int] = []
        self._cgroups: list[str] = []

    def _control(self) -> None:
        """The verdict kernel wrote during a launch: only a cancel (or its end) is possible."""
        try:
            self.sock.settimeout(5)
            kind, _ = recv_frame(self.sock)
        except (OSError, EOFError, ValueError, struct.error):
            raise _Cancelled(gone=True) from None
        if kind == b"C":
            raise _Cancelled(gone=False)
        raise _Cancelled(gone=True)       # only a cancel may come during a launch

    def new_folder(self) -> str:
        """The launch's folder (store, the ranks' cwd): root's, writable by the launch's group
        only, in the host's own /tmp; the host itself never opens anything in it."""
        self.launches += 1
        path = tempfile.mkdtemp(prefix=f"launch{self.launches}-")
        if self.gid is not None:
            os.chown(path, -1, self.gid)
            os.chmod(path, 0o2770)
            # torch's FileStore creates its file 0644: made here first (before any rank of
            # this launch exists), writable by the launch's group.
            fd = os.open(os.path.join(path, "store"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o660)
            os.fchmod(fd, 0o660)
            os.close(fd)
        else:
            os.chmod(path, 0o700)
        return path

    def start_rank(self, spec: dict, rank: int, conn):
        """Fork rank `rank`; returns (process, its meter, the read end of its stack pipe)."""
        from zerocourse import _rank, footprint
        r_fd, w_fd = os.pipe()
        os.set_blocking(r_fd, False)
        self._pipes += [r_fd, w_fd]
        spec.setdefault("stack_fds", {})[rank] = w_fd
        uid = None if self.uid_base is None else self.uid_base + rank
        cgroup = None
        if self.memcg:
            cgroup = os.path.join(self.memcg, f"l{self.launches}-r{rank}-{os.getpid()}")
            try:
                os.mkdir(cgroup)
                self._cgroups.append(cgroup)
            except OSError:
                cgroup = None
        creds = {"uid": uid, "gid": self.gid, "cgroup": cgroup, "host_pid": os.getpid(),
                 "nofile": 256}
        proc = Forked(_rank.hosted_rank_main, (spec, rank, conn, creds))
        os.close(w_fd)
        self._pipes.remove(w_fd)
        meter = footprint.RankMeter(proc.pid, uid=uid, cgroup=cgroup, netns_total=True)
        self.meters.append(meter)
        return proc, meter, r_fd

    def tick(self) -> None:
        """Every ~50 ms of a launch: note every rank socket's bytes (one sock_diag dump of
        this namespace, which holds only the ranks' sockets)."""
        now = time.monotonic()
        if now - self._seen < 0.05 or not self.meters:
            return
        self._seen = now
        from zerocourse.footprint import tcp_sockets
        socks = tcp_sockets()
        for meter in self.meters:
            meter.see_sockets(socks)

    def done(self, tmpdir: str, ranks) -> None:
        """After a launch (the ranks are killed): kill whatever else runs as the ranks' users
        (a child that left the rank's process group), close the pipes, remove the cgroups.
        The folder stays: the ranks wrote it, and it goes with the host's tmpfs."""
        if self.uid_base is not None:
            from zerocourse.footprint import _process_table
            uids = {self.uid_base + r.rank for r in ranks}
            end = time.monotonic() + 2.0
            while time.monotonic() < end:
                left = [p for p, (_, uid) in _process_table().items() if uid in uids]
                if not left:
                    break
                for pid in left:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                time.sleep(0.005)
        self.meters = []
        for fd in self._pipes:
            try:
                os.close(fd)
            except OSError:
                pass
        self._pipes = []
        for path in self._cgroups:
            for _ in range(50):
                try:
                    os.rmdir(path)
                    break
                except OSError:
                    time.sleep(0.02)
        self._cgroups = []


def _header(raw: bytes) -> dict:
    """The launch header, checked field by field (it comes from the verdict kernel: course
    code, but a wrong field must be an error, not a rank started with it)."""
    header = json.loads(raw)
    if not isinstance(header, dict) or set(header) != set(_HEADER_KEYS):
        raise ValueError(f"a launch header with unexpected fields")
    for key, kinds in _HEADER_KEYS.items():
        value = header[key]
        if kinds is bool:
            ok = isinstance(value, bool)
        else:
            ok = isinstance(value, kinds) and not isinstance(value, bool)
        if not ok:
            raise ValueError(f"launch header field {key!r} is a {type(value).__name__}")
    if not 1 <= header["world_size"] <= 64 or header["backend"] not in ("gloo", "nccl"):
        raise ValueError("a launch with an unexpected world size or backend")
    if not all(isinstance(r, int) for r in header["fail_join"]):
        raise ValueError("launch header field 'fail_join' holds a non-int")
    return header


def serve(fd: int, uid_base: int | None = None, gid: int | None = None,
          memcg: str | None = None) -> None:
    """Answer launches on the inherited socket `fd` until the verdict kernel goes."""
    import importlib
    from zerocourse import footprint
    L = importlib.import_module("zerocourse.launch")
    sock = socket.socket(fileno=fd)
    lock = threading.Lock()
    sys.stdout = _FrameStream(sock, b"o", lock)
    sys.stderr = _FrameStream(sock, b"e", lock)
    hosted = Hosted(sock, uid_base, gid, memcg)

    def reply(kind: bytes, body: bytes) -> None:
        with lock:
            send_frame(sock, kind, body)

    while True:
        try:
            sock.settimeout(None)
            kind, body = recv_frame(sock)
        except (OSError, EOFError, ValueError, struct.error):
            return
        if kind != b"L":
            continue                              # a cancel that came after the launch ended
        try:
            n = struct.unpack(">I", body[:4])[0]
            header = _header(body[4:4 + n])
        except Exception as e:  # noqa: BLE001
            reply(b"F", json.dumps({"type": "RankError", "builtin": "", "rank": None,
                                    "timeout": False, "figures": None,
                                    "message": f"the rank host refused the launch: {e}"}).encode())
            continue
        spec = dict(payload=body[4 + n:], world_size=header["world_size"],
                    backend=header["backend"], coll_timeout=header["coll_timeout"],
                    cwd="/tmp", sys_path=list(sys.path), sources={}, cell_names={},
                    trusted=True, device_proxy=header["device_proxy"])
        L._FAIL_JOIN = tuple(int(r) for r in header["fail_join"])   # tests of the retry
        footprint._LAST = None
        try:
            raws = L.run_spec(spec, header["timeout"], hosted=hosted)
        except _Cancelled as c:
            if c.gone:
                return
            reply(b"X", json.dumps({"figures": footprint._LAST}).encode())
            continue
        except L.RankError as e:
            builtin = next((c.__name__ for c in type(e).__mro__
                            if c.__name__ in L._TRUSTED_EXCEPTIONS and c.__module__ == "builtins"), "")
            reply(b"F", json.dumps({"type": type(e).__name__, "builtin": builtin, "rank": e.rank,
                                    "timeout": isinstance(e, L.RankTimeoutError),
                                    "message": str(e), "figures": footprint._LAST}).encode())
            continue
        except Exception as e:  # noqa: BLE001 - the host stays up for the next launch
            import traceback
            traceback.print_exc(file=sys.__stderr__)          # the grader's log
            reply(b"F", json.dumps({"type": "RankError", "builtin": "", "rank": None,
                                    "timeout": False, "figures": footprint._LAST,
                                    "message": f"the rank host failed: {type(e).__name__}: {e}"
                                    }).encode())
            continue
        info = json.dumps({"sizes": [len(r) for r in raws], "figures": footprint._LAST}).encode()
        reply(b"R", struct.pack(">I", len(info)) + info + b"".join(raws))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--uid-base", type=int)
    parser.add_argument("--gid", type=int)
    parser.add_argument("--memcg")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # the verdict kernel's interrupts are its own
    # What the launcher's fork server preloads, for the same reason: imported once here, before
    # any rank is forked, instead of in every rank of every launch (torch._dynamo, which the
    # first torch.optim step of a rank imports, measured 2.1-2.4 s per rank idle: 04's graded
    # cells spent ~50 of their 64 s importing it).
    import importlib
    for module in importlib.import_module("zerocourse.launch").forkserver_preload():
        importlib.import_module(module)
    if args.uid_base is not None and os.geteuid() == 0:
        os.setgroups([args.gid])                      # to give the launch folders its group
        uid_base, gid = args.uid_base, args.gid
    else:
        uid_base, gid = None, None
    serve(args.fd, uid_base, gid, args.memcg if args.memcg and os.path.isdir(args.memcg) else None)


if __name__ == "__main__":
    main()
