"""Plain data: the only values that cross from learner code to the code that grades it.

    decode(data)  torch.save bytes -> plain data, or PlainDataError naming what was refused

Under grading, a learner's function called from the verdict kernel (autograder/verdict.py)
and a rank running learner code (the launcher's trusted mode, zerocourse/launch.py) send
their results as `torch.save` bytes. `torch.load(weights_only=True)` runs no code, but it
still rebuilds more than values: a tensor keeps the attributes its sender put in its
`__dict__` (`t.detach = torch.Tensor` made a check compare nothing), a Fraction's slots
can hold anything, a tensor may be sparse or a Parameter. So the loaded value is walked
and rebuilt from scratch; exactly these are admitted:

    None, bool, int, float, complex, str, bytes      exact builtin types
    fractions.Fraction                               rebuilt from its int numerator/denominator
    torch.dtype, torch.Size                          (test helpers return a tensor's dtype, shape)
    list, tuple, dict (OrderedDict becomes dict)     keys: the atoms above or tuples of them
    set                                              of such keys (10's answer_gathers_params)
    torch.Tensor (a Parameter too)                   dense (strided), not on meta;
                                                     returned as a fresh copy with no attributes

Anything else (a frozenset, a torch.device, a sparse or meta tensor, a subclass) is refused
with a message that names it and where it sits. Nesting is limited (64 levels), so is
the number of values (1,000,000).
"""
from __future__ import annotations

import collections
import fractions
import io
import warnings

import torch

MAX_DEPTH = 64
MAX_ITEMS = 1_000_000
_ATOMS = (type(None), bool, int, float, complex, str, bytes)
_KEY_ATOMS = _ATOMS + (fractions.Fraction,)
_DTYPES = frozenset(v for v in vars(torch).values() if isinstance(v, torch.dtype))


class PlainDataError(TypeError):
    """The value is not plain data (see the module docstring for what is)."""


def decode(data: bytes):
    """torch.save bytes -> plain data, rebuilt; raises PlainDataError for anything else.

    Args:
        data: what a learner's function or a rank sent (untrusted bytes).
    """
    try:
        with torch.serialization.safe_globals([fractions.Fraction]), warnings.catch_warnings():
            warnings.simplefilter("ignore")             # torch.load's notes on odd pickles
            value = torch.load(io.BytesIO(data), weights_only=True)
    except Exception as e:  # noqa: BLE001 - whatever the unpickler refused, say so plainly
        reason = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        raise PlainDataError(f"not plain data ({reason})") from None
    return rebuild(value)


def rebuild(value, where: str = "the value"):
    """A copy of `value` made only of the admitted types (see the module docstring)."""
    budget = [MAX_ITEMS]
    return _rebuild(value, where, 0, budget)


def _refuse(where: str, what: str):
    raise PlainDataError(f"{where} is {what}: only numbers, strings, bytes, tensors, lists, "
                         f"tuples, sets, dicts and Fractions are plain data")


def _rebuild(value, where: str, depth: int, budget: list):
    budget[0] -= 1
    if budget[0] < 0:
        raise PlainDataError(f"more than {MAX_ITEMS} values: not plain data")
    if depth > MAX_DEPTH:
        raise PlainDataError(f"{where} is nested more than {MAX_DEPTH} levels deep")
    kind = type(value)
    if kind in _ATOMS:
        return value
    if kind is fractions.Fraction:
        # The unpickler fills a Fraction's slots with whatever the sender wrote.
        n, d = getattr(value, "_numerator", None), getattr(value, "_denominator", None)
        if type(n) is not int or type(d) is not int or d == 0:
            _refuse(where, "a Fraction whose numerator or denominator is not an int")
        return fractions.Fraction(n, d)
    if kind is torch.dtype:
        if value not in _DTYPES:
            _refuse(where, "an unknown dtype")
        return value
    if kind is torch.Size:
        return torch.Size([_int(x, f"{where}[{i}]") for i, x in enumerate(tuple.__iter__(value))])
    if kind is list or kind is tuple:
        items = [_rebuild(x, f"{where}[{i}]", depth + 1, budget)
                 for i, x in enumerate(list.__iter__(value) if kind is list else tuple.__iter__(value))]
        return items if kind is list else tuple(items)
    if kind is set:
        # Elements are rebuilt as keys are (builtin atoms or tuples of them): their __eq__ and
        # __hash__ are the builtins', so membership and equality mean what a check expects.
        return {_key(x, where, depth, budget) for x in set.__iter__(value)}
    if kind is dict or kind is collections.OrderedDict:
        out = {}
        for k, v in dict.items(value):
            key = _key(k, where, depth, budget)
            out[key] = _rebuild(v, f"{where}[{key!r}]", depth + 1, budget)
        return out
    if kind is torch.Tensor or kind is torch.nn.Parameter:
        return _tensor(value, where)
    _refuse(where, f"a {kind.__module__}.{kind.__qualname__}")


def _int(x, where: str) -> int:
    if type(x) is not int:
        _refuse(where, f"a {type(x).__name__} where an int belongs")
    return x


def _key(k, where: str, depth: int, budget: list):
    if type(k) in _KEY_ATOMS:
        return _rebuild(k, f"a key of {where}", depth + 1, budget)
    if type(k) is tuple:
        return tuple(_key(x, where, depth + 1, budget) for x in tuple.__iter__(k))
    _refuse(f"a key of {where}", f"a {type(k).__name__}")


def _tensor(t, where: str) -> torch.Tensor:
    """A fresh dense tensor with t's values: methods are called through the class, never
    looked up on the object (its __dict__ is the sender's)."""
    T = torch.Tensor
    if T.layout.__get__(t) is not torch.strided:
        _refuse(where, f"a {T.layout.__get__(t)} tensor (only dense tensors)")
    if T.device.__get__(t).type == "meta":
        _refuse(where, "a tensor on the meta device (it holds no values)")
    return T.clone(T.detach(t), memory_format=torch.contiguous_format)
