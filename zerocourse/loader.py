"""Import functions and classes defined in a notebook (a learner's or the solutions').

Later notebooks, the benchmarks and the torchrun script reuse a learner's
implementations without copying them into the package:

    nb = load_notebook("notebooks/03_zero1/03_zero1.ipynb", names=["ZeRO1Adam"])
    opt = nb.ZeRO1Adam(model.parameters())

Only the DEFINITIONS of a notebook are executed: top-level imports, `def`,
`class`, and assignments of literal constants. Everything else (training loops,
launches, plots, tests) is skipped, so loading is fast and has no side effects.
The loaded module is not put in sys.modules, so `launch` sends its functions
to the ranks by value.

When a learner's notebook cannot be used (missing, a stub, broken), a demo falls back on
something else and says so in ONE line, with the details folded away:

    try:
        mod = load_notebook("../05_zero3/05_zero3.ipynb", names=["ZeRO3Module"])
        ...                                        # e.g. a smoke test on 2 ranks
    except Exception as e:
        explain_fallback("your ZeRO3Module (05)", e, "torch FSDP2")
    # ⓘ your ZeRO3Module (05) not used (not written yet: it raises NotImplementedError);
    #   using torch FSDP2 instead.                                      [details: the traceback]
"""
from __future__ import annotations

import ast
import html
import json
import os
import traceback
import types


class NotebookLoadError(ImportError):
    """A notebook is missing, unreadable, or lacks the names asked for."""


def _is_literal(node: ast.AST) -> bool:
    try:
        ast.literal_eval(node)
        return True
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False


def _keep(stmt: ast.stmt) -> bool:
    """Definitions only: imports, functions, classes, literal constants."""
    if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef,
                         ast.ClassDef)):
        return True
    if isinstance(stmt, ast.Assign):
        return all(isinstance(t, ast.Name) for t in stmt.targets) and _is_literal(stmt.value)
    if isinstance(stmt, ast.AnnAssign):
        return isinstance(stmt.target, ast.Name) and stmt.value is not None and _is_literal(stmt.value)
    return False


def _cell_code(source: str) -> str:
    """Drop IPython magics and shell escapes, which are not Python."""
    if source.lstrip().startswith("%%"):
        return ""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                     for line in source.splitlines())


def load_notebook(path: str, names: list[str] | None = None, module_name: str | None = None):
    """Execute a notebook's definitions into a new module and return it.

    Args:
        path: the .ipynb file.
        names: names that must be defined (NotebookLoadError lists the missing ones).
        module_name: the module's __name__ (default: derived from the file name).
    Returns:
        a types.ModuleType whose attributes are the notebook's definitions.
    """
    if not os.path.exists(path):
        raise NotebookLoadError(f"no notebook at {path!r}")
    try:
        with open(path, encoding="utf-8") as f:
            nb = json.load(f)
        cells = nb["cells"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise NotebookLoadError(f"{path} is not a readable notebook: {e}") from None
    stem = os.path.splitext(os.path.basename(path))[0]
    mod = types.ModuleType(module_name or f"notebook_{stem}")
    mod.__file__ = os.path.abspath(path)
    for i, cell in enumerate(cells):
        if cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        src = "".join(src) if isinstance(src, list) else src
        try:
            tree = ast.parse(_cell_code(src))
        except SyntaxError as e:
            raise NotebookLoadError(f"{path}: code cell {i} has a syntax error (line {e.lineno}): "
                                    f"{e.msg}") from None
        tree.body = [s for s in tree.body if _keep(s)]
        if not tree.body:
            continue
        # The file name names the cell, so tracebacks say where the code came from.
        code = compile(tree, f"{path} [cell {i}]", "exec")
        try:
            exec(code, mod.__dict__)
        except Exception as e:
            raise NotebookLoadError(f"{path}: defining code cell {i} failed: "
                                    f"{type(e).__name__}: {e}") from e
    missing = [n for n in (names or []) if n not in mod.__dict__]
    if missing:
        raise NotebookLoadError(f"{path} does not define {missing}; was the cell that defines "
                                f"them renamed or deleted?")
    return mod


def short_reason(error: BaseException) -> str:
    """Why something could not be used, in a few words (for one line in a notebook).

    A stub's NotImplementedError reads "not written yet"; a missing notebook names the path; a
    failure inside a rank gives the rank's exception type and the first line of its message,
    without the launcher's "rank r failed with ..." wrapper or the traceback.

    Args:
        error: the exception caught while loading or trying the learner's code.
    """
    text = str(error).strip()
    first = text.splitlines()[0].strip() if text else ""
    kind = type(error).__name__
    if first.startswith("rank ") and " failed with " in first:       # zerocourse.launch's wrapper
        first = first.split(" failed with ", 1)[1]
        kind, _, first = first.partition(":")
        first = first.strip()
    if kind == "NotImplementedError" or isinstance(error, NotImplementedError):
        return "not written yet: it raises NotImplementedError"
    if isinstance(error, NotebookLoadError) or isinstance(error, FileNotFoundError):
        return first or kind
    first = first if len(first) <= 120 else first[:117] + "..."
    return f"{kind}: {first}" if first else kind


def explain_fallback(what: str, error: BaseException, instead: str) -> str:
    """Say in one line that `what` could not be used and `instead` is; fold the details away.

    In a notebook the full error (the ranks' tracebacks included) goes under a collapsed
    "details" fold; elsewhere only the line is printed. Nothing goes to stderr (a demo's
    fallback is information, not an error).

    Args:
        what: what was tried, e.g. "your ZeRO3Module (05)".
        error: the exception it raised.
        instead: what is used in its place, e.g. "torch FSDP2".
    Returns:
        the line printed.
    """
    line = f"ⓘ {what} not used ({short_reason(error)}); using {instead} instead."
    details = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    try:
        from IPython import get_ipython
        from IPython.display import display
        in_notebook = get_ipython() is not None and hasattr(get_ipython(), "kernel")
    except ImportError:
        in_notebook = False
    if in_notebook:
        display({"text/plain": line,                        # the line alone where no HTML shows
                 "text/html": f"<div>{html.escape(line)}</div><details><summary>details</summary>"
                              f"<pre>{html.escape(details)}</pre></details>"}, raw=True)
    else:
        print(line)
    return line
