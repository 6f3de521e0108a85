"""The course on a shared JupyterHub (deploy/hub/), end to end, in headless Chromium.

deploy/hub/setup.sh makes a hub on 127.0.0.1 (a free port) with two learners and an instructor
(Linux users, PAM passwords set by this test); the instructor releases 00_setup; learner 1 logs
in through the hub's login page, fetches it from the Assignments tab, solves it (the solution
notebook's code put into the fetched copy), validates and submits from the UI; learner 2 submits
the blank copy (nbgrader on the command line, as that user); deploy/hub/grade.sh collects,
grades with autograder/grade.py and releases feedback; learner 1 fetches and opens it.
Checked: full marks and 0; learners never hold solutions or hidden tests and cannot read the
instructor's course, the repository's solutions, tests, history or instructor notes (every file a
learner can open is searched for the hidden tests' and the notes' lines); learner 2's submission
named for learner 1 (`nbgrader submit --student`) is refused in collect and in grade.py's inbound
mode, with a status row; learners see only the Assignments tab, the instructor sees Formgrader,
under a CSP that refuses an inline script added to the page;
after deploy/hub/teardown.sh nothing is left (users, folders, hub, proxy, servers, kernels).
Screenshots: artifacts/hub/ (or $ZEROCOURSE_HUB_ARTIFACTS).
"""
import csv
import glob
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import time

import pytest

from tests.browser import BrowserUnavailable, browser_tools, Browser
from tests.fixtures.make_submission import load, solution_as_submission, source

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HUB = os.path.join(ROOT, "deploy", "hub")
VENV = os.path.join(ROOT, ".venv")
ARTIFACTS = os.environ.get("ZEROCOURSE_HUB_ARTIFACTS", os.path.join(ROOT, "artifacts", "hub"))
AID = "00_setup"
# Names unlikely to exist on a real machine; setup.sh refuses to reuse an existing user.
INSTRUCTOR, L1, L2 = "zchub-teach", "zchub-ada", "zchub-bob"
HUB_ROOT = "/srv/zerocourse-hub-test"


def _run(cmd, timeout=900, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n" \
                                 f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def _as(user, *cmd, cwd=None, timeout=300):
    """Run a command as one of the hub's users, with the environment their server has."""
    role = "instructor" if user == INSTRUCTOR else "learner"
    env = ["env", "-i", f"HOME=/home/{user}", f"USER={user}", f"PATH={VENV}/bin:/usr/bin:/bin",
           f"JUPYTER_CONFIG_PATH={HUB_ROOT}/jupyter/{role}"]
    return subprocess.run(["runuser", "-u", user, "--", *env, *cmd], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd or f"/home/{user}")


def _free_port_block():
    """A port p with p+1 and p+2 free too (the hub's API and the proxy's API)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p < 65000 and all(_port_free(p + i) for i in (1, 2)):
            return p
    raise RuntimeError("no block of 3 free ports")


def _port_free(p):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", p))
            return True
        except OSError:
            return False


def _leftovers(uids):
    """Processes of the test's users, or of the hub (its folder or proxy in the command line)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{entry}")
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if st.st_uid in uids or HUB_ROOT in cmd or any(
                name in cmd for name in ("configurable-http-proxy", "jupyterhub")):
            found.append(f"{entry} uid={st.st_uid} {cmd[:200]}")
    return found


def _secret_lines():
    """Lines of the solution notebook a learner must never hold: solution code and hidden
    tests (long enough to be distinctive, and absent from the release copy)."""
    released = json.dumps(load("notebooks", AID))
    lines = set()
    for cell in load("solutions", AID)["cells"]:
        for block in re.findall(r"### BEGIN (?:SOLUTION|HIDDEN TESTS)\n(.*?)### END",
                                source(cell), flags=re.S):
            lines |= {ln.strip() for ln in block.splitlines()
                      if len(ln.strip()) >= 20 and json.dumps(ln.strip())[1:-1] not in released}
    assert lines, "found no solution or hidden-test lines in the solution notebook"
    return lines


_SCAN = r"""
import json, os, sys
root, needles = sys.argv[1], json.load(open(sys.argv[2]))
closed = ("solutions", "tests", ".git", ".ci", "artifacts", os.path.join("autograder", "notes"))
found = []
for d, dirs, files in os.walk(root):
    dirs[:] = [x for x in dirs if x not in (".venv", "__pycache__")]
    for name in files:
        path = os.path.join(d, name)
        try:
            with open(path, errors="replace") as f:
                text = f.read()
        except OSError:
            continue                      # not readable by this learner: as it should be
        rel = os.path.relpath(path, root)
        if any(rel.startswith(c + os.sep) for c in closed):
            found.append(rel)
        found += [f"{rel}: {n[:60]}" for n in needles if n in text]
print(json.dumps(found))
"""


def _learner_scan(user):
    """Files of the repository `user` can read that are instructor material, or that hold a
    hidden test's line or a line found only in the instructor notes."""
    closed = ("solutions", "tests", ".git", ".ci", "artifacts", os.path.join("autograder", "notes"))
    public = []
    for d, dirs, files in os.walk(ROOT):
        rel = os.path.relpath(d, ROOT)
        if any(f"{rel}/".startswith(c + "/") for c in closed) or "/.venv" in f"/{rel}" or \
                "__pycache__" in rel:
            dirs[:] = []
            continue
        for name in files:
            with open(os.path.join(d, name), errors="replace") as f:
                public.append(f.read())
    public = "\n".join(public)
    needles = set()
    for path in glob.glob(os.path.join(ROOT, "solutions", "*", "*.ipynb")):
        with open(path) as f:
            for cell in json.load(f)["cells"]:
                for block in re.findall(r"### BEGIN HIDDEN TESTS\n(.*?)### END", source(cell), re.S):
                    needles |= {ln.strip() for ln in block.splitlines() if len(ln.strip()) >= 25}
    for path in glob.glob(os.path.join(ROOT, "autograder", "notes", "*.md")):
        with open(path) as f:
            needles |= {ln.strip() for ln in f if len(ln.strip()) >= 40}
    needles = sorted(n for n in needles if n not in public)    # what only those files hold
    assert len(needles) > 100, len(needles)
    spec = os.path.join(HUB_ROOT, "scan-needles.json")
    with open(spec, "w") as f:
        json.dump(needles, f)
    os.chmod(spec, 0o644)
    p = _as(user, "python3", "-c", _SCAN, ROOT, spec, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def _grep_home(user, needles):
    hits = []
    for path in glob.glob(f"/home/{user}/**/*", recursive=True):
        if os.path.isfile(path) and ".cache" not in path:
            with open(path, errors="replace") as f:
                text = f.read()
            hits += [(path, n) for n in needles if n in text]
    return hits


@pytest.fixture(scope="module")
def tools():
    if os.geteuid() != 0:
        pytest.skip("the hub test creates Linux users and runs JupyterHub as root: run as root")
    if not (shutil.which("node") and shutil.which("npm")):
        if not shutil.which("apt-get"):
            pytest.skip("node/npm missing (configurable-http-proxy needs them) and no apt-get")
        subprocess.run(["apt-get", "install", "-y", "-qq", "nodejs", "npm"], capture_output=True,
                       timeout=900, env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
        if not shutil.which("npm"):
            pytest.skip("node/npm missing and `apt-get install nodejs npm` did not provide them")
    try:
        return browser_tools()
    except BrowserUnavailable as e:
        pytest.skip(f"no browser for the hub test: {e}")


class Step:
    """Screenshots named by step: artifacts/hub/NN-what.png."""

    def __init__(self, driver):
        self.driver, self.n, self.names = driver, 0, []

    def shot(self, what):
        self.n += 1
        name = f"{self.n:02d}-{what}.png"
        self.driver.save_screenshot(os.path.join(ARTIFACTS, name))
        self.names.append(name)


def _wait(cond, timeout, what, interval=0.3):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = cond()
            if value:
                return value
        except Exception as e:          # the page is still loading
            last = e
        time.sleep(interval)
    raise TimeoutError(f"waited {timeout} s for {what} (last error: {last!r})")


def _login(driver, url, user, password):
    from selenium.webdriver.common.by import By
    driver.get(f"{url}/hub/login")
    _wait(lambda: driver.find_element(By.ID, "username_input"), 30, "the login form")
    driver.find_element(By.ID, "username_input").send_keys(user)
    driver.find_element(By.ID, "password_input").send_keys(password)
    driver.find_element(By.ID, "login_submit").click()
    # The hub spawns the user's server, then JupyterLab loads with its Nbgrader menu.
    _wait(lambda: [e for e in driver.find_elements(By.CSS_SELECTOR, ".lm-MenuBar-item")
                   if e.text.strip() == "Nbgrader"], 150, f"JupyterLab of {user}")


def _nbgrader_menu(driver):
    """Open the Nbgrader menu; the commands of its visible items."""
    from selenium.webdriver.common.by import By
    [m for m in driver.find_elements(By.CSS_SELECTOR, ".lm-MenuBar-item")
     if m.text.strip() == "Nbgrader"][0].click()
    _wait(lambda: driver.find_elements(By.CSS_SELECTOR, ".lm-Menu-item"), 10, "the menu")
    # An item whose plugin is disabled has no registered command: it renders without a label.
    return [e.get_attribute("data-command") for e in
            driver.find_elements(By.CSS_SELECTOR, ".lm-Menu .lm-Menu-item")
            if e.is_displayed() and e.get_attribute("data-command") and e.text.strip()]


def _click_menu_item(driver, command):
    from selenium.webdriver.common.by import By
    driver.find_element(By.CSS_SELECTOR, f'.lm-Menu-item[data-command="{command}"]').click()


def _list(driver, which):
    """The rows of one list of the Assignments tab (released / fetched / submitted)."""
    from selenium.webdriver.common.by import By
    return driver.find_elements(By.CSS_SELECTOR, f"#{which}_assignments_list > .list_item")


def _button(row, text):
    from selenium.webdriver.common.by import By
    found = [b for b in row.find_elements(By.TAG_NAME, "button")   # "fetch" renders as "Fetch"
             if b.text.strip().lower() == text.lower()]
    return found[0] if found else None


def _js_click(driver, node):
    driver.execute_script("arguments[0].click()", node)


# ~4 min on an idle 2-core machine; several times that when other jobs share the cores.
@pytest.mark.timeout(1500)
def test_hub_end_to_end(tools):
    os.makedirs(ARTIFACTS, exist_ok=True)
    for old in glob.glob(os.path.join(ARTIFACTS, "*.png")):
        os.remove(old)
    started = time.monotonic()
    if os.path.exists(os.path.join(HUB_ROOT, "hub.json")):   # an interrupted earlier run
        _run([os.path.join(HUB, "teardown.sh"), "--root", HUB_ROOT], timeout=120)
    users_file = os.path.join(ARTIFACTS, "users.txt")
    with open(users_file, "w") as f:
        f.write(f"instructor {INSTRUCTOR}\nlearner {L1}\nlearner {L2}\n")
    port = _free_port_block()
    url = f"http://127.0.0.1:{port}"
    uids, failure = set(), None
    timings = {}
    try:
        out = _run([os.path.join(HUB, "setup.sh"), users_file, "--root", HUB_ROOT,
                    "--ip", "127.0.0.1", "--port", str(port), "--cull-idle", "600",
                    "--grant-traverse"], timeout=900)
        timings["setup"] = time.monotonic() - started
        assert "hub up" in out, out
        uids = {int(_run(["id", "-u", u]).strip()) for u in (INSTRUCTOR, L1, L2)}
        password = secrets.token_urlsafe(12)
        _run(["chpasswd"], input="".join(f"{u}:{password}\n" for u in (INSTRUCTOR, L1, L2)))

        # The instructor releases 00_setup from the course folder setup.sh made (source/ is
        # solutions/): the same release copy as notebooks/.
        course = f"/home/{INSTRUCTOR}/zero-by-hand"
        for args in (["generate_assignment", AID], ["release_assignment", AID]):
            p = _as(INSTRUCTOR, f"{VENV}/bin/nbgrader", *args, cwd=course)
            assert p.returncode == 0, p.stdout + p.stderr
        with open(f"{course}/release/{AID}/{AID}.ipynb") as a, \
                open(os.path.join(ROOT, "notebooks", AID, f"{AID}.ipynb")) as b:
            assert json.load(a) == json.load(b), "the hub's release differs from notebooks/"

        # Learners cannot read the instructor's course, nor the repository's solutions, tests,
        # history or instructor notes (hidden-test tables, rubrics, quiz answers), in a terminal;
        # the instructor has the notes in the course folder.
        t0 = time.monotonic()
        for target in (course, f"{course}/source/{AID}/{AID}.ipynb", f"{course}/notes/{AID}.md",
                       os.path.join(ROOT, "solutions", AID, f"{AID}.ipynb"),
                       os.path.join(ROOT, "autograder", "notes", f"{AID}.md"),
                       os.path.join(ROOT, "autograder", "notes", "06_communication_bill.md"),
                       os.path.join(ROOT, "tests", "test_nb00.py"),
                       os.path.join(ROOT, ".git", *(["HEAD"] if os.path.isdir(f"{ROOT}/.git") else []))):
            for user in (L1, L2):
                p = _as(user, "cat", target)
                assert p.returncode != 0 and "Permission denied" in p.stderr, (user, target, p.stderr)
        p = _as(L2, "ls", os.path.join(ROOT, "autograder", "notes"))
        assert p.returncode != 0 and "Permission denied" in p.stderr, p.stdout
        p = _as(INSTRUCTOR, "cat", f"{course}/notes/{AID}.md")
        assert p.returncode == 0 and p.stdout.strip(), p.stderr
        # ...nor find their text anywhere they can read: every file of the repository a learner
        # can open, searched for the hidden tests' and the notes' own lines.
        leaks = _learner_scan(L2)
        assert leaks == [], f"instructor-only text readable by a learner: {leaks[:10]}"
        timings["learner reads (s)"] = time.monotonic() - t0

        with Browser(*tools) as browser:
            try:
                from selenium.webdriver.common.by import By
                from selenium.webdriver.common.keys import Keys
                d = browser.driver
                step = Step(d)
                d.get(f"{url}/hub/login")
                _wait(lambda: d.find_element(By.ID, "username_input"), 30, "the login page")
                step.shot("learner1-login-page")
                _login(d, url, L1, password)
                timings["learner1 server up"] = time.monotonic() - started
                step.shot("learner1-jupyterlab")

                # A learner's Nbgrader menu: the Assignments tab only.
                commands = _nbgrader_menu(d)
                step.shot("learner1-nbgrader-menu-assignments-only")
                assert commands == ["nbgrader:open-assignment-list"], commands
                _click_menu_item(d, "nbgrader:open-assignment-list")
                row = _wait(lambda: [r for r in _list(d, "released") if AID in r.text], 60,
                            "00_setup among the released assignments")[0]
                page = d.find_element(By.ID, "nbgrader-assignment-list").text
                assert "does not exist" not in page and "rror" not in page, page
                step.shot("learner1-assignments-released")

                _button(row, "fetch").click()
                row = _wait(lambda: [r for r in _list(d, "fetched") if AID in r.text], 60,
                            "00_setup among the downloaded assignments")[0]
                step.shot("learner1-assignments-fetched")
                fetched = f"/home/{L1}/{AID}/{AID}.ipynb"
                with open(fetched) as f:
                    text = f.read()
                for marker in ("### BEGIN SOLUTION", "BEGIN HIDDEN TESTS", *_secret_lines()):
                    assert marker not in text, f"the fetched notebook holds {marker!r}"

                # Learner 1 solves it: the solution's code in the solution cells of the copy.
                with open(fetched, "w") as f:
                    json.dump(solution_as_submission(AID), f, indent=1)
                os.chown(fetched, *[int(_run(["id", flag, L1])) for flag in ("-u", "-g")])

                _js_click(d, row.find_element(By.CSS_SELECTOR, ".assignment-notebooks-link"))
                validate = _wait(lambda: _button(row, "Validate"), 10, "the Validate button")
                _js_click(d, validate)
                dialog = _wait(lambda: d.find_elements(
                    By.CSS_SELECTOR, ".nbgrader-SuccessDialog, .nbgrader-ErrorDialog"), 240,
                    "the validation result")[0]
                step.shot("learner1-validate-result")
                assert d.find_elements(By.CSS_SELECTOR, "#validation-message.validation-success"), \
                    dialog.text
                d.find_element(By.CSS_SELECTOR, ".jp-Dialog-button.jp-mod-accept").click()
                timings["validated"] = time.monotonic() - started

                row = [r for r in _list(d, "fetched") if AID in r.text][0]
                _button(row, "Submit").click()
                _wait(lambda: [r for r in _list(d, "submitted") if AID in r.text], 60,
                      "00_setup among the submitted assignments")
                step.shot("learner1-assignments-submitted")

                # Learner 2 hands in the blank copy from a terminal (nbgrader CLI, same exchange).
                for args in (["fetch_assignment", AID], ["submit", AID]):
                    p = _as(L2, f"{VENV}/bin/nbgrader", *args)
                    assert p.returncode == 0, p.stdout + p.stderr
                # ...and cannot list the submissions in the exchange (learner 1's among them).
                inbound = f"{HUB_ROOT}/exchange/zero-by-hand/inbound"
                p = _as(L2, "ls", inbound)
                assert p.returncode != 0 and "Permission denied" in p.stderr, p.stdout
                # Then learner 2 submits the blank copy AS LEARNER 1 (nbgrader's own --student):
                # an inbound entry named for learner 1, newer than learner 1's real submission.
                time.sleep(1.1)
                p = _as(L2, f"{VENV}/bin/nbgrader", "submit", AID, f"--student={L1}")
                assert p.returncode == 0, p.stdout + p.stderr
                l2_uid = int(_run(["id", "-u", L2]))
                forged = [e for e in glob.glob(f"{inbound}/{L1}+{AID}+*")
                          if os.lstat(e).st_uid == l2_uid]
                assert len(forged) == 1, os.listdir(inbound)

                # The instructor's Nbgrader menu has Formgrader, which opens on the course.
                d.get(f"{url}/hub/logout")
                _login(d, url, INSTRUCTOR, password)
                commands = _nbgrader_menu(d)
                assert "nbgrader:open-formgrader" in commands, commands
                _click_menu_item(d, "nbgrader:open-formgrader")
                _wait(lambda: d.find_elements(By.CSS_SELECTOR, "#formgrader iframe"), 30,
                      "the Formgrader panel")
                d.switch_to.frame(d.find_element(By.CSS_SELECTOR, "#formgrader iframe"))
                # Its table of assignments fills in from its API: 00_setup, released.
                _wait(lambda: AID in d.find_element(By.TAG_NAME, "body").text, 60,
                      "00_setup in Formgrader's Manage Assignments")
                # ...served under the policy that runs no inline script but the server's own:
                # formgrader's own (nonced) scripts filled the table above; a script added to
                # the page, as a sanitizer miss would add it, is refused.
                ran = d.execute_script(
                    "const s = document.createElement('script'); s.textContent = 'window.zcRan = 1';"
                    "document.body.appendChild(s); return window.zcRan === 1;")
                assert ran is False, "an inline script ran in the instructor's formgrader"
                d.switch_to.default_content()
                step.shot("instructor-formgrader")
                d.find_element(By.TAG_NAME, "body").send_keys(Keys.ESCAPE)

                # Grading: collect, autograde (autograder/grade.py), release feedback.
                timings["before grading"] = time.monotonic() - started
                out = _run([os.path.join(HUB, "grade.sh"), AID, "--root", HUB_ROOT], timeout=900)
                timings["graded"] = time.monotonic() - started
                with open(f"{HUB_ROOT}/graded/{AID}/grades.csv") as f:
                    rows = {r["student_id"]: r for r in csv.DictReader(f)}
                assert set(rows) == {L1, L2}, (rows, out)
                full = float(rows[L1]["max_score"])
                # Learner 1's own submission is graded, not the newer forgery; learner 2's row
                # says what was refused and why (collect refused it: autograder/exchange.py).
                assert full > 0 and float(rows[L1]["score"]) == full, rows[L1]
                assert rows[L1]["status"] == "graded", rows[L1]
                assert float(rows[L2]["score"]) == 0, rows[L2]
                why = f"refused: inbound entry '{os.path.basename(forged[0])}' names {L1} but " \
                      f"the entry is owned by {L2}"
                assert rows[L2]["status"].startswith("graded; " + why), rows[L2]
                # grade.py's own inbound mode on the exchange's entry refuses it the same way.
                t0 = time.monotonic()
                only = os.path.join(HUB_ROOT, "forged-inbound")
                os.makedirs(only)
                _run(["cp", "-a", forged[0], only])          # -a: owner and modes kept
                _run([f"{VENV}/bin/python", os.path.join(ROOT, "autograder", "grade.py"), only,
                      os.path.join(HUB_ROOT, "graded", "forged")], timeout=300)
                with open(os.path.join(HUB_ROOT, "graded", "forged", "grades.csv")) as f:
                    forged_rows = list(csv.DictReader(f))
                assert [(r["student_id"], r["status"]) for r in forged_rows] == [(L2, why + (
                    "; only a learner's own account can submit as that learner"))], forged_rows
                timings["grade.py inbound refusal (s)"] = time.monotonic() - t0

                # Learner 1 fetches the feedback from the Assignments tab and opens it.
                d.get(f"{url}/hub/logout")
                _login(d, url, L1, password)
                if not d.find_elements(By.ID, "nbgrader-assignment-list"):
                    _nbgrader_menu(d)
                    _click_menu_item(d, "nbgrader:open-assignment-list")
                row = _wait(lambda: [r for r in _list(d, "submitted") if AID in r.text], 60,
                            "00_setup among the submitted assignments")[0]
                _wait(lambda: "feedback available to fetch" in row.text, 10, "feedback to fetch")
                _button(row, "Fetch Feedback").click()
                row = _wait(lambda: [r for r in _list(d, "submitted")
                                     if AID in r.text and "view feedback" in r.text], 60,
                            "the (view feedback) link")[0]
                step.shot("learner1-feedback-fetched")
                html = glob.glob(f"/home/{L1}/{AID}/feedback/*/{AID}.html")
                assert len(html) == 1, html
                rel = os.path.relpath(html[0], f"/home/{L1}")
                d.get(f"{url}/user/{L1}/files/{rel}")
                body = _wait(lambda: d.find_element(By.TAG_NAME, "body").text, 30, "the feedback")
                step.shot("learner1-feedback-page")
                assert re.search(rf"Score: {full:g}(\.0)? / {full:g}", body) or \
                    f"{full:g} / {full:g}" in body.replace(".0", ""), body[:500]
                d.get(f"{url}/hub/logout")
                timings["feedback opened"] = time.monotonic() - started

            except BaseException:
                step.shot("failure")            # the page where it stopped
                raise

        # Nothing secret in either learner's home: no hidden tests anywhere (learner 1's
        # notebook holds the solution the test put there, so only learner 2 is checked for it).
        hidden = ["BEGIN HIDDEN TESTS"] + [ln for ln in _secret_lines()
                                           if ln not in json.dumps(solution_as_submission(AID))]
        assert _grep_home(L1, hidden) == []
        assert _grep_home(L2, ["### BEGIN SOLUTION", *hidden, *_secret_lines()]) == []
    except BaseException as e:
        failure = e
        raise
    finally:
        log = os.path.join(HUB_ROOT, "jupyterhub.log")
        if os.path.exists(log):
            shutil.copy(log, os.path.join(ARTIFACTS, "jupyterhub.log"))
        down = subprocess.run([os.path.join(HUB, "teardown.sh"), "--root", HUB_ROOT],
                              capture_output=True, text=True, timeout=180)
        time.sleep(0.5)
        left = _leftovers(uids)
        with open(os.path.join(ARTIFACTS, "timings.json"), "w") as f:
            json.dump({**{k: round(v, 1) for k, v in timings.items()},
                       "total": round(time.monotonic() - started, 1)}, f, indent=1)
        if failure is None:
            with open(os.path.join(ARTIFACTS, "jupyterhub.log")) as f:   # servers log here too
                assert "does not exist" not in f.read(), "a server warned about a missing folder"
            assert down.returncode == 0, down.stdout + down.stderr
            assert left == [], f"left running after teardown: {left}"
            for u in (INSTRUCTOR, L1, L2):
                assert subprocess.run(["id", u], capture_output=True).returncode != 0, u
            assert not os.path.exists(HUB_ROOT)
            assert os.stat(os.path.join(ROOT, "solutions")).st_mode & 0o007 == \
                os.stat(os.path.join(ROOT, "notebooks")).st_mode & 0o007, "modes not restored"
