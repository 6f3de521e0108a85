"""Split grading: learner code runs in one kernel, verdicts are computed in another.

nbgrader's own Execute runs every cell, tests included, in the learner's kernel and
then reads the score off the outputs that kernel produced, which the learner's code
can forge (IPython hooks, input transformers, exception handlers, patched torch or
zerocourse, objects with a forged `__eq__`). `SplitExecute` replaces it:

- the LEARNER kernel runs every cell except the graded test cells, as the learner
  wrote them; it also serves the verdict kernel's questions (autograder/learner_rpc.py);
- the VERDICT kernel never runs learner code. It runs the course's own definitions,
  taken from the release copy on the grader's disk (not from the submission), and the
  graded test cells, whose source nbgrader restored from the gradebook. The names the
  assignment asks for are proxies into the learner kernel that carry plain data only
  (autograder/verdict.py); its ranks run learner code in the launcher's trusted mode.

So a test cell's outputs, and with them nbgrader's score, come from code the learner
never touched; a trick in the learner kernel can only change what the learner's own
functions return, which the tests then judge. Also here:
- stderr in a test cell is not a failure (only an exception is): it is shown as stdout;
- a test cell's printed output is reduced to the checks' ✅/❌ lines (ranks' prints,
  which may quote anything, stay in the grader's log);
- a learner cell that hangs beyond the cell timeout or kills its kernel costs only
  itself: the learner kernel is restarted, the cells before it are run again, and
  grading goes on;
- silence is not a pass: a test cell scores only when its source ran to its end in the
  verdict kernel (a nonce printed by its last statement, `verdict.completed`) and, when
  the cell's own check prints a ✅ (a top-level passed(...)), with that ✅;
- output is capped in bytes (ZEROCOURSE_CELL_OUTPUT_BYTES per cell, 4 MiB, and
  ZEROCOURSE_NOTEBOOK_OUTPUT_BYTES per notebook, 16 MiB): past it the cell is stopped,
  the rest of its output dropped as it arrives (never buffered) and the reason recorded
  in the cell; a single huge message is bounded by the submission's memory cgroup;
- IPython's history is off in both kernels (nbclient keeps it only for "python3"), so no
  test cell is ever written to a kernel's disk;
- each phase's time is in the grader's log ("split grading: ...").
"""
from __future__ import annotations

import ast
import asyncio
import builtins
import json
import os
import re
import secrets
import tempfile
import time

import nbformat
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from traitlets import Unicode

from nbgrader.preprocessors import Execute

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
VERDICT_KERNEL = "zc-verdict"
# After a cell timeout, how long an interrupted kernel may take to become idle again before
# it counts as stuck and is restarted (a busy machine delivers interrupts late).
SETTLE_S = 15
# Names IPython itself gives every kernel.
_IPYTHON = {"display", "get_ipython", "In", "Out", "exit", "quit"}
# What a test cell may show the learner: the checks' own lines.
_CHECK_LINE = re.compile(r"^\s*(✅|❌|☑)")
# Bytes of output a cell, and a whole notebook, may produce before the grader stops it.
CELL_OUTPUT_BYTES = int(os.environ.get("ZEROCOURSE_CELL_OUTPUT_BYTES", 4 << 20))
NOTEBOOK_OUTPUT_BYTES = int(os.environ.get("ZEROCOURSE_NOTEBOOK_OUTPUT_BYTES", 16 << 20))
# Options of both kernels: no history file (it would hold the hidden tests).
KERNEL_ARGS = ["--HistoryManager.enabled=False"]


def _size(value) -> int:
    """Bytes of the strings in a message's content (cheap: no serialisation)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_size(k) + _size(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return sum(_size(v) for v in value)
    return 8


def _calls_passed(src: str) -> bool:
    """Whether a test cell's source calls passed(...) as a top-level statement (so, when it
    ran to its end, it printed a ✅)."""
    try:
        tree = ast.parse(_strip_magics(src))
    except SyntaxError:
        return False
    return any(isinstance(s, ast.Expr) and isinstance(s.value, ast.Call) and
               getattr(s.value.func, "id", getattr(s.value.func, "attr", "")) == "passed"
               for s in tree.body)


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def is_test(cell) -> bool:
    m = _meta(cell)
    return cell.get("cell_type") == "code" and bool(m.get("grade")) and not m.get("solution")


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def asked_names(release: dict, tests: list | None = None) -> list[str]:
    """The learner's names the tests may use: what the answer cells define, and every name
    the course's cells read that no course cell binds (an answer cell's stub defines none).

    Args:
        release: the release copy (the course's cells, answer stubs, visible tests).
        tests: the graded test cells as nbgrader restored them (hidden parts included).
    """
    names, bound, loads = [], set(), []
    for cell in list(release["cells"]) + list(tests or []):
        if cell.get("cell_type") != "code":
            continue
        try:
            tree = ast.parse(_strip_magics(_source(cell)))
        except SyntaxError:
            continue
        if _meta(cell).get("solution"):
            names += [n for n in _top_level_bound(tree) if n not in names]
            continue
        bound |= set(_top_level_bound(tree))
        loads += [n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
                  and isinstance(n.ctx, ast.Load)]
    for n in loads:
        if n not in bound and n not in names and not hasattr(builtins, n) and n not in _IPYTHON:
            names.append(n)
    return names


def _top_level_bound(tree: ast.Module) -> list[str]:
    """Names a cell binds at top level (defs, classes, imports, assignments, loop targets)."""
    out = []
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append(stmt.name)
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            out += [(a.asname or a.name).split(".")[0] for a in stmt.names]
        else:
            for node in ast.walk(stmt):
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    out.append(node.id)
                elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    out.append(node.name)
    return out


def _strip_magics(src: str) -> str:
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                     for line in src.splitlines())


def course_cells(release: dict) -> list[tuple[str | None, str]]:
    """(grade_id of a test cell or None, source) of the release copy's code cells that are
    the course's own: instructor cells and test cells, never answer cells."""
    out = []
    for cell in release["cells"]:
        if cell.get("cell_type") != "code" or _meta(cell).get("solution"):
            continue
        out.append((_meta(cell).get("grade_id") if is_test(cell) else None, _source(cell)))
    return out


def release_notebook(aid: str) -> dict:
    """The release copy the verdict kernel trusts: ZEROCOURSE_RELEASE_DIR (grade.py points it
    at the one it generated) or the course's notebooks/."""
    base = os.environ.get("ZEROCOURSE_RELEASE_DIR") or os.path.join(ROOT, "notebooks")
    with open(os.path.join(base, aid, f"{aid}.ipynb"), encoding="utf-8") as f:
        return json.load(f)


def clean_test_outputs(outputs: list) -> tuple[list, str]:
    """(outputs the learner may see, the full text for the grader's log)."""
    kept, log = [], []
    for out in outputs:
        kind = out.get("output_type")
        if kind == "stream":
            text = out.get("text", "")
            log.append(text)
            lines = [l for l in text.splitlines(keepends=True) if _CHECK_LINE.match(l)]
            if lines:
                # stderr is never a failure (nbgrader scores any stderr as 0): stdout it is
                kept.append(nbformat.v4.new_output("stream", name="stdout", text="".join(lines)))
        elif kind == "error":
            log.append(f"{out.get('ename')}: {out.get('evalue')}\n")
            # A rank's traceback and a long message (the learner's code wrote it) stay in the log.
            evalue = out.get("evalue", "").split("--- traceback from rank")[0]
            if len(evalue) > 1500:
                evalue = evalue[:1500] + " [...]"
            kept.append(nbformat.v4.new_output("error", ename=out.get("ename", "Error"),
                                               evalue=evalue, traceback=[]))
        elif kind == "display_data":
            kept.append(out)              # figures drawn by the course's own checks
        # execute_result: never (nbgrader would read it as partial credit)
    return kept, "".join(log)


class SplitExecute(Execute):
    """nbgrader's Execute, with graded test cells run in a separate verdict kernel."""

    verdict_kernel = Unicode(VERDICT_KERNEL, help="kernelspec of the verdict kernel").tag(config=True)
    # Where the kernels' own stdout/stderr go (their start-up banner): None = inherited.
    kernel_output = None

    def preprocess(self, nb, resources=None, km=None):
        from nbclient import NotebookClient
        NotebookClient.__init__(self, nb, km)
        self.reset_execution_trackers()
        self._check_assign_resources(resources)
        aid = (resources or {}).get("nbgrader", {}).get("assignment") or \
            os.environ.get("ZEROCOURSE_ASSIGNMENT")
        t_parse = time.monotonic()
        release = release_notebook(aid)
        self._course = course_cells(release)
        self._names = asked_names(release, [c for c in nb.cells if is_test(c)])
        self._phases = {"release parse": time.monotonic() - t_parse}
        self._out_total = 0
        self._cell_bytes: dict = {}         # cell index -> bytes of output so far
        self._capped: dict = {}             # cell index -> why its output was cut
        rpc_dir = os.environ.get("ZEROCOURSE_RPC_DIR") or tempfile.mkdtemp(prefix="zcrpc-")
        self._socket = os.path.join(rpc_dir, "learner.sock")
        self._done_a: list[int] = []          # learner cells run so far (replayed on restart)
        self.extra_arguments = list(self.extra_arguments) + KERNEL_ARGS
        # Nothing in either kernel needs a clean exit (no history, nothing to save): killed at
        # once, instead of nbgrader's graceful wait of up to 5 s each.
        self.shutdown_kernel = "immediate"
        self._verdict = _VerdictClient(config=self.config, kernel_name=self.verdict_kernel)
        self._verdict.shutdown_kernel = "immediate"
        self._verdict.extra_arguments = list(self._verdict.extra_arguments) + KERNEL_ARGS
        self._verdict.log = self.log
        self._vnb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("")])
        NotebookClient.__init__(self._verdict, self._vnb)
        self._verdict.reset_execution_trackers()
        self._verdict.resources = self.resources
        t0 = time.monotonic()
        spent = {"learner": 0.0, "tests": 0.0}
        per_cell: list[tuple[float, int]] = []
        # Both kernel processes start at once (each start-up is ~0.8 s of interpreter and
        # ipykernel import, idle), then each is connected to in turn.
        self._launch_learner()
        try:
            try:
                self._launch_verdict()
                self._start_learner(launched=True)
                self._phases["learner kernel start"] = time.monotonic() - t0
                t = time.monotonic()
                self._start_verdict()       # imports torch and starts its ranks' server meanwhile
                self._phases["verdict kernel start"] = time.monotonic() - t
                self.log.info("split grading: both kernels up in %.1f s", time.monotonic() - t0)
                for index, cell in enumerate(self.nb.cells):
                    if cell.get("cell_type") != "code":
                        continue
                    t = time.monotonic()
                    if is_test(cell):
                        self._run_test(cell)
                        spent["tests"] += time.monotonic() - t
                    else:
                        self._run_learner(cell, index)
                        spent["learner"] += time.monotonic() - t
                    per_cell.append((time.monotonic() - t, index))
            finally:
                t = time.monotonic()
                if self._verdict.km is not None:
                    self._verdict._cleanup_kernel()
        finally:
            self._cleanup_kernel()
            self._phases["kernels shutdown"] = time.monotonic() - t
        self._phases.update({"learner cells": spent["learner"], "test cells": spent["tests"]})
        self.log.info("split grading: %.1f s in all, learner cells %.1f s, test cells %.1f s",
                      time.monotonic() - t0, spent["learner"], spent["tests"])
        self.log.info("split grading phases: %s", ", ".join(
            f"{k} {v:.2f} s" for k, v in self._phases.items()))
        self.log.info("split grading: slowest cells %s", ", ".join(
            f"#{i} {d:.1f} s" for d, i in sorted(per_cell, reverse=True)[:5]))
        self.set_widgets_metadata()
        return self.nb, self.resources

    def _output_kwargs(self) -> dict:
        out = self.kernel_output
        return {} if out is None else {"stdout": out, "stderr": out}

    # -- the learner kernel -------------------------------------------------------------
    def _launch_learner(self) -> None:
        """Start the learner kernel's process (not waited for: _start_learner connects)."""
        if self.km is None:
            self.km = self.create_kernel_manager()
        self.start_new_kernel(**self._output_kwargs())

    def _start_learner(self, launched: bool = False) -> None:
        if not launched:
            self._launch_learner()
        self.start_new_kernel_client()
        info = self.wait_for_reply(self.kc.kernel_info())
        self.nb.metadata["language_info"] = info["content"]["language_info"]
        boot = (f"def _zc_boot():\n"
                f"    import importlib.util, sys\n"
                f"    spec = importlib.util.spec_from_file_location('_zc_learner_rpc', "
                f"{os.path.join(HERE, 'learner_rpc.py')!r})\n"
                f"    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
                f"    mod.serve({self._socket!r}, get_ipython().user_ns)\n"
                f"_zc_boot(); del _zc_boot\n")
        self._hidden(self, boot, what="learner kernel start")

    def _hidden(self, client, code: str, what: str, timeout: int = 600):
        """Run code the learner never sees; raise if it fails (a grading error, not a score).
        Its own timeout: start-up work on a busy machine is not the learner's time."""
        cell = nbformat.v4.new_code_cell(code)
        keep = client.nb.cells[0] if client.nb.cells else None
        saved, client.timeout = client.timeout, timeout
        try:
            client.execute_cell(cell, 0, store_history=False)
        finally:
            client.timeout = saved
            if keep is not None:
                client.nb.cells[0] = keep
        errors = [o for o in cell.outputs if o.get("output_type") == "error"]
        if errors:
            raise RuntimeError(f"{what} failed: {errors[0].get('ename')}: {errors[0].get('evalue')}")
        return cell

    def _settled(self, client) -> bool:
        """After a timeout: did the interrupt stop the cell (only slowly, on a busy machine)?"""
        try:
            self._hidden(client, "pass", what="settle", timeout=SETTLE_S)
            return True
        except (CellTimeoutError, DeadKernelError, RuntimeError):
            return False

    # -- output caps (the learner kernel) --------------------------------------------
    def process_message(self, msg, cell, cell_index):
        if msg.get("msg_type") != "status":
            why = self._over_cap(_size(msg.get("content")), cell_index)
            if why:
                if cell_index not in self._capped:
                    self._capped[cell_index] = why
                    self._stop_cell(self)
                return None                      # dropped: never buffered
        return super().process_message(msg, cell, cell_index)

    def _over_cap(self, n: int, cell_index: int) -> str | None:
        """Why this message of `n` bytes is dropped (its cell or the notebook would go over
        its cap), or None; only what is kept counts toward the notebook's total."""
        if cell_index in self._capped:
            return self._capped[cell_index]
        if self._cell_bytes.get(cell_index, 0) + n > CELL_OUTPUT_BYTES:
            return (f"this cell's output went over {CELL_OUTPUT_BYTES >> 20} MiB: the grader "
                    f"stopped the cell and dropped the rest of its output")
        if self._out_total + n > NOTEBOOK_OUTPUT_BYTES:
            return (f"the notebook's output went over {NOTEBOOK_OUTPUT_BYTES >> 20} MiB: the "
                    f"grader stopped this cell and dropped the rest of its output")
        self._cell_bytes[cell_index] = self._cell_bytes.get(cell_index, 0) + n
        self._out_total += n
        return None

    @staticmethod
    def _stop_cell(client) -> None:
        """Interrupt the kernel (from inside nbclient's message loop)."""
        try:
            result = client.km.interrupt_kernel()
            if asyncio.iscoroutine(result):
                asyncio.ensure_future(result)
        except Exception:  # noqa: BLE001 - the cell's timeout stops it otherwise
            pass

    def _note_cap(self, cell, index: int) -> None:
        why = self._capped.get(index)
        if why:
            cell.outputs = list(cell.get("outputs", []))[:50] + [nbformat.v4.new_output(
                "error", ename="OutputLimitError", evalue=why, traceback=[])]

    def _absorb_interrupt(self, client) -> None:
        """After a cell the grader interrupted for its output: a late interrupt lands here,
        in a cell of the grader's, never in the learner's next cell."""
        try:
            self._hidden(client, "import time\ntime.sleep(0.5)", what="settle", timeout=SETTLE_S)
        except Exception:  # noqa: BLE001 - an interrupt (or a dead kernel: handled later)
            pass

    def _run_learner(self, cell, index: int) -> None:
        try:
            self.preprocess_cell(cell, self.resources, index)
            self._note_cap(cell, index)
            if index in self._capped:
                self._absorb_interrupt(self)
            self._done_a.append(index)
        except (CellTimeoutError, DeadKernelError) as e:
            died = isinstance(e, DeadKernelError)
            if not died and self._settled(self):
                # Interrupted, just late: the cell failed (its outputs say so), the kernel lives.
                cell.outputs = list(cell.get("outputs", [])) + [nbformat.v4.new_output(
                    "error", ename="CellTimeoutError", evalue=f"this cell did not finish "
                    f"within {self.timeout} s and was interrupted", traceback=[])]
                self._done_a.append(index)
                return
            self.log.warning("learner cell %d %s: restarting the learner kernel", index,
                             "killed its kernel" if died else "did not stop")
            cell.outputs = [nbformat.v4.new_output(
                "error", ename="CellTimeoutError" if not died else "DeadKernelError",
                evalue=("this cell " + ("killed the kernel" if died else
                        f"did not finish within {self.timeout} s and ignored the interrupt") +
                        "; the grader restarted your kernel, ran the cells before it again "
                        "and went on without it"),
                traceback=[])]
            self._restart_learner()

    def _restart_learner(self) -> None:
        try:
            self._cleanup_kernel()
        except Exception:  # noqa: BLE001 - it is being replaced
            pass
        self.km = self.kc = None
        self._start_learner()
        for index in list(self._done_a):
            original = self.nb.cells[index]
            replay = nbformat.v4.new_code_cell(_source(original))
            try:
                self.execute_cell(replay, index, store_history=False)
            except (CellTimeoutError, DeadKernelError) as e:
                self.nb.cells[index] = original
                if isinstance(e, CellTimeoutError) and self._settled(self):
                    continue                    # slow this time; it ran before
                self._done_a.remove(index)      # it blocks now: leave it out, start again
                return self._restart_learner()
            self.nb.cells[index] = original

    # -- the verdict kernel -------------------------------------------------------------
    def _launch_verdict(self) -> None:
        """Start the verdict kernel's process (not waited for: _start_verdict connects)."""
        v = self._verdict
        v.km = v.create_kernel_manager()
        if os.environ.get("ZEROCOURSE_VERDICT_IPC"):     # its own folder, not the learner's
            v.km.transport, v.km.ip = "ipc", os.environ["ZEROCOURSE_VERDICT_IPC"]
        v.start_new_kernel(**self._output_kwargs())

    def _start_verdict(self) -> None:
        v = self._verdict
        v.start_new_kernel_client()
        t = time.monotonic()
        v.wait_for_reply(v.kc.kernel_info())
        self._phases["verdict kernel info"] = time.monotonic() - t
        self._defined = 0                   # course cells whose definitions ran there
        self._verdict_ready = False
        # Not waited for: the verdict kernel imports torch and starts the fork server of its
        # ranks while the learner's cells run (the first test cell waits for it).
        v.kc.execute("import autograder.verdict as _zcv\n"
                     f"_zcv.start({self._socket!r}, {self._names!r}, "
                     f"timeout={max(10.0, float(self.timeout or 150) - 20)})\n"
                     "_zcv.warm_up()\n", silent=True,
                     store_history=False)

    def _run_test(self, cell) -> None:
        if not self._verdict_ready:         # its start-up (sent without waiting) went well?
            self._hidden(self._verdict, "_zcv.sync",
                         what="verdict kernel start")
            self._verdict_ready = True
        gid = _meta(cell).get("grade_id")
        ids = [g for g, _ in self._course]
        upto = ids.index(gid) if gid in ids else len(self._course)
        defs = [src for _, src in self._course[self._defined:upto]]
        if defs:
            self._hidden(self._verdict, f"_zc_errors = _zcv.load_definitions({defs!r}, globals())",
                         what="course definitions")
            self._defined = upto
        nonce = secrets.token_hex(12)
        src = _source(cell)
        run = nbformat.v4.new_code_cell("_zcv.sync(globals())\n" + src +
                                        f"\n_zcv.completed({nonce!r})\n")
        self._verdict.capped = None
        try:
            self._verdict.execute_cell(run, 0, store_history=True)
        except (CellTimeoutError, DeadKernelError) as e:
            run.outputs = list(run.get("outputs", [])) + [nbformat.v4.new_output(
                "error", ename=type(e).__name__, evalue=f"the test did not finish: {e}"[:500],
                traceback=[])]
            self._verdict._cleanup_kernel()
            self._start_verdict()
        if self._verdict.capped:
            self._absorb_interrupt(self._verdict)
        outputs = list(run.get("outputs", []))
        errored = any(o.get("output_type") == "error" for o in outputs)
        text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
        if not errored:
            # Silence is not a pass: the test's source must have run to its end, here.
            why = None
            if f"[zc-completed {nonce}]" not in text:
                why = self._verdict.capped or "the test did not run to its end in the grader"
            elif _calls_passed(src) and not any(_CHECK_LINE.match(l) and "✅" in l
                                                 for l in text.splitlines()):
                why = "the test ran, but its check printed no ✅"
            if why:
                outputs.append(nbformat.v4.new_output("error", ename="GradingError",
                                                      evalue=f"❌ {why}: 0 points", traceback=[]))
        kept, log = clean_test_outputs(outputs)
        self.log.info("test cell %s, full output:\n%s", gid, log)
        cell.outputs = kept
        cell["execution_count"] = run.get("execution_count")


class _VerdictClient(Execute):
    """nbgrader's Execute for the verdict kernel, with the same output cap per cell (its
    cells print the ranks' output, which learner code writes)."""

    capped = None          # why the current cell's output was cut, or None
    _bytes = 0             # bytes of output of the current cell

    def process_message(self, msg, cell, cell_index):
        if msg.get("msg_type") != "status":
            self._bytes += _size(msg.get("content"))
            if self._bytes > CELL_OUTPUT_BYTES:
                if not self.capped:
                    self.capped = (f"the test's output (the ranks' prints) went over "
                                   f"{CELL_OUTPUT_BYTES >> 20} MiB: the grader stopped it")
                    SplitExecute._stop_cell(self)
                return None
        return super().process_message(msg, cell, cell_index)

    def execute_cell(self, cell, cell_index, *args, **kwargs):
        self._bytes = 0
        return super().execute_cell(cell, cell_index, *args, **kwargs)
