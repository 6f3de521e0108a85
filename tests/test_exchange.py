"""The exchange's inbound entries are taken only from the learner they name (autograder/exchange.py).

Real ownership, real accounts: as root, entries are chowned to the system accounts `nobody`
and `daemon`, playing two learners. nobody submits; daemon then writes a newer entry named
nobody (the forgery that would replace nobody's work), one named daemon whose notebook is
nobody's file, and an entry copied in by the grader itself (root) for a learner with no
account is kept. Checked in grade.py's inbound mode and in the course's `nbgrader collect`.
The hub test (tests/test_hub.py) does the same with the hub's own learner accounts.
"""
import csv
import json
import os
import pwd
import subprocess
import sys

import pytest

from autograder import exchange, grade

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AID = "00_setup"
TS = "2026-01-0{} 10:00:00.000000 UTC"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chowns files to other accounts: run as root")


def _entry(folder, name, owner, notebook_owner=None, text="{}"):
    d = os.path.join(folder, name)
    os.makedirs(d)
    nb = os.path.join(d, f"{AID}.ipynb")
    with open(nb, "w") as f:
        f.write(text)
    with open(os.path.join(d, "timestamp.txt"), "w") as f:
        f.write(name.split("+")[2])
    for path in (d, os.path.join(d, "timestamp.txt")):
        os.chown(path, pwd.getpwnam(owner).pw_uid, -1)
    os.chown(nb, pwd.getpwnam(notebook_owner or owner).pw_uid, -1)


@pytest.fixture
def inbound(tmp_path):
    folder = str(tmp_path / "inbound")
    os.makedirs(folder)
    _entry(folder, f"nobody+{AID}+{TS.format(1)}+a1", "nobody", text='{"genuine": 1}')
    _entry(folder, f"nobody+{AID}+{TS.format(2)}+b2", "daemon", text='{"forged": 1}')
    _entry(folder, f"daemon+{AID}+{TS.format(3)}+c3", "daemon", notebook_owner="nobody")
    _entry(folder, f"carol+{AID}+{TS.format(1)}+d4", "root")
    return folder


def test_grade_inbound_refuses_entries_not_owned_by_the_learner(inbound, tmp_path):
    known = set(grade.assignments())
    refused = exchange.refused_entries(inbound, lambda n: grade.parse_inbound(n, known))
    assert sorted(refused) == [f"daemon+{AID}+{TS.format(3)}+c3", f"nobody+{AID}+{TS.format(2)}+b2"]
    forged = refused[f"nobody+{AID}+{TS.format(2)}+b2"]
    assert forged["owner"] == "daemon" and "names nobody but the entry is owned by daemon" in \
        forged["why"], forged
    assert "its 00_setup.ipynb is owned by nobody" in refused[f"daemon+{AID}+{TS.format(3)}+c3"]["why"]
    # nobody's own (older) entry is the one graded, not the newer forgery; carol's copy stays.
    work, paths = grade.find_work(inbound, known, skip=set(refused))
    assert work == [("carol", AID), ("nobody", AID)]
    with open(paths[("nobody", AID)]) as f:
        assert json.load(f) == {"genuine": 1}
    # grade.py end to end on the refused entries alone (nothing to grade: no kernel starts):
    # one row per refusal, on the account that made it.
    only_forged = str(tmp_path / "only-forged")
    os.makedirs(only_forged)
    for name in refused:
        os.rename(os.path.join(inbound, name), os.path.join(only_forged, name))
    out = str(tmp_path / "out")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "autograder", "grade.py"),
                           only_forged, out, "--jobs", "1"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(os.path.join(out, "grades.csv")) as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"daemon"}, rows
    assert float(rows["daemon"]["score"]) == 0
    assert rows["daemon"]["status"].count("refused: inbound entry") == 2, rows["daemon"]["status"]


def test_refusal_joins_the_owners_own_row():
    rows = [{"student_id": "daemon", "assignment_id": AID, "score": 7.0, "max_score": 7.0,
             "pending_manual": 0.0, "status": "graded", "seconds": 1.0}]
    refused = {"x": {"student": "nobody", "assignment": AID, "owner": "daemon", "why": "refused: w"}}
    merged = exchange.add_refusals(rows, refused, {AID})
    assert len(merged) == 1 and merged[0]["status"] == "graded; refused: w" and merged[0]["score"] == 7.0


def test_collect_takes_only_entries_owned_by_the_learner(inbound, tmp_path):
    """`nbgrader collect` with the course's configuration (c.ExchangeFactory.collect)."""
    ex = tmp_path / "exchange"
    os.makedirs(ex / "zero-by-hand")
    os.rename(inbound, ex / "zero-by-hand" / "inbound")
    course = tmp_path / "course"
    os.makedirs(course)
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
               ZEROCOURSE_NBGRADER_ROOT=str(course),      # (PATH: nbgrader runs alembic)
               ZEROCOURSE_GRADEBOOK=f"sqlite:///{course}/gradebook.db")
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "nbgrader"), "collect",
                           AID, f"--Exchange.root={ex}"], cwd=os.path.join(ROOT, "autograder"),
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    submitted = course / "submitted"
    assert sorted(os.listdir(submitted)) == [".zerocourse-refused.json", "carol", "nobody"]
    with open(submitted / "nobody" / AID / f"{AID}.ipynb") as f:
        assert json.load(f) == {"genuine": 1}, "the forgery replaced nobody's submission"
    assert proc.stderr.count("refused: inbound entry") == 2, proc.stderr
    # grade.py on the collected folder reports what collect refused.
    refused = exchange.refused_entries(str(submitted), lambda n: None)
    assert {r["owner"] for r in refused.values()} == {"daemon"} and len(refused) == 2
