"""Split grading's parts, one at a time (the end-to-end proofs are the grading batteries).

- only plain data crosses from the learner's kernel: `verdict.decode` refuses code,
  custom classes and forged ints; learner errors arrive as the builtin class of that name;
- a stand-in for a learner function calls into a real answer server and ships the
  learner's object, unopened, to whoever unpickles it (the ranks);
- a test cell's outputs keep only the checks' lines; stderr is never a failure under
  nbgrader's own scoring rule; no execute_result survives;
- ids, symlinks, oversize and deeply nested files, copied cells: refused or repaired;
- written answers not yet graded read "awaiting manual grading" in feedback.
"""
import io
import json
import os
import pickle
import time

import nbformat
import pytest
import torch

from autograder import feedback, grade, learner_rpc, split_execute, verdict
from tests.fixtures.make_submission import load


class _Boom:
    def __reduce__(self):
        return (os.system, ("touch /tmp/zc-split-test-pwned",))


class _ForgedInt(int):
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__


def _saved(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def test_decode_gives_plain_data_back():
    from fractions import Fraction
    value = {"a": [1, 2.5, "x", None, True], "t": torch.arange(3), "f": Fraction(3, 2), "n": (1, 2)}
    got = verdict.decode(_saved(value))
    assert got["a"] == value["a"] and torch.equal(got["t"], value["t"])
    assert got["f"] == Fraction(3, 2) and got["n"] == (1, 2)


@pytest.mark.parametrize("hostile", [_Boom(), _ForgedInt(3), {"x": _ForgedInt(1)}],
                         ids=["code", "forged-int", "nested-forged-int"])
def test_decode_refuses_code_and_custom_classes(hostile):
    marker = "/tmp/zc-split-test-pwned"
    if os.path.exists(marker):
        os.unlink(marker)
    for data in (_saved(hostile), pickle.dumps(hostile)):
        with pytest.raises(Exception):
            verdict.decode(data)
    assert not os.path.exists(marker)


@pytest.fixture
def answer_server(tmp_path):
    """The learner side of split grading, serving a namespace from this process."""
    ns = {"double": lambda x: 2 * x, "answer": 42, "picky": _picky, "model": _ForgedInt(1),
          "forged": lambda: _ForgedInt(7)}
    path = str(tmp_path / "learner.sock")
    learner_rpc.serve(path, ns)
    for _ in range(50):
        if os.path.exists(path):
            break
        time.sleep(0.02)
    verdict.connect(path, ["double", "answer", "picky", "model", "forged", "missing"], timeout=10)
    return path, ns


def _picky(x):
    if x < 0:
        raise ValueError("x must be >= 0")
    raise KeyError("secret")


def test_stand_ins_call_the_learner_and_bring_back_plain_data(answer_server):
    ns = {}
    verdict.sync(ns)
    assert set(ns) == {"double", "answer", "picky", "model", "forged"}     # "missing" stays unbound
    assert ns["double"](21) == 42 and ns["answer"] == 42
    assert isinstance(ns["model"], verdict.LearnerObject)
    with pytest.raises(ValueError, match="x must be >= 0"):
        ns["picky"](-1)
    with pytest.raises(KeyError):
        ns["picky"](1)
    with pytest.raises(TypeError, match="cannot accept"):
        ns["forged"]()                                    # an int subclass is not plain data
    # Sent elsewhere (to the ranks), a stand-in is the learner's real object.
    assert pickle.loads(pickle.dumps(ns["double"]))(5) == 10


def test_course_names_are_never_replaced(answer_server):
    def mine(x):
        return "course"
    ns = {"double": mine}
    verdict.sync(ns)
    assert ns["double"] is mine


def test_dead_learner_kernel_fails_the_test_not_the_grader(tmp_path):
    verdict.connect(str(tmp_path / "nobody.sock"), ["f"], timeout=2)
    with pytest.raises(verdict.LearnerKernelError, match="did not answer"):
        verdict.sync({})


def _determine_grade(outputs):
    from nbgrader.utils import determine_grade
    cell = nbformat.v4.new_code_cell("pass", metadata={"nbgrader": {
        "grade": True, "solution": False, "grade_id": "x", "points": 3}})
    cell.outputs = outputs
    return determine_grade(cell)[0]


def test_stderr_and_prints_never_cost_points():
    outs = [nbformat.v4.new_output("stream", name="stderr", text="FutureWarning: deprecated\n"),
            nbformat.v4.new_output("stream", name="stdout", text="[rank 0] secret line\n✅ ok\n"),
            nbformat.v4.new_output("execute_result", data={"text/plain": "0.0"}, execution_count=1)]
    assert _determine_grade(outs) == 0           # nbgrader's own rule, as it stands
    kept, log = split_execute.clean_test_outputs(outs)
    assert _determine_grade(kept) == 3
    assert [o["text"] for o in kept] == ["✅ ok\n"]
    assert "secret line" in log and "FutureWarning" in log


def test_error_text_loses_rank_tracebacks():
    err = nbformat.v4.new_output("error", ename="AssertionError", traceback=["x"],
                                 evalue="❌ wrong\n--- traceback from rank 0 ---\nhidden line")
    kept, _ = split_execute.clean_test_outputs([err])
    assert kept[0]["evalue"] == "❌ wrong\n" and _determine_grade(kept) == 0


def test_asked_names_cover_the_answers_and_never_the_courses():
    names = split_execute.asked_names(load("notebooks", "03_zero1"))
    assert names[:2] == ["shard_bounds", "ZeRO1Adam"]
    # The course's own names are never taken from the learner's kernel.
    assert not {"launch", "check_equal", "ToyModel", "torch", "passed", "_check_zero1"} & set(names)
    # A value answer whose stub assigns nothing is still asked for (the tests read it).
    assert "answer_gpt2_gb" in split_execute.asked_names(load("notebooks", "01_bytes_per_parameter"))
    course = split_execute.course_cells(load("notebooks", "00_setup"))
    assert all("raise NotImplementedError()" not in src for _, src in course)


@pytest.mark.parametrize("bad", ["alice*", "-rf", "bob ", " bob", "a/b", "..", "[ab]", "x?",
                                 "", "a" * 65, "ünï"])
def test_refused_ids(bad):
    assert grade.refuse_id("student", bad)


@pytest.mark.parametrize("good", ["alice", "bob.smith", "s-123", "x_y", "a@b.edu", "A1+2"])
def test_plain_ids(good):
    assert grade.refuse_id("student", good) is None


def test_intake_refuses_links_huge_and_deep_files(tmp_path, monkeypatch):
    real = tmp_path / "real.ipynb"
    real.write_text(json.dumps(load("notebooks", "00_setup")))
    link = tmp_path / "link.ipynb"
    link.symlink_to(real)
    assert "symbolic link" in grade._preflight(str(link))
    deep = tmp_path / "deep.ipynb"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    assert "not valid JSON" in grade._preflight(str(deep))
    monkeypatch.setattr(grade, "MAX_BYTES", 1000)
    assert "over the" in grade._preflight(str(real))
    fifo = tmp_path / "fifo.ipynb"
    os.mkfifo(fifo)
    assert "not a regular file" in grade._preflight(str(fifo))


def test_copied_cells_are_repaired():
    nb = load("notebooks", "00_setup")
    test = next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade"))
    nb["cells"].append(json.loads(json.dumps(test)))
    notes = grade.repair(nb)
    assert len(notes) == 1 and "appeared twice" in notes[0]
    ids = [c["metadata"]["nbgrader"]["grade_id"] for c in nb["cells"] if "nbgrader" in c["metadata"]]
    assert len(ids) == len(set(ids))


def test_feedback_marks_pending_manual_answers():
    page = ('<h4>07 (Score: 5.0 / 9.0)</h4><li><a href="#q-feynman">Written response</a> '
            '(Score: 0.0 / 4.0)</li><a name="q-feynman"></a><div class="panel-heading">'
            '<span>Student\'s answer</span><span class="pull-right">Score: 0.0 / 4.0 <a href="#top">')
    out = feedback.mark_pending(page, {"q-feynman": 4.0})
    assert "Score: 0.0 / 4.0" not in out
    assert out.count("awaiting manual grading (4 points)") == 2
    assert "(Score: 5.0 / 9.0; 4 points await manual grading)" in out


def test_decode_rebuilds_tensors_without_their_attributes():
    """weights_only restores a tensor's __dict__: `detach = torch.Tensor` made check_close
    compare nothing (3/7 became 7/7). The one decoder rebuilds every tensor by copy."""
    from zerocourse.plain import PlainDataError
    t = torch.zeros(3)
    t.detach, t.note = torch.Tensor, "forged"
    got = verdict.decode(_saved({"mean": t, "p": torch.nn.Parameter(torch.ones(2))}))
    assert type(got["mean"]) is torch.Tensor and got["mean"].__dict__ == {}
    assert type(got["p"]) is torch.Tensor and torch.equal(got["p"], torch.ones(2))
    # A set of plain atoms is an answer (10's answer_gathers_params): rebuilt as a builtin set.
    got = verdict.decode(_saved({0, 2, (1, "a")}))
    assert type(got) is set and got == {0, 2, (1, "a")}
    for bad, name in ((torch.device("cpu"), "torch.device"),
                      (torch.zeros(3).to_sparse(), "sparse"), (torch.zeros(2, device="meta"), "meta")):
        with pytest.raises(PlainDataError, match=name):
            verdict.decode(_saved(bad))


class _FakeVerdict:
    """Stands for the verdict kernel: `prints(source, nonce)` says what the cell printed."""

    capped = None

    def __init__(self, prints):
        self.prints = prints

    def execute_cell(self, cell, index, store_history=True):
        import re
        nonce = re.search(r"_zcv\.completed\('([0-9a-f]+)'\)", cell.source).group(1)
        text = self.prints(cell.source, nonce)
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)] if text else []


@pytest.mark.parametrize("prints, scores", [
    (lambda src, nonce: f"✅ right\n[zc-completed {nonce}]\n", True),
    (lambda src, nonce: "", False),                                   # silence
    (lambda src, nonce: "✅ right\n", False),                          # no completion record
    (lambda src, nonce: f"[zc-completed {'0' * 24}]\n✅ right\n", False),  # another cell's nonce
    (lambda src, nonce: f"[zc-completed {nonce}]\n", False),           # its passed() printed nothing
], ids=["completed", "silent", "no-record", "wrong-nonce", "no-tick"])
def test_silence_is_not_a_pass(prints, scores):
    """A graded cell scores only when its source ran to its end in the verdict kernel (the
    cell's own nonce) and, when it calls passed() at top level, with the ✅ it prints."""
    ep = split_execute.SplitExecute()
    ep._verdict, ep._verdict_ready, ep._course, ep._defined = _FakeVerdict(prints), True, [], 0
    cell = nbformat.v4.new_code_cell("check_true(True, 'x')\npassed('right')", metadata={
        "nbgrader": {"grade": True, "solution": False, "grade_id": "t", "points": 2}})
    ep._run_test(cell)
    assert (_determine_grade(cell.outputs) == 3) == scores, cell.outputs
    assert not any("zc-completed" in o.get("text", "") for o in cell.outputs)


def test_a_cell_without_passed_needs_only_its_completion():
    ep = split_execute.SplitExecute()
    ep._verdict = _FakeVerdict(lambda src, nonce: f"[zc-completed {nonce}]\n")
    ep._verdict_ready, ep._course, ep._defined = True, [], 0
    cell = nbformat.v4.new_code_cell("if True:\n    passed('only sometimes')", metadata={
        "nbgrader": {"grade": True, "solution": False, "grade_id": "t", "points": 1}})
    ep._run_test(cell)
    assert _determine_grade(cell.outputs) == 3
