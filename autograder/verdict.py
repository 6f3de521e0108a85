"""The verdict kernel's side of split grading: learner names as proxies, plain data only.

Graded test cells run in a kernel that never executes learner code (see
autograder/split_execute.py). The names the assignment asks for (`shard_bounds`,
`ZeRO1Adam`, ...) are bound here to stand-ins that reach into the learner's kernel
(autograder/learner_rpc.py) over a Unix socket:

- a callable becomes a `LearnerCallable`: calling it runs the call in the learner's
  kernel and returns the result decoded by zerocourse.plain.decode, so only plain data
  (numbers, strings, tensors rebuilt without attributes, lists, tuples, dicts, Fraction)
  ever reaches this kernel: no learner object, no forged `__eq__`, no code;
- sent to ranks (an argument of `launch`, or a global of a test helper), it pickles
  as the learner's real object, which only the (sandboxed) ranks unpickle; their
  results come back through the launcher's trusted mode (ZEROCOURSE_TRUSTED=1),
  decoded the same safe way;
- a plain value is decoded once and bound as itself.
An error raised by learner code arrives as the builtin exception of the same name
(ValueError, TypeError, ...), else as a RuntimeError naming it.
"""
from __future__ import annotations

import json
import os
import socket
import struct

MAX_FRAME = 512 << 20
# Learner exceptions re-raised as themselves; anything else becomes a RuntimeError.
_BUILTIN_ERRORS = {c.__name__: c for c in (
    ValueError, TypeError, KeyError, IndexError, AssertionError, NotImplementedError,
    RuntimeError, ZeroDivisionError, AttributeError, NameError, TimeoutError, ArithmeticError,
    LookupError, OverflowError, RecursionError)}


class LearnerKernelError(RuntimeError):
    """The learner's kernel did not answer (it died, hung, or replied nonsense)."""


def decode(data: bytes):
    """torch.save bytes -> plain data, rebuilt; anything else (code, custom classes, tensors
    carrying attributes) is refused (zerocourse/plain.py: the one decoder of the grader)."""
    from zerocourse.plain import decode as plain_decode
    return plain_decode(data)


class _Client:
    """One connection to the learner kernel's socket (reconnects after an error)."""

    def __init__(self, path: str, timeout: float):
        self.path, self.timeout, self.sock = path, timeout, None

    def ask(self, *request) -> bytes:
        try:
            return self._ask(request)
        except LearnerKernelError:
            if request[0] == "call":          # never run the learner's code twice
                raise
            return self._ask(request)         # a restarted learner kernel: a new connection

    def _ask(self, request) -> bytes:
        import cloudpickle
        body = cloudpickle.dumps(request)
        try:
            if self.sock is None:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.settimeout(self.timeout)
                self.sock.connect(self.path)
            self.sock.sendall(struct.pack(">Q", len(body)) + body)
            (n,) = struct.unpack(">Q", self._exact(8))
            if n > MAX_FRAME:
                raise LearnerKernelError(f"the learner's kernel sent {n} bytes (limit {MAX_FRAME})")
            return self._exact(n)
        except (OSError, EOFError, struct.error) as e:
            self.close()
            raise LearnerKernelError(
                f"your notebook's kernel did not answer ({type(e).__name__}: {e}); did a cell "
                f"before this one crash it, hang, or replace Python's machinery?") from None

    def _exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(min(n - len(buf), 1 << 20))
            if not chunk:
                raise EOFError("connection closed")
            buf += chunk
        return bytes(buf)

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
        self.sock = None


def _value(name: str, reply: bytes):
    kind, payload = reply[:1], reply[1:]
    if kind == b"V":
        try:
            return decode(payload)
        except Exception as e:
            raise TypeError(f"{name} gave a value the grader cannot accept ({str(e)[:300]}): "
                            f"return plain values (numbers, strings, tensors, lists, tuples, "
                            f"dicts)") from None
    if kind == b"E":
        try:
            info = json.loads(payload.decode())
            etype, message = str(info["type"]), str(info["message"])
        except Exception:
            raise LearnerKernelError(f"{name}: unreadable error from the learner's kernel") from None
        cls = _BUILTIN_ERRORS.get(etype)
        if cls is not None:
            raise cls(message)
        raise RuntimeError(f"{etype}: {message}")
    raise LearnerKernelError(f"{name}: unexpected reply {kind!r} from the learner's kernel")


class LearnerCallable:
    """Stand-in for a function or class defined by the learner (see module docstring)."""

    def __init__(self, client: _Client, name: str):
        self._client, self._name, self._pickled = client, name, None

    def __call__(self, *args, **kwargs):
        return _value(self._name, self._client.ask("call", self._name, args, kwargs))

    def __reduce__(self):
        # The ranks (sandboxed) unpickle the learner's real object; this kernel never does.
        if self._pickled is None:
            reply = self._client.ask("pickle", self._name)
            if reply[:1] != b"P":
                raise LearnerKernelError(f"{self._name} cannot be sent to the ranks")
            self._pickled = reply[1:]
        import cloudpickle
        return cloudpickle.loads, (self._pickled,)

    def __repr__(self):
        return f"<your {self._name}>"


class LearnerObject:
    """Stand-in for a learner value that is not plain data: usable only inside ranks."""

    __reduce__ = LearnerCallable.__reduce__

    def __init__(self, client: _Client, name: str):
        self._client, self._name, self._pickled = client, name, None

    def __repr__(self):
        return f"<your {self._name} (not plain data)>"


_state: dict = {}


def nothing(rank: int, world_size: int) -> None:
    """A rank that does nothing: the verdict kernel's first launch starts its fork server."""


def warm_up() -> None:
    """Start the ranks' fork server and wait for it (one launch of one rank)."""
    from zerocourse import launch
    launch(nothing, 1)


def connect(socket_path: str, names: list[str], timeout: float = 120.0) -> None:
    """Stand-ins for `names` will come from the learner kernel's socket at `socket_path`."""
    _state.update(client=_Client(socket_path, timeout), names=list(names), mine={})


def start(socket_path: str, names: list[str], timeout: float = 120.0) -> None:
    """Set up this process as THE verdict kernel: `connect`, then harden it against its own
    ranks (process-wide changes: only ever in the verdict kernel, never in a test process)."""
    connect(socket_path, names, timeout)
    try:                                   # a test cell's last expression never becomes an
        get_ipython().ast_node_interactivity = "none"   # noqa: F821   execute_result
    except NameError:
        pass
    try:                                   # ranks (learner code, same user) cannot ptrace us
        import ctypes
        ctypes.CDLL(None).prctl(4, 0)      # PR_SET_DUMPABLE = 4
    except Exception:
        pass
    # Ranks run in the rank host under grading (their own sandbox and users); without it
    # (no sandbox) they are this kernel's user and can write its folder and /tmp: nothing is
    # ever imported from there, and what reads config at import is imported now.
    import sys
    sys.path[:] = [p for p in sys.path if p not in ("", ".", os.getcwd())]
    sys.dont_write_bytecode = True
    import matplotlib.pyplot  # noqa: F401
    # Ranks get no cell sources: these cells hold the hidden tests, and a rank runs learner code.
    import importlib
    launcher = importlib.import_module("zerocourse.launch")   # the module, not the function
    launcher._cell_sources = lambda: ({}, {})


def completed(nonce: str) -> None:
    """The last statement of every graded test cell: it prints the cell's nonce only if the
    test's source ran to its end here (split_execute.py scores a cell only with it)."""
    print(f"[zc-completed {nonce}]", flush=True)


def sync(ns: dict) -> None:
    """Bind every asked-for name to what the learner's kernel holds now (or unbind it)."""
    client, mine = _state["client"], _state["mine"]
    for name in _state["names"]:
        current = ns.get(name, None)
        if name in ns and mine.get(name) is not current:
            continue                       # defined by the course's own cells: keep it
        reply = client.ask("describe", name)
        kind = reply[:1]
        if kind == b"M":
            ns.pop(name, None)
            mine.pop(name, None)
            continue
        if kind == b"F":
            value = LearnerCallable(client, name)
        elif kind == b"U":
            value = LearnerObject(client, name)
        else:
            try:
                value = _value(name, reply)
            except TypeError:              # not plain data: usable only inside ranks
                value = LearnerObject(client, name)
        ns[name] = mine[name] = value


def load_definitions(sources: list[str], ns: dict) -> list[str]:
    """Run the course's own definitions (imports, defs, classes, constants), statement by
    statement; returns the errors (a definition that needs a learner name may fail)."""
    import ast
    from zerocourse.loader import _cell_code, _keep
    errors = []
    for src in sources:
        try:
            tree = ast.parse(_cell_code(src))
        except SyntaxError as e:
            errors.append(f"syntax: {e}")
            continue
        for stmt in tree.body:
            if not _keep(stmt):
                continue
            code = compile(ast.Module(body=[stmt], type_ignores=[]), "<course definitions>", "exec")
            try:
                exec(code, ns)
            except Exception as e:  # noqa: BLE001
                errors.append(f"{type(e).__name__}: {e}")
    return errors


