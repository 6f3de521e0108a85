"""The course as a learner sees it: notebooks run in JupyterLab and Notebook 7, in headless Chromium.

What a learner does, through the menus: open the notebook, Run > Run All Cells; where a stub
stops the run, select the next cell and Run All Below. Checked on the rendered page: no error
but the stubs' NotImplementedError, each launch's "[rank r]" lines in the cell that launched,
tqdm progress bars rendered as widgets, the memory calculator's slider redrawing its figure.
Screenshots (artifacts/browser/, or $ZEROCOURSE_BROWSER_ARTIFACTS) include the three the
README shows: the environment check, the memory calculator and the ZeRO-3 timeline
(`make screenshots` copies them to docs/screenshots/).

And nothing learner-authored runs in a browser: a hostile submission graded by grade.py, then
shown in formgrader (served as `make formgrader` serves it) and as feedback (issue 25 item 5).
"""
import json
import os
import shutil
import time
import pytest

from tests.browser import Browser, BrowserUnavailable, JupyterServer, browser_tools, wait_until
from tests.fixtures.make_submission import load, solution_as_submission

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARTIFACTS = os.environ.get("ZEROCOURSE_BROWSER_ARTIFACTS", os.path.join(ROOT, "artifacts", "browser"))
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


@pytest.fixture(scope="module")
def tools():
    try:
        return browser_tools()
    except BrowserUnavailable as e:
        pytest.skip(f"no browser for the end-to-end test: {e}")


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """A learner's folder, as `make lab` makes it: the release copies, plus finished copies
    (stubs filled with the solutions, as a learner who did the work has them)."""
    os.makedirs(ARTIFACTS, exist_ok=True)
    root = tmp_path_factory.mktemp("my-notebooks")
    for aid in ("00_setup", "01_bytes_per_parameter"):
        shutil.copytree(os.path.join(ROOT, "notebooks", aid), root / aid)
    for aid in ("01_bytes_per_parameter", "05_zero3", "07_overlap", "08_accumulation_and_activations"):
        (root / f"{aid}-done").mkdir()
        with open(root / f"{aid}-done" / f"{aid}.ipynb", "w") as f:
            json.dump(solution_as_submission(aid), f)
    return root


@pytest.fixture(scope="module")
def browser(tools):
    with Browser(*tools) as b:
        yield b


def _server(app, course):
    return JupyterServer(app, str(course), os.path.join(ARTIFACTS, f"jupyter-{app}.log"))


@pytest.fixture(scope="module")
def lab(course):
    server = _server("lab", course)
    with server:
        yield server
    assert server.left_behind == [], f"processes left after JupyterLab stopped: {server.left_behind}"


def _errors(cells):
    return [(i, o["ename"], o.get("evalue", "")[:3000]) for i, c in enumerate(cells)
            for o in c["outputs"] if o["output_type"] == "error"]


def _text(cell):
    return "".join(o.get("text", "") for o in cell["outputs"] if o["output_type"] == "stream")


def _shot(browser, name, node=None):
    path = os.path.join(ARTIFACTS, name)
    if node is None:
        browser.driver.save_screenshot(path)
    else:                                # the notebook scrolls inside the page: bring it in view
        browser.driver.execute_script("arguments[0].scrollIntoView({block: 'start'})", node)
        time.sleep(0.3)
        node.screenshot(path)
    assert os.path.getsize(path) > 1000, f"empty screenshot {path}"
    return path


def _check_setup_notebook(browser, page, shots: str):
    """00_setup as released: every cell ran, only stubs failed, rank lines where they belong,
    the launch sweep's tqdm bar is a widget that reached 4/4."""
    page.run_all()
    page.run_past_errors()
    cells = page.cells()
    _shot(browser, f"{shots}-00_setup-page.png")
    with open(os.path.join(ARTIFACTS, f"{shots}-00_setup-cells.json"), "w") as f:
        json.dump(cells, f, indent=1)           # the whole outputs, for a failure's post-mortem
    code = [c for c in cells if c["type"] == "code" and c["source"].strip()]
    assert all(c["count"] is not None for c in code), [c["count"] for c in code]
    errors = _errors(cells)
    assert errors, "the release copy has stubs: some cells must raise NotImplementedError"
    unexpected = "\n\n".join(f"cell {i}: {name}: {text}" for i, name, text in errors
                             if name != "NotImplementedError")
    assert not unexpected, unexpected

    hello = page.index_of("launch(hello, 2)")
    for r in range(2):
        assert f"[rank {r}] hello from rank {r} of 2" in _text(cells[hello])
    for r in range(4):
        assert f"[rank {r}] hello from rank {r} of 4" in _text(cells[hello])
    others = [i for i, c in enumerate(cells) if i != hello and "hello from rank" in _text(c)]
    assert others == [], f"rank output leaked into cells {others}"

    sweep = page.index_of("launch sweep over N")
    assert any(WIDGET_MIME in o.get("data", {}) for o in cells[sweep]["outputs"]), \
        "the tqdm bar was not sent as a widget"
    node = page.cell_node(sweep)
    page.wait_for(lambda: node.find_elements("css selector", ".widget-hprogress"), 20,
                  "the tqdm progress widget to render")
    page.wait_for(lambda: "4/4" in node.text, 20, "the progress bar to reach 4/4")
    assert node.find_elements("css selector", ".jp-OutputArea-output img"), "no figure under the sweep"
    return cells


def _check_memory_calculator(browser, page, shot: str | None):
    """The finished 01: no error at all; dragging the calculator's ranks slider redraws it."""
    from selenium.webdriver.common.action_chains import ActionChains
    page.run_all()
    cells = page.cells()
    assert _errors(cells) == []
    node = page.cell_node(page.index_of("memory_calculator(bytes_per_parameter"))
    page.wait_for(lambda: len(node.find_elements("css selector", ".widget-slider")) >= 3, 30,
                  "the calculator's sliders to render")
    img = node.find_elements("css selector", ".widget-image")
    assert img, "the calculator's figure (an Image widget) did not render"
    sliders = node.find_elements("css selector", ".widget-slider")
    size = next(s for s in sliders if "parameters" in s.text)
    ranks = next(s for s in sliders if "ranks N" in s.text)
    assert "7.5B" in size.text, f"the size slider moved the notebook's 7.5B: {size.text!r}"
    assert ranks.text.split()[-1] == "64", ranks.text
    before_src, before_text = img[0].get_attribute("src"), node.text
    if shot:
        _shot(browser, shot, node.find_element("css selector", ".jp-Cell-outputWrapper"))
    handle = ranks.find_element("css selector", ".noUi-handle")
    ActionChains(browser.driver).click_and_hold(handle).move_by_offset(-60, 0).release().perform()
    page.wait_for(lambda: ranks.text.split()[-1] != "64", 10, "the slider's readout to change")
    page.wait_for(lambda: img[0].get_attribute("src") != before_src, 30,
                  "the figure to change after moving the slider")
    page.wait_for(lambda: node.text != before_text, 30,
                  f"the calculator's verdict to follow the slider (N = {ranks.text.split()[-1]})")


def test_jupyterlab_setup_notebook(browser, lab):
    page = browser.open(lab, "00_setup/00_setup.ipynb")
    cells = _check_setup_notebook(browser, page, "lab")
    env = page.index_of("check_environment()")
    assert "torch" in _text(cells[env]) and "❌" not in _text(cells[env]), _text(cells[env])
    _shot(browser, "environment_check.png", page.cell_node(env))     # code and its output


def test_jupyterlab_bytes_notebook_release_copy(browser, lab):
    page = browser.open(lab, "01_bytes_per_parameter/01_bytes_per_parameter.ipynb")
    page.run_all()
    rounds = page.run_past_errors()
    cells = page.cells()
    errors = _errors(cells)
    assert rounds >= 1 and errors
    assert {e[1] for e in errors} == {"NotImplementedError"}, errors
    _shot(browser, "lab-01-release-page.png")


def test_jupyterlab_memory_calculator(browser, lab):
    page = browser.open(lab, "01_bytes_per_parameter-done/01_bytes_per_parameter.ipynb")
    _check_memory_calculator(browser, page, "memory_calculator.png")


def test_jupyterlab_zero3_timeline(browser, lab):
    """The finished 05: the cells the timeline needs (definitions and the demo), not the tests."""
    nb = load("notebooks", "05_zero3")
    page = browser.open(lab, "05_zero3-done/05_zero3.ipynb")
    target = page.index_of("unit gathered (rank 0)")
    needed = [i for i, c in enumerate(nb["cells"][:target + 1])
              if c["cell_type"] == "code" and not c["metadata"].get("nbgrader", {}).get("grade")]
    page.run_cells(needed)
    cells = page.cells()
    assert _errors(cells) == []
    assert "not ready" not in _text(cells[target - 2]), _text(cells[target - 2])
    node = page.cell_node(target)
    imgs = node.find_elements("css selector", ".jp-OutputArea-output img")
    assert imgs, "the timeline figure did not render"
    _shot(browser, "zero3_timeline.png", imgs[0])


def _run_up_to(page, aid, snippet):
    """Run the finished notebook's code cells up to the one containing `snippet` (its demos and
    definitions, not the graded tests); returns the cells and that cell's index."""
    nb = load("notebooks", aid)
    target = page.index_of(snippet)
    needed = [i for i, c in enumerate(nb["cells"][:target + 1])
              if c["cell_type"] == "code" and not c["metadata"].get("nbgrader", {}).get("grade")]
    page.run_cells(needed, timeout=300)
    cells = page.cells()
    assert _errors(cells) == []
    return cells, target


def _figure(browser, page, target, shot):
    node = page.cell_node(target)
    imgs = node.find_elements("css selector", ".jp-OutputArea-output img")
    assert imgs, f"the figure of cell {target} did not render"
    _shot(browser, shot, imgs[0])


def test_jupyterlab_overlap_timeline(browser, lab):
    """The finished 07: the measured timelines (all-reduce after backward vs buckets during
    backward) render, from the learner's OverlappedDP."""
    page = browser.open(lab, "07_overlap-done/07_overlap.ipynb")
    cells, target = _run_up_to(page, "07_overlap", "all-reduce after backward vs buckets during backward")
    text = _text(cells[target])
    assert "not ready" not in text and "overlapped:" in text, text
    _figure(browser, page, target, "overlap_timeline.png")


def test_jupyterlab_checkpointing_bars(browser, lab):
    """The finished 08: the two bars of checkpointing on ZeRO-3 (bytes kept for backward down,
    all-gathers up) render; without a sibling 05 the demo says it used torch FSDP2."""
    page = browser.open(lab, "08_accumulation_and_activations-done/08_accumulation_and_activations.ipynb")
    cells, target = _run_up_to(page, "08_accumulation_and_activations", "kB kept for backward after forward")
    text = _text(cells[target])
    assert "ZeRO-3 used:" in text and "with checkpointing" in text, text
    _figure(browser, page, target, "checkpointing_bars.png")


def test_notebook7(browser, course):
    """Notebook 7 (`jupyter notebook`): the same learner run of 00 and the calculator of 01."""
    nb7 = _server("notebook", course)
    with nb7:
        page = browser.open(nb7, "00_setup/00_setup.ipynb")
        _check_setup_notebook(browser, page, "notebook7")
        page = browser.open(nb7, "01_bytes_per_parameter-done/01_bytes_per_parameter.ipynb")
        _check_memory_calculator(browser, page, None)
        _shot(browser, "notebook7-01-calculator.png")
        assert len(nb7.kernels()) == 2, nb7.kernels()
    assert nb7.left_behind == [], f"processes left after Notebook 7 stopped: {nb7.left_behind}"


# --- Nothing learner-authored runs in a browser (issue 25, item 5) --------------------------------
# One hostile submission of 01 (its figures are PNGs from course cells that run under grading), graded once by autograder/grade.py as `make grade` does, then shown in formgrader
# (served as `make formgrader` serves it) and as feedback. Each payload, if it ran, would set
# window.zcPwned and request http://127.0.0.1:<watcher>/hit/<vector>.
HOSTILE_AID = "01_bytes_per_parameter"


class Watcher:
    """An HTTP server on loopback that records the paths a payload requests."""

    def __init__(self):
        import http.server
        import threading
        hits = self.hits = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                hits.append(self.path)
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def payload(self, vector):
        return (f"window.zcPwned=(window.zcPwned||[]).concat(['{vector}']);"
                f"new Image().src='http://127.0.0.1:{self.port}/hit/{vector}'")

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _hostile_cells(watcher):
    """The three vectors: a text/html output with an event handler, an application/javascript
    output, a markdown cell with an event handler."""
    import nbformat
    html = "<b>bold stays</b><img src=x onerror=" + json.dumps(watcher.payload("html")) + ">"
    return [nbformat.v4.new_code_cell("from IPython.display import HTML, Javascript, display\n"
                                      f"display(HTML({html!r}))"),
            nbformat.v4.new_code_cell(f"display(Javascript({watcher.payload('js')!r}))"),
            nbformat.v4.new_markdown_cell("My answer <img src=x onerror=" +
                                          json.dumps(watcher.payload("md")) + ">")]


HOSTILE_TEST = "test_formgrader_and_feedback_run_nothing_learner_authored"


@pytest.fixture(scope="module", autouse=True)
def hostile_grading(request, tools, tmp_path_factory):
    """Starts grading mallory's hostile submission when the module starts (only if its test is
    selected): grade.py runs while the JupyterLab tests mostly wait on the browser, so the
    grading adds little wall time. Yields (base folder, watcher, process, start time)."""
    import signal
    import subprocess
    import sys
    from tests.fixtures.make_submission import write
    if not any(item.name == HOSTILE_TEST for item in request.session.items):
        yield None
        return
    watcher, proc = Watcher(), None
    try:
        base = tmp_path_factory.mktemp("hostile")
        nb = solution_as_submission(HOSTILE_AID)
        nb["cells"] += _hostile_cells(watcher)
        write(nb, str(base / "subs"), "mallory", HOSTILE_AID)
        with open(base / "grade.log", "w") as log:      # a file: a full pipe would block it
            proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "autograder", "grade.py"),
                                     str(base / "subs"), str(base / "out"), "--jobs", "1"],
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        yield base, watcher, proc, time.monotonic()
    finally:
        if proc is not None and proc.poll() is None:    # the session was cut short
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        watcher.close()


@pytest.fixture(scope="module")
def hostile_graded(hostile_grading):
    """(OUT folder, watcher, (seconds waited here, seconds it ran before)): graded."""
    base, watcher, proc, started = hostile_grading
    t0 = time.monotonic()
    rc = proc.wait(timeout=max(60.0, 900 - (t0 - started)))
    with open(base / "grade.log") as f:
        log = f.read()
    assert rc == 0, f"grade.py exited {rc}:\n{log[-4000:]}"
    return str(base / "out"), watcher, (time.monotonic() - t0, t0 - started)


def _course_figures(aid):
    """How many figures the course's own cells of `aid` draw (each ends in plt.show())."""
    nb = load("solutions", aid)
    return sum("plt.show()" in "".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")


def _nothing_ran(browser, watcher, where):
    time.sleep(1.0)                          # an image request takes a moment to go out
    ran = browser.driver.execute_script("return window.zcPwned || null")
    assert ran is None and watcher.hits == [], f"{where}: payload ran: {ran} {watcher.hits}"


def _figures(browser, where, expected):
    """The course's PNG figures are on the page and decoded by the browser."""
    sizes = browser.driver.execute_script("""
        return Array.from(document.images).filter(i => i.src.startsWith('data:image/png'))
                    .map(i => i.complete ? i.naturalWidth : 0);""")
    assert len(sizes) == expected and all(w > 100 for w in sizes), (where, sizes)


def _inject(browser, watcher):
    """What a sanitizer miss would put in the page: an inline handler and an inline script
    (WebDriver's own script is not subject to the page's CSP; what it inserts is)."""
    browser.driver.execute_script("""
        const d = document.createElement('div');
        d.innerHTML = '<img src="data:," onerror="' + arguments[0] + '">';
        document.body.appendChild(d);
        const s = document.createElement('script');
        s.textContent = arguments[0];
        document.body.appendChild(s);""", watcher.payload("inject"))


def _raw_hostile_cells(watcher):
    """The hostile cells as an autograde without the sanitizer would have written them."""
    html, js, md = _hostile_cells(watcher)
    html.outputs = [{"output_type": "display_data", "metadata": {}, "data": {
        "text/html": "<b>bold stays</b><img src=x onerror=" + json.dumps(watcher.payload("html"))
                     + ">", "text/plain": "<IPython.core.display.HTML object>"}}]
    js.outputs = [{"output_type": "display_data", "metadata": {},
                   "data": {"application/javascript": watcher.payload("js"),
                            "text/plain": "<IPython.core.display.Javascript object>"}}]
    for cell in (html, js):
        cell.execution_count = 1
    return [html, js, md]


def _waiter(driver):
    def wait(cond, timeout, what):
        wait_until(cond, timeout, what, on_timeout=lambda: driver.save_screenshot(
            os.path.join(ARTIFACTS, "hostile-timeout.png")))
    return wait


def _csp_refusals(messages):
    return [m for m in messages if "Content Security Policy" in m]


@pytest.mark.timeout(900)
def test_formgrader_and_feedback_run_nothing_learner_authored(browser, hostile_graded):
    """formgrader (as `make formgrader` runs it) and the feedback page, with the three vectors:
    nothing runs, the course's figures render, formgrader and JupyterLab work under the CSP;
    with the protection off (the controls at the end) the same payloads run and are seen."""
    from nbgrader.api import Gradebook
    out, watcher, (waited, before) = hostile_graded
    t0 = time.monotonic()
    os.makedirs(ARTIFACTS, exist_ok=True)
    nb_path = os.path.join(out, "autograded", "mallory", HOSTILE_AID, f"{HOSTILE_AID}.ipynb")
    with open(nb_path) as f:
        graded = json.load(f)
    import csv
    with open(os.path.join(out, "grades.csv")) as f:
        row, = csv.DictReader(f)
    assert row["status"] == "graded" and float(row["score"]) == float(row["max_score"]) > 0, \
        f"the hostile cells changed the solution's score: {row}"
    # On disk (what formgrader reads): no payload in any output, the markdown as literal text.
    outputs = [o for c in graded["cells"] if c["cell_type"] == "code" for o in c["outputs"]]
    assert not [o for o in outputs if "onerror" in json.dumps(o) or
                "application/javascript" in o.get("data", {})], "a payload output survived"
    assert "".join(graded["cells"][-1]["source"]).startswith("> ⚠ **Shown as text by the grader")
    figures = sum("image/png" in o.get("data", {}) for o in outputs)
    assert figures == _course_figures(HOSTILE_AID) > 0, \
        f"the course's figures of {HOSTILE_AID}: {figures} of {_course_figures(HOSTILE_AID)}"

    with Gradebook(f"sqlite:///{out}/gradebook.db") as gb:
        sub = gb.find_submission_notebook(HOSTILE_AID, HOSTILE_AID, "mallory").id
    server = JupyterServer(
        "lab", out, os.path.join(ARTIFACTS, "formgrader.log"),
        args=[f"--config={ROOT}/autograder/formgrader_config.py", "--ServerApp.default_url=/formgrader"],
        env={"ZEROCOURSE_NBGRADER_ROOT": out, "ZEROCOURSE_GRADEBOOK": f"sqlite:///{out}/gradebook.db"})
    d = browser.driver
    page_wait = _waiter(d)
    with server:
        browser.console()
        # JupyterLab itself under the policy: the app and its Nbgrader menu come up, no refusal.
        d.get(server.url + "/lab")
        page_wait(lambda: [e for e in d.find_elements("css selector", ".lm-MenuBar-item")
                           if e.text.strip() == "Nbgrader"], 120, "JupyterLab's Nbgrader menu")
        time.sleep(2)
        assert _csp_refusals(browser.console()) == [], "JupyterLab broke under the CSP"
        # formgrader's own pages: their nonced inline scripts ran (tables filled from the API).
        d.get(server.url + "/formgrader")
        page_wait(lambda: HOSTILE_AID in d.find_element("tag name", "body").text, 60,
                  "Manage Assignments listing the assignment")
        d.get(f"{server.url}/formgrader/gradebook/{HOSTILE_AID}/{HOSTILE_AID}")
        page_wait(lambda: "Submission #1" in d.find_element("tag name", "body").text, 60,
                  "the gradebook listing the submission")
        assert _csp_refusals(browser.console()) == [], "a formgrader page broke under the CSP"

        # The submission view of the sanitized notebook (the autograde step's sanitizer).
        submission_url = f"{server.url}/formgrader/submissions/{sub}/"
        d.get(submission_url)
        page_wait(lambda: d.execute_script("return typeof toggle_name === 'function' && "
                                           "typeof submission_id === 'string'"), 60,
                  "formgrader's inline scripts on the submission view")
        _nothing_ran(browser, watcher, "formgrader, autograded notebook")
        _figures(browser, "formgrader", figures)
        body = d.find_element("tag name", "body").text
        assert "bold stays" in body and "Shown as text by the grader" in body and \
            "My answer <img src=x onerror=" in body, "the learner's text is not shown as text"
        assert _csp_refusals(browser.console()) == []
        _shot(browser, "formgrader-hostile-submission.png")

        # The same view of an autograded notebook that holds the raw payloads (graded by other
        # means, e.g. formgrader's Autograde button): formgrader's exporter sanitizes it.
        raw = json.loads(json.dumps(graded))
        raw["cells"][-3:] = _raw_hostile_cells(watcher)
        with open(nb_path, "w") as f:
            json.dump(raw, f)
        d.get(submission_url)
        page_wait(lambda: d.execute_script("return typeof submission_id === 'string'"), 60,
                  "the submission view")
        _nothing_ran(browser, watcher, "formgrader, raw notebook")
        assert d.execute_script("return document.querySelectorAll('#notebook-container "
                                "[onerror], #notebook-container script').length") == 0

        # The CSP alone: what a sanitizer miss would add to the page is refused.
        _inject(browser, watcher)
        _nothing_ran(browser, watcher, "formgrader, injected after load")
        refused = _csp_refusals(browser.console())
        assert len(refused) >= 2, f"the CSP did not refuse the injected handler and script: {refused}"
    assert server.left_behind == []

    # Feedback, as a learner or an LMS opens it: a file, no server, no header.
    page = os.path.join(out, "feedback", "mallory", HOSTILE_AID, f"{HOSTILE_AID}.html")
    d.get("file://" + page)
    page_wait(lambda: "Shown as text by the grader" in d.find_element("tag name", "body").text,
              30, "the feedback page")
    _nothing_ran(browser, watcher, "feedback")
    _figures(browser, "feedback", figures)
    _inject(browser, watcher)
    _nothing_ran(browser, watcher, "feedback, injected after load")

    # Controls: with the protection off, this browser runs each payload and the watcher sees
    # it, so every check above can fail. (1) The raw notebook exported by plain nbconvert
    # (no sanitizer, no policy): the three vectors run. (2) The feedback page without its
    # CSP <meta>: the injected handler and script run.
    from nbconvert import HTMLExporter
    import nbformat
    unprotected, _ = HTMLExporter().from_notebook_node(
        nbformat.reads(json.dumps(raw), as_version=4))
    control = os.path.join(os.path.dirname(out), "control-vectors.html")
    with open(control, "w") as f:
        f.write(unprotected)
    d.get("file://" + control)
    vectors = {"/hit/html", "/hit/js", "/hit/md"}
    page_wait(lambda: vectors <= set(watcher.hits), 30, "the unprotected page's three payloads")
    assert sorted(d.execute_script("return window.zcPwned")) == ["html", "js", "md"]
    _figures(browser, "unprotected control", figures)
    with open(page) as f:
        bare = f.read().replace('http-equiv="Content-Security-Policy"', 'name="no-csp"')
    control = os.path.join(os.path.dirname(out), "control-feedback.html")
    with open(control, "w") as f:
        f.write(bare)
    d.get("file://" + control)
    _inject(browser, watcher)
    # (both payloads request the same URL: the browser may send it once)
    page_wait(lambda: d.execute_script("return window.zcPwned") == ["inject", "inject"] and
              "/hit/inject" in watcher.hits, 10, "the bare feedback page's injected payloads to run")
    print(f"\nhostile formgrader/feedback: waited {waited:.0f} s for grading (started "
          f"{before:.0f} s earlier), browser checks {time.monotonic() - t0:.0f} s")
