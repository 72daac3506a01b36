"""Comparators (pure functions): returned values vs expected values, stdout vs expected stdout.

They run outside the sandbox, on decoded plain data; an :class:`~sandloop.tasks.values.Opaque`
(an object that was not plain data, such as an always-equal object) equals nothing.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from sandloop.tasks.values import Opaque

__all__ = ["floats_close", "output_equal", "values_equal"]

ValueMode = Literal["strict", "python", "json"]
OutputMode = Literal["exact", "whitespace", "float"]


def floats_close(expected: float, actual: float, rel_tol: float, abs_tol: float) -> bool:
    """Equal within tolerance; NaN equals NaN (an expected NaN is a legitimate answer)."""
    if math.isnan(expected) or math.isnan(actual):
        return math.isnan(expected) and math.isnan(actual)
    if expected == actual:  # also equal infinities
        return True
    return math.isclose(expected, actual, rel_tol=rel_tol, abs_tol=abs_tol)


def _is_num(x: Any, mode: ValueMode) -> bool:
    t = type(x)
    if mode == "python":
        return t is int or t is float or t is bool
    return t is int or t is float


def values_equal(
    expected: Any,
    actual: Any,
    mode: ValueMode = "strict",
    *,
    rel_tol: float = 1e-9,
    abs_tol: float = 1e-9,
) -> bool:
    """Compare decoded values.

    ``strict``: identical types all the way down; floats within tolerance. ``python``: Python
    ``==`` on plain data (``1 == 1.0 == True``, list != tuple, set == frozenset), floats within
    tolerance. ``json``: strict, except tuple == list and int == float (data that went through
    JSON cannot keep those apart).
    """
    if isinstance(expected, Opaque) or isinstance(actual, Opaque):
        return False
    te, ta = type(expected), type(actual)
    if _is_num(expected, mode) and _is_num(actual, mode):
        if mode == "strict" and te is not ta:
            return False
        if te is float or ta is float:
            return floats_close(float(expected), float(actual), rel_tol, abs_tol)
        return bool(expected == actual)
    if te is complex or ta is complex:
        if te is not ta and mode == "strict":
            return False
        try:
            e, a = complex(expected), complex(actual)
        except (TypeError, ValueError):
            return False
        return floats_close(e.real, a.real, rel_tol, abs_tol) and floats_close(
            e.imag, a.imag, rel_tol, abs_tol
        )
    seq = (list, tuple)
    if te in seq and ta in seq:
        if te is not ta and mode != "json":
            return False
        return len(expected) == len(actual) and all(
            values_equal(e, a, mode, rel_tol=rel_tol, abs_tol=abs_tol)
            for e, a in zip(expected, actual, strict=True)
        )
    if te is dict and ta is dict:
        if len(expected) != len(actual):
            return False
        for k, v in expected.items():
            # Keys are compared by hashing (exact), values with the comparator.
            if k not in actual:
                return False
            if mode == "strict" and not _same_key_type(k, actual):
                return False
            if not values_equal(v, actual[k], mode, rel_tol=rel_tol, abs_tol=abs_tol):
                return False
        return True
    sets = (set, frozenset)
    if te in sets and ta in sets:
        if te is not ta and mode == "strict":
            return False
        if mode == "strict" and {type(x) for x in expected} != {type(x) for x in actual}:
            return False
        return bool(expected == actual)
    if te is not ta:
        return False
    # bool is not a number in strict and json modes (1 != True), but True still equals True.
    if te is str or te is bytes or te is bool or expected is None:
        return bool(expected == actual)
    return False


def _same_key_type(key: Any, actual: dict[Any, Any]) -> bool:
    for k in actual:
        if k == key:
            return type(k) is type(key)
    return False


def _float_token(tok: str) -> float | None:
    try:
        return float(tok)
    except ValueError:
        return None


def output_equal(
    expected: str,
    actual: str,
    mode: OutputMode = "whitespace",
    *,
    rel_tol: float = 1e-9,
    abs_tol: float = 1e-9,
) -> bool:
    """Compare program output with the expected output.

    ``exact``: byte-for-byte, except that a final newline is optional on both sides. ``whitespace``:
    the same whitespace-separated tokens. ``float``: the same tokens, where two tokens that both
    parse as numbers are compared within tolerance.
    """
    if mode == "exact":
        return expected.removesuffix("\n") == actual.removesuffix("\n")
    e_toks, a_toks = expected.split(), actual.split()
    if len(e_toks) != len(a_toks):
        return False
    if mode == "whitespace":
        return e_toks == a_toks
    for e, a in zip(e_toks, a_toks, strict=True):
        if e == a:
            continue
        fe, fa = _float_token(e), _float_token(a)
        if fe is None or fa is None or not floats_close(fe, fa, rel_tol, abs_tol):
            return False
    return True
