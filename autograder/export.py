"""Grades for a learning-management system: one row per learner, one column per assignment.

    python autograder/export.py OUT          (what `make export OUT=...` runs)

Reads OUT/grades.csv (written by `make grade`, refreshed by `make feedback`) and writes
    OUT/export/grades_by_learner.csv   student_id, one score column per assignment, total, max_total
    OUT/export/feedback/<student>.zip   that learner's feedback pages, <assignment>.html each
A learner with no row for an assignment gets an empty cell there (not a zero: nothing was
submitted, which an LMS may treat differently); max_total adds the maximum of every
assignment graded in OUT (an assignment nobody submitted has no known maximum there).
"""
from __future__ import annotations

import csv
import os
import sys
import zipfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from autograder.nbgrader_run import assignments  # noqa: E402


def read_grades(out: str) -> list[dict]:
    path = os.path.join(out, "grades.csv")
    if not os.path.exists(path):
        raise SystemExit(f"{out} has no grades.csv: run `make grade SUBMISSIONS=... OUT={out}` first")
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def export(out: str, course: list[str] | None = None) -> tuple[str, list[str]]:
    """Write the LMS table and the feedback zips; return (table path, zip paths).

    Args:
        out: the folder `make grade` wrote.
        course: assignment ids that make the columns (default: the course's, plus any other
            in grades.csv).
    """
    out = os.path.abspath(out)
    rows = read_grades(out)
    if course is None:
        course = sorted({r["assignment_id"] for r in rows if r["assignment_id"]} | set(assignments()))
    max_by_aid = {r["assignment_id"]: float(r["max_score"]) for r in rows if r["max_score"]}
    learners = sorted({r["student_id"] for r in rows})
    score = {(r["student_id"], r["assignment_id"]): float(r["score"] or 0) for r in rows}
    dest = os.path.join(out, "export")
    os.makedirs(os.path.join(dest, "feedback"), exist_ok=True)
    table = os.path.join(dest, "grades_by_learner.csv")
    max_total = sum(max_by_aid.get(a, 0.0) for a in course)
    with open(table, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student_id", *course, "total", "max_total"])
        for sid in learners:
            cells = [score.get((sid, a), "") for a in course]
            total = sum(c for c in cells if c != "")
            w.writerow([sid, *[f"{c:g}" if c != "" else "" for c in cells], f"{total:g}", f"{max_total:g}"])
    zips = []
    for sid in learners:
        pages = [(a, os.path.join(out, "feedback", sid, a, f"{a}.html")) for a in course]
        pages = [(a, p) for a, p in pages if os.path.isfile(p)]
        if not pages:
            continue
        path = os.path.join(dest, "feedback", f"{sid}.zip")
        with zipfile.ZipFile(path + ".tmp", "w", zipfile.ZIP_DEFLATED) as z:
            for aid, page in pages:
                z.write(page, f"{aid}.html")
        os.replace(path + ".tmp", path)
        zips.append(path)
    return table, zips


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: python autograder/export.py OUT   (the folder make grade wrote)")
        return 2
    table, zips = export(sys.argv[1])
    print(f"wrote {table}\nwrote {len(zips)} feedback zip(s) under {os.path.dirname(table)}/feedback/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
