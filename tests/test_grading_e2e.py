"""Every notebook through `make grade` and `make check`, as a learner's submission would go.

The in-process harness (tests/harness.py) proves each notebook's tests on fixtures fast;
this proves the real path: split grading (tests in the verdict kernel, learner names as
stand-ins), the sandbox, nbgrader's gradebook and feedback. Each reference solution and a
valid alternative that writes to stderr from its ranks get every autograded point (manual
points pending), blank release copies get 0, and
`make check` predicts it: exit 0 and full marks on a solution, exit 1 on the stubs.
"""
import json
import os
import re
import subprocess

import pytest

from autograder.nbgrader_run import assignments
from tests.fixtures.alternatives.build import answers_of, fixtures, submission
from tests.fixtures.make_submission import ROOT, load, make_grade, solution_as_submission, write

pytestmark = pytest.mark.timeout(2400)
AIDS = assignments()
# Stubs fail every graded cell of every notebook in-process (tests/harness.assert_stubs_fail);
# end to end, the notebooks whose tests reach learner names in the most ways.
BLANK = ["01_bytes_per_parameter", "05_zero3", "10_capstone"]
# Valid alternatives that print to stderr, warn, or call deprecated collective names from their
# ranks (one per notebook that launches ranks): under nbgrader's own rule they lost most points.
NOISY = ["02_data_parallelism/async_per_param_noisy", "03_zero1/per_param_shards_async_noisy",
         "04_zero2/fp32_comm_deprecated_names", "05_zero3/hooks_flat_resize_fp32_rs",
         "06_communication_bill/own_bounds_irecv_noisy", "07_overlap/noisy_predivide_autograd_function",
         "08_accumulation_and_activations/noisy_avg_torch_wrapper"]


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    subs = tmp_path_factory.mktemp("e2e-submissions")
    out = tmp_path_factory.mktemp("e2e-graded")
    for aid in AIDS:
        write(solution_as_submission(aid), subs, "ref", aid)
    for aid in BLANK:
        write(load("notebooks", aid), subs, "blank", aid)
    for key in NOISY:
        aid, style = key.split("/")
        write(submission(aid, answers_of(fixtures()[key])), subs, "noisy", aid)
    rows, took = make_grade(subs, out, timeout=2400)
    # Seconds per submission, for the workshop plan (artifacts/timings/grading_s.json).
    folder = os.path.join(ROOT, "artifacts", "timings")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "grading_s.json"), "w") as f:
        json.dump({"total_s": round(took, 1), "load": round(os.getloadavg()[0], 1),
                   "rows": {"/".join(k): float(r["seconds"]) for k, r in rows.items()}}, f, indent=1)
    return rows


def _manual_points(aid) -> float:
    """Points a person grades: answer cells that are also graded (written answers)."""
    return sum(float(c["metadata"]["nbgrader"].get("points", 0)) for c in load("notebooks", aid)["cells"]
               if c["metadata"].get("nbgrader", {}).get("solution")
               and c["metadata"]["nbgrader"].get("grade"))


@pytest.mark.parametrize("aid", AIDS)
def test_reference_gets_every_autograded_point(graded, aid):
    row = graded[("ref", aid)]
    score, top, pending = float(row["score"]), float(row["max_score"]), float(row["pending_manual"])
    assert score == top - _manual_points(aid) and score > 0, row
    assert row["status"].startswith("graded"), row
    assert pending <= _manual_points(aid), row
    if pending:
        assert "await manual grading" in row["status"], row


@pytest.mark.parametrize("key", NOISY)
def test_noisy_valid_alternative_gets_every_autograded_point(graded, key):
    aid = key.split("/")[0]
    row = graded[("noisy", aid)]
    assert float(row["score"]) == float(row["max_score"]) - _manual_points(aid), row


@pytest.mark.parametrize("aid", BLANK)
def test_blank_copy_gets_nothing(graded, aid):
    row = graded[("blank", aid)]
    assert float(row["score"]) == 0, row


def _check(path):
    return subprocess.run(["make", "-s", "check", f"NOTEBOOK={path}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)


def test_check_predicts_full_marks(tmp_path):
    nb = solution_as_submission("03_zero1")
    path = tmp_path / "03_zero1" / "03_zero1.ipynb"
    os.makedirs(path.parent)
    path.write_text(json.dumps(nb))
    proc = _check(path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "would score" in proc.stdout and re.search(r"zero1-adam-check\s+2/2", proc.stdout)
    assert "✅ every autograded point" in proc.stdout


def test_check_fails_on_stubs_with_messages(tmp_path):
    path = tmp_path / "00_setup" / "00_setup.ipynb"
    os.makedirs(path.parent)
    path.write_text(json.dumps(load("notebooks", "00_setup")))
    proc = _check(path)
    assert proc.returncode != 0
    assert "setup-sum-of-ranks-check" in proc.stdout and "0/1" in proc.stdout
    assert "NotImplementedError" in proc.stdout
    assert "autograded point(s) lost" in proc.stdout
