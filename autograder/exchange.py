"""The exchange's inbound entries are taken only from the learner they name.

On a shared machine (deploy/hub/) every learner can write into nbgrader's inbound/ folder, and
an entry's name says whose it is: `<student>+<assignment>+<timestamp>+<random>`. bob can
create `alice+00_setup+<later>` holding a blank notebook; nbgrader's collect only logs a
warning (`check_owner`) and takes the newest entry, so bob would replace alice's submission.
The file system knows better: the entry and its notebook are owned by bob's uid.

An entry is accepted when its folder and its notebook (not followed if links) are owned by the
account of the learner it names, or by the user grading (root or the instructor: a folder
they copied in themselves). Anything else is refused, with a status row that says who owns
it, in both places that read inbound/:

- `OwnerCheckedCollect`, nbgrader's collect for the course (c.ExchangeFactory.collect in
  autograder/nbgrader_config.py): forged entries are never copied to submitted/ (the
  learner's own newest entry is), and each is recorded in submitted/.zerocourse-refused.json;
- `autograder/grade.py` on an inbound/ folder (`refused_entries` before it picks the newest
  entry per learner) or on the submitted/ folder collect filled (the refusals it recorded).

The row of a refused entry is the owner's (the account that made it), for its assignment: a
new row with score 0, or a note on the status of the owner's own graded row.
"""
from __future__ import annotations

import json
import os
import pwd
import stat

from nbgrader.exchange.default.collect import ExchangeCollect, groupby

RECORD = ".zerocourse-refused.json"      # in the submitted/ folder collect fills


def account(uid: int) -> str:
    """The account name of `uid` (a plain id for grades.csv), or uid-N when it has none."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid-{uid}"


def owner_problem(entry: str, student: str, notebook: str) -> tuple[str, str] | None:
    """(the entry's maker, why) when the inbound folder `entry` or its `notebook` is not the named
    `student`'s (nor the grading user's own), else None."""
    try:
        allowed = {pwd.getpwnam(student).pw_uid}
    except KeyError:
        allowed = set()
    allowed.add(os.geteuid())
    maker = None                        # the entry folder's owner: who made the entry
    for path in (entry, os.path.join(entry, notebook)):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue                    # a missing notebook gets its own row from grade.py
        maker = maker or account(st.st_uid)
        if st.st_uid not in allowed or (path == entry and not stat.S_ISDIR(st.st_mode)):
            named = student if allowed - {os.geteuid()} else f"{student} (no such account)"
            what = "the entry" if path == entry else f"its {notebook}"
            return maker, (f"refused: inbound entry {os.path.basename(entry)!r} names {named} "
                           f"but {what} is owned by {account(st.st_uid)}; only a learner's own "
                           f"account can submit as that learner")
    return None


def refused_entries(submissions: str, parse) -> dict[str, dict]:
    """Inbound entries of `submissions` that are refused: entry name -> {student, assignment,
    owner, why}; plus those collect recorded, when `submissions` is its submitted/ folder.

    Args:
        submissions: an exchange inbound/ folder, or a submitted/ folder collect filled.
        parse: entry name -> (student, assignment, timestamp) or None (grade.parse_inbound).
    """
    refused = load_record(submissions)
    for name in sorted(os.listdir(submissions)):
        m = None if name.startswith(".") else parse(name)
        if m is None:
            continue
        sid, aid, _ = m
        problem = owner_problem(os.path.join(submissions, name), sid, f"{aid}.ipynb")
        if problem:
            refused[name] = {"student": sid, "assignment": aid, "owner": problem[0],
                             "why": problem[1]}
    return refused


def load_record(folder: str) -> dict[str, dict]:
    """The refusals collect recorded in `folder` (a submitted/ folder), or {}."""
    path = os.path.join(folder, RECORD)
    if not os.path.isfile(path) or os.path.islink(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except ValueError:
        return {}
    return {k: v for k, v in data.items() if isinstance(v, dict) and
            {"student", "assignment", "owner", "why"} <= set(v)} if isinstance(data, dict) else {}


def add_refusals(rows: list[dict], refused: dict[str, dict], known: set) -> list[dict]:
    """grades.csv rows with each refused entry on its owner's row for that assignment (a new
    row, score 0, or a note on the owner's own graded row)."""
    by_key = {(r["student_id"], r["assignment_id"]): r for r in rows}
    for name in sorted(refused):
        r = refused[name]
        if r["assignment"] not in known:
            continue
        key = (r["owner"], r["assignment"])
        if key in by_key:
            by_key[key]["status"] += "; " + r["why"]
        else:
            by_key[key] = {"student_id": r["owner"], "assignment_id": r["assignment"],
                           "score": 0.0, "max_score": "", "pending_manual": 0.0,
                           "status": r["why"], "seconds": 0.0}
    return sorted(by_key.values(), key=lambda r: (r["student_id"], r["assignment_id"]))


class OwnerCheckedCollect(ExchangeCollect):
    """nbgrader's collect, minus the entries not owned by the learner they name.

    nbgrader picks each learner's newest entry; here the refused ones are taken out first, so
    a forgery newer than the learner's own submission never replaces it. Each refusal is
    logged as an error and recorded for grade.py (RECORD in the submitted/ folder).
    """

    def init_src(self):
        super().init_src()
        student = self.coursedir.student_id or "*"
        records = [self._path_to_record(os.path.join(self.inbound_path, r["filename"]))
                   for r in self._all_records(student)]
        refused = {}
        for rec in records:
            problem = owner_problem(os.path.join(self.inbound_path, rec["filename"]),
                                    rec["username"], f"{self.coursedir.assignment_id}.ipynb")
            if problem:
                refused[rec["filename"]] = {"student": rec["username"], "owner": problem[0],
                                            "assignment": self.coursedir.assignment_id,
                                            "why": problem[1]}
                self.log.error(problem[1])
        kept = [r for r in records if r["filename"] not in refused]
        self.src_records = []
        for group in groupby(kept, lambda item: item["username"]).values():
            ordered = self._sort_by_timestamp(group)
            early = [r for r in ordered if self.duedate is not None and self.before_duedate
                     and r["timestamp"] <= self.duedate]
            self.src_records.append((early or ordered)[0])
        if refused:
            self._record(refused)

    def _all_records(self, student):
        import glob
        pattern = os.path.join(self.inbound_path, f"{student}+{self.coursedir.assignment_id}+*")
        return [{"filename": os.path.basename(p)} for p in glob.glob(pattern)]

    def _record(self, refused: dict) -> None:
        folder = os.path.dirname(os.path.dirname(self.coursedir.format_path(
            self.coursedir.submitted_directory, "x", self.coursedir.assignment_id)))
        os.makedirs(folder, exist_ok=True)
        record = dict(load_record(folder), **refused)
        tmp = os.path.join(folder, RECORD + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1, sort_keys=True)
        os.replace(tmp, os.path.join(folder, RECORD))
