"""`make check` (autograder/check.py): a ✅ predicts the grade, and any file name works.

The assignment is found from the notebook's graded cells (a second attempt such as
07_overlap_alt.ipynb), or named with --assignment. A cell whose visible check can only see the
format (zerocourse.checks.format_only: "☑ ...") is "not checked here": its points are shown
apart, never under "✅ every autograded point". One end-to-end run on a two-cell assignment
(split grading's kernels, ~15 s) shows the ☑ line surviving split grading's output filter;
the rest is static.
"""
import json
import os
import subprocess
import sys

import nbformat
import pytest

from autograder import check
from autograder.split_execute import clean_test_outputs
from tests.fixtures.make_submission import ROOT, load, solution_as_submission


def test_a_second_attempt_under_another_name_is_its_assignment():
    nb = load("notebooks", "07_overlap")
    aid, how = check.find_assignment(nb, "my-notebooks/07_overlap/07_overlap_alt.ipynb")
    assert aid == "07_overlap" and "graded cells" in how and "07_overlap_alt" in how
    aid, _ = check.find_assignment(solution_as_submission("00_setup"), "/tmp/attempt 2.ipynb")
    assert aid == "00_setup"


def test_the_cells_decide_over_the_name_and_assignment_over_both():
    nb = load("notebooks", "03_zero1")
    assert check.find_assignment(nb, "x/04_zero2.ipynb")[0] == "03_zero1"
    assert check.find_assignment(nb, "x/anything.ipynb", "04_zero2") == ("04_zero2", "--assignment")
    aid, why = check.find_assignment(nb, "x/a.ipynb", "09_nope")
    assert aid is None and "09_nope" in why and "03_zero1" in why


def test_without_graded_cells_the_name_decides_or_the_message_says_what_to_do():
    empty = {"cells": [{"cell_type": "code", "source": "x = 1", "metadata": {}}]}
    assert check.find_assignment(empty, "d/01_bytes_per_parameter.ipynb") == (
        "01_bytes_per_parameter", "its file name")
    aid, why = check.find_assignment(empty, "d/mine.ipynb")
    assert aid is None and "--assignment" in why and "00_setup" in why


def test_the_format_only_line_survives_the_output_filter():
    text = "noise\n☑ q2 is a number: format only: correctness is in the hidden tests\n✅ done\n"
    kept, log = clean_test_outputs([nbformat.v4.new_output("stream", name="stdout", text=text)])
    assert kept[0]["text"] == text.split("\n", 1)[1] and "noise" in log


def _cell(kind, source, **meta):
    cell = nbformat.v4.new_code_cell(source) if kind == "code" else nbformat.v4.new_markdown_cell(source)
    if meta:
        cell["metadata"]["nbgrader"] = dict(schema_version=3, locked=False, task=False, **meta)
    return cell


def _assignment():
    """A release copy with one answer cell, a checked test (2 points) and a format-only one (3)."""
    return nbformat.v4.new_notebook(cells=[
        _cell("code", "from zerocourse.checks import check_equal, check_true, passed, format_only"),
        _cell("code", "raise NotImplementedError()", grade=False, grade_id="demo-answer", solution=True),
        _cell("code", 'check_equal("answer", answer, 42)\npassed("answer is 42")',
              grade=True, grade_id="demo-answer-check", points=2, solution=False),
        _cell("code", 'check_true(isinstance(guess, int), "guess is an int")\n'
                      'format_only("guess is an int")',
              grade=True, grade_id="demo-guess-check", points=3, solution=False),
    ])


@pytest.mark.timeout(600)
def test_format_only_points_are_not_checked_here(tmp_path):
    release = tmp_path / "release"
    (release / "99_demo").mkdir(parents=True)
    (release / "99_demo" / "99_demo.ipynb").write_text(json.dumps(_assignment()))
    mine = _assignment()
    mine["cells"][1]["source"] = "answer = 42\nguess = 7          # a wrong guess: only the hidden tests know"
    path = tmp_path / "work" / "99_demo_second_try.ipynb"
    path.parent.mkdir()
    path.write_text(json.dumps(mine))
    env = dict(os.environ, ZEROCOURSE_RELEASE_DIR=str(release), ZEROCOURSE_SANDBOX="0")
    proc = subprocess.run([sys.executable, "autograder/check.py", str(path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=540)
    out = proc.stdout
    print(out[-3000:], proc.stderr[-2000:])
    assert proc.returncode == 0, out
    assert "(assignment 99_demo, from its graded cells" in out
    assert "☑ guess is an int: format only: correctness is in the hidden tests" in out   # kept
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("demo-")}
    assert rows["demo-answer-check"].split()[1] == "2/2"
    assert "not checked here: 3 point(s), format only" in rows["demo-guess-check"]
    assert "every autograded point" not in out
    assert "✅ 2 autograded point(s) checked here, none lost" in out
    assert "☑ 3 more point(s) not checked here" in out
