"""What one submission may use and who it runs as (autograder/resources.py), and the grader's
preflight (autograder/preflight.py): issue 25, items 8 and 9, and the uids of parallel runs.

- two grading runs on one machine never share a uid (the lock files);
- a submission's box: a size-limited folder, memory / cpu / pids cgroups that the command it
  runs (nbgrader) and everything that starts are in; closing it leaves nothing behind;
- a misconfigured grader stops before the first submission, naming the cause (an
  interpreter the sandbox cannot see, a zerocourse from another checkout).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from autograder import preflight, resources

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="uids, cgroups and mounts need root "
                               "(the grader runs as root; elsewhere it grades as its user)")


@ROOT_ONLY
def test_two_grading_runs_never_share_a_uid():
    a = resources.UserBlock.reserve(2)
    b = resources.UserBlock.reserve(3)
    try:
        uids = lambda block, n: {u for k in range(n) for u in block.slot(k).values()} | \
            {block.slot(k)["ranks"] + r for k in range(n) for r in range(resources.MAX_RANKS)}
        assert not uids(a, 2) & uids(b, 3)
        assert len(uids(a, 2)) == 2 * (3 + resources.MAX_RANKS)       # no uid used twice in a run
    finally:
        a.release()
        b.release()
    c = resources.UserBlock.reserve(2)           # a released block is free again
    try:
        assert c.base == a.base
    finally:
        c.release()


def _runs_in(cgroup: str, comm: str) -> bool:
    """Does a process named `comm` run in this cgroup?"""
    with open(os.path.join(cgroup, "cgroup.procs")) as f:
        pids = f.read().split()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == comm:
                    return True
        except OSError:
            pass
    return False


@ROOT_ONLY
def test_a_submission_box_holds_its_command_and_leaves_nothing_behind():
    box = resources.SubmissionBox(mem=1 << 30, cpu_shares=2048, pids=64)
    base, cgroups = box.base, dict(box.cgroups)
    try:
        assert box.mounted and set(cgroups) == {"memory", "cpu", "pids"}
        with open(os.path.join(cgroups["memory"], "memory.limit_in_bytes")) as f:
            assert int(f.read()) == 1 << 30
        with open(os.path.join(cgroups["cpu"], "cpu.shares")) as f:
            assert int(f.read()) == 2048
        # The command and what it starts are inside every cgroup of the box.
        out = subprocess.run(box.cmd(["/bin/sh", "-c", "cat /proc/self/cgroup"]), capture_output=True,
                             text=True, check=True).stdout
        for ctrl, path in cgroups.items():
            assert f":{ctrl}:/{os.path.basename(path)}" in out, out
        # The folder is a tmpfs of its own size: a flood stops there, not on the host's disk.
        proc = subprocess.run(["dd", "if=/dev/zero", f"of={base}/fill", "bs=1M", "count=200"],
                              capture_output=True)
        assert proc.returncode != 0 and os.path.getsize(f"{base}/fill") <= resources.BOX_BYTES
        # A process left running in it is killed when the box closes (once it runs there:
        # the box's command joins its cgroups first, then becomes `sleep`).
        left = subprocess.Popen(box.cmd(["sleep", "600"]))
        deadline = time.monotonic() + 60
        while not _runs_in(cgroups["pids"], "sleep") and time.monotonic() < deadline:
            assert left.poll() is None, "the box's command ended before it ran"
            time.sleep(0.05)
        assert _runs_in(cgroups["pids"], "sleep")
    finally:
        box.close()
    assert left.wait(timeout=10) != 0
    assert not os.path.exists(base) and not any(os.path.exists(p) for p in cgroups.values())


@ROOT_ONLY
def test_a_box_closed_while_its_command_joins_leaves_nothing_behind():
    """close() right after Popen: the command may join a cgroup after close() saw it empty
    (rmdir then fails with EBUSY); close() must still kill it and remove every cgroup."""
    for i in range(20):
        box = resources.SubmissionBox(mem=1 << 30, cpu_shares=1024, pids=64)
        base, cgroups = box.base, dict(box.cgroups)
        left = subprocess.Popen(box.cmd(["sleep", "600"]), stderr=subprocess.DEVNULL)
        time.sleep(i * 0.0005)          # 0-10 ms: the join lands before, during, after close()
        box.close()
        left.wait(timeout=10)
        assert not os.path.exists(base)
        assert not [p for p in cgroups.values() if os.path.exists(p)], cgroups


def test_preflight_names_a_zerocourse_from_another_checkout(monkeypatch):
    monkeypatch.setattr(preflight, "_where_zerocourse", lambda: "/elsewhere/zerocourse/__init__.py")
    with pytest.raises(SystemExit, match="imports zerocourse from /elsewhere/zerocourse"):
        preflight.check({}, sandbox=False)


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_preflight_names_an_interpreter_the_sandbox_cannot_see(tmp_path, monkeypatch):
    """A .venv reached through a symbolic link: the kernelspec's interpreter path does not
    exist inside the sandbox, which shows only real paths."""
    link = tmp_path / "venv-link"
    os.symlink(os.path.dirname(os.path.dirname(sys.executable)), link)
    fake = str(link / "bin" / os.path.basename(sys.executable))
    monkeypatch.setattr(sys, "executable", fake)
    monkeypatch.setattr(preflight, "_where_zerocourse",
                        lambda: os.path.join(preflight.ROOT, "zerocourse", "__init__.py"))
    with pytest.raises(SystemExit, match="is not visible inside the grading sandbox"):
        preflight.check({}, sandbox=True)
