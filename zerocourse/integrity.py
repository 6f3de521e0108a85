"""Detect code that replaced the course's instruments, in one shared interpreter.

`make grade` does not rely on this: its graded tests run in a kernel that never
runs learner code (autograder/split_execute.py), so nothing there can be replaced.
Where tests and a learner's code do share one interpreter (the in-process fixture
harness, tests/harness.py), `assert_untampered(globals())` at the top of a graded
cell makes a fixture that redefines `check_equal`, monkeypatches `zerocourse.checks`
or `zerocourse.comm`, or swaps a builtin fail with a message saying what was replaced.

How: every function and method of the course's modules must still have the code
compiled from the module's file; names the notebook imported from them must
still be those very objects; builtins must still be built in.
"""
from __future__ import annotations

import builtins
import sys
import types

MODULES = ("zerocourse.checks", "zerocourse.comm", "zerocourse.launch", "zerocourse.memory",
           "zerocourse.optim", "zerocourse.models", "zerocourse.loader", "zerocourse.integrity",
           "zerocourse.gather_tracker", "zerocourse.standin", "zerocourse.checkpoint",
           "zerocourse.state_diff", "zerocourse.devices")
_BUILTINS = ("print", "isinstance", "issubclass", "len", "abs", "max", "min", "sum", "all", "any",
             "open", "exec", "eval", "compile", "__import__", "getattr", "setattr", "hasattr",
             "range", "zip", "enumerate", "sorted", "repr", "round", "iter", "next")
_GUARDED_NAMES = [("zerocourse.checks", n) for n in ("passed", "check_true", "check_equal",
                                                     "check_type", "check_close", "check_raises",
                                                     "check_answered")] + \
                 [("zerocourse.launch", "launch"), ("zerocourse.comm", "CommTracer")]
_fresh_cache: dict[str, dict[str, bytes]] = {}


def _codes(code: types.CodeType, prefix: str = "") -> dict[str, bytes]:
    """qualname -> bytecode of every function compiled in a module's code."""
    out = {}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            if const.co_flags & 0x2:        # CO_NEWLOCALS: a function, not a class body
                out[const.co_qualname] = const.co_code
            out.update(_codes(const))
    return out


def _fresh(mod: types.ModuleType) -> dict[str, bytes]:
    name = mod.__name__
    if name not in _fresh_cache:
        with builtins.open(mod.__file__, encoding="utf-8") as f:
            _fresh_cache[name] = _codes(builtins.compile(f.read(), mod.__file__, "exec"))
    return _fresh_cache[name]


def _functions(mod: types.ModuleType):
    """(qualname, function) for the module's own functions and its classes' methods."""
    for value in list(vars(mod).values()):
        if isinstance(value, types.FunctionType) and getattr(value, "__module__", None) == mod.__name__:
            yield value.__qualname__, value
        elif isinstance(value, type) and getattr(value, "__module__", None) == mod.__name__:
            for attr in vars(value).values():
                fn = attr.__func__ if isinstance(attr, (staticmethod, classmethod)) else attr
                # torch wraps some methods (e.g. __torch_dispatch__) with functools.wraps.
                while isinstance(getattr(fn, "__wrapped__", None), types.FunctionType) and \
                        fn.__code__.co_filename != mod.__file__:
                    fn = fn.__wrapped__
                if isinstance(fn, types.FunctionType):
                    yield fn.__qualname__, fn


def find_tampering(namespace: dict | None = None) -> list[str]:
    """What was replaced: a list of sentences (empty when nothing was)."""
    problems = []
    # Builtins first, with nothing but attribute reads: if they were replaced, the checks
    # below (which call isinstance, getattr, ...) could be fooled themselves.
    for n in _BUILTINS:
        obj = builtins.__dict__.get(n)
        cls = obj.__class__
        if not (cls is types.BuiltinFunctionType or
                (cls is type and obj.__module__ == "builtins")):
            problems.append(f"the builtin {n}() was replaced")
    if problems:
        return problems
    import zerocourse
    if getattr(zerocourse, "__file__", None) is None or \
            "zerocourse" not in builtins.repr(zerocourse.__file__):
        problems.append("the zerocourse package was replaced")
    modules = {n: sys.modules[n] for n in MODULES if n in sys.modules}
    for name, mod in modules.items():
        fresh = _fresh(mod)
        for qualname, fn in _functions(mod):
            if qualname in fresh and fn.__code__.co_code != fresh[qualname]:
                problems.append(f"{name}.{qualname} was changed")
        for qualname in fresh:
            if "." in qualname or "<" in qualname:
                continue
            fn = vars(mod).get(qualname)
            while isinstance(getattr(fn, "__wrapped__", None), types.FunctionType) and \
                    getattr(getattr(fn, "__code__", None), "co_filename", None) != mod.__file__:
                fn = fn.__wrapped__
            if not isinstance(fn, types.FunctionType) or fn.__code__.co_code != fresh[qualname] \
                    or fn.__code__.co_filename != mod.__file__:
                problems.append(f"{name}.{qualname} was replaced")
    if namespace is not None:
        # The names graded cells call, as the course's imports bound them: a notebook that
        # rebinds one (def check_equal(...): pass) would let tests pass on a forged check.
        # (Only these: learners' contract names, like model_state_bytes, may shadow others.)
        for name, var in _GUARDED_NAMES:
            mod = modules.get(name)
            if mod is not None and var in namespace and namespace[var] is not vars(mod).get(var):
                problems.append(f"`{var}` in this notebook is no longer {name}.{var}")
    return problems


def assert_untampered(namespace: dict | None = None) -> None:
    """Raise AssertionError naming every replaced instrument (see the module docstring)."""
    problems = find_tampering(namespace)
    if problems:
        raise AssertionError("❌ this graded test cannot be trusted: " + "; ".join(problems) +
                             ". Remove the cell that redefines or patches them, restart the "
                             "kernel and run all cells.")
