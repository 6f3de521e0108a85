"""The course as a learner sees it: notebooks run in JupyterLab and Notebook 7, in headless Chromium.

What a learner does, through the menus: open the notebook, Run > Run All Cells; where a stub
stops the run, select the next cell and Run All Below. Checked on the rendered page: no error
but the stubs' NotImplementedError, each launch's "[rank r]" lines in the cell that launched,
tqdm progress bars rendered as widgets, the memory calculator's slider redrawing its figure.
Screenshots (artifacts/browser/, or $ZEROCOURSE_BROWSER_ARTIFACTS) include the three the
README shows: the environment check, the memory calculator and the ZeRO-3 timeline
(`make screenshots` copies them to docs/screenshots/).
"""
import json
import os
import shutil
import time
import pytest

from tests.browser import Browser, BrowserUnavailable, JupyterServer, browser_tools
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
