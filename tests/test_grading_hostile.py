"""`make grade` against submissions that attack the grade itself (issue: grading you can trust).

One `make grade` run grades a second battery of 00_setup submissions beside the one in
tests/test_grading.py: each tries to raise its own score (IPython hooks, input transformers,
exception handlers, a replaced tamper guard, patched torch, forged `__eq__`, a fake answer
server, a tensor whose own attribute replaces a method the checks call), to read or leak what
it must not (hidden tests, secrets, instructor notes, the verdict kernel's history, grader
paths), to escape or to harm another student (kernelspecs, globbing ids, symlinks, links to
the gradebook, startup code planted for a restart), to reach the verdict kernel from its ranks
(planted startup code, killing what it can, forged frames to the rank host, a daemon left
behind), or to stop the class (a notebook nested 100,000 deep, an uninterruptible cell,
killing every process it can, a 200 MB message, cells over the output cap, 3 GiB written
wherever it can). The tests assert each exact score and status, that feedback shows no
hidden-test or notes text, that no other student's gradebook rows changed, that nothing
outside the submission changed, and each attack's own evidence (what a probe printed, the
caps' notes in the cells).
"""
import hashlib
import html
import json
import os
import re
import time

import pytest

from tests.fixtures.make_submission import (ROOT, load, make_grade, solution_as_submission,
                                            write)
from tests.proc_util import descendants
from tests.test_grading import AID, ENV, MEAN, NO_DIVIDE, SUM, _after, _before, _sol

pytestmark = pytest.mark.timeout(1800)
# Lines only the hidden tests have (the rest of a test cell is visible in the learner's copy).
HIDDEN_ONLY = ("for n in (1, 3, 4):", "cases = [((5,), torch.float64", "results = launch(_mean_case, n")


def _blank_with(code: str) -> dict:
    """The release copy (stubs) with a learner cell of `code` right after the imports."""
    nb = load("notebooks", AID)
    nb["cells"].insert(2, {"cell_type": "code", "metadata": {}, "execution_count": None,
                           "outputs": [], "source": code})
    return nb


def _with_cell(nb: dict, code: str, at: int = 2) -> dict:
    nb["cells"].insert(at, {"cell_type": "code", "metadata": {}, "execution_count": None,
                            "outputs": [], "source": code})
    return nb


HOOK_EXECUTE_RESULT = """
_ip = get_ipython()
def _forge(info):
    _ip.displayhook(7.0)        # an execute_result before every cell: nbgrader's partial credit
_ip.events.register("pre_run_cell", _forge)
"""
INPUT_TRANSFORMER = "get_ipython().input_transformers_post.append(lambda lines: ['pass\\n'])"
SWALLOW = """
def _swallow(shell, etype, evalue, tb, tb_offset=None):
    return None
get_ipython().set_custom_exc((BaseException,), _swallow)
"""
GUARD_OFF = """
import zerocourse.integrity as _zi
_zi.find_tampering = lambda namespace=None: []
_zi.assert_untampered = lambda namespace=None: None
"""
TORCH_PATCHED = """
import torch as _t
_t.Tensor.any = lambda self, *a, **k: _t.tensor(False)
_t.allclose = lambda *a, **k: True
_t.equal = lambda *a, **k: True
_t.Tensor.__eq__ = lambda self, other: _t.ones_like(self, dtype=_t.bool)
"""
FORGED_INT = """
class _Always(int):
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = int.__hash__
"""
HOOK_PRINTS = """
import linecache, sys
def _leak(result):
    print(result.info.raw_cell)
    print("".join("".join(v[2]) for v in list(linecache.cache.values()) if len(v) > 2 and v[2]))
get_ipython().events.register("post_run_cell", _leak)
"""
RANK_LEAK = ("import linecache\n"
             "    _all = ''.join(''.join(v[2]) for v in list(linecache.cache.values()) "
             "if len(v) > 2 and v[2])\n    print(_all)\n")
ESCAPE = """
import glob, json, os
_spec = {"argv": ["/bin/sh", "-c", "touch /tmp/zc-escaped; exec python -m ipykernel_launcher -f {connection_file}"],
         "display_name": "pwned", "language": "python"}
_targets = [os.path.join(p, "kernels", n, "kernel.json") for p in
            os.environ.get("JUPYTER_PATH", "").split(os.pathsep) + [
            os.path.expanduser("~/.local/share/jupyter"), "/usr/local/share/jupyter",
            "/usr/share/jupyter", os.path.join(os.__file__.rsplit("/lib/", 1)[0], "share/jupyter")]
            if p for n in ("python3", "zc-verdict")]
_wrote = []
for _t in _targets:
    try:
        os.makedirs(os.path.dirname(_t), exist_ok=True)
        with open(_t, "w") as _f:
            json.dump(_spec, _f)
        _wrote.append(_t)
    except OSError:
        pass
for _d in [os.environ.get("ZEROCOURSE_RPC_DIR", ""), "/tmp", os.path.expanduser("~")]:
    try:
        open(os.path.join(_d, "zc-planted.py"), "w").write("import os; os._exit(0)")
    except OSError:
        pass
print("wrote", _wrote)
"""
SECRETS = """
import glob, os
_readable = []
for _p in ["/etc/shadow", "/root/.ssh", "/root/.bash_history", "/home"] + glob.glob("/work/*/solutions") + \\
          glob.glob("/work/*/tests") + glob.glob("/tmp/*") + [%r, %r, %r]:
    try:
        if os.path.isdir(_p):
            if os.listdir(_p):
                _readable.append(_p)
        else:
            open(_p, "rb").read(1)
            _readable.append(_p)
    except OSError:
        pass
# What the sandbox shows on purpose is no secret: the course's own folders and the folders that
# hold them (they list nothing else, wherever the checkout lives: /tmp too), the kernel's own
# /tmp files and its sockets' folders.
import sys, zerocourse
_mine = [os.path.dirname(os.path.dirname(zerocourse.__file__)), sys.prefix, os.path.realpath(sys.prefix),
         os.path.realpath(sys.base_prefix), "/tmp/.mpl", "/tmp/.ipython"] + glob.glob("/tmp/zcsb-*")
def _own(p):       # made by the kernel itself (in its fresh /tmp: multiprocessing's folder)
    try:
        return os.stat(p).st_uid == os.getuid() and p.startswith("/tmp/")
    except OSError:
        return False
_readable = [p for p in _readable if not _own(p) and not any(
    m.startswith(p.rstrip("/") + "/") or m == p or p.startswith(m.rstrip("/") + "/") for m in _mine)]
# Nor are the folders that hold what the sandbox shows by design (the course's zerocourse/,
# data/, autograder/, its .venv) when they list nothing else: /tmp/<checkout> is one of them
# when the checkout lives under /tmp (issue 26).
_shown = %r
_readable = [p for p in _readable if not (os.path.isdir(p) and all(any(
    s == os.path.join(p, e) or s.startswith(os.path.join(p, e) + "/") for s in _shown)
    for e in os.listdir(p)))]
print("READABLE", _readable)
"""
FAKE_SERVER = """
import os, pickle, socket, struct, threading
class _Boom:
    def __reduce__(self):
        return (os.system, ("touch /tmp/zc-verdict-pwned",))
_path = os.path.join(os.environ.get("ZEROCOURSE_RPC_DIR", "/nonexistent"), "learner.sock")
def _fake():
    try:
        os.unlink(_path)
    except OSError:
        pass
    s = socket.socket(socket.AF_UNIX); s.bind(_path); os.chmod(_path, 0o666); s.listen(8)
    while True:
        c, _ = s.accept()
        def _one(c=c):
            while True:
                hdr = c.recv(8)
                if len(hdr) < 8:
                    return
                n = struct.unpack(">Q", hdr)[0]
                while n:
                    n -= len(c.recv(min(n, 65536)))
                body = b"V" + pickle.dumps(_Boom())
                c.sendall(struct.pack(">Q", len(body)) + body)
        threading.Thread(target=_one, daemon=True).start()
threading.Thread(target=_fake, daemon=True).start()
"""
SIGINT_IGNORED = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"
NOISE = ("import sys, warnings\n"
         "    print('debug: about to reduce', file=sys.stderr)\n"
         "    warnings.warn('a learner warning')\n")
DEPRECATED = ("_x = torch.zeros(2 * dist.get_world_size())\n"      # FutureWarning on every rank
              "    dist.all_gather_into_tensor(_x, torch.ones(2))\n"
              "    dist.reduce_scatter_tensor(torch.zeros(2), _x)\n")
KILL_ALL = "import os, signal\nos.kill(-1, signal.SIGKILL)"
BUILTINS = """
import builtins
builtins.isinstance = lambda *a: True
builtins.AssertionError = type("AssertionError", (Exception,), {})
"""


# --- issue 25 (part 3): learner code shares nothing with what judges it ---------------------
# A rank of the verdict kernel's tests plants startup code wherever it can write (HOME, cwd,
# /tmp, IPython's folders, an ipykernel_launcher.py) and kills every process it can signal,
# hoping the verdict kernel restarts into its code. In a blank notebook: 0 is fair.
PLANT_AND_KILL = """
import os, signal
_code = "get_ipython().input_transformers_post.append(lambda lines: ['pass\\\\n'])\\n"
for _d in {os.getcwd(), os.path.expanduser("~"), "/tmp", os.environ.get("HOME", "/tmp")}:
    for _rel in (".ipython/profile_default/startup/00-pwn.py", "ipykernel_launcher.py",
                 "sitecustomize.py", "usercustomize.py"):
        try:
            os.makedirs(os.path.dirname(os.path.join(_d, _rel)), exist_ok=True)
            open(os.path.join(_d, _rel), "w").write(_code)
        except OSError:
            pass
for _pid in [int(p) for p in os.listdir("/proc") if p.isdigit()]:
    if _pid != os.getpid():
        try:
            os.kill(_pid, signal.SIGKILL)
        except OSError:
            pass
"""
# The learner kernel turns its connection file, and every file of its folders, into links to
# the class gradebook, then kills itself: root must never write through them on the restart.
CONNECTION_LINKS = """
import glob, os, signal
_target = %r
for _p in ["/zc/connection.json", os.path.join(os.getcwd(), "connection.json")] + \\
        glob.glob("/tmp/zcsb-*/*/*") + glob.glob("/tmp/zcsb-*/*"):
    try:
        if os.path.isdir(_p) and not os.path.islink(_p):
            continue
        os.unlink(_p)
    except OSError:
        pass
    try:
        os.symlink(_target, _p)
    except OSError:
        pass
os.kill(os.getpid(), signal.SIGKILL)
"""
# In a rank of the tests: anything of the verdict kernel or the grader it can read (IPython
# history, the answer socket, the grader's environment, the instructor notes) sabotages it.
RANK_THIEF = ("import glob, os\n"
              "    _found = [p for p in glob.glob('/tmp/**/history.sqlite', recursive=True) +\n"
              "              glob.glob(os.path.expanduser('~/**/history.sqlite'), recursive=True) +\n"
              "              glob.glob('/tmp/zcsb-*/r/learner.sock') + glob.glob('/tmp/zcsb-*/v/*') +\n"
              f"              glob.glob({os.path.join(ROOT, 'autograder', 'notes', '*.md')!r})\n"
              "              if os.access(p, os.R_OK)]\n"
              "    _found += [k for k in os.environ if k in ('ZEROCOURSE_GRADEBOOK', 'ZEROCOURSE_NBGRADER_ROOT',\n"
              "               'ZEROCOURSE_RELEASE_DIR', 'ZEROCOURSE_RPC_DIR', 'ZEROCOURSE_VERDICT_IPC')]\n"
              "    for _pid in [p for p in os.listdir('/proc') if p.isdigit()]:\n"
              "        try:\n"
              "            _env = open(f'/proc/{_pid}/environ', 'rb').read()\n"
              "            _found += ['environ'] if b'GRADEBOOK' in _env or b'RANK_HOST_FD' in _env else []\n"
              "        except OSError:\n"
              "            pass\n"
              "    if _found:\n"
              "        print('FOUND', _found)\n"
              "        return -1\n")
# A last plain cell: print whatever of the verdict kernel's history the learner kernel reaches.
HISTORY_PRINT = """
import glob, os, sqlite3
for _p in glob.glob("/tmp/**/history.sqlite", recursive=True) + \\
        glob.glob(os.path.expanduser("~/**/history.sqlite"), recursive=True):
    try:
        print(_p, sqlite3.connect(_p).execute("select source from input").fetchall())
    except Exception as _e:
        print(_p, _e)
"""
# "Plain data" that is not: a wrong answer whose own attribute replaces Tensor.detach, and the
# course's plain() turned into the identity inside the rank (issue 25: 3/7 became 7/7).
FORGED_TENSOR = """
def global_mean(local):
    import torch
    import zerocourse.checks as _c
    _c.plain = lambda value: value
    out = torch.zeros_like(local)
    out.detach = torch.Tensor
    return out
"""
# Instructor material printed into the feedback, from the learner kernel and from a rank.
NOTES_READER = f"""
import glob, os
_notes = []
_ag = {os.path.join(ROOT, "autograder")!r}
for _p in glob.glob(_ag + "/notes/*.md") + glob.glob(_ag + "/*.md") + glob.glob(_ag + "/rubric.py") + \\
        glob.glob(_ag + "/handout/*") + glob.glob(_ag + "/grade.py"):
    try:
        print(open(_p).read())
        _notes.append(_p)
    except OSError:
        pass
print("NOTES", _notes)
"""
# One 200 MB message, then six cells of 5 MB each (the notebook's cap is 16 MiB).
BYTE_FLOOD = "import sys\nsys.stdout.write('x' * 200_000_000)\nsys.stdout.flush()"
CELL_FLOOD = "import sys\nfor _ in range(5):\n    sys.stdout.write('y' * 1_000_000 + '\\n')"
# 3 GiB written wherever the learner kernel can write (its /tmp, HOME, /dev/shm, its sockets'
# folder on the host): the writable folders are size-limited.
DISK_FILLER = """
import glob, os
_wrote = {}
for _d in ["/tmp", os.path.expanduser("~"), "/dev/shm"] + glob.glob("/tmp/zcsb-*/l"):
    _n = 0
    try:
        with open(os.path.join(_d, "filler.bin"), "wb") as _f:
            while _n < 3 << 30:
                _f.write(b"z" * (8 << 20))
                _n += 8 << 20
    except OSError:
        pass
    _wrote[_d] = _n
    try:
        os.unlink(os.path.join(_d, "filler.bin"))
    except OSError:
        pass
print("WROTE", max(_wrote.values()))
"""
# A rank leaves a daemon behind that kills everything it can, hoping to break later launches.
RANK_DAEMON = ("import os, signal, time\n"
               "    if rank == 0 and os.fork() == 0:\n"
               "        os.setsid()\n"
               "        _parent = os.getppid()\n"
               "        while os.getppid() == _parent:\n"
               "            time.sleep(0.01)\n"
               "        while True:\n"
               "            for _p in [int(p) for p in os.listdir('/proc') if p.isdigit()]:\n"
               "                try:\n"
               "                    os.kill(_p, signal.SIGKILL)\n"
               "                except OSError:\n"
               "                    pass\n"
               "            time.sleep(0.01)\n")
# Every rank kills every process it may signal (kill(-1): all but itself): it reaches nothing.
RANK_KILLS_ALL = "import os, signal\n    os.kill(-1, signal.SIGKILL)\n"
# A rank forges the rank host's "results" frame on every socket it holds but its own pipe.
RANK_FORGES = ("import os, stat, struct, json\n"
               "    from zerocourse import _rank as _r\n"
               "    _mine = _r._CHANNEL.conn.fileno()\n"
               "    _body = json.dumps({'sizes': [], 'figures': []}).encode()\n"
               "    _frame = b'R' + struct.pack('>I', len(_body)) + _body\n"
               "    for _fd in [int(f) for f in os.listdir('/proc/self/fd')]:\n"
               "        try:\n"
               "            if _fd > 2 and _fd != _mine and stat.S_ISSOCK(os.fstat(_fd).st_mode):\n"
               "                import socket as _s\n"
               "                _k = _s.socket(fileno=os.dup(_fd))\n"
               "                if _k.family == _s.AF_UNIX:\n"
               "                    _k.sendall(struct.pack('>Q', len(_frame)) + _frame)\n"
               "                _k.detach()\n"
               "        except OSError:\n"
               "            pass\n")
# The grader's paths in the learner kernel's environment (the gradebook, OUT, the release).
GRADER_PATHS = """
import os
_paths = %r
_seen = [k for k, v in os.environ.items() if any(p in v for p in _paths)]
for _pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    try:
        _env = open(f"/proc/{_pid}/environ", "rb").read().decode("utf-8", "replace")
        _seen += [f"/proc/{_pid}" for p in _paths if p in _env]
    except OSError:
        pass
print("GRADER-PATHS", _seen)
"""
# Kill the learner kernel after planting a startup file in its HOME and a marker in its cwd:
# the restarted kernel must start in fresh folders (the planted file would break global_mean).
RESTART_PLANT = """
import os, signal
os.makedirs(os.path.expanduser("~/.ipython/profile_default/startup"), exist_ok=True)
open(os.path.expanduser("~/.ipython/profile_default/startup/00-pwn.py"), "w").write(
    "global_mean = lambda local: local * 0\\n")
open("marker-before-restart", "w").write("x")
os.kill(os.getpid(), signal.SIGKILL)
"""
RESTART_CHECK = """
import os
if os.path.exists("marker-before-restart") or os.path.exists(
        os.path.expanduser("~/.ipython/profile_default/startup/00-pwn.py")):
    def global_mean(local):
        return local * 0
"""


def _deep(out, subs):
    return "[" * 100_000 + "]" * 100_000


def _copied_test():
    nb = _sol()
    i = next(i for i, c in enumerate(nb["cells"])
             if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == f"{SUM}-check")
    nb["cells"].insert(i + 1, json.loads(json.dumps(nb["cells"][i])))
    return nb


def _secrets(out, subs):
    from autograder.sandbox_kernel import readonly_paths
    probe = SECRETS % (os.path.join(out, "gradebook.db"), str(subs),
                       os.path.join(ROOT, "solutions", AID, f"{AID}.ipynb"), readonly_paths(ROOT))
    return _sol(_before(SUM, probe),
                (SUM, "return int(t.item())", "return int(t.item()) if not _readable else -1"))


def _cell_after(nb: dict, gid: str, code: str) -> dict:
    """Insert a plain learner cell right after the cell `gid`."""
    i = next(i for i, c in enumerate(nb["cells"])
             if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == gid)
    return _with_cell(nb, code, at=i + 1)


def _blank_sum(code: str) -> dict:
    """The release copy (stubs) whose sum_of_ranks runs `code` in its ranks, then is right."""
    nb = load("notebooks", AID)
    cell = next(c for c in nb["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == SUM)
    cell["source"] = ("import torch, torch.distributed as dist\n"
                      "def sum_of_ranks(rank, world_size):\n"
                      "    exec(" + repr(code) + ", {})\n"
                      "    t = torch.tensor([float(rank + 1)])\n"
                      "    dist.all_reduce(t)\n"
                      "    return int(t.item())\n")
    return nb


def _restart_links(out, subs):
    """Links to the gradebook and planted startup code, its kernel killed; then a cell that
    breaks global_mean if the restarted kernel found any of it (fresh folders: it finds none)."""
    nb = _cell_after(_sol(), MEAN, RESTART_CHECK)
    kill = (CONNECTION_LINKS % os.path.join(out, "gradebook.db")).replace(
        "os.kill(os.getpid(), signal.SIGKILL)", "")
    return _cell_after(nb, MEAN, kill + RESTART_PLANT)


def _thieves(out, subs):
    probe = GRADER_PATHS % ([str(out), os.path.join(str(out), "gradebook.db"), os.path.join(str(out), "release")],)
    nb = _sol(_after(MEAN, NOTES_READER), (SUM, "t = torch.tensor", RANK_THIEF + "    t = torch.tensor"))
    nb = _cell_after(nb, MEAN, probe)
    return _with_cell(nb, HISTORY_PRINT, at=len(nb["cells"]))


# student -> (builder(out, subs), expected score, text the status must contain)
HOSTILE = {
    "alice": (lambda o, s: _sol(), 7, "graded"),
    "hook-execute-result": (lambda o, s: _blank_with(HOOK_EXECUTE_RESULT), 0, "graded"),
    "input-transformer": (lambda o, s: _blank_with(INPUT_TRANSFORMER), 0, "graded"),
    "exception-swallower": (lambda o, s: _blank_with(SWALLOW), 0, "graded"),
    "guard-replaced": (lambda o, s: _sol(NO_DIVIDE, _after(MEAN, GUARD_OFF)), 3, "graded"),
    "torch-patched": (lambda o, s: _sol(NO_DIVIDE, _after(MEAN, TORCH_PATCHED)), 3, "graded"),
    "forged-eq-int": (lambda o, s: _sol(_before(SUM, FORGED_INT),
                                        (SUM, "return int(t.item())", "return _Always(-5)")),
                      4, "graded"),
    "hook-prints-source": (lambda o, s: _blank_with(HOOK_PRINTS), 0, "graded"),
    "rank-leaks-source": (lambda o, s: _sol(
        (SUM, "t = torch.tensor", RANK_LEAK + "    t = torch.tensor"),
        (MEAN, "dist.all_reduce(out)", RANK_LEAK + "    raise ValueError(_all)")), 3, "graded"),
    "escape-kernelspec": (lambda o, s: _sol(_after(MEAN, ESCAPE)), 7, "graded"),
    "fake-answer-server": (lambda o, s: _blank_with(FAKE_SERVER), 0, "graded"),
    "secret-reader": (_secrets, 7, "graded"),
    "sigint-ignored": (lambda o, s: _sol(_after(MEAN, SIGINT_IGNORED)), 3, "graded"),
    "kill-everything": (lambda o, s: _with_cell(_sol(), KILL_ALL, at=1), 7, "graded"),
    "builtins-replaced": (lambda o, s: _blank_with(BUILTINS), 0, "graded"),
    "copied-test-cell": (lambda o, s: _copied_test(), 7, "appeared twice"),
    "deep-json": (_deep, 0, "not valid JSON"),
    # Valid and noisy: stderr from every rank (a print, a warning, a deprecated collective's
    # FutureWarning) never costs a point; only a failed check does.
    "noisy-but-right": (lambda o, s: _sol((SUM, "t = torch.tensor", NOISE + "    t = torch.tensor"),
                                          (MEAN, "dist.all_reduce(out)",
                                           NOISE + "    " + DEPRECATED + "    dist.all_reduce(out)")),
                        7, "graded"),
    # Issue 25 (part 3): the verdict side runs no learner code, root never acts on a path a
    # sandbox writes, plain data is plain, instructor material is out of reach, limits are
    # per submission (see autograder/README.md's threat model). Several attacks with the same
    # fair score share a submission (each one would cost points if it worked; the tests
    # below also check each one's own evidence).
    "rank-plants-startup": (lambda o, s: _blank_sum(PLANT_AND_KILL), 3, "graded"),
    "forged-tensor": (lambda o, s: _sol((MEAN, "def global_mean", FORGED_TENSOR + "\ndef _unused_global_mean")),
                      3, "graded"),
    # history, the answer socket, instructor notes, grader paths: from a rank and from the kernel
    "thieves": (_thieves, 7, "graded"),
    # a rank forges the host's frames, kills every process it may signal, leaves a daemon
    "rank-attacks": (lambda o, s: _sol((SUM, "t = torch.tensor",
                                        RANK_FORGES + "    " + RANK_KILLS_ALL + "    " + RANK_DAEMON +
                                        "    t = torch.tensor")), 7, "graded"),
    # one 200 MB message, two cells over the 4 MiB cap, 3 GiB written wherever it can
    "floods-and-fills": (lambda o, s: _cell_after(_cell_after(
        _sol(_after(MEAN, CELL_FLOOD), _after(SUM, CELL_FLOOD)), MEAN, DISK_FILLER), MEAN, BYTE_FLOOD),
        7, "graded"),
    # links to the gradebook in its folders, startup code in HOME, then its kernel killed
    "restart-links": (_restart_links, 7, "graded"),
    "zz-victim": (lambda o, s: _sol(), 7, "graded"),     # graded after every attack above
}
# Folders whose names are refused before nbgrader sees them (globs, options, spaces).
BAD_IDS = {"alice*": "refused: student id", "-rf": "refused: student id",
           "bob ": "refused: student id", "[ab]lice": "refused: student id"}


def _tree_digest(paths) -> str:
    h = hashlib.sha256()
    for base in paths:
        for dirpath, dirnames, filenames in sorted(os.walk(base)):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(filenames):
                p = os.path.join(dirpath, name)
                h.update(p.encode())
                try:
                    h.update(open(p, "rb").read())
                except OSError:
                    pass
    return h.hexdigest()


WATCHED = [os.path.join(ROOT, d) for d in ("zerocourse", "autograder", "data", "solutions", "notebooks")]


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    subs = tmp_path_factory.mktemp("hostile-submissions")
    out = tmp_path_factory.mktemp("hostile-graded")
    for student, (build, _, _) in HOSTILE.items():
        write(build(str(out), str(subs)), subs, student, AID)
    for bad in BAD_IDS:
        write(solution_as_submission(AID), subs, bad, AID)
    os.makedirs(subs / "symlink-solutions" / AID)
    os.symlink(os.path.join(ROOT, "solutions", AID, f"{AID}.ipynb"),
               subs / "symlink-solutions" / AID / f"{AID}.ipynb")
    os.makedirs(subs / "symlink-classmate" / AID)
    os.symlink(subs / "alice" / AID / f"{AID}.ipynb", subs / "symlink-classmate" / AID / f"{AID}.ipynb")
    huge = load("notebooks", AID)
    huge["metadata"]["padding"] = "x" * (21 << 20)
    write(huge, subs, "huge-file", AID)
    digest = _tree_digest(WATCHED)
    before = descendants(os.getpid())
    rows, took = make_grade(subs, out, ENV, timeout=1800)
    return rows, out, subs, before, took, digest


@pytest.mark.parametrize("student", list(HOSTILE))
def test_hostile_scores(graded, student):
    rows, *_ = graded
    _, expected, status = HOSTILE[student]
    row = rows[student]
    assert float(row["score"]) == expected, row
    assert status in row["status"], row


@pytest.mark.parametrize("bad", list(BAD_IDS) + ["symlink-solutions", "symlink-classmate",
                                                 "huge-file"])
def test_refused_before_grading(graded, bad):
    rows, out, *_ = graded
    row = rows[bad]
    assert float(row["score"]) == 0 and "refused" in row["status"], row
    assert not (out / "autograded" / bad).exists()


def test_gradebook_holds_only_expected_rows(graded):
    """Every graded student has exactly its own score; refused ids never reached nbgrader."""
    rows, out, *_ = graded
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{out / 'gradebook.db'}") as gb:
        scores = {s.student.id: s.score for s in gb.find_assignment(AID).submissions}
    expected = {s: e for s, (_, e, st) in HOSTILE.items() if st != "not valid JSON"}
    assert scores == expected


def _text(path):
    return html.unescape(re.sub(r"<[^>]+>", "", path.read_text()))


# Lines only the instructor notes have (autograder/notes/, out of every sandbox).
NOTES_ONLY = ("## 3. Graded cells", "| grade_id | points | what it checks |", "## 4. Common mistakes",
              "## 2. Time to teach")


def test_feedback_shows_no_hidden_test_text(graded):
    rows, out, *_ = graded
    for student, (_, _, status) in HOSTILE.items():
        if status == "not valid JSON":
            continue
        text = _text(out / "feedback" / student / AID / f"{AID}.html")
        for line in HIDDEN_ONLY + NOTES_ONLY:
            assert line not in text, (student, line)
    # The leak tried to print every cell it could see; the checks' own lines are all that show.
    leak = _text(out / "feedback" / "rank-leaks-source" / AID / f"{AID}.html")
    assert "❌" in leak and "✅" in leak


def test_no_escape_and_nothing_changed(graded):
    rows, out, subs, before, took, digest = graded
    assert _tree_digest(WATCHED) == digest
    assert not os.path.exists("/tmp/zc-escaped") and not os.path.exists("/tmp/zc-verdict-pwned")
    assert not os.path.exists(os.path.join(ROOT, ".venv", "share", "jupyter", "kernels", "zc-verdict"))
    assert not (out / "solutions").exists()          # no instructor copy beside feedback/
    deadline = time.monotonic() + 20
    while descendants(os.getpid()) - before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert descendants(os.getpid()) - before == set()


def _outputs(out, student) -> str:
    nb = json.loads((out / "autograded" / student / AID / f"{AID}.ipynb").read_text())
    return "".join("".join(o.get("text", "")) + o.get("evalue", "") for c in nb["cells"]
                   for o in c.get("outputs", []))


def test_nothing_of_the_grader_reaches_a_kernel(graded):
    """The learner kernel finds no instructor notes, no grader path in any environment it can
    read, no history of the verdict kernel (issue 25, items 1, 2, 6)."""
    _, out, *_ = graded
    text = _outputs(out, "thieves")
    assert "NOTES []" in text and "GRADER-PATHS []" in text and "history.sqlite" not in text


def test_floods_are_capped_per_cell_and_per_notebook(graded):
    """A 200 MB message and cells of 5 MB each: the autograded notebook and the feedback stay
    small, and the capped cells say why (issue 25, item 8)."""
    _, out, *_ = graded
    nb = out / "autograded" / "floods-and-fills" / AID / f"{AID}.ipynb"
    page = out / "feedback" / "floods-and-fills" / AID / f"{AID}.html"
    assert nb.stat().st_size < 12 << 20 and page.stat().st_size < 12 << 20
    cells = json.loads(nb.read_text())["cells"]
    floods = [c for c in cells if "'y' * 1_000_000" in "".join(c["source"])]
    assert len(floods) == 2
    for cell in floods:              # the two solution cells over 4 MiB: stopped, and why
        notes = [o.get("evalue", "") for o in cell["outputs"] if o["output_type"] == "error"]
        assert any("went over 4 MiB: the grader stopped the cell" in n for n in notes), notes


def test_writable_folders_are_size_limited(graded):
    """3 GiB written wherever the learner kernel can write: no folder took more than its
    tmpfs allows (the kernel's /tmp: 256 MiB)."""
    _, out, *_ = graded
    wrote = int(re.search(r"WROTE (\d+)", _outputs(out, "floods-and-fills")).group(1))
    assert 0 < wrote <= 256 << 20, wrote


def test_uninterruptible_cell_costs_one_timeout(graded):
    """One cell timeout, the wait for the interrupt to settle, a restart and a replay: not a
    timeout per later cell, and never the whole notebook."""
    from autograder.split_execute import SETTLE_S
    rows, *_ = graded
    extra = float(rows["sigint-ignored"]["seconds"]) - float(rows["alice"]["seconds"])
    assert extra < float(ENV["ZEROCOURSE_CELL_TIMEOUT"]) + SETTLE_S + 60, rows["sigint-ignored"]
