"""The learner kernel's side of split grading: answer the verdict kernel's questions.

Runs INSIDE the learner's (untrusted) kernel, started by autograder/split_execute.py
before the notebook's first cell. It serves one Unix socket; the verdict kernel
(autograder/verdict.py) asks it, for a name the learner's cells defined:

    ("describe", name)           -> b"M" missing | b"F" callable | b"V"+value | b"U" not plain data
    ("pickle", name)             -> b"P" + cloudpickle bytes (shipped, unopened, to ranks)
    ("call", name, args, kwargs) -> b"V" + value | b"E" + JSON {type, message}

Values travel as `torch.save` bytes and the verdict kernel reads them with
`torch.load(weights_only=True)`: plain data only. Nothing here is trusted: the
learner's code may replace all of it, which can only make its own tests fail.
Frames are an 8-byte big-endian length and a body.
"""
import io
import json
import os
import socket
import struct
import threading
import traceback

MAX_FRAME = 512 << 20


def _recv_exact(conn, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError("verdict kernel closed the connection")
        buf += chunk
    return bytes(buf)


def recv_frame(conn) -> bytes:
    (n,) = struct.unpack(">Q", _recv_exact(conn, 8))
    if n > MAX_FRAME:
        raise ValueError(f"frame of {n} bytes is over the {MAX_FRAME} limit")
    return _recv_exact(conn, n)


def send_frame(conn, body: bytes) -> None:
    conn.sendall(struct.pack(">Q", len(body)) + body)


def _plain(obj):
    """numpy floating/bool scalars become Python's (valid answers; torch.load rejects numpy)."""
    mod = type(obj).__module__
    if mod == "numpy" and hasattr(obj, "item") and getattr(obj, "ndim", 1) == 0 and \
            type(obj).__name__.startswith(("float", "bool")):
        return obj.item()
    if isinstance(obj, list):
        return [_plain(x) for x in obj]
    if type(obj) is tuple:
        return tuple(_plain(x) for x in obj)
    if type(obj) is dict:
        return {k: _plain(v) for k, v in obj.items()}
    return obj


def _encode(value) -> bytes:
    import torch
    buf = io.BytesIO()
    torch.save(_plain(value), buf)
    return b"V" + buf.getvalue()


def _error(exc: BaseException) -> bytes:
    return b"E" + json.dumps({"type": type(exc).__name__, "message": str(exc)[:4000],
                              "traceback": "".join(traceback.format_exception_only(
                                  type(exc), exc))[:4000]}).encode()


def _answer(ns: dict, request) -> bytes:
    op, name = request[0], request[1]
    if name not in ns:
        return b"M"
    obj = ns[name]
    if op == "describe":
        if callable(obj):
            return b"F"
        try:
            return _encode(obj)
        except Exception:
            return b"U"
    if op == "pickle":
        from zerocourse.launch import dumps
        return b"P" + dumps(obj)
    if op == "call":
        try:
            return _encode(obj(*request[2], **request[3]))
        except BaseException as e:  # noqa: BLE001 - the learner's error is the answer
            return _error(e)
    return _error(ValueError(f"unknown request {op!r}"))


def _serve_one(conn, ns: dict) -> None:
    import cloudpickle
    with conn:
        while True:
            try:
                request = cloudpickle.loads(recv_frame(conn))
            except EOFError:
                return
            try:
                reply = _answer(ns, request)
            except BaseException as e:  # noqa: BLE001
                reply = _error(e)
            send_frame(conn, reply)


def serve(path: str, ns: dict) -> None:
    """Answer the verdict kernel on Unix socket `path` from namespace `ns`, in a thread."""
    # Whatever is left at the path (the previous kernel's socket, or a link or folder a cell
    # put there before it killed its kernel) makes way: this kernel binds a fresh socket.
    if os.path.isdir(path) and not os.path.islink(path):
        import shutil
        shutil.rmtree(path, ignore_errors=True)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    os.chmod(path, 0o666)          # the verdict kernel runs as another user
    srv.listen(4)

    def loop():
        while True:
            conn, _ = srv.accept()
            threading.Thread(target=_serve_one, args=(conn, ns), daemon=True,
                             name="zc-verdict-conn").start()

    threading.Thread(target=loop, daemon=True, name="zc-verdict-rpc").start()
