"""Bytes that really crossed this rank's TCP sockets, read from the Linux kernel.

`CommTracer` (comm.py) *computes* what a rank sends under the ring model from each call's
tensor sizes. `SocketBytes` *measures* it: the kernel counts, for every TCP socket, the payload
bytes written to it (`footprint.tcp_info_sent`: sent once or still queued, so a slow ACK
cannot make it low) and the payload bytes that arrived (`tcpi_bytes_received`). Summed over this process's TCP sockets (the socket entries of
/proc/self/fd, each asked for its family and protocol with SO_DOMAIN / SO_PROTOCOL, which says
"TCP" without parsing /proc/net/tcp), read before and after a block, the difference is what went
over gloo's connections during the block, with gloo's own framing included and TCP/IP headers
excluded. The file rendezvous store of `zerocourse.launch` is no socket, so nothing else counts.

Usage inside a rank:

    with SocketBytes() as w:
        dist.all_reduce(t)
    w.sent, w.received            # bytes, this rank

Linux only (TCP_INFO with bytes_acked needs kernel >= 4.1). Elsewhere `SocketBytes()` raises
`WireUnavailable`; `available()` says so without raising, for notebooks to show as a note.
"""
from __future__ import annotations

import os
import socket
import struct
import sys
import time

from zerocourse.footprint import tcp_info_sent

# struct tcp_info (include/uapi/linux/tcp.h): 8 one-byte fields, 24 __u32, then __u64s:
# tcpi_unacked @24 (segments sent, not yet acknowledged); pacing_rate @104,
# max_pacing_rate @112, bytes_acked @120, bytes_received @128.
_UNACKED_AT, _RECEIVED_AT, _NEEDED = 24, 128, 136
_SETTLE_S = 2.0                                       # longest wait for in-flight ACKs (a busy machine)
_TCP_INFO = getattr(socket, "TCP_INFO", 11)          # 11 on Linux; absent on some platforms


class WireUnavailable(RuntimeError):
    """Socket byte counters cannot be read on this system (not Linux, or no TCP_INFO)."""


def available() -> tuple[bool, str]:
    """(True, "") where SocketBytes works, else (False, a sentence saying why)."""
    if not sys.platform.startswith("linux"):
        return False, f"socket byte counters need Linux's TCP_INFO; not available on this OS ({sys.platform})"
    if not os.path.exists("/proc/self/fd") or not hasattr(socket, "SO_PROTOCOL"):
        return False, "socket byte counters need /proc and SO_PROTOCOL (Linux); not available on this OS"
    return True, ""


def _my_sockets() -> dict[int, int]:
    """{inode: fd} for this process's open sockets."""
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:                                  # closed since listdir
            continue
        if target.startswith("socket:["):
            out[int(target[8:-1])] = int(name)
    return out


def _tcp_dup(fd: int) -> socket.socket | None:
    """A dup of `fd` if it is an IPv4/IPv6 TCP socket, else None (closing the dup never closes
    gloo's socket; holding it keeps the socket's counters readable after gloo closes its fd)."""
    try:
        s = socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM)     # dup()s the fd
    except OSError:                                                    # closed meanwhile
        return None
    try:
        # Ask the socket what it is (the family passed to fromfd is not checked by the kernel).
        if (s.getsockopt(socket.SOL_SOCKET, socket.SO_DOMAIN) in (socket.AF_INET, socket.AF_INET6)
                and s.getsockopt(socket.SOL_SOCKET, socket.SO_PROTOCOL) == socket.IPPROTO_TCP):
            return s
    except OSError:
        pass
    s.close()
    return None


def _counters(s: socket.socket) -> tuple[int, int, int]:
    """(bytes sent, bytes_received, what is still in flight) of TCP socket `s`: sent counts
    what was written to it (footprint's count: acknowledged, in flight or queued), so a settle
    cut short on a busy machine cannot make it low; in flight is unacknowledged segments plus
    queued bytes, 0 when everything sent has been acknowledged."""
    raw = s.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 256)
    if len(raw) < _NEEDED:
        raise WireUnavailable(f"this kernel's TCP_INFO has no bytes_acked ({len(raw)} bytes < "
                              f"{_NEEDED}); not available on this OS (needs Linux >= 4.1)")
    sent = tcp_info_sent(raw)
    received, = struct.unpack_from("Q", raw, _RECEIVED_AT)
    unacked, = struct.unpack_from("I", raw, _UNACKED_AT)
    return sent, received, unacked + _send_queue(s)


def _send_queue(s: socket.socket) -> int:
    """Bytes still in the socket's send queue, sent or not (Linux SIOCOUTQ); 0 if unknown.
    A send returns once the kernel holds the bytes: they may not even be on the wire yet."""
    try:
        import fcntl
        import termios
        buf = fcntl.ioctl(s.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
        return struct.unpack("i", buf)[0]
    except (ImportError, OSError):
        return 0


class SocketBytes:
    """Bytes this process sent and received on its TCP sockets during a `with` block.

    On entry it dups every TCP socket the process has and reads its counters; on exit it adds
    the sockets opened meanwhile (their counters start at 0, so gloo's lazily opened connections
    count), waits (up to 2 s, on entry too) for in-flight segments to be acknowledged, and subtracts. Holding
    the dups through the block keeps a socket readable even if gloo closes it (a peer that
    finished and tore down); a socket both opened and closed inside the block is missed, and
    a connection opened inside it adds 1 byte (Linux counts the SYN as acknowledged data).

    Attributes (after the block):
        sent: payload bytes this rank sent that its peers acknowledged (gloo's headers included,
            TCP/IP headers not).
        received: payload bytes this rank received.
        per_socket: {inode: (sent, received)} for the sockets that moved bytes.
    """

    def __init__(self):
        ok, why = available()
        if not ok:
            raise WireUnavailable(why)
        self.sent = self.received = 0
        self.per_socket: dict[int, tuple[int, int]] = {}
        self._held: dict[int, socket.socket] = {}        # inode -> our dup
        self._before: dict[int, tuple[int, int]] = {}

    def _hold_new(self) -> None:
        for inode, fd in _my_sockets().items():
            if inode not in self._held:
                s = _tcp_dup(fd)
                if s is not None:
                    self._held[inode] = s

    def _settled(self) -> dict[int, tuple[int, int, int]]:
        """Counters once no segment awaits its ACK (or after _SETTLE_S): a send returns when
        the kernel has the bytes, and their ACK may come much later on a busy machine."""
        deadline = time.monotonic() + _SETTLE_S
        while True:
            now = {inode: _counters(s) for inode, s in self._held.items()}
            if not any(c[2] for c in now.values()) or time.monotonic() >= deadline:
                return now
            time.sleep(0.001)                             # a segment still awaits its ACK

    def __enter__(self) -> "SocketBytes":
        self._hold_new()
        # Settle first: the tail of an earlier send, acknowledged only now, is not this block's.
        self._before = {inode: c[:2] for inode, c in self._settled().items()}
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._hold_new()
            now = self._settled()
        finally:
            for s in self._held.values():
                s.close()                                 # our dups only
            self._held = {}
        self.per_socket = {}
        for inode, (acked, received, _) in now.items():
            a0, r0 = self._before.get(inode, (0, 0))      # opened inside the block: from 0
            if acked - a0 or received - r0:
                self.per_socket[inode] = (acked - a0, received - r0)
        self.sent = sum(s for s, _ in self.per_socket.values())
        self.received = sum(r for _, r in self.per_socket.values())

    def summary(self) -> dict:
        """Plain data for `launch` to return: {"sent": ..., "received": ..., "sockets": ...}."""
        return {"sent": self.sent, "received": self.received, "sockets": len(self.per_socket)}
