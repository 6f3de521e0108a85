"""Autograde a folder of submissions and write grades.csv and feedback.

    python autograder/grade.py SUBMISSIONS OUT        (what `make grade` runs)

SUBMISSIONS is laid out <student_id>/<assignment_id>/<assignment_id>.ipynb.
OUT becomes an nbgrader course folder for this grading run:

    OUT/grades.csv                 student_id, assignment_id, score, max_score, status, seconds
    OUT/feedback/<student>/<assignment>/<assignment>.html   (hidden tests' source removed)
    OUT/submitted, OUT/autograded  nbgrader's copies (SUBMISSIONS itself is never modified)
    OUT/gradebook.db               the gradebook (open it with formgrader for manual grading)
    OUT/logs/<student>-<assignment>.log   nbgrader's output for each submission

    python autograder/grade.py SUBMISSIONS OUT --jobs 4   (JOBS=4 make grade ...)

grades `--jobs` submissions at once, each in its own sandbox (default: one per two cores).
Grading again into the same OUT (a late submission, a subset) replaces those rows of
grades.csv and keeps the others. SUBMISSIONS may also be nbgrader's exchange: its
collected `submitted/` folder (same layout plus timestamp.txt) or an `inbound/` folder
of <student>+<assignment>+<timestamp>+<random> submissions (the newest of each is graded).

A submission that cannot be graded (not a notebook, wrong assignment id, ...) gets a
row with score 0 and a status that says why; the others are graded regardless.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import stat
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from autograder import nbgrader_forks  # noqa: E402
from autograder.nbgrader_run import HERE as CONFIG_DIR, ROOT, assignments, command_env, nbgrader  # noqa: E402
from autograder.resources import SubmissionBox, UserBlock, memory_limit  # noqa: E402

FIELDS = ["student_id", "assignment_id", "score", "max_score", "pending_manual", "status", "seconds"]


# Ids reach nbgrader's command line, where --student is a glob and spaces are stripped.
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,63}$")
MAX_BYTES = int(os.environ.get("ZEROCOURSE_MAX_SUBMISSION_BYTES", 20 << 20))


def refuse_id(kind: str, value: str) -> str | None:
    """Why an id cannot be graded safely, or None: no globs, paths, spaces or leading '-'."""
    if ID_RE.match(value):
        return None
    return (f"refused: {kind} id {value!r} is not a plain name (letters, digits, _ . @ + -, "
            f"starting with a letter or digit, at most 64 characters); rename the folder")


def _preflight(path: str) -> str | None:
    """Why this file cannot be autograded, or None when it looks like a notebook."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "missing notebook"
    if stat.S_ISLNK(st.st_mode):
        return "refused: the notebook is a symbolic link; submit the file itself"
    if not stat.S_ISREG(st.st_mode):
        return "refused: the notebook is not a regular file"
    if st.st_size == 0:
        return "empty file"
    if st.st_size > MAX_BYTES:
        return (f"refused: the notebook is {st.st_size / 2**20:.1f} MiB, over the "
                f"{MAX_BYTES / 2**20:.0f} MiB limit; clear its outputs (Edit > Clear Outputs)")
    try:
        with open(path, encoding="utf-8") as f:
            nb = json.load(f)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        return f"not valid JSON ({e.__class__.__name__}: {str(e)[:80]})"
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list) or \
            not all(isinstance(c, dict) for c in nb["cells"]):
        return "not a Jupyter notebook (no cells)"
    return None


def repair(nb: dict) -> list[str]:
    """Fix what a learner does by accident; returns notes for the status column.

    A copied cell keeps its nbgrader grade_id, and nbgrader then refuses the whole
    notebook: every copy after the first becomes a plain cell (it still runs).
    """
    notes, seen = [], set()
    for cell in nb["cells"]:
        meta = cell.get("metadata")
        grader = meta.get("nbgrader") if isinstance(meta, dict) else None
        if not isinstance(grader, dict):
            continue
        gid = grader.get("grade_id")
        if gid in seen:
            del meta["nbgrader"]
            notes.append(f"cell {gid!r} appeared twice: the copy was graded as a plain cell")
        seen.add(gid)
    return notes


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


def rank_preload(aid: str) -> str:
    """ZEROCOURSE_RANK_PRELOAD for aid's kernels (zerocourse.launch.forkserver_preload):
    "light" where no code cell of its source (solutions and hidden tests) mentions optim, so
    no rank steps an optimizer and the fork servers need not import torch._dynamo; else "full"."""
    try:
        with open(os.path.join(ROOT, "solutions", aid, f"{aid}.ipynb"), encoding="utf-8") as f:
            cells = json.load(f)["cells"]
    except (OSError, ValueError, KeyError):
        return "full"
    code = "".join("".join(c.get("source", "")) for c in cells if c.get("cell_type") == "code")
    return "full" if "optim" in code else "light"


def _nbgrader(*args: str, env: dict, timeout: float, box: SubmissionBox | None = None
              ) -> subprocess.CompletedProcess:
    """`nbgrader *args`, forked from a process that imported nbgrader once (nbgrader_forks),
    else the command; inside `box`'s cgroups when given (a submission's autograde)."""
    if nbgrader_forks.enabled():
        return nbgrader_forks.run(list(args), command_env(env), CONFIG_DIR, timeout,
                                  list(box.cgroups.values()) if box else [])
    return nbgrader(*args, env=env, timeout=timeout, wrap=box.cmd if box else None)


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


def kernel_env(base: str, sandbox: bool, users: dict | None = None, memcg: str | None = None) -> dict:
    """Folders and kernelspecs for one submission's two kernels (learner, verdict).

    What a kernel may write on the host is only base/l (the learner's sockets), base/v (the
    verdict kernel's) and base/r (the learner's answer socket); the kernelspecs (base/specs)
    and nbgrader's runtime folder with the connection files (base/rt) are root's, outside
    every sandbox, so nothing a kernel writes changes how the next kernel starts. Each kernel
    gets a fresh /tmp (its HOME) inside its sandbox at every start.

    Args:
        base: the submission's folder (resources.SubmissionBox: size-limited as root).
        sandbox: run the kernels under bubblewrap (autograder/sandbox_kernel.py).
        users: the submission's uids (resources.UserBlock.slot), as root; None: this user.
        memcg: the submission's memory cgroup (the rank host measures ranks in cgroups below it).
    """
    dirs = {k: os.path.join(base, k) for k in ("l", "v", "r", "specs", "rt")}
    for d in dirs.values():
        os.makedirs(d, exist_ok=True)
    for key in ("specs", "rt"):
        os.chmod(dirs[key], 0o700)
    if sandbox and users and os.geteuid() == 0:
        for key, role in (("l", "learner"), ("r", "learner"), ("v", "verdict")):
            os.chown(dirs[key], users[role], users[role])
            os.chmod(dirs[key], 0o700 if key != "r" else 0o755)
    else:
        os.chmod(dirs["r"], 0o755)
    specs = os.path.join(dirs["specs"], "kernels")
    sandbox_py = os.path.join(ROOT, "autograder", "sandbox_kernel.py")
    for name, role in (("python3", "learner"), ("zc-verdict", "verdict")):
        os.makedirs(os.path.join(specs, name), exist_ok=True)
        argv = ([sys.executable, sandbox_py, "--role", role] if sandbox else
                [sys.executable, "-m", "ipykernel_launcher"]) + \
            ["-f", "{connection_file}"]
        spec = {"argv": argv, "display_name": f"Python 3 ({role})", "language": "python",
                # Interrupts travel as a message: a signal to the launcher would stop at bwrap.
                "interrupt_mode": "message" if sandbox else "signal",
                "env": {"PYTHONPATH": ROOT} if role == "verdict" else {}}
        if role == "verdict":
            # The launcher's trusted mode: nothing a rank sends is unpickled there.
            spec["env"]["ZEROCOURSE_TRUSTED"] = "1"
        with open(os.path.join(specs, name, "kernel.json"), "w") as f:
            json.dump(spec, f)
    env = {"JUPYTER_PATH": dirs["specs"], "JUPYTER_RUNTIME_DIR": dirs["rt"],
           "JUPYTER_CONFIG_DIR": dirs["specs"], "JUPYTER_DATA_DIR": dirs["specs"],
           "ZEROCOURSE_RPC_DIR": dirs["r"]}
    if not sandbox:
        return env
    if shutil.which("bwrap") is None:
        raise SystemExit("make grade runs each submission in a bubblewrap sandbox, and bwrap is "
                         "not installed: `sudo apt-get install bubblewrap` (Debian/Ubuntu), or "
                         "grade unsandboxed with ZEROCOURSE_SANDBOX=0 (trusted submissions only)")
    env.update({
        "ZC_LEARNER_WORK": dirs["l"], "ZC_VERDICT_WORK": dirs["v"], "ZC_SANDBOX_SHARED": dirs["r"],
        # RLIMIT_NPROC counts all of this user's tasks: its own user has none but these.
        "ZC_SANDBOX_NPROC": str(200 if users else _user_tasks() + 200),
        "ZC_SANDBOX_MEM": os.environ.get("ZC_SANDBOX_MEM", str(4 << 30)),
        # The kernels talk to nbgrader over Unix sockets in their own folders.
        "ZEROCOURSE_KERNEL_IPC": os.path.join(dirs["l"], "k"),
        "ZEROCOURSE_VERDICT_IPC": os.path.join(dirs["v"], "k")})
    if users:
        env.update({"ZC_LEARNER_UID": str(users["learner"]), "ZC_VERDICT_UID": str(users["verdict"]),
                    "ZC_HOST_UID_BASE": str(users["ranks"]), "ZC_HOST_GID": str(users["group"])})
    if memcg:
        env["ZC_SANDBOX_MEMCG"] = memcg
    return env


def gradebook_rows(db_path: str) -> dict:
    """Every grade and comment in the gradebook, keyed by (student, assignment, cell)."""
    import sqlite3
    if not os.path.exists(db_path):
        return {}
    query = ("SELECT sa.student_id, a.name, bc.name, {cols} FROM {table} x "
             "JOIN submitted_notebook sn ON x.notebook_id = sn.id "
             "JOIN submitted_assignment sa ON sn.assignment_id = sa.id "
             "JOIN assignment a ON sa.assignment_id = a.id "
             "JOIN base_cell bc ON x.cell_id = bc.id")
    rows = {}
    with sqlite3.connect(db_path) as db:
        for table, cols in (("grade", "x.auto_score, x.manual_score, x.extra_credit"),
                            ("comment", "x.auto_comment, x.manual_comment")):
            for r in db.execute(query.format(table=table, cols=cols)):
                rows[(r[0], r[1], r[2], table)] = r[3:]
    return rows


def _others_changed(before: dict, after: dict, sid: str) -> list:
    keys = {k for k in set(before) | set(after) if k[0] != sid}
    return sorted(k for k in keys if before.get(k) != after.get(k))


def pending_cells(db_path: str, aid: str, sid: str) -> dict[str, float]:
    """grade_id -> points of this submission's answers that wait for a person."""
    from nbgrader.api import Gradebook, MissingEntry
    with Gradebook("sqlite:///" + db_path) as gb:
        try:
            sub = gb.find_submission(aid, sid)
        except MissingEntry:
            return {}
        return {g.name: float(g.max_score) for nb in sub.notebooks for g in nb.grades
                if g.needs_manual_grade}


def pending_manual(db_path: str, aid: str, sid: str) -> float:
    """Points of this submission that wait for a person (written answers not yet graded)."""
    return sum(pending_cells(db_path, aid, sid).values())


def feedback(out: str, env: dict, aid: str, sids: list[str]) -> list[str]:
    """nbgrader's feedback for `sids` (hidden tests removed), pending answers marked;
    returns the students who got none."""
    from autograder import rubric
    from autograder.feedback import mark_pending, secure_page
    # Rubrics sit in the autograded notebooks for formgrader only: out while feedback is written.
    graded = [os.path.join(out, "autograded", sid, aid, f"{aid}.ipynb") for sid in sids]
    graded = [p for p in graded if os.path.exists(p)]
    for path in graded:
        rubric.strip(path)
    try:
        proc = _nbgrader("generate_feedback", aid, "--force", env=env, timeout=600)
    finally:
        for path in graded:
            rubric.add(path, aid)
    with open(os.path.join(out, "logs", f"feedback-{aid}.log"), "w") as f:
        f.write(proc.stdout + proc.stderr)
    db_path, missing = os.path.join(out, "gradebook.db"), []
    for sid in sids:
        page = os.path.join(out, "feedback", sid, aid, f"{aid}.html")
        if not os.path.exists(page):
            missing.append(sid)
            continue
        secure_page(page)               # a CSP <meta>: no script of the learner's runs there
        pending = pending_cells(db_path, aid, sid)
        if pending:
            with open(page, encoding="utf-8") as f:
                text = mark_pending(f.read(), pending)
            with open(page, "w", encoding="utf-8") as f:
                f.write(text)
    return missing


def _grade_one(sid, aid, nb_path, out, env, timeout, sandbox, users, box_limits) -> tuple[str | None, str]:
    """Autograde one submission; returns (why it was not graded or None, log text)."""
    dst = os.path.join(out, "submitted", sid, aid)
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    with open(nb_path, encoding="utf-8") as f:
        nb = json.load(f)
    notes = repair(nb)
    with open(os.path.join(dst, f"{aid}.ipynb"), "w", encoding="utf-8") as f:
        json.dump(nb, f)
    step = ["autograde", aid, "--student", sid, "--create", "--force"]
    box = SubmissionBox(box_limits["mem"], box_limits["cpu_shares"]) if sandbox else None
    base = box.base if box else tempfile.mkdtemp(prefix="zcsb-")
    # No fork server warmed at `import zerocourse`: under grading the tests' ranks run in the
    # rank host and the demos skip themselves, so the learner kernel's server mostly went
    # unused (2-5 CPU-s a submission); a learner cell that does launch starts it then.
    run_env = dict(env, **kernel_env(base, sandbox, users, box.cgroups.get("memory") if box else None),
                   ZEROCOURSE_RANK_PRELOAD=rank_preload(aid), ZEROCOURSE_WARM_UP="0")
    t0 = time.monotonic()
    try:
        proc = _nbgrader(*step, env=run_env, timeout=timeout, box=box)
        log = f"$ nbgrader {' '.join(step)}\n{proc.stdout}{proc.stderr}"
        if box and box.oom_kills():
            log += (f"\n[grade.py] the submission hit its memory limit ({box_limits['mem'] >> 20} MiB): "
                    f"the kernel killed {box.oom_kills()} of its processes\n")
        if proc.returncode != 0:
            why = f"nbgrader autograde failed (see logs/{sid}-{aid}.log)"
            if box and box.oom_kills():
                why = (f"grading stopped: the submission used more than its {box_limits['mem'] >> 20} "
                       f"MiB of memory (see logs/{sid}-{aid}.log)")
        else:
            why = None
            graded = os.path.join(out, "autograded", sid, aid, f"{aid}.ipynb")
            if os.path.exists(graded):
                from autograder import rubric
                rubric.add(graded, aid)         # beside the written answers, for formgrader
    except Exception as e:  # subprocess.TimeoutExpired and friends
        log, why = f"$ nbgrader {' '.join(step)}\n{e}", f"grading stopped: {type(e).__name__}"
    finally:
        if box:
            peak = box.peak_bytes()
            if peak:
                log += f"\n[grade.py] nbgrader autograde {time.monotonic() - t0:.1f} s, peak memory {peak >> 20} MiB\n"
            box.close()
        else:
            shutil.rmtree(base, ignore_errors=True)
    if notes:
        why = "; ".join(([why] if why else ["graded"]) + notes)
    return why, log


def default_jobs() -> int:
    """Submissions graded at once by default: one per two cores (a submission runs two kernels
    and up to four ranks), and no more than memory allows (each sandbox may use 4 GiB)."""
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        mem = 8 << 30
    return max(1, min((os.cpu_count() or 2) // 2, mem // (4 << 30)))


def parse_inbound(name: str, known: set) -> tuple[str, str, str] | None:
    """(student, assignment, timestamp) of an exchange inbound entry
    <student>+<assignment>+<timestamp>[+<random>], or None. A student id may hold '+':
    the assignment is the known id followed by one or two fields."""
    parts = name.split("+")
    for i in range(1, len(parts) - 1):
        if parts[i] in known and len(parts) - i - 1 in (1, 2):
            return "+".join(parts[:i]), parts[i], parts[i + 1]
    return None


def find_work(submissions: str, known: set, skip=frozenset()) -> tuple[list[tuple[str, str]], dict]:
    """The (student, assignment) pairs under `submissions`, and where each notebook is.

    Two layouts: <student>/<assignment>/<assignment>.ipynb (make grade's own, and nbgrader's
    collected submitted/ folder), or the exchange's inbound/ folder, whose entries are
    <student>+<assignment>+<timestamp>+<random>/<assignment>.ipynb: the newest per pair wins.
    Entries in `skip` (refused: autograder/exchange.py) are not considered.
    """
    entries = sorted(e for e in os.listdir(submissions) if not e.startswith(".") and e not in skip)
    inbound = {}
    for e in entries:
        m = parse_inbound(e, known)
        if m and os.path.isdir(os.path.join(submissions, e)):
            sid, aid, ts = m              # nbgrader's timestamps sort as text (ISO order)
            if (sid, aid) not in inbound or ts > inbound[(sid, aid)][0]:
                inbound[(sid, aid)] = (ts, os.path.join(submissions, e, f"{aid}.ipynb"))
    if inbound:
        return sorted(inbound), {k: v[1] for k, v in inbound.items()}
    work = []
    for sid in entries:
        sdir = os.path.join(submissions, sid)
        if not os.path.isdir(sdir):
            continue
        for aid in sorted(os.listdir(sdir)) if not os.path.islink(sdir) else [""]:
            adir = os.path.join(sdir, aid)
            if not aid or (os.path.isdir(adir) and not aid.startswith(".")):
                work.append((sid, aid))
    return work, {(sid, aid): os.path.join(submissions, sid, aid, f"{aid}.ipynb") for sid, aid in work}


class _InFlight:
    """Who is being graded now, and which students each job overlapped with: a job may only
    change its own student's gradebook rows, so the check after it ignores those students."""

    def __init__(self):
        self.lock, self.running = threading.Lock(), {}

    def start(self, key, sid) -> set:
        with self.lock:
            seen = {s for s, _ in self.running.values()} | {sid}
            for _, other in self.running.values():
                other.add(sid)
            self.running[key] = (sid, seen)
            return seen

    def stop(self, key) -> None:
        with self.lock:
            self.running.pop(key, None)


def grade(submissions: str, out: str, timeout: float = 1200.0, sandbox: bool = True,
          jobs: int = 1) -> list[dict]:
    """Grade every submission under `submissions` into `out`; return this run's grade rows.

    Args:
        submissions: folder laid out <student_id>/<assignment_id>/<assignment_id>.ipynb
            (or an exchange inbound/ folder, see find_work).
        out: output folder (created; reused across runs, the gradebook keeps growing and
            grades.csv keeps the rows of students not graded again).
        timeout: seconds one submission's autograde may take in all.
        sandbox: run each submission's kernels in the bubblewrap sandbox (autograder/sandbox_kernel.py).
        jobs: submissions graded at once, each in its own sandbox with its own users.
    """
    submissions, out = os.path.abspath(submissions), os.path.abspath(out)
    if not os.path.isdir(submissions):
        raise SystemExit(f"SUBMISSIONS={submissions} is not a folder; expected "
                         f"<student_id>/<assignment_id>/<assignment_id>.ipynb inside it")
    if out == submissions or out.startswith(submissions + os.sep):
        raise SystemExit("OUT must be outside SUBMISSIONS (grading must not touch the submissions)")
    if jobs < 1:
        raise SystemExit(f"JOBS={jobs}: grade at least one submission at a time (JOBS=1 or more)")
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    old_link = os.path.join(out, "solutions")
    if os.path.islink(old_link):          # OUT folders of earlier versions linked solutions/ here
        os.unlink(old_link)
    db_path = os.path.join(out, "gradebook.db")
    # Parallel autogrades share one SQLite gradebook: wait for a lock instead of failing on it.
    env = {"ZEROCOURSE_NBGRADER_ROOT": out, "ZEROCOURSE_GRADEBOOK": f"sqlite:///{db_path}?timeout=120",
           "ZEROCOURSE_RELEASE_DIR": os.path.join(out, "release")}
    known = set(assignments())
    # Inbound entries not owned by the learner they name (autograder/exchange.py).
    from autograder import exchange
    refused = exchange.refused_entries(submissions, lambda name: parse_inbound(name, known))
    work, paths = find_work(submissions, known, skip=set(refused))
    why_not = {key: _intake(submissions, *key, known, paths[key]) for key in work}

    # Users of this run only (no other grading run on the machine holds them), and what each
    # submission may use: a memory share, an equal CPU share, a cap on its tasks.
    user_block = UserBlock.reserve(jobs) if sandbox else UserBlock(None, None)
    box_limits = {"mem": memory_limit(jobs), "cpu_shares": 1024 * max(2, os.cpu_count() or 2)}
    # Can this machine grade at all? Checked beside the registration below, before anyone's
    # submission: a misconfigured grader stops here, naming the cause, not with a class of 0s.
    pre = _Preflight(sandbox, user_block) if any(w is None for w in why_not.values()) else None
    if pre is not None and nbgrader_forks.enabled():
        nbgrader_forks.warm()               # its imports overlap the gradebook's setup too

    # Register assignments and students first, one at a time: parallel jobs then only add rows
    # of their own submission to the gradebook.
    registered = set()
    for aid in sorted({aid for key, aid in work if why_not[(key, aid)] is None}):
        proc = _nbgrader("generate_assignment", aid, "--force",
                        f"--CourseDirectory.release_directory={os.path.join(out, 'release')}",
                        env=env, timeout=600)
        if proc.returncode != 0:
            raise SystemExit(f"cannot register {aid} in the gradebook:\n{proc.stderr[-3000:]}")
        registered.add(aid)
    _add_students(db_path, sorted({sid for sid, aid in work if why_not[(sid, aid)] is None}))
    if pre is not None:
        try:
            pre.wait()
        except SystemExit:
            user_block.release()
            raise

    slots, in_flight = list(range(jobs)), _InFlight()
    slot_lock = threading.Lock()

    def one(sid: str, aid: str) -> dict:
        t0 = time.monotonic()
        row = {"student_id": sid, "assignment_id": aid, "score": 0.0, "max_score": "",
               "pending_manual": 0.0, "status": "graded", "seconds": 0.0}
        why = why_not[(sid, aid)]
        try:
            if aid in registered:
                row["max_score"] = _max_score(db_path, aid)
            if why is None:
                with slot_lock:
                    slot = slots.pop()
                overlap = in_flight.start((sid, aid), sid)
                try:
                    before = gradebook_rows(db_path)
                    why, log = _grade_one(sid, aid, paths[(sid, aid)], out, env, timeout, sandbox,
                                          user_block.slot(slot), box_limits)
                    with open(os.path.join(out, "logs", f"{sid}-{aid}.log"), "w") as f:
                        f.write(log)
                    changed = [k for k in _others_changed(before, gradebook_rows(db_path), sid)
                               if k[0] not in overlap]
                finally:
                    in_flight.stop((sid, aid))
                    with slot_lock:
                        slots.append(slot)
                if changed:
                    raise SystemExit(f"STOPPED: grading {sid}/{aid} changed other students' "
                                     f"gradebook rows {changed[:5]}; restore {db_path} from a "
                                     f"backup and report this submission")
                score = _score(db_path, aid, sid)
                if score is not None:
                    row["score"] = score
                    row["pending_manual"] = pending_manual(db_path, aid, sid)
        except SystemExit:
            raise
        except Exception as e:  # noqa: BLE001 - one submission never stops the class
            why = f"grading error: {type(e).__name__}: {str(e)[:200]}"
        if why is not None:
            row["status"] = why
        elif row["pending_manual"]:
            row["status"] = f"graded; {row['pending_manual']:g} points await manual grading"
        row["seconds"] = round(time.monotonic() - t0, 1)
        return row

    rows, started = [], time.monotonic()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(one, sid, aid) for sid, aid in work]
        try:
            for fut in as_completed(futures):
                rows.append(fut.result())
                _progress(rows[-1], len(rows), len(work), started)
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        finally:
            user_block.release()
    rows = exchange.add_refusals(rows, refused, known)   # sorted by student, assignment

    graded = {}
    for row in rows:
        if row["status"].startswith("graded"):
            graded.setdefault(row["assignment_id"], []).append(row["student_id"])
    # Feedback for everyone graded, one nbgrader run per assignment (hidden tests removed).
    for aid, sids in graded.items():
        missing = feedback(out, env, aid, sids)
        for row in rows:
            if row["assignment_id"] == aid and row["student_id"] in missing:
                row["status"] += f"; no feedback generated (see logs/feedback-{aid}.log)"
    _write_rows(out, rows, merge=True)
    return rows


class _Preflight:
    """autograder/preflight.py's check, in a thread (it overlaps the gradebook's setup)."""

    def __init__(self, sandbox: bool, users: UserBlock):
        self.error, self.seconds = None, None
        self.base = tempfile.mkdtemp(prefix="zcpf-")
        # Its learner kernel launches nothing (no fork server to warm) and its one launch
        # steps no optimizer (a light preload): grading's own kernels are not made lighter.
        env = dict(kernel_env(self.base, sandbox, users.slot(0)), ZEROCOURSE_WARM_UP="0",
                   ZEROCOURSE_RANK_PRELOAD="light")
        self.thread = threading.Thread(target=self._run, args=(env, sandbox), daemon=True)
        self.thread.start()

    def _run(self, env, sandbox):
        from autograder import preflight
        try:
            self.seconds = preflight.check(env, sandbox)
        except SystemExit as e:
            self.error = str(e)
        except Exception as e:  # noqa: BLE001 - reported as the cause
            self.error = f"grading cannot start: the preflight check failed: {type(e).__name__}: {e}"

    def wait(self) -> None:
        self.thread.join()
        shutil.rmtree(self.base, ignore_errors=True)
        if self.error:
            raise SystemExit(self.error)
        print(f"preflight: both kernels and a 2-rank launch work ({self.seconds:.1f} s)", flush=True)


def _add_students(db_path: str, sids: list[str]) -> None:
    """Create the students' gradebook rows (parallel `autograde --create` calls would race)."""
    from nbgrader.api import Gradebook
    if not sids:                        # nothing to grade (all refused): no gradebook needed
        return
    with Gradebook("sqlite:///" + db_path) as gb:
        for sid in sids:
            gb.update_or_create_student(sid)


def _intake(submissions: str, sid: str, aid: str, known: set, path: str) -> str | None:
    """Why this submission (its notebook at `path`) cannot be graded, or None."""
    why = refuse_id("student", sid) or (refuse_id("assignment", aid) if aid else None)
    if why:
        return why
    adir = os.path.dirname(path)
    sdir = os.path.dirname(adir)          # the student's folder (SUBMISSIONS itself for inbound/)
    if not aid or os.path.islink(adir) or (sdir != submissions and os.path.islink(sdir)):
        return "refused: a folder of the submission is a symbolic link"
    if aid not in known:
        return f"unknown assignment id {aid!r} (course has {sorted(known)})"
    return _preflight(path)


def _progress(row: dict, done: int, total: int, started: float) -> None:
    """One line per submission as it finishes, with an estimate of the time left."""
    left = (time.monotonic() - started) / done * (total - done)
    print(f"[{done}/{total}] {row['student_id']} {row['assignment_id']}: "
          f"{row['score']:g}/{row['max_score'] or '?'} in {row['seconds']}s ({row['status']}); "
          f"about {left:.0f} s left", flush=True)


def _write_rows(out: str, rows: list[dict], merge: bool = False) -> None:
    """Write grades.csv; with merge, rows of (student, assignment) pairs not in `rows` stay."""
    path = os.path.join(out, "grades.csv")
    if merge and os.path.exists(path):
        with open(path, newline="") as f:
            kept = {(r["student_id"], r["assignment_id"]): r for r in csv.DictReader(f)}
        kept.update({(r["student_id"], r["assignment_id"]): r for r in rows})
        rows = [kept[k] for k in sorted(kept)]
    with open(path + ".tmp", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    os.replace(path + ".tmp", path)       # never a half-written grades.csv


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
        feedback(out, env, aid, sorted(s for s, a in graded if a == aid))
    rows = []
    for key in sorted(set(old) | set(graded)):
        row = dict(old.get(key) or {"student_id": key[0], "assignment_id": key[1],
                                    "status": "graded", "seconds": ""})
        if key in graded:
            row["score"], row["max_score"] = graded[key]
            row["pending_manual"] = pending_manual(db_path, key[1], key[0])
            if row["status"].startswith("graded"):
                row["status"] = (f"graded; {row['pending_manual']:g} points await manual grading"
                                 if row["pending_manual"] else "graded")
        rows.append(row)
    _write_rows(out, rows)
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
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("JOBS") or default_jobs()),
                        help=f"submissions graded at once (default: JOBS, or {default_jobs()} here)")
    parser.add_argument("--no-sandbox", action="store_true",
                        help="run kernels unsandboxed (also ZEROCOURSE_SANDBOX=0); trusted work only")
    args = parser.parse_args()
    sandbox = not args.no_sandbox and os.environ.get("ZEROCOURSE_SANDBOX", "1") != "0"
    rows = grade(args.submissions, args.out, args.timeout, sandbox=sandbox, jobs=args.jobs)
    width = max([len(r["student_id"]) for r in rows] + [10])
    for r in rows:
        print(f"{r['student_id']:<{width}} {r['assignment_id']:<24} "
              f"{r['score']:>6g} / {r['max_score'] or '?':<6} {r['seconds']:>6}s  {r['status']}")
    print(f"wrote {os.path.join(os.path.abspath(args.out), 'grades.csv')} ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
