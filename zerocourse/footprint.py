"""What each rank holds and sends, measured by the launcher from OUTSIDE the rank.

`zerocourse.memory` and `zerocourse.comm` are instruments that run inside a rank, in the
same process as the code they measure: that code can patch them, or keep what they do not
walk (a module-level dict holding the full optimizer state is reachable from neither the
model nor the optimizer). The figures here come from the process that started the ranks,
which the rank's code cannot reach:

    # in a rank (a test helper):
    from zerocourse.footprint import mark
    model = ...; mark("model")                 # the launcher measures this rank, then it goes on
    for step in range(3):
        ...; optimizer.step(); mark("step")

    # in the process that called launch(), after it returned or raised:
    from zerocourse.footprint import last_launch, held_at
    ranks = last_launch()                      # one dict per rank (plain data):
    # {"marks": [{"label": "model", "held": 17_000_000, "sent": 0}, {"label": "step", ...}, ...],
    #  "measured_by": "rank host: the rank's memory cgroup, TCP counters of its uid" | "launcher: ..."}
    min(held_at(ranks[0], "step"))             # bytes rank 0 held at its least, between steps

- `held`: bytes of memory the rank's processes allocated since the rank started (the moment
  before any of the launched function's code was unpickled) and still hold: anonymous memory,
  shared memory and files on tmpfs they wrote, kernel memory charged to them (pipes), and
  their TCP sockets' queued bytes. Under grading (the rank host, as root) it is the rank's
  own memory cgroup: usage minus file cache; elsewhere the sum of RssAnon + RssShmem of the
  rank's process and its descendants (/proc/<pid>/status). Freed memory is returned to the
  system in ranks (glibc's mmap and trim thresholds are fixed at 128 KiB before user code),
  so `held` falls when tensors are freed.
- `sent`: payload bytes the rank's code wrote to its TCP sockets since the rank started:
  acknowledged, in flight or still queued (tcp_info from the kernel's sock_diag: bytes sent
  minus retransmitted plus not yet sent, summed over the rank's sockets: those of its uid
  under the rank host, those in its processes' fd tables elsewhere). Not the acknowledged
  bytes alone: right after a collective returns, its last segments' ACKs may still be on the
  way, by how much depends on the machine's load.
  A socket closed since it was last seen keeps what it had sent then; the rank host looks
  at every socket every 50 ms or so, and a mark also carries `all_sent`: the bytes through
  the loopback of the host's own network namespace since the rank started (every rank of
  the launch together, TCP/IP headers included; no socket can hide from it).
- `mark(label)` blocks until the launcher has measured: the figure is the rank's memory at
  that point of its code. Outside a rank it does nothing.

What it proves and what it cannot: code inside a rank cannot change these figures, nor hide
memory from them (another process of its own is counted; a peer rank is measured too; a
file goes to a size-limited tmpfs that is counted). It CAN choose when the course's marks
are sent (it runs in the same process as the test helper that calls mark()), so a check
- requires every mark it placed (a rank that makes marks vanish fails),
- reads held bytes at marks placed between steps, against an upper bound (persistent state
  cannot be hidden below the minimum between steps),
- requires between consecutive step marks the traffic a real step causes (`sent`), so a
  mark sent before the state exists needs traffic forged too,
- ends the helper with a dist.barrier() after its last mark, so no peer tears its sockets
  down while a rank is still being measured.
Measured on this course's 2-core CI machine under load (tests/test_rank_host.py): with a
4M-parameter fp32 model at N=2, an Adam-like state (12 bytes per parameter) held sharded
reads 24.2-24.4 MB above the model, held whole 48.2-48.5 MB, and the model itself 16.1-16.5 MB
(16.0 MB of parameters): the noise is under 0.6 MB. A check needs Ψ large enough that the
state sharding removes (12Ψ(N-1)/N bytes for Adam) is many times a margin of ~2 MB: Ψ of a
few million parameters, a launch of well under a second per step.

A memory test cell, for example (the bound is the notebook's own formula):

    def _held_between_steps(rank, world_size):
        import torch.distributed as dist
        from zerocourse.footprint import mark
        model = BigEnoughModel(device=rank_device())      # Ψ of a few million
        mark("model")
        optimizer = LearnersOptimizer(model.parameters())
        for _ in range(3):
            loss_of(model).backward()
            optimizer.step()
            mark("step")
        dist.barrier()
        return None

    launch(_held_between_steps, 2)
    for rank, figures in enumerate(last_launch()):
        steps, model = held_at(figures, "step"), held_at(figures, "model")
        check_true(len(steps) == 3 and len(model) == 1, "the rank was measured at every step", rank=rank)
        sent = sent_at(figures, "model") + sent_at(figures, "step")
        check_true(all(b - a >= min_bytes_per_step for a, b in zip(sent, sent[1:])), ...)
        check_true(min(steps) <= bound + 2e6, "bytes held between steps (measured outside the rank)",
                   f"{min(steps)} B", rank=rank)
"""
from __future__ import annotations

import ctypes
import os
import socket
import struct
import time

# The launcher fills this after every launch (success or failure): one dict per rank.
_LAST: list[dict] | None = None


def last_launch() -> list[dict] | None:
    """The measurements of the last launch this process made (None before the first).

    Returns:
        [{"marks": [{"label": str, "held": int, "sent": int}, ...], "measured_by": str}, ...]
        one dict per rank, marks in the order the rank made them; held and sent are bytes since
        the rank started (see the module docstring).
    """
    return _LAST


def held_at(rank_figures: dict, label: str) -> list[int]:
    """The `held` bytes of every mark of one rank with this label, in order."""
    return [m["held"] for m in rank_figures["marks"] if m["label"] == label]


def sent_at(rank_figures: dict, label: str) -> list[int]:
    """The `sent` bytes of every mark of one rank with this label, in order."""
    return [m["sent"] for m in rank_figures["marks"] if m["label"] == label]


def mark(label: str) -> None:
    """In a rank: have the launcher measure this rank now (blocks until it has); else nothing.

    Args:
        label: a short name for this point (the same label may be used many times).
    """
    from zerocourse import _rank
    chan = _rank._CHANNEL
    if chan is None:
        return
    chan.mark(str(label)[:200])


# --------------------------------------------------------------------------
# memory
# --------------------------------------------------------------------------
def return_freed_memory() -> None:
    """Make glibc give freed memory back to the system at once (called in every rank before
    user code): fixed mmap and trim thresholds, so `held` falls when a large tensor is freed
    instead of staying in the heap (glibc's default raises the mmap threshold up to 32 MiB as
    tensors are freed, and then keeps freed tensors' pages)."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, 128 * 1024)       # M_MMAP_THRESHOLD
        libc.mallopt(-1, 128 * 1024)       # M_TRIM_THRESHOLD
    except Exception:                      # not glibc: figures fall later, or not at all
        pass


def _status_bytes(pid: int) -> int:
    """RssAnon + RssShmem of one process, in bytes (0 when it is gone)."""
    total = 0
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith((b"RssAnon:", b"RssShmem:")):
                    total += int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return 0
    return total


def _process_table() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, uid) of every process this one can see."""
    table = {}
    try:
        entries = os.listdir("/proc")
    except OSError:                        # no /proc (macOS): the rank's own figures only
        return table
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            uid = os.stat(f"/proc/{entry}").st_uid
        except OSError:
            continue
        # The command name is in parentheses and may hold anything: split after the last ")".
        fields = stat[stat.rfind(b")") + 2:].split()
        table[int(entry)] = (int(fields[1]), uid)
    return table


def descendants(pid: int, table: dict | None = None) -> list[int]:
    """pid and every process below it."""
    table = _process_table() if table is None else table
    kids: dict[int, list[int]] = {}
    for p, (ppid, _) in table.items():
        kids.setdefault(ppid, []).append(p)
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def cgroup_held(path: str) -> int:
    """A memory cgroup's usage without its file cache (clean or dirty pages of files on disk):
    anonymous + shared memory (tmpfs, memfd) + kernel memory charged to it, in bytes."""
    with open(os.path.join(path, "memory.usage_in_bytes")) as f:
        usage = int(f.read())
    files = 0
    with open(os.path.join(path, "memory.stat")) as f:
        for line in f:
            name, _, value = line.partition(" ")
            if name in ("active_file", "inactive_file"):
                files += int(value)
    return max(0, usage - files)


# --------------------------------------------------------------------------
# TCP: the kernel's sock_diag (what `ss -ti` reads)
# --------------------------------------------------------------------------
_NETLINK_SOCK_DIAG, _SOCK_DIAG_BY_FAMILY = 4, 20
_NLM_F_REQUEST, _NLM_F_DUMP, _NLMSG_ERROR, _NLMSG_DONE = 1, 0x300, 2, 3
_INET_DIAG_INFO = 2
_DIAG_MSG = struct.Struct("=BBBB48sIIIII")       # inet_diag_msg: 72 bytes
# struct tcp_info: tcpi_bytes_acked (__u64), tcpi_notsent_bytes (__u32), tcpi_bytes_sent and
# tcpi_bytes_retrans (__u64, Linux >= 4.19).
_ACKED_AT, _NOTSENT_AT, _BYTES_SENT_AT, _RETRANS_AT = 120, 144, 200, 208


def tcp_info_sent(info: bytes) -> int:
    """Payload bytes a socket was given to send, from its struct tcp_info: acknowledged, in
    flight (sent once, retransmissions not counted twice) or still queued. A send returns once
    the kernel holds the bytes, so a figure read right after a collective would miss the tail
    its ACK (or a busy machine's scheduler) has not delivered yet: 4.93 of 5.33 MB of a 3-rank
    all-reduce, seen beside a CPU burner. Counting what was written is exact at any load. An
    older kernel (no tcpi_bytes_sent) gives the acknowledged bytes."""
    if len(info) >= _RETRANS_AT + 8:
        sent, retrans = struct.unpack_from("=QQ", info, _BYTES_SENT_AT)
        return sent - retrans + struct.unpack_from("=I", info, _NOTSENT_AT)[0]
    return struct.unpack_from("=Q", info, _ACKED_AT)[0]


def tcp_sockets() -> list[dict]:
    """Every TCP socket of this network namespace: uid, inode, bytes written (sent), queues.

    Returns:
        [{"uid": int, "inode": int, "sent": int, "queued": int}, ...]; [] where sock_diag
        cannot be used (not Linux).
    """
    try:
        nl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG)
    except (OSError, AttributeError):
        return []
    out = []
    with nl:
        nl.settimeout(5)
        for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), start=1):
            req = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 1 << (_INET_DIAG_INFO - 1),
                              0, 0xFFFFFFFF) + bytes(48)
            nl.send(struct.pack("=IHHII", 16 + len(req), _SOCK_DIAG_BY_FAMILY,
                                _NLM_F_REQUEST | _NLM_F_DUMP, seq, 0) + req)
            done = False
            while not done:
                data = nl.recv(1 << 16)
                at = 0
                while at + 16 <= len(data):
                    length, kind, _, _, _ = struct.unpack_from("=IHHII", data, at)
                    if length < 16:
                        done = True
                        break
                    if kind in (_NLMSG_DONE, _NLMSG_ERROR):
                        done = True
                        break
                    body = data[at + 16:at + length]
                    if len(body) >= _DIAG_MSG.size:
                        *_, rqueue, wqueue, uid, inode = _DIAG_MSG.unpack_from(body)
                        entry = {"uid": uid, "inode": inode, "sent": 0, "queued": rqueue + wqueue}
                        a = _DIAG_MSG.size
                        while a + 4 <= len(body):
                            alen, atype = struct.unpack_from("=HH", body, a)
                            if alen < 4:
                                break
                            if atype == _INET_DIAG_INFO and alen - 4 >= _ACKED_AT + 8:
                                entry["sent"] = tcp_info_sent(body[a + 4:a + alen])
                            a += (alen + 3) & ~3
                        out.append(entry)
                    at += (length + 3) & ~3
    return out


def socket_inodes(pids) -> set[int]:
    """Inodes of the sockets open in these processes (their own fd tables)."""
    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    return inodes


# --------------------------------------------------------------------------
# the launcher's side
# --------------------------------------------------------------------------
def loopback_bytes() -> int | None:
    """Bytes sent through the loopback interface of this network namespace (headers
    included), or None: under the rank host the namespace holds only the launch's ranks, so
    this counts everything they sent each other, whatever sockets they used."""
    try:
        with open("/proc/net/dev") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name.strip() == "lo":
                    return int(rest.split()[8])          # transmit bytes
    except (OSError, ValueError, IndexError):
        pass
    return None


class RankMeter:
    """Measures one rank from outside: `sample()` -> (held, sent) now, in bytes.

    Args:
        pid: the rank's process.
        uid: under the rank host, the rank's own uid (its sockets and processes are its uid's);
            None when the rank runs as the launcher's user (then its process tree counts).
        cgroup: the rank's own memory cgroup folder, or None (then /proc is read).
        netns_total: report the loopback bytes of the whole namespace too (the rank host).
    """

    def __init__(self, pid: int, uid: int | None = None, cgroup: str | None = None,
                 netns_total: bool = False):
        self.pid, self.uid, self.cgroup, self.netns_total = pid, uid, cgroup, netns_total
        self.marks: list[dict] = []
        self._start: tuple[int, int, int | None] | None = None
        # Bytes each socket of the rank had sent when last seen: a socket closed since still
        # counts what it sent until then (gloo closes its sockets when a peer leaves).
        self._sent: dict[int, int] = {}

    def _pids(self, table: dict) -> list[int]:
        if self.uid is not None:
            return [p for p, (_, uid) in table.items() if uid == self.uid]
        return descendants(self.pid, table)

    def see_sockets(self, socks: list[dict], pids=None) -> list[dict]:
        """Record the rank's sockets among `socks` (a tcp_sockets() dump); returns them."""
        if self.uid is not None:
            mine = [s for s in socks if s["uid"] == self.uid]
        else:
            inodes = socket_inodes(pids if pids is not None else [self.pid])
            mine = [s for s in socks if s["inode"] in inodes]
        for s in mine:
            self._sent[s["inode"]] = max(self._sent.get(s["inode"], 0), s["sent"])
        return mine

    def sample(self, alone: bool = False) -> tuple[int, int]:
        """(held, sent) of the rank now; `alone`: it has started no process yet (its start:
        no scan of the machine's /proc, which costs milliseconds under load)."""
        # The processes: the rank's tree (or its uid's) from /proc, unless its cgroup counts them.
        pids = self._pids(_process_table()) if self.cgroup is None and not alone else [self.pid]
        mine = self.see_sockets(tcp_sockets(), pids)
        if self.cgroup is not None:
            try:
                held = cgroup_held(self.cgroup)
            except (OSError, ValueError):
                held = sum(_status_bytes(p) for p in self._pids(_process_table()))
        else:
            held = sum(_status_bytes(p) for p in pids)
        held += sum(s["queued"] for s in mine)
        return held, sum(self._sent.values())

    def on_mark(self, label: str) -> None:
        """The rank marked `label` (and waits): record its figures since its start."""
        if self._start is not None and label == START:
            return                          # only the rank's first mark is its start
        held, sent = self.sample(alone=self._start is None)
        lo = loopback_bytes() if self.netns_total else None
        if self._start is None:             # the launcher's own first mark, before user code
            self._start = (held, sent, lo)
            return
        entry = {"label": label, "held": held - self._start[0], "sent": sent - self._start[1]}
        if lo is not None and self._start[2] is not None:
            entry["all_sent"] = lo - self._start[2]
        self.marks.append(entry)

    def figures(self) -> dict:
        """This rank's marks, and how they were measured (plain data)."""
        how = ("rank host: the rank's memory cgroup" if self.cgroup else
               "rank host: /proc of the rank's uid" if self.uid is not None else
               "launcher: /proc of the rank's processes")
        sock = "TCP counters of its uid" if self.uid is not None else "TCP counters of its sockets"
        return {"marks": list(self.marks), "measured_by": f"{how}, {sock}"}


START = "\x00start"        # the label of the mark a rank sends before user code (not reported)
