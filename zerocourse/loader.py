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
"""
from __future__ import annotations

import ast
import json
import os
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
