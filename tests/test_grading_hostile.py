"""`make grade` against submissions that attack the grade itself (issue: grading you can trust).

One `make grade` run grades a second battery of 00_setup submissions beside the one in
tests/test_grading.py: each tries to raise its own score (IPython hooks, input transformers,
exception handlers, a replaced tamper guard, patched torch, forged `__eq__`, a fake answer
server), to read or leak what it must not (hidden tests, secrets), to escape or to harm
another student (kernelspecs, globbing ids, symlinks), or to stop the class (a notebook
nested 100,000 deep, an uninterruptible cell, killing every process it can). The tests
assert each exact score and status, that feedback shows no hidden-test text, that no
other student's gradebook rows changed, and that nothing outside the submission changed.
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
# Its own folder, and the folders that hold it (they list nothing else), are not secrets.
_mine = [os.path.expanduser("~"), os.environ.get("ZEROCOURSE_RPC_DIR", "~")]
_readable = [p for p in _readable if not any(m.startswith(p.rstrip("/") + "/") or m == p or
                                                p.startswith(m) for m in _mine)]
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


def test_feedback_shows_no_hidden_test_text(graded):
    rows, out, *_ = graded
    for student, (_, _, status) in HOSTILE.items():
        if status == "not valid JSON":
            continue
        text = _text(out / "feedback" / student / AID / f"{AID}.html")
        for line in HIDDEN_ONLY:
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


def test_uninterruptible_cell_costs_one_timeout(graded):
    """One cell timeout, the wait for the interrupt to settle, a restart and a replay: not a
    timeout per later cell, and never the whole notebook."""
    from autograder.split_execute import SETTLE_S
    rows, *_ = graded
    extra = float(rows["sigint-ignored"]["seconds"]) - float(rows["alice"]["seconds"])
    assert extra < float(ENV["ZEROCOURSE_CELL_TIMEOUT"]) + SETTLE_S + 60, rows["sigint-ignored"]
