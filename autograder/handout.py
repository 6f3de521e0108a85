"""`make handout OUT=dir`: the learner's repository, without solutions, tests or hidden tests.

    python autograder/handout.py OUT

OUT gets notebooks/ (the release copies: solutions and hidden tests already removed by
nbgrader), zerocourse/, data/, requirements.txt, pyproject.toml, the licences, a learner
Makefile and README (autograder/handout/), and the grader's machinery that `make check`
runs (autograder/*.py, no instructor notes). Never solutions/, tests/ or bench figures.
OUT must be new (or empty): a handout never overwrites anything. It becomes a git
repository with one commit when git is available, ready to push where learners clone from.
Before it is declared done, every file is scanned for nbgrader's solution and hidden-test
markers; one found stops the handout with an error and the folder is removed.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COPY = ["notebooks", "zerocourse", "data", "requirements.txt", "pyproject.toml", "setup.mk",
        "LICENSE", "LICENSE-TEXT"]
# What `make check` imports: the split execution of the grader, run on the learner's notebook.
AUTOGRADER = ["__init__.py", "check.py", "grade.py", "feedback.py", "nbgrader_run.py",
              "split_execute.py", "verdict.py", "learner_rpc.py", "sandbox_kernel.py", "resources.py",
              "preflight.py", "nbgrader_forks.py"]
MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS")
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints", "*.egg-info")


def leaks(folder: str) -> list[str]:
    """Files under `folder` that hold a solution or hidden-test marker."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in filenames:
            path = os.path.join(dirpath, name)
            try:
                with open(path, encoding="utf-8", errors="ignore") as f:
                    text = f.read()
            except OSError:
                continue
            if any(m in text for m in MARKERS):
                found.append(os.path.relpath(path, folder))
    return found


def handout(out: str) -> str:
    """Write the learner repository into `out`; return its absolute path.

    Args:
        out: a folder that does not exist yet, or an empty one, outside this repository.
    """
    out = os.path.abspath(out)
    if out == ROOT or out.startswith(ROOT + os.sep):
        raise SystemExit(f"OUT={out} is inside the course repository; choose a folder outside it "
                         f"(e.g. OUT=../zero-by-hand-learners)")
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise SystemExit(f"OUT={out} exists and is not empty; a handout never overwrites: "
                         f"choose a new folder or empty this one")
    os.makedirs(out, exist_ok=True)
    try:
        for item in COPY:
            src = os.path.join(ROOT, item)
            if os.path.isdir(src):
                shutil.copytree(src, os.path.join(out, item), ignore=IGNORE)
            else:
                shutil.copy2(src, os.path.join(out, item))
        os.makedirs(os.path.join(out, "autograder"))
        for name in AUTOGRADER:
            shutil.copy2(os.path.join(ROOT, "autograder", name), os.path.join(out, "autograder", name))
        for name in ("Makefile", "README.md"):
            shutil.copy2(os.path.join(ROOT, "autograder", "handout", name), os.path.join(out, name))
        with open(os.path.join(out, ".gitignore"), "w") as f:
            f.write(".venv/\n__pycache__/\n*.pyc\n.ipynb_checkpoints/\n*.egg-info/\n/my-notebooks/\n")
        found = leaks(out)
        if found:
            raise SystemExit(f"STOPPED: solution or hidden-test markers in {found[:5]}; "
                             f"run `make release` (notebooks/ must be nbgrader's release copies)")
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    if shutil.which("git"):
        git = ["git", "-C", out, "-c", "user.name=ZeRO by hand", "-c", "user.email=course@localhost"]
        subprocess.run(git[:3] + ["init", "-q"], check=True)
        subprocess.run(git + ["add", "-A"], check=True)
        subprocess.run(git + ["commit", "-q", "-m", "ZeRO by hand: learner handout"], check=True)
    return out


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: python autograder/handout.py OUT   (a new folder outside this repository)")
        return 2
    out = handout(sys.argv[1])
    print(f"wrote the learner repository to {out} (no solutions/, tests/ or hidden tests); "
          f"learners run `make lab` there")
    return 0


if __name__ == "__main__":
    sys.exit(main())
