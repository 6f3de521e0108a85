"""Friendly assertions for self-check and hidden-test cells.

Every failure says what was expected, what came, on which rank, and a hint:

    check_equal("sum_of_ranks on 3 ranks", got=5, expected=6, rank=2,
                hint="did every rank call all_reduce?")
    AssertionError: ❌ sum_of_ranks on 3 ranks (rank 2): expected 6, got 5.
                    Hint: did every rank call all_reduce?
"""
from __future__ import annotations

import fractions
import math

import torch


# Tensor methods are called through the class (see check_close).
_T = torch.Tensor
_PLAIN_ATOMS = (type(None), bool, int, float, str, bytes, torch.dtype, torch.Size, fractions.Fraction)


def plain(value):
    """`value` if it is plain data a trusted kernel can decode, else a string describing it.

    Test helpers that run in ranks wrap what learner code returned in plain() before returning
    it: results cross to the grading kernel decoded with torch.load(weights_only=True), which
    refuses other objects (a numpy scalar, a learner's class) with an error that names nothing.
    A string such as "<float32: 3.0>" then fails the check that follows with a readable message.

    Args:
        value: anything a learner's function returned.
    Returns:
        value itself (tensors detached, on the CPU) when it is None, bool, int, float, str, bytes,
        a tensor, torch.dtype, torch.Size, a Fraction, or a list/tuple/dict of these; a numpy
        float or bool scalar as Python's (as the grader's kernel accepts them); else
        "<TypeName: repr>".
    """
    if type(value).__module__ == "numpy" and getattr(value, "ndim", 1) == 0 and \
            type(value).__name__.startswith(("float", "bool")):
        return value.item()
    if isinstance(value, torch.Tensor):
        if type(value) in (torch.Tensor, torch.nn.Parameter):
            return _T.cpu(_T.detach(value))
    elif isinstance(value, _PLAIN_ATOMS) and type(value) in _PLAIN_ATOMS:
        return value
    elif type(value) in (list, tuple):
        return type(value)(plain(v) for v in value)
    elif type(value) is dict:
        return {plain(k): plain(v) for k, v in value.items()}
    return f"<{type(value).__name__}: {value!r:.60}>"


def passed(message: str) -> None:
    """Print a green tick line (self-check cells end with one per check).

    A ✅ predicts the cell's points: print it only after checks that decide them. A visible
    check that can only see the format prints format_only(...) instead."""
    print(f"✅ {message}")


# The mark of a visible check that decides nothing (make check: "not checked here").
FORMAT_ONLY = "☑"


def format_only(message: str) -> None:
    """Print the line of a visible check that can only check the format (a quiz answer whose
    correctness only the hidden tests know): `make check` lists that cell's points as
    "not checked here", never as a predicted grade."""
    print(f"{FORMAT_ONLY} {message}: format only: correctness is in the hidden tests")


def _fail(what: str, detail: str, rank: int | None, hint: str) -> None:
    where = f" (rank {rank})" if rank is not None else ""
    msg = f"❌ {what}{where}: {detail}"
    if hint:
        msg += f"\n   Hint: {hint}"
    raise AssertionError(msg)


def check_answered(name: str, namespace: dict) -> None:
    """The learner assigned the self-test answer `name` (in `namespace`, a cell's globals()).

    While the answer cell still holds its stub, the name does not exist: say so as the stub
    itself does (NotImplementedError), not as a NameError that looks like a bug in the test.
    """
    if name not in namespace:
        raise NotImplementedError(f"{name} is not assigned yet: in the cell above, replace "
                                  f"`raise NotImplementedError()` with `{name} = ...` and run it")


def check_true(condition, what: str, detail: str = "", rank: int | None = None, hint: str = "") -> None:
    """Fail with `what` and `detail` unless condition holds."""
    if not condition:
        _fail(what, detail or "the condition does not hold", rank, hint)


def check_equal(what: str, got, expected, rank: int | None = None, hint: str = "") -> None:
    """Exact equality for plain values (ints, strings, tuples, dicts)."""
    if got != expected:
        _fail(what, f"expected {expected!r}, got {got!r}", rank, hint)


def check_type(what: str, got, expected_type, rank: int | None = None, hint: str = "") -> None:
    """isinstance check with a readable message."""
    if not isinstance(got, expected_type):
        names = getattr(expected_type, "__name__", str(expected_type))
        _fail(what, f"expected a {names}, got {type(got).__name__}: {got!r:.80}", rank, hint)


def check_close(what: str, got, expected, atol: float = 0.0, rtol: float = 0.0,
                rank: int | None = None, hint: str = "") -> None:
    """Numbers or tensors equal within |got - expected| <= atol + rtol * |expected|.

    Tensors must also agree in shape (and dtype when `expected` is a tensor);
    the message gives the largest difference and where it is.
    """
    if isinstance(expected, torch.Tensor) or isinstance(got, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            _fail(what, f"expected a tensor, got {type(got).__name__}", rank, hint)
        expected = torch.as_tensor(expected)
        # Methods through the class, never looked up on the objects: a value may come from
        # learner code, and an attribute it carries (t.detach = ...) must not change the check.
        got_shape, expected_shape = tuple(_T.size(got)), tuple(_T.size(expected))
        if got_shape != expected_shape:
            _fail(what, f"expected shape {expected_shape}, got {got_shape}", rank, hint)
        if _T.dtype.__get__(got) != _T.dtype.__get__(expected):
            _fail(what, f"expected dtype {_T.dtype.__get__(expected)}, got {_T.dtype.__get__(got)}",
                  rank, hint)
        g = _T.cpu(_T.double(_T.detach(got)))
        e = _T.cpu(_T.double(_T.detach(expected)))
        if _T.numel(g) == 0:
            return
        diff = _T.abs(g - e)
        bad = diff > atol + rtol * _T.abs(e)
        if bool(_T.any(bad)) or bool(_T.any(torch.isnan(g))) != bool(_T.any(torch.isnan(e))):
            flat = _T.flatten(diff)
            idx = int(_T.argmax(_T.nan_to_num(flat, float("inf"))))
            pos = tuple(int(i) for i in torch.unravel_index(torch.tensor(idx), got_shape)) \
                if _T.dim(g) else ()
            _fail(what, f"max |got - expected| = {float(flat[idx]):.3g} at index {pos} "
                        f"(got {float(_T.flatten(g)[idx]):.6g}, expected {float(_T.flatten(e)[idx]):.6g}; "
                        f"{int(_T.sum(bad))} of {_T.numel(g)} elements off; tolerance "
                        f"atol={atol:g}, rtol={rtol:g})", rank, hint)
        return
    if not (isinstance(got, (int, float)) and not isinstance(got, bool)):
        _fail(what, f"expected a number close to {expected!r}, got {type(got).__name__}: {got!r:.80}",
              rank, hint)
    if not math.isclose(got, expected, rel_tol=rtol, abs_tol=atol):
        _fail(what, f"expected {expected!r}, got {got!r} (tolerance atol={atol:g}, rtol={rtol:g})",
              rank, hint)


def check_raises(what: str, exc_type, fn, *args, match: str | None = None, hint: str = "", **kwargs):
    """fn(*args, **kwargs) must raise exc_type (whose message contains `match`, if given)."""
    try:
        fn(*args, **kwargs)
    except exc_type as e:
        if match is not None and match.lower() not in str(e).lower():
            _fail(what, f"raised {type(e).__name__} as expected, but its message {str(e)!r} "
                        f"does not mention {match!r}", None, hint)
        return e
    except Exception as e:  # noqa: BLE001 - report what came instead
        _fail(what, f"expected {exc_type.__name__}, got {type(e).__name__}: {e}", None, hint)
    _fail(what, f"expected {exc_type.__name__}, but nothing was raised", None, hint)
