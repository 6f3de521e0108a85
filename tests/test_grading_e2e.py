"""Every notebook through `make grade` and `make check`, as a learner's submission would go.

The in-process harness (tests/harness.py) proves each notebook's tests on fixtures fast;
this proves the real path: split grading (tests in the verdict kernel, learner names as
stand-ins), the sandbox, nbgrader's gradebook and feedback. Each reference solution and a
valid alternative that writes to stderr from its ranks get every autograded point (manual
points pending), blank release copies get 0, and
`make check` predicts it: exit 0 and full marks on a solution, exit 1 on the stubs.
The submissions are graded in three parts (PARTS), which the two pytest workers grade at once.
"""
import json
import os
import re
import subprocess

import pytest

from autograder.nbgrader_run import assignments
from tests.fixtures.alternatives.build import answers_of, fixtures, submission
from tests.fixtures.make_submission import ROOT, load, make_grade, solution_as_submission, write
from tests.timeline import record_timing

pytestmark = pytest.mark.timeout(2400)
# 00_setup's reference goes through `make grade` in tests/test_grading.py's battery (student
# "correct", 7/7 of 7), beside the attacks on it: not graded a second time here.
GRADED_ELSEWHERE = {"00_setup": ("tests.test_grading", "correct")}
AIDS = [aid for aid in assignments() if aid not in GRADED_ELSEWHERE]
# Stubs fail every graded cell of every notebook in-process (tests/harness.assert_stubs_fail);
# end to end, the notebooks whose tests reach learner names in the most ways.
BLANK = ["01_bytes_per_parameter", "05_zero3", "10_capstone"]
# Valid alternatives that print to stderr, warn, or call deprecated collective names from their
# ranks (one per notebook that launches ranks): under nbgrader's own rule they lost most points.
# Graded here only (tests/test_alternatives.py leaves them to this file).
NOISY = ["02_data_parallelism/async_per_param_noisy", "03_zero1/per_param_shards_async_noisy",
         "04_zero2/fp32_comm_deprecated_names", "05_zero3/hooks_flat_resize_fp32_rs",
         "06_communication_bill/own_bounds_irecv_noisy", "07_overlap/noisy_predivide_autograd_function",
         "08_accumulation_and_activations/noisy_avg_torch_wrapper"]

# The submissions are graded in PARTS, one `make grade` each: each part is one xdist work unit
# (tests/conftest.py), so the two workers grade two parts at once instead of one worker grading
# all while the other runs out of work. A notebook's submissions stay in one part (nbgrader
# generates a notebook's release once per `make grade`), so a part costs only a grade.py start.
# Seconds of one reference submission per notebook, `make grade` in the suite beside the other
# worker (autograder/notes/WORKSHOP.md, 2026-11): the weights that balance the parts. A notebook
# not listed weighs as the mean.
GRADE_S = {"01_bytes_per_parameter": 26, "02_data_parallelism": 54, "03_zero1": 35,
           "04_zero2": 103, "05_zero3": 30, "06_communication_bill": 24, "07_overlap": 36,
           "08_accumulation_and_activations": 33, "10_capstone": 20}
N_PARTS = 3


def _partition(aids: list[str], n: int) -> dict[str, list[str]]:
    """Notebooks into n parts of about equal grading time (longest first onto the lightest)."""
    mean = sum(GRADE_S.values()) / len(GRADE_S)
    weight = {aid: GRADE_S.get(aid, mean) * (1 + sum(k.startswith(aid + "/") for k in NOISY)
                                             + 0.7 * (aid in BLANK)) for aid in aids}
    parts: dict[str, list[str]] = {f"e2e-{i + 1}": [] for i in range(n)}
    load_s = dict.fromkeys(parts, 0.0)
    for aid in sorted(aids, key=lambda a: (-weight[a], a)):
        part = min(parts, key=lambda p: (load_s[p], p))
        parts[part].append(aid)
        load_s[part] += weight[aid]
    return parts


PARTS = _partition(AIDS, N_PARTS)
PART_OF = {aid: part for part, aids in PARTS.items() for aid in aids}
_GRADED: dict[str, dict] = {}           # part -> grades.csv rows: one `make grade` per process


def _in_part(values, aid):
    return pytest.param(*values, marks=pytest.mark.xdist_group(PART_OF[aid]))


@pytest.fixture
def graded(tmp_path_factory):
    """rows(aid): the grades.csv rows of aid's part, graded on first use in this process."""
    def rows(aid: str) -> dict:
        part = PART_OF[aid]
        if part not in _GRADED:
            _GRADED[part] = _grade_part(part, tmp_path_factory)
        return _GRADED[part]
    return rows


def _grade_part(part: str, tmp_path_factory) -> dict:
    subs = tmp_path_factory.mktemp(f"{part}-submissions")
    out = tmp_path_factory.mktemp(f"{part}-graded")
    aids = PARTS[part]
    for aid in aids:
        write(solution_as_submission(aid), subs, "ref", aid)
    for aid in BLANK:
        if aid in aids:
            write(load("notebooks", aid), subs, "blank", aid)
    for key in NOISY:
        aid, style = key.split("/")
        if aid in aids:
            write(submission(aid, answers_of(fixtures()[key])), subs, "noisy", aid)
    rows, took = make_grade(subs, out, timeout=2400)
    rows = {k if isinstance(k, tuple) else (k, aids[0]): r for k, r in rows.items()}
    # Seconds per submission, for the workshop plan (artifacts/timings/grading_s.json).
    for (student, aid), r in rows.items():
        record_timing("grading_s", f"{student}/{aid}", float(r["seconds"]))
    record_timing("grading_s", f"{part} make grade ({len(rows)} submissions)", took)
    return rows


def _manual_points(aid) -> float:
    """Points a person grades: answer cells that are also graded (written answers)."""
    return sum(float(c["metadata"]["nbgrader"].get("points", 0)) for c in load("notebooks", aid)["cells"]
               if c["metadata"].get("nbgrader", {}).get("solution")
               and c["metadata"]["nbgrader"].get("grade"))


@pytest.mark.parametrize("aid", [_in_part([aid], aid) for aid in AIDS])
def test_reference_gets_every_autograded_point(graded, aid):
    row = graded(aid)[("ref", aid)]
    score, top, pending = float(row["score"]), float(row["max_score"]), float(row["pending_manual"])
    assert score == top - _manual_points(aid) and score > 0, row
    assert row["status"].startswith("graded"), row
    assert pending <= _manual_points(aid), row
    if pending:
        assert "await manual grading" in row["status"], row


def test_references_graded_elsewhere_still_are():
    """The reference of a notebook left out here is a full-marks student of another battery."""
    import importlib
    for aid, (module, student) in GRADED_ELSEWHERE.items():
        battery = importlib.import_module(module)
        assert battery.AID == aid and _manual_points(aid) == 0
        build, expected, status = battery.BATTERY[student]
        assert build("out", "subs") == solution_as_submission(aid)
        top = sum(float(c["metadata"]["nbgrader"].get("points", 0)) for c in load("solutions", aid)["cells"]
                  if c["metadata"].get("nbgrader", {}).get("grade"))
        assert (expected, status) == (top, "graded")


@pytest.mark.parametrize("key", [_in_part([key], key.split("/")[0]) for key in NOISY])
def test_noisy_valid_alternative_gets_every_autograded_point(graded, key):
    aid = key.split("/")[0]
    row = graded(aid)[("noisy", aid)]
    assert float(row["score"]) == float(row["max_score"]) - _manual_points(aid), row


@pytest.mark.parametrize("aid", [_in_part([aid], aid) for aid in BLANK])
def test_blank_copy_gets_nothing(graded, aid):
    row = graded(aid)[("blank", aid)]
    assert float(row["score"]) == 0, row


def test_parts_grade_every_notebook_once():
    assert sorted(a for aids in PARTS.values() for a in aids) == sorted(AIDS)
    assert all(PARTS.values()), PARTS
    assert set(BLANK) | {k.split("/")[0] for k in NOISY} <= set(AIDS)


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
