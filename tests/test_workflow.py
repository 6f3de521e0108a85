"""The instructor's cycle of autograder/README.md, end to end, on two fixture students:
hand out -> learners self-check (make check) -> collect -> make grade -> manual review in
the gradebook (as formgrader does) -> make feedback -> grades.csv. (`make release` is
covered by test_notebooks.py::test_release_is_fresh.)"""
import csv
import os
import shutil
import subprocess

from tests.fixtures.make_submission import ROOT, replace_in, solution_as_submission, write

AID = "00_setup"
FAST = {"ZEROCOURSE_COLLECTIVE_TIMEOUT": "3", "ZEROCOURSE_TIMEOUT": "10"}


def _make(*args, timeout=900):
    return subprocess.run(["make", "-s", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, **FAST))


def test_instructor_cycle(tmp_path):
    # Hand out: each learner gets a copy of the release notebook (a plain zip would do the same).
    handout = tmp_path / "handout"
    shutil.copytree(os.path.join(ROOT, "notebooks", AID), handout / AID)
    # Learners work: ada solves it, bo forgets to divide by the world size.
    subs = tmp_path / "submissions"
    ada = write(solution_as_submission(AID), subs, "ada", AID)
    nb = solution_as_submission(AID)
    replace_in(nb, "setup-global-mean", "return out / dist.get_world_size()", "return out")
    bo = write(nb, subs, "bo", AID)

    # Learners self-check before submitting (the grader's own execution, visible tests); ada
    # checks a second attempt saved under another name (the cells say which assignment it is).
    alt = os.path.join(os.path.dirname(ada), f"{AID}_alt.ipynb")
    shutil.copy(ada, alt)
    ok = _make("check", f"NOTEBOOK={alt}")
    os.unlink(alt)                             # the grader collects <assignment>.ipynb only
    assert ok.returncode == 0 and "✅ every autograded point" in ok.stdout, ok.stdout + ok.stderr
    assert f"(assignment {AID}, from its graded cells" in ok.stdout, ok.stdout
    bad = _make("check", f"NOTEBOOK={bo}")
    assert bad.returncode != 0 and "point(s) lost" in bad.stdout, bad.stdout
    assert "❌ global_mean on 2 ranks" in bad.stdout and "Hint:" in bad.stdout, bad.stdout

    # Collect and grade.
    out = tmp_path / "graded"
    proc = _make("grade", f"SUBMISSIONS={subs}", f"OUT={out}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(out / "grades.csv") as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    assert (float(rows["ada"]["score"]), float(rows["bo"]["score"])) == (7, 3)
    assert (out / "feedback" / "bo" / AID / f"{AID}.html").exists()

    # Manual review (what formgrader writes): one point of extra credit for bo's effort.
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{out / 'gradebook.db'}") as gb:
        grade = gb.find_grade("setup-global-mean-check", AID, AID, "bo")
        grade.extra_credit = 1
        gb.db.commit()
    feedback = out / "feedback" / "bo" / AID / f"{AID}.html"
    feedback.unlink()

    # Feedback and grades reflect the review.
    proc = _make("feedback", f"OUT={out}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(out / "grades.csv") as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    assert float(rows["bo"]["score"]) == 4 and float(rows["ada"]["score"]) == 7
    assert feedback.exists()
