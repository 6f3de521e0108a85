"""What an instructor runs a workshop with: parallel grading, re-grading into the same folder,
the exchange's folders, the LMS export, and the learner handout.

One grading of three 00_setup submissions covers `make grade` end to end (JOBS=2, a progress
line per submission, the collected layout with timestamp.txt, then a re-grade of one learner
from an exchange inbound/ folder merged into the same OUT), then `make export` on that OUT.
The handout is checked for what it must not contain (solutions/, tests/, nbgrader markers,
any solution or hidden test, paraphrased or not: tests/leak.py) and for what it must do
(`make check` from it).
"""
import csv
import json
import os
import subprocess
import sys
import zipfile

import pytest

from tests.fixtures.make_submission import ROOT, load, solution_as_submission, write

pytestmark = pytest.mark.timeout(1500)
AID = "00_setup"
MANUAL = "06_communication_bill"          # has a manually graded written answer


def _make(*args, env=None, timeout=900):
    proc = subprocess.run(["make", "-s", *args], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, **(env or {})), timeout=timeout)
    print(proc.stdout[-4000:], proc.stderr[-3000:], sep="\n")
    return proc


def _rows(out):
    with open(os.path.join(out, "grades.csv")) as f:
        return {r["student_id"]: r for r in csv.DictReader(f) if r["assignment_id"] == AID}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """alice (solution) and bob (blank) graded with JOBS=2, then carol from an inbound folder."""
    subs = tmp_path_factory.mktemp("collected")
    out = str(tmp_path_factory.mktemp("graded"))
    write(solution_as_submission(AID), subs, "alice", AID)
    write(load("notebooks", AID), subs, "bob", AID)
    write(solution_as_submission(MANUAL), subs, "alice", MANUAL)   # a written answer to grade
    for sid in ("alice", "bob"):             # what `nbgrader collect` leaves beside the notebook
        (subs / sid / AID / "timestamp.txt").write_text("2026-11-30 09:00:00.000000 UTC")
    first = _make("grade", f"SUBMISSIONS={subs}", f"OUT={out}", "JOBS=2")
    assert first.returncode == 0, first.stderr[-3000:]
    after_first = _rows(out)

    inbound = tmp_path_factory.mktemp("inbound")
    for stamp, nb in (("2026-11-30 09:00:00.000000 UTC", load("notebooks", AID)),
                      ("2026-11-30 10:30:00.000000 UTC", solution_as_submission(AID))):
        folder = inbound / f"carol+{AID}+{stamp}+k3x9"
        folder.mkdir()
        (folder / f"{AID}.ipynb").write_text(json.dumps(nb))
    second = _make("grade", f"SUBMISSIONS={inbound}", f"OUT={out}")
    assert second.returncode == 0, second.stderr[-3000:]
    return dict(out=out, first=first.stdout, after_first=after_first, rows=_rows(out))


def test_jobs_grade_each_submission_with_a_progress_line(graded):
    rows = graded["after_first"]
    assert set(rows) == {"alice", "bob"}
    assert float(rows["alice"]["score"]) == float(rows["alice"]["max_score"]) > 0, rows["alice"]
    assert float(rows["bob"]["score"]) == 0, rows["bob"]
    progress = [l for l in graded["first"].splitlines() if l.startswith(("[1/3]", "[2/3]", "[3/3]"))]
    assert len(progress) == 3 and all("left" in l for l in progress), graded["first"]


def test_rubric_for_formgrader_never_in_feedback(graded):
    import nbformat
    out = graded["out"]
    nb = nbformat.read(os.path.join(out, "autograded", "alice", MANUAL, f"{MANUAL}.ipynb"), as_version=4)
    ids = [c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells]
    answer = ids.index("three-x-explanation")
    assert "Rubric for `three-x-explanation`" in nb.cells[answer + 1].source
    assert "Instructor only" in nb.cells[answer + 1].source
    page = open(os.path.join(out, "feedback", "alice", MANUAL, f"{MANUAL}.html"), encoding="utf-8").read()
    assert "Rubric for" not in page and "Instructor only" not in page


def test_regrade_merges_and_inbound_takes_the_newest(graded):
    rows = graded["rows"]
    assert set(rows) == {"alice", "bob", "carol"}, rows        # alice and bob kept, not rewritten
    assert rows["alice"] == graded["after_first"]["alice"]
    assert float(rows["carol"]["score"]) == float(rows["carol"]["max_score"]) > 0, rows["carol"]


def test_export_one_row_per_learner_and_feedback_zips(graded):
    out = graded["out"]
    proc = _make("export", f"OUT={out}")
    assert proc.returncode == 0, proc.stderr
    with open(os.path.join(out, "export", "grades_by_learner.csv")) as f:
        table = list(csv.reader(f))
    header = table[0]
    body = {r[0]: dict(zip(header, r)) for r in table[1:]}
    assert header[0] == "student_id" and header[-2:] == ["total", "max_total"] and AID in header
    assert set(body) == {"alice", "bob", "carol"}
    assert body["alice"][AID] == f"{float(graded['rows']['alice']['score']):g}"
    assert float(body["alice"]["total"]) == float(body["alice"][AID]) + float(body["alice"][MANUAL])
    assert body["bob"][AID] == "0"
    missing = [a for a in header[1:-2] if a not in (AID, MANUAL)]
    assert missing and all(body["alice"][a] == "" for a in missing)    # not submitted: empty, not 0
    with zipfile.ZipFile(os.path.join(out, "export", "feedback", "alice.zip")) as z:
        assert sorted(z.namelist()) == [f"{AID}.html", f"{MANUAL}.html"]
        page = z.read(f"{AID}.html").decode()
    assert "BEGIN HIDDEN TESTS" not in page and "✅" in page


def test_make_usage_errors_are_clear(tmp_path):
    for target, words in (("export", "usage: make export OUT="), ("handout", "usage: make handout OUT="),
                          ("formgrader", "usage: make formgrader OUT=")):
        proc = _make(target)
        assert proc.returncode != 0 and words in proc.stdout + proc.stderr
    (tmp_path / "subs").mkdir()
    proc = _make("grade", f"SUBMISSIONS={tmp_path}/subs", f"OUT={tmp_path}/o", "JOBS=0")
    assert proc.returncode != 0 and "JOBS=0" in proc.stdout + proc.stderr


# --- the handout -------------------------------------------------------------------------------
# What it must not contain is decided by tests/leak.py (normalised token n-grams, paraphrases
# included) on the handout's own files: the same allowlist as tests/test_leak.py, whose scan of
# the repository covers every file the handout ships (checked here too).

@pytest.fixture(scope="module")
def handout(tmp_path_factory):
    out = tmp_path_factory.mktemp("handout") / "zero-by-hand"
    proc = _make("handout", f"OUT={out}")
    assert proc.returncode == 0, proc.stderr
    return out


def test_handout_has_no_solutions_or_hidden_tests(handout):
    from tests import leak
    top = sorted(os.listdir(handout))
    assert "solutions" not in top and "tests" not in top and "bench" not in top, top
    assert not os.path.exists(handout / "autograder" / "notes"), "instructor notes in the handout"
    files = []
    for dirpath, dirnames, filenames in os.walk(handout):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        files += [os.path.relpath(os.path.join(dirpath, n), handout) for n in filenames]
    markers = [(f, m) for f, text in leak.read_texts(files, str(handout)).items()
               for m in ("BEGIN SOLUTION", "BEGIN HIDDEN TESTS") if m in text]
    assert not markers, markers
    # every shipped file is one the repository's leak scan reads (the handout's README and
    # Makefile are autograder/handout/'s)
    scanned = set(leak.visible_files())
    unscanned = [f for f in files if f != ".gitignore" and f not in scanned
                 and os.path.join("autograder", "handout", f) not in scanned]
    assert not unscanned, unscanned
    allowed = leak.read_allowlist()
    regions, matches = leak.scan_texts(leak.notebooks("solutions"),
                                       leak.read_texts(files, str(handout)), allowed)
    assert len(regions) > 60                  # the check reads the real solutions
    bad = leak.unexplained(matches, allowed)
    assert not bad, "\n".join(leak.describe(m) for m in bad[:10])
    assert sorted(os.listdir(handout / "notebooks")) == sorted(os.listdir(os.path.join(ROOT, "notebooks")))


def test_handout_refuses_to_overwrite(handout):
    proc = _make("handout", f"OUT={handout}")
    assert proc.returncode != 0 and "not empty" in proc.stdout + proc.stderr
    assert (handout / "README.md").exists()


def test_make_check_works_from_the_handout(handout, tmp_path):
    # A learner's handout has its own .venv, where zerocourse is the handout's: here the
    # course's .venv runs it, so PYTHONPATH points both kernels at the handout's zerocourse
    # (the sandbox would hand the learner kernel the course checkout's copy instead).
    nb = tmp_path / AID / f"{AID}.ipynb"
    nb.parent.mkdir()
    nb.write_text(json.dumps(solution_as_submission(AID)))
    proc = subprocess.run([sys.executable, "autograder/check.py", str(nb)], cwd=handout,
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=str(handout), ZEROCOURSE_SANDBOX="0"))
    print(proc.stdout[-3000:], proc.stderr[-2000:])
    assert proc.returncode == 0 and "✅ every autograded point" in proc.stdout
