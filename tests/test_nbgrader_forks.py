"""autograder/nbgrader_forks.py: nbgrader calls forked from a preloaded server behave as the
command does (status, output, environment, folder, cgroups, timeout), and no call reaches the
server or the next call."""
import os
import subprocess
import sys
import time

import pytest

from autograder import nbgrader_forks
from autograder.nbgrader_run import command_env
from autograder.resources import SubmissionBox
from tests.proc_util import descendants

# An nbgrader_config.py that reports what the call sees, then leaves a mark on a module the
# server preloaded: the next call must not see it.
CONFIG = """\
import os, sys, nbgrader
print("SEEN", os.getcwd(), os.environ.get("ZC_PROBE"), getattr(nbgrader, "_zc_mark", None), flush=True)
print("CGROUP", open("/proc/self/cgroup").read().replace("\\n", ";"), flush=True)
print("ON STDERR", file=sys.stderr, flush=True)
nbgrader._zc_mark = os.environ.get("ZC_PROBE")
if os.environ.get("ZC_EXIT"):
    sys.exit(int(os.environ["ZC_EXIT"]))
if os.environ.get("ZC_HANG"):
    import time
    time.sleep(600)
c = get_config()
"""


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "nbgrader_config.py").write_text(CONFIG)
    return str(tmp_path)


def _seen(out: str) -> list[str]:
    return next(l for l in out.splitlines() if l.startswith("SEEN ")).split(" ")[1:]


def test_a_call_is_the_command_and_leaves_nothing_for_the_next(folder):
    first = nbgrader_forks.run(["db", "student", "list"], command_env({"ZC_PROBE": "one"}), folder, 120)
    second = nbgrader_forks.run(["db", "student", "list"], command_env({"ZC_PROBE": "two"}), folder, 120)
    plain = subprocess.run([os.path.join(os.path.dirname(sys.executable), "nbgrader"), "db", "student", "list"],
                           cwd=folder, env=command_env({"ZC_PROBE": "two"}), capture_output=True,
                           text=True, timeout=120)
    assert first.returncode == second.returncode == plain.returncode == 0, (first, second, plain)
    assert _seen(first.stdout) == [folder, "one", "None"]
    assert _seen(second.stdout) == [folder, "two", "None"], "a call saw what the one before it left"
    assert "ON STDERR" in second.stderr and "ON STDERR" not in second.stdout
    # The same output as the command (nbgrader's own lines), the config's lines aside.
    assert [l for l in second.stderr.splitlines() if "ON STDERR" not in l] == \
        [l for l in plain.stderr.splitlines() if "ON STDERR" not in l]


def _schema_version(folder: str) -> list:
    import sqlite3
    with sqlite3.connect(os.path.join(folder, "gradebook.db")) as db:
        return db.execute("SELECT version_num FROM alembic_version").fetchall()


def test_a_new_gradebook_records_the_schema_version_the_command_records(tmp_path):
    """A call reads the schema's head revision in-process; the command asks `alembic heads`."""
    forked, plain = tmp_path / "forked", tmp_path / "plain"
    for d in (forked, plain):
        d.mkdir()
        (d / "nbgrader_config.py").write_text("c = get_config()\n")
    got = nbgrader_forks.run(["db", "student", "list"], command_env(), str(forked), 120)
    ran = subprocess.run([os.path.join(os.path.dirname(sys.executable), "nbgrader"), "db", "student", "list"],
                         cwd=str(plain), env=command_env(), capture_output=True, text=True, timeout=120)
    assert got.returncode == ran.returncode == 0, (got, ran)
    assert _schema_version(str(forked)) == _schema_version(str(plain)) != [], \
        (_schema_version(str(forked)), _schema_version(str(plain)))


def test_a_failing_call_exits_as_the_command_does(folder):
    args = ["db", "student", "list"]
    got = nbgrader_forks.run(args, command_env({"ZC_EXIT": "3"}), folder, 120)
    plain = subprocess.run([os.path.join(os.path.dirname(sys.executable), "nbgrader"), *args],
                           cwd=folder, env=command_env({"ZC_EXIT": "3"}), capture_output=True,
                           text=True, timeout=120)
    assert got.returncode == plain.returncode == 3, (got, plain)


def test_a_timeout_kills_the_call_and_what_it_started(folder):
    before = descendants(os.getpid())
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        nbgrader_forks.run(["db", "student", "list"], command_env({"ZC_HANG": "1"}), folder, 3)
    assert time.monotonic() - t0 < 60
    left = descendants(os.getpid()) - before
    # What stays is the fork server alone (it lives as long as this process), never a call.
    for pid in left:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            assert b"forkserver" in f.read(), f"left behind: {pid}"


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.isdir("/sys/fs/cgroup/memory"),
                    reason="cgroup v1 memory controller as root (the grading boxes) needed")
def test_a_call_runs_inside_the_submissions_cgroups(folder):
    box = SubmissionBox(1 << 30, 1024)
    try:
        assert box.cgroups, "no cgroup was made"
        got = nbgrader_forks.run(["db", "student", "list"], command_env(), folder, 120, list(box.cgroups.values()))
        line = next(l for l in got.stdout.splitlines() if l.startswith("CGROUP "))
        for ctrl, path in box.cgroups.items():
            assert os.path.basename(path) in line, (ctrl, line)
        assert box.peak_bytes() and box.peak_bytes() > 10 << 20, "its memory did not count in the box"
    finally:
        box.close()


def test_a_flood_of_output_is_kept_to_its_head_and_tail(tmp_path):
    path = tmp_path / "out"
    path.write_bytes(b"HEAD" + b"x" * (3 << 20) + b"TAIL")
    text = nbgrader_forks._read_capped(str(path), keep=1 << 20)
    assert text.startswith("HEAD") and text.endswith("TAIL") and len(text) < (1 << 20) + 200
    assert f"{(3 << 20) + 8 - (1 << 20)} bytes of output left out" in text
