"""Autograde a folder of submissions and write grades.csv and feedback.

    python autograder/grade.py SUBMISSIONS OUT        (what `make grade` runs)

SUBMISSIONS is laid out <student_id>/<assignment_id>/<assignment_id>.ipynb.
OUT becomes an nbgrader course folder for this grading run:

    OUT/grades.csv                 student_id, assignment_id, score, max_score, status, seconds
    OUT/feedback/<student>/<assignment>/<assignment>.html   (hidden tests' source removed)
    OUT/submitted, OUT/autograded  nbgrader's copies (SUBMISSIONS itself is never modified)
    OUT/gradebook.db               the gradebook (open it with formgrader for manual grading)
    OUT/logs/<student>-<assignment>.log   nbgrader's output for each submission

A submission that cannot be graded (not a notebook, wrong assignment id, ...) gets a
row with score 0 and a status that says why; the others are graded regardless.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from autograder.nbgrader_run import ROOT, assignments, nbgrader  # noqa: E402

FIELDS = ["student_id", "assignment_id", "score", "max_score", "status", "seconds"]


def _preflight(path: str) -> str | None:
    """Why this file cannot be autograded, or None when it looks like a notebook."""
    if not os.path.isfile(path):
        return "missing notebook"
    if os.path.getsize(path) == 0:
        return "empty file"
    try:
        with open(path, encoding="utf-8") as f:
            nb = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        return f"not valid JSON ({e.__class__.__name__}: {str(e)[:80]})"
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        return "not a Jupyter notebook (no cells)"
    return None


def _max_score(db_path: str, aid: str) -> float:
    from nbgrader.api import Gradebook
    with Gradebook("sqlite:///" + db_path) as gb:
        return float(gb.find_assignment(aid).max_score)


def _score(db_path: str, aid: str, sid: str) -> float | None:
    from nbgrader.api import Gradebook, MissingEntry
    with Gradebook("sqlite:///" + db_path) as gb:
        try:
            return float(gb.find_submission(aid, sid).score)
        except MissingEntry:
            return None


def _user_tasks() -> int:
    """Processes and threads of this user now: RLIMIT_NPROC counts both, machine-wide."""
    n = 0
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and os.stat(f"/proc/{entry}").st_uid == os.getuid():
                n += len(os.listdir(f"/proc/{entry}/task"))
        except OSError:
            pass
    return n


PIDS_CGROUP_ROOT = "/sys/fs/cgroup/pids"
PIDS_MAX = 256          # processes + threads of one submission (a 4-rank launch needs ~60)


def make_pids_cgroup() -> str | None:
    """A fresh cgroup capping one submission's tasks, or None where cgroups are not writable."""
    if not os.access(PIDS_CGROUP_ROOT, os.W_OK):
        return None
    path = os.path.join(PIDS_CGROUP_ROOT, f"zerocourse-{os.getpid()}-{time.monotonic_ns()}")
    try:
        os.mkdir(path)
        with open(os.path.join(path, "pids.max"), "w") as f:
            f.write(str(PIDS_MAX))
        return path
    except OSError:
        return None


def remove_cgroup(path: str | None) -> None:
    """Kill whatever is still in the cgroup (nothing outlives grading), then remove it."""
    if not path:
        return
    for _ in range(50):
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                pids = [int(p) for p in f.read().split()]
        except OSError:
            return
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        time.sleep(0.1)
    try:
        os.rmdir(path)
    except OSError:
        pass


def sandbox_env(out: str, submissions: str, work: str) -> dict:
    """Environment that makes nbgrader start this submission's kernel in the sandbox
    (autograder/sandbox_kernel.py): a python3 kernelspec of our own, Unix-socket transport."""
    if shutil.which("bwrap") is None:
        raise SystemExit("make grade runs each submission in a bubblewrap sandbox, and bwrap is "
                         "not installed: `sudo apt-get install bubblewrap` (Debian/Ubuntu), or "
                         "grade unsandboxed with ZEROCOURSE_SANDBOX=0 (trusted submissions only)")
    spec_dir = os.path.join(work, "jupyter", "kernels", "python3")
    os.makedirs(spec_dir, exist_ok=True)
    with open(os.path.join(spec_dir, "kernel.json"), "w") as f:
        json.dump({"argv": [sys.executable, os.path.join(ROOT, "autograder", "sandbox_kernel.py"),
                            "-f", "{connection_file}"],
                   # Interrupts travel as a message: a signal to the launcher would stop at bwrap.
                   "interrupt_mode": "message",
                   "display_name": "Python 3 (sandboxed)", "language": "python"}, f)
    hide = [os.path.join(ROOT, "solutions"), os.path.join(ROOT, "tests"), os.path.join(ROOT, ".git"),
            os.path.join(ROOT, "autograder", "gradebook.db"), out, submissions]
    return {"JUPYTER_PATH": os.path.join(work, "jupyter"),
            "JUPYTER_RUNTIME_DIR": os.path.join(work, "runtime"),
            "ZC_SANDBOX_WORK": work,
            "ZC_SANDBOX_HIDE": os.pathsep.join(hide),
            "ZC_SANDBOX_KEEP": os.pathsep.join(sorted({ROOT, sys.prefix, sys.base_prefix,
                                                       os.path.realpath(sys.executable)})),
            # RLIMIT_NPROC counts all of this user's tasks: allow the ones running now + 200
            # (a 4-rank launch needs ~60 with their threads).
            "ZC_SANDBOX_NPROC": str(_user_tasks() + 200),
            "ZC_SANDBOX_MEM": os.environ.get("ZC_SANDBOX_MEM", str(4 << 30))}


def grade(submissions: str, out: str, timeout: float = 1200.0, sandbox: bool = True) -> list[dict]:
    """Grade every submission under `submissions` into `out`; return the grade rows.

    Args:
        submissions: folder laid out <student_id>/<assignment_id>/<assignment_id>.ipynb.
        out: output folder (created; reused across runs, the gradebook keeps growing).
        timeout: seconds one submission's autograde may take in all.
        sandbox: run each submission's kernel in the bubblewrap sandbox (autograder/sandbox_kernel.py).
    """
    submissions, out = os.path.abspath(submissions), os.path.abspath(out)
    if not os.path.isdir(submissions):
        raise SystemExit(f"SUBMISSIONS={submissions} is not a folder; expected "
                         f"<student_id>/<assignment_id>/<assignment_id>.ipynb inside it")
    if out == submissions or out.startswith(submissions + os.sep):
        raise SystemExit("OUT must be outside SUBMISSIONS (grading must not touch the submissions)")
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    link = os.path.join(out, "solutions")
    if not os.path.islink(link):
        os.symlink(os.path.join(ROOT, "solutions"), link)
    db_path = os.path.join(out, "gradebook.db")
    env = {"ZEROCOURSE_NBGRADER_ROOT": out, "ZEROCOURSE_GRADEBOOK": "sqlite:///" + db_path}
    known = set(assignments())

    work = []
    for sid in sorted(os.listdir(submissions)):
        sdir = os.path.join(submissions, sid)
        if not os.path.isdir(sdir) or sid.startswith("."):
            continue
        for aid in sorted(os.listdir(sdir)):
            if os.path.isdir(os.path.join(sdir, aid)) and not aid.startswith("."):
                work.append((sid, aid))

    registered = set()
    graded: dict[str, list[str]] = {}
    rows = []
    for sid, aid in work:
        t0 = time.monotonic()
        row = {"student_id": sid, "assignment_id": aid, "score": 0.0, "max_score": "",
               "status": "graded", "seconds": 0.0}
        nb_path = os.path.join(submissions, sid, aid, f"{aid}.ipynb")
        why = None
        if aid not in known:
            why = f"unknown assignment id {aid!r} (course has {sorted(known)})"
        else:
            why = _preflight(nb_path)
        if why is None and aid not in registered:
            proc = nbgrader("generate_assignment", aid, "--force",
                            f"--CourseDirectory.release_directory={os.path.join(out, 'release')}",
                            env=env, timeout=600)
            if proc.returncode != 0:
                raise SystemExit(f"cannot register {aid} in the gradebook:\n{proc.stderr[-3000:]}")
            registered.add(aid)
        if aid in registered:
            row["max_score"] = _max_score(db_path, aid)
        if why is None:
            dst = os.path.join(out, "submitted", sid, aid)
            shutil.rmtree(dst, ignore_errors=True)
            os.makedirs(dst)
            shutil.copy2(nb_path, os.path.join(dst, f"{aid}.ipynb"))
            step = ["autograde", aid, "--student", sid, "--create", "--force"]
            # A short private folder: Unix socket paths must stay under ~100 characters.
            work = tempfile.mkdtemp(prefix="zcsb-")
            run_env = dict(env)
            cgroup = None
            if sandbox:
                run_env.update(sandbox_env(out, submissions, work))
                run_env["ZEROCOURSE_KERNEL_IPC"] = os.path.join(work, "k")
                cgroup = make_pids_cgroup()
                if cgroup:
                    run_env["ZC_SANDBOX_CGROUP"] = cgroup
            try:
                proc = nbgrader(*step, env=run_env, timeout=timeout)
                log = f"$ nbgrader {' '.join(step)}\n{proc.stdout}{proc.stderr}"
                if "DeadKernelError" in log or "Kernel died" in log:
                    # nbgrader stops a notebook whose kernel died (os.abort, a segfault, the
                    # memory limit): nothing after it was run, so nothing after it passes.
                    why = (f"kernel died while running the notebook (os.abort, a crash or a "
                           f"limit): no test counted; see logs/{sid}-{aid}.log")
                elif proc.returncode != 0:
                    why = f"nbgrader autograde failed (see logs/{sid}-{aid}.log)"
                else:
                    graded.setdefault(aid, []).append(sid)
            except Exception as e:  # subprocess.TimeoutExpired and friends
                log, why = f"$ nbgrader {' '.join(step)}\n{e}", f"grading stopped: {type(e).__name__}"
            finally:
                remove_cgroup(cgroup)
                shutil.rmtree(work, ignore_errors=True)
            with open(os.path.join(out, "logs", f"{sid}-{aid}.log"), "w") as f:
                f.write(log)
            score = _score(db_path, aid, sid)
            if score is not None:
                row["score"] = score
        if why is not None:
            row["status"] = why
        row["seconds"] = round(time.monotonic() - t0, 1)
        rows.append(row)

    # Feedback for everyone graded, one nbgrader run per assignment (hidden tests removed).
    for aid, sids in graded.items():
        proc = nbgrader("generate_feedback", aid, "--force", env=env, timeout=600)
        with open(os.path.join(out, "logs", f"feedback-{aid}.log"), "w") as f:
            f.write(proc.stdout + proc.stderr)
        for row in rows:
            if row["assignment_id"] == aid and row["student_id"] in sids and not os.path.exists(
                    os.path.join(out, "feedback", row["student_id"], aid, f"{aid}.html")):
                row["status"] += f"; no feedback generated (see logs/feedback-{aid}.log)"

    with open(os.path.join(out, "grades.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    return rows


def refresh(out: str) -> list[dict]:
    """After manual grading in formgrader: regenerate feedback and grades.csv from the gradebook.

    Rows of grades.csv that could not be graded (bad files, unknown ids) are kept as they were.
    """
    from nbgrader.api import Gradebook
    out = os.path.abspath(out)
    db_path = os.path.join(out, "gradebook.db")
    if not os.path.exists(db_path):
        raise SystemExit(f"{out} has no gradebook.db: run `make grade SUBMISSIONS=... OUT={out}` first")
    env = {"ZEROCOURSE_NBGRADER_ROOT": out, "ZEROCOURSE_GRADEBOOK": "sqlite:///" + db_path}
    old = {}
    if os.path.exists(os.path.join(out, "grades.csv")):
        with open(os.path.join(out, "grades.csv")) as f:
            old = {(r["student_id"], r["assignment_id"]): r for r in csv.DictReader(f)}
    with Gradebook("sqlite:///" + db_path) as gb:
        graded = {(s.student.id, s.assignment.name): (float(s.score), float(s.max_score))
                  for a in gb.assignments for s in a.submissions}
    for aid in sorted({a for _, a in graded}):
        proc = nbgrader("generate_feedback", aid, "--force", env=env, timeout=600)
        with open(os.path.join(out, "logs", f"feedback-{aid}.log"), "w") as f:
            f.write(proc.stdout + proc.stderr)
    rows = []
    for key in sorted(set(old) | set(graded)):
        row = dict(old.get(key) or {"student_id": key[0], "assignment_id": key[1],
                                    "status": "graded", "seconds": ""})
        if key in graded:
            row["score"], row["max_score"] = graded[key]
        rows.append(row)
    with open(os.path.join(out, "grades.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    return rows


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--refresh":
        rows = refresh(sys.argv[2])
        print(f"feedback regenerated, grades.csv rewritten ({len(rows)} rows)")
        return 0
    parser = argparse.ArgumentParser(description="Autograde SUBMISSIONS into OUT "
                                                 "(or: grade.py --refresh OUT after manual grading).")
    parser.add_argument("submissions")
    parser.add_argument("out")
    parser.add_argument("--timeout", type=float, default=1200.0,
                        help="seconds one submission may take (default 1200)")
    parser.add_argument("--no-sandbox", action="store_true",
                        help="run kernels unsandboxed (also ZEROCOURSE_SANDBOX=0); trusted work only")
    args = parser.parse_args()
    sandbox = not args.no_sandbox and os.environ.get("ZEROCOURSE_SANDBOX", "1") != "0"
    rows = grade(args.submissions, args.out, args.timeout, sandbox=sandbox)
    width = max([len(r["student_id"]) for r in rows] + [10])
    for r in rows:
        print(f"{r['student_id']:<{width}} {r['assignment_id']:<24} "
              f"{r['score']:>6g} / {r['max_score'] or '?':<6} {r['seconds']:>6}s  {r['status']}")
    print(f"wrote {os.path.join(os.path.abspath(args.out), 'grades.csv')} ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
