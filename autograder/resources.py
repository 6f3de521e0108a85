"""What one submission's grading may use, and who it runs as.

    users = UserBlock.reserve(slots)      # uids no other grading run on this machine holds
    box = SubmissionBox(users.slot(k), mem=..., cpu_shares=..., pids=...)
    box.cmd(["nbgrader", ...])            # the command, run inside the submission's cgroups
    box.close()                           # kill what is left, remove cgroups and folder

- Users: a grading run reserves a block of uids with a lock file only root can reach
  (/run/zerocourse-uids/<n>.lock, held while the run lasts; the kernel frees it when the
  run ends, however it ends). Two runs on one machine (two instructors, tests at once)
  never share a uid. Per slot: the learner kernel, the verdict kernel, the ranks of its
  rank host (one uid per rank, up to 64) and the ranks' group.
- Cgroups (v1, where root can write them): memory (the whole submission: nbgrader, which
  buffers its output, both kernels, the rank host and its ranks), cpu (an equal share per
  job under --jobs: a student's 100 busy processes slow only that student) and pids.
- A size-limited folder (tmpfs, as root) for everything a sandbox may write on the host:
  the kernels' sockets. Kernels' own /tmp and HOME are tmpfs mounts inside their sandboxes.
Without root: no users, no cgroups, a plain folder (the sandbox still holds; the limits
are the rlimits of autograder/sandbox_kernel.py).
"""
from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import tempfile
import time

CGROUP_ROOT = "/sys/fs/cgroup"
UID_LOCKS = "/run/zerocourse-uids"
UID_START = 7_100_000                # far above system users and /etc/subuid ranges
UIDS_PER_SLOT = 80                   # learner, verdict, 64 ranks, the ranks' group, spare
MAX_RANKS = 64
PIDS_MAX = 384                       # processes + threads of a submission, nbgrader's included
BOX_BYTES = 64 << 20                 # the host folder a submission's sandboxes may write


class UserBlock:
    """A block of uids reserved for one grading run (see the module docstring)."""

    def __init__(self, base: int | None, lock_fd: int | None):
        self.base, self._lock = base, lock_fd

    @classmethod
    def reserve(cls, slots: int) -> "UserBlock":
        """Reserve uids for `slots` submissions graded at once (none when not root)."""
        if os.geteuid() != 0:
            return cls(None, None)
        os.makedirs(UID_LOCKS, mode=0o700, exist_ok=True)
        os.chmod(UID_LOCKS, 0o700)
        size = slots * UIDS_PER_SLOT
        taken = _uids_in_use()
        for n in range(4096):
            base = UID_START + n * max(size, 1024)
            if any(base <= u < base + size for u in taken):
                continue
            fd = os.open(os.path.join(UID_LOCKS, f"{base}.lock"), os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            return cls(base, fd)
        raise SystemExit("no free block of uids for the grading sandboxes (4096 runs at once?)")

    def slot(self, k: int) -> dict | None:
        """{"learner", "verdict", "ranks" (first rank uid), "group"} of slot k, or None."""
        if self.base is None:
            return None
        b = self.base + k * UIDS_PER_SLOT
        return {"learner": b, "verdict": b + 1, "ranks": b + 2, "group": b + 2 + MAX_RANKS}

    def release(self) -> None:
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


def _uids_in_use() -> set[int]:
    """Uids of running processes and of /etc/passwd: a block must hold none of them."""
    uids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                uids.add(os.stat(f"/proc/{entry}").st_uid)
            except OSError:
                pass
    try:
        with open("/etc/passwd") as f:
            for line in f:
                parts = line.split(":")
                if len(parts) > 2 and parts[2].isdigit():
                    uids.add(int(parts[2]))
    except OSError:
        pass
    return uids


def memory_limit(jobs: int) -> int:
    """Bytes one submission may use (ZC_SUBMISSION_MEM, else a share of this machine)."""
    if os.environ.get("ZC_SUBMISSION_MEM"):
        return int(os.environ["ZC_SUBMISSION_MEM"])
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        total = 8 << 30
    return int(max(3 << 30, min(8 << 30, total // (jobs + 1))))


class SubmissionBox:
    """The cgroups and the size-limited folder of one submission.

    Args:
        mem: bytes of memory for the whole submission (its memory cgroup).
        cpu_shares: its weight under --jobs (equal for every job).
        pids: processes + threads.
    """

    def __init__(self, mem: int, cpu_shares: int, pids: int = PIDS_MAX):
        self.base = tempfile.mkdtemp(prefix="zcsb-")     # short: Unix socket paths < 108 chars
        self.mounted = False
        if os.geteuid() == 0:
            proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={BOX_BYTES},mode=0711",
                                   "zerocourse-box", self.base], capture_output=True)
            self.mounted = proc.returncode == 0
        self.cgroups: dict[str, str] = {}
        name = f"zerocourse-{os.getpid()}-{time.monotonic_ns()}"
        for ctrl, files in (("memory", {"memory.limit_in_bytes": mem, "memory.memsw.limit_in_bytes": mem,
                                        "memory.use_hierarchy": 1}),
                            ("cpu", {"cpu.shares": cpu_shares}),
                            ("pids", {"pids.max": pids})):
            path = _make_cgroup(ctrl, name, files)
            if path:
                self.cgroups[ctrl] = path

    def cmd(self, argv: list[str]) -> list[str]:
        """`argv` started inside this submission's cgroups (everything it starts inherits them)."""
        paths = list(self.cgroups.values())
        if not paths:
            return argv
        script = " && ".join(f'echo $$ > "${i + 1}/cgroup.procs"' for i in range(len(paths)))
        return ["/bin/sh", "-c", f'{script} && shift {len(paths)} && exec "$@"', "sh", *paths, *argv]

    def peak_bytes(self) -> int | None:
        """The most memory the submission used at once (its memory cgroup), or None."""
        path = self.cgroups.get("memory")
        try:
            with open(os.path.join(path, "memory.max_usage_in_bytes")) as f:
                return int(f.read())
        except (OSError, TypeError, ValueError):
            return None

    def oom_kills(self) -> int:
        """How often the kernel killed a process of the submission for its memory limit."""
        path = self.cgroups.get("memory")
        try:
            with open(os.path.join(path, "memory.oom_control")) as f:
                for line in f:
                    if line.startswith("oom_kill "):
                        return int(line.split()[1])
        except (OSError, TypeError, ValueError):
            pass
        return 0

    def close(self) -> None:
        """Kill whatever is still in the submission's cgroups, remove them and the folder."""
        for path in self.cgroups.values():
            _empty_and_remove(path)
        self.cgroups = {}
        if self.mounted:
            subprocess.run(["umount", "-l", self.base], capture_output=True)
            self.mounted = False
        shutil.rmtree(self.base, ignore_errors=True)


def _make_cgroup(ctrl: str, name: str, files: dict) -> str | None:
    root = os.path.join(CGROUP_ROOT, ctrl)
    if not os.access(root, os.W_OK):
        return None
    path = os.path.join(root, name)
    try:
        os.mkdir(path)
    except OSError:
        return None
    for fname, value in files.items():
        try:
            with open(os.path.join(path, fname), "w") as f:
                f.write(str(value))
        except OSError:
            if fname in ("memory.limit_in_bytes", "cpu.shares", "pids.max"):
                _empty_and_remove(path)
                return None
    return path


def _empty_and_remove(path: str) -> None:
    """Kill every task in a cgroup and in the cgroups below it, then remove them all.

    A process may still be joining while this runs (a command of the box that was just
    started): rmdir then fails with EBUSY after the cgroup looked empty, so it kills and tries
    again until the cgroup is gone (measured: closing a box 0-10 ms after starting its command
    left a cgroup behind in 60 of 80 closes when it gave up after one rmdir; 0 of 80 now)."""
    for dirpath, dirnames, _ in sorted(os.walk(path), key=lambda x: -len(x[0])):
        for _ in range(50):
            try:
                with open(os.path.join(dirpath, "cgroup.procs")) as f:
                    pids = [int(p) for p in f.read().split()]
            except OSError:
                break                               # gone already
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            try:
                os.rmdir(dirpath)
                break
            except FileNotFoundError:
                break
            except OSError:                         # a task is still in it, or just joined
                time.sleep(0.1)
