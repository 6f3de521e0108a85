"""Drive the course's notebooks in a real browser: JupyterLab or Notebook 7, headless Chromium.

    tools = browser_tools()                       # (chromium, chromedriver), installing them if
                                                  # it can; raises BrowserUnavailable otherwise
    with JupyterServer("lab", notebook_dir) as server, Browser(*tools) as browser:
        page = browser.open(server, "00_setup/00_setup.ipynb")   # waits for an idle kernel
        page.run_all()                  # Run > Run All Cells, from the menu bar
        page.run_past_errors()          # after a stub's error, Run All Below from the next cell
        cells = page.cells()            # [{"type", "source", "outputs", "count"}] (the models)
        page.cell_node(i)               # the cell's DOM node (a WebElement), scrolled into view

The server runs with `make lab`'s setup (the course's .venv, its notebook folder) plus what a
test needs: loopback only, no token, the app exposed as window.jupyterapp (to read cell models
and wait for the kernel), and settings, workspaces and runtime files in a private folder (no
news pop-up, no restored layout). Stopping it shuts its kernels down; no process is left.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

BIN = os.path.dirname(sys.executable)
# Chromium on a machine without network or display (see the environment notes in README).
CHROME_FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1280,1800", "--force-device-scale-factor=1"]
APT_PACKAGES = ["chromium", "chromium-driver", "fonts-noto-color-emoji"]


def wait_until(cond, timeout: float, what: str, interval: float = 0.25, describe=None,
               on_timeout=None) -> None:
    """Poll cond() until it is true; an exception from it counts as not yet (a page loading).

    Args:
        cond: a function of no arguments.
        timeout: seconds before TimeoutError("waited <timeout> s for <what> (<describe()>)").
        what: what is waited for, in the error.
        interval: seconds between polls.
        describe: a function giving the state to add to the error (e.g. the kernel's status).
        on_timeout: called before the error is raised (e.g. to save a screenshot).
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            if cond():
                return
        except Exception:                   # the page is still loading
            pass
        if time.monotonic() > deadline:
            if on_timeout is not None:
                on_timeout()
            extra = f" ({describe()})" if describe is not None else ""
            raise TimeoutError(f"waited {timeout:g} s for {what}{extra}")
        time.sleep(interval)


class BrowserUnavailable(RuntimeError):
    """Chromium or ChromeDriver is missing and could not be installed (the test skips)."""


def browser_tools() -> tuple[str, str]:
    """Paths of chromium and chromedriver; installs Debian's packages first if root can.

    Raises:
        BrowserUnavailable: with the reason, when they are missing and cannot be installed.
    """
    def found():
        chrome = shutil.which("chromium") or shutil.which("chromium-browser")
        driver = shutil.which("chromedriver")
        return (chrome, driver) if chrome and driver else None

    if found():
        return found()
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise BrowserUnavailable("chromium and chromedriver are not installed and this user cannot "
                                 "apt-get them: sudo apt-get install " + " ".join(APT_PACKAGES))
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *APT_PACKAGES]):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise BrowserUnavailable(f"could not install the browser ({' '.join(cmd)} exited "
                                     f"{proc.returncode}): {proc.stderr.strip()[-500:]}")
    if not found():
        raise BrowserUnavailable("apt-get installed " + " ".join(APT_PACKAGES) +
                                 " but chromium/chromedriver are still not on PATH")
    return found()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JupyterServer:
    """`jupyter lab` or `jupyter notebook` (Notebook 7) on 127.0.0.1, no token, for one test.

    Args:
        app: "lab" or "notebook".
        notebook_dir: the folder it serves (as `make lab` serves my-notebooks/).
        log_path: where the server's output goes (a test artifact).
    """

    def __init__(self, app: str, notebook_dir: str, log_path: str, args: list[str] = (),
                 env: dict | None = None):
        """args: more command-line options (e.g. --config=...); env: more variables."""
        assert app in ("lab", "notebook"), app
        self.app, self.notebook_dir, self.log_path = app, notebook_dir, log_path
        self.args, self.env = list(args), dict(env or {})
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None
        self._home = None
        self.left_behind: list[int] = []

    def __enter__(self):
        self._home = tempfile.mkdtemp(prefix="zc-jupyter-")
        settings = os.path.join(self._home, "settings", "@jupyterlab", "apputils-extension")
        os.makedirs(settings)
        with open(os.path.join(settings, "notification.jupyterlab-settings"), "w") as f:
            json.dump({"fetchNews": "false", "checkForUpdates": False}, f)
        env = dict(os.environ,
                   PATH=BIN + os.pathsep + os.environ.get("PATH", ""),
                   JUPYTER_CONFIG_DIR=os.path.join(self._home, "config"),
                   JUPYTER_RUNTIME_DIR=os.path.join(self._home, "runtime"),
                   JUPYTERLAB_SETTINGS_DIR=os.path.join(self._home, "settings"),
                   JUPYTERLAB_WORKSPACES_DIR=os.path.join(self._home, "workspaces"),
                   **self.env)
        args = [os.path.join(BIN, "jupyter"), self.app, "--no-browser", "--ip=127.0.0.1",
                f"--port={self.port}", "--ServerApp.port_retries=0", "--IdentityProvider.token=",
                "--ServerApp.password=", f"--notebook-dir={self.notebook_dir}",
                "--expose-app-in-browser", *self.args]
        if os.geteuid() == 0:
            args.append("--allow-root")
        log = open(self.log_path, "w")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env,
                                     cwd=self.notebook_dir, start_new_session=True)
        log.close()
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(self.url + "/api/status", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__(None, None, None)
                with open(self.log_path) as f:
                    raise RuntimeError(f"jupyter {self.app} did not start:\n{f.read()[-3000:]}")
            time.sleep(0.3)

    def kernels(self) -> list[dict]:
        with urllib.request.urlopen(self.url + "/api/kernels", timeout=5) as r:
            return json.load(r)

    def processes(self) -> list[int]:
        """PIDs of this server and everything it started (kernels, fork servers, ranks): they
        all inherit its private JUPYTER_RUNTIME_DIR, even after being orphaned."""
        marker = f"JUPYTER_RUNTIME_DIR={os.path.join(self._home, 'runtime')}".encode()
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != os.getpid():
                try:
                    with open(f"/proc/{entry}/environ", "rb") as f:
                        if marker in f.read().split(b"\0"):
                            pids.append(int(entry))
                except OSError:
                    pass
        return pids

    def __exit__(self, *exc):
        # Shut every kernel down through the API (kernels live in their own sessions), then
        # the server; SIGKILL what is left. `left_behind` says what had to be killed.
        try:
            for k in self.kernels():
                req = urllib.request.Request(f"{self.url}/api/kernels/{k['id']}", method="DELETE")
                urllib.request.urlopen(req, timeout=10).close()
        except OSError:
            pass
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while self.processes() and time.monotonic() < deadline:
            time.sleep(0.2)
        self.left_behind = self.processes()
        for pid in self.left_behind:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        shutil.rmtree(self._home, ignore_errors=True)


class Browser:
    """Headless Chromium through Debian's ChromeDriver (Selenium; nothing is downloaded)."""

    def __init__(self, chromium: str, chromedriver: str):
        self.chromium, self.chromedriver = chromium, chromedriver
        self.driver = None
        self._profile = None

    def __enter__(self):
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
        self._profile = tempfile.mkdtemp(prefix="zc-chromium-")
        opts = webdriver.ChromeOptions()
        opts.binary_location = self.chromium
        for flag in CHROME_FLAGS + [f"--user-data-dir={self._profile}"]:
            opts.add_argument(flag)
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})    # console: CSP reports
        self.driver = webdriver.Chrome(service=Service(self.chromedriver), options=opts)
        self.driver.set_script_timeout(30)
        return self

    def console(self) -> list[str]:
        """Console messages since the last call (Chromium's, e.g. "Refused to execute...")."""
        return [e.get("message", "") for e in self.driver.get_log("browser")]

    def __exit__(self, *exc):
        if self.driver is not None:
            self.driver.quit()
        shutil.rmtree(self._profile, ignore_errors=True)

    def open(self, server: JupyterServer, path: str, timeout: float = 90) -> "NotebookPage":
        """Open a notebook (path relative to the server's folder) and wait for an idle kernel."""
        prefix = "lab/tree" if server.app == "lab" else "notebooks"
        self.driver.get(f"{server.url}/{prefix}/{path}")
        page = NotebookPage(self.driver, path)
        # The app may restore earlier tabs: wait for THIS notebook to be the current one.
        page.wait_for(lambda: page.js("return nb() ? nb().context.path : null") == path, timeout,
                      "the notebook to open")
        page.wait_for(lambda: page.status() == "idle", timeout, "an idle kernel")
        return page


# JavaScript run in the page. `nb()` is the open notebook panel in JupyterLab and Notebook 7.
_JS_NB = """
const app = window.jupyterapp;
const nb = () => {
  const w = app && app.shell.currentWidget;
  return (w && w.content && w.content.widgets && w.sessionContext) ? w : null;
};
"""


class NotebookPage:
    """One open notebook: run it from the menus, read its cells, find their DOM nodes."""

    def __init__(self, driver, path: str):
        self.driver, self.path = driver, path

    def js(self, body: str, *args):
        return self.driver.execute_script(_JS_NB + body, *args)

    def status(self) -> str:
        return self.js("""
            const w = nb();
            if (!w) return app ? 'no notebook yet' : 'app not loaded';
            const s = w.sessionContext.session;
            return (s && s.kernel) ? w.sessionContext.kernelDisplayStatus : 'no kernel';""")

    def wait_for(self, cond, timeout: float, what: str, interval: float = 0.25):
        wait_until(cond, timeout, f"{self.path}: {what}", interval,
                   describe=lambda: f"kernel: {self.status()}")

    def click_menu(self, menu: str, command: str) -> None:
        """Click a menu of the menu bar, then the item that runs `command`, like a user."""
        from selenium.webdriver.common.by import By
        bar = [e for e in self.driver.find_elements(By.CSS_SELECTOR, ".lm-MenuBar-item")
               if e.text.strip() == menu]
        assert bar, f"no {menu!r} menu in the menu bar"
        bar[0].click()
        item = f'.lm-Menu-item[data-command="{command}"]'
        self.wait_for(lambda: self.driver.find_elements(By.CSS_SELECTOR, item), 10,
                      f"menu item {command}")
        self.driver.find_elements(By.CSS_SELECTOR, item)[0].click()

    def busy(self) -> bool:
        return self.js("""
            const w = nb();
            // Cells scrolled out of view may not be rendered (no prompt node): ask the model too.
            const pending = w.content.widgets.some(c => c.model.type === 'code' && (
              c.model.executionState === 'running' ||
              (c.promptNode && (c.promptNode.textContent || '').includes('*'))));
            return pending || w.sessionContext.kernelDisplayStatus !== 'idle';""")

    def wait_idle(self, timeout: float) -> None:
        """Wait until no cell is queued or running and the kernel is idle (twice in a row)."""
        time.sleep(0.5)
        calm = [0]

        def idle():
            calm[0] = 0 if self.busy() else calm[0] + 1
            return calm[0] >= 2
        self.wait_for(idle, timeout, "the cells to finish", interval=0.5)

    def run_all(self, timeout: float = 180) -> None:
        """Run > Run All Cells; returns when the kernel is idle again."""
        self.click_menu("Run", "runmenu:run-all")
        self.wait_idle(timeout)

    def run_past_errors(self, timeout: float = 180, max_rounds: int = 40) -> int:
        """Run All stops at a cell that raises (a learner's stub). Like a learner who moves on,
        select the next cell and Run All Below, until every code cell has run. Returns rounds."""
        for rounds in range(max_rounds):
            nxt = self.js("""
                const cells = nb().content.widgets;
                for (let i = 0; i < cells.length; i++) {
                  const c = cells[i];
                  if (c.model.type !== 'code') continue;
                  if (c.model.executionCount === null && c.model.sharedModel.getSource().trim())
                    return i;
                }
                return -1;""")
            if nxt < 0:
                return rounds
            self.js("nb().content.activeCellIndex = arguments[0];", nxt)
            self.js("app.commands.execute('notebook:run-all-below');")
            self.wait_idle(timeout)
        raise AssertionError(f"{self.path}: cells still not run after {max_rounds} rounds")

    def cells(self) -> list[dict]:
        """Every cell's type, source, outputs (nbformat JSON, as the front end holds them) and
        execution count (None: never run)."""
        return self.js("""
            return nb().content.widgets.map(c => ({
              type: c.model.type,
              source: c.model.sharedModel.getSource(),
              outputs: c.model.type === 'code' ? c.model.outputs.toJSON() : [],
              count: c.model.type === 'code' ? c.model.executionCount : null}));""")

    def index_of(self, snippet: str) -> int:
        found = [i for i, c in enumerate(self.cells()) if snippet in c["source"]]
        assert len(found) == 1, f"{self.path}: {len(found)} cells contain {snippet!r}"
        return found[0]

    def cell_node(self, index: int):
        """The cell's DOM node, scrolled to the top of the view (rendered even if windowed)."""
        self.js("nb().content.activeCellIndex = arguments[0];", index)
        node = self.js("const n = nb().content.widgets[arguments[0]].node; "
                       "n.scrollIntoView({block: 'start'}); return n;", index)
        time.sleep(0.3)
        return node

    def run_cells(self, indices: list[int], timeout: float = 180) -> None:
        """Run only these cells, in order (a test that needs a few cells of a long notebook)."""
        for i in indices:
            self.js("nb().content.activeCellIndex = arguments[0];", i)
            self.js("app.commands.execute('notebook:run-cell');")
            self.wait_idle(timeout)
