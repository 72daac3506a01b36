"""Comparators (pure functions): returned values vs expected values, stdout vs expected stdout.

They run outside the sandbox, on decoded plain data (see :mod:`sandloop.tasks.values`): ``None``,
``bool``, ``int``, ``float``, ``complex``, ``str``, ``bytes``, ``list``, ``tuple``, ``dict``,
``set`` and ``frozenset``. Anything else — an :class:`~sandloop.tasks.values.Opaque` (an object
that was not plain data, such as an always-equal object) or a subclass of a plain type — equals
nothing, not even itself.

Value modes differ only in which types count as the same *kind* (docs/rewards.md has the table):

* ``strict``: every type is its own kind (``True`` != ``1`` != ``1.0``, ``(1,)`` != ``[1]``,
  ``set`` != ``frozenset``);
* ``json``: ``int`` and ``float`` are one kind, ``list`` and ``tuple`` are one kind; everything
  else as in ``strict`` (``True`` != ``1``: JSON keeps booleans and numbers apart);
* ``python``: Python ``==`` on plain data: ``bool``, ``int``, ``float`` and ``complex`` are one
  kind, ``set`` and ``frozenset`` are one kind; ``list`` != ``tuple``.

Within a kind: ``bool``, ``int``, ``str``, ``bytes`` and ``None`` are equal when exactly equal;
a ``float`` or ``complex`` on either side makes the comparison numeric within
``rel_tol``/``abs_tol`` (``math.isclose``; an ``int`` is converted to the nearest float; NaN
equals NaN; -0.0 equals 0.0); sequences are equal element by element; dicts have the same keys
and equal values. Dict keys and set elements are matched *exactly* (by hash, no float
tolerance), keeping types apart as the mode does, with NaN equal to NaN.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Literal

__all__ = ["floats_close", "output_equal", "values_equal"]

ValueMode = Literal["strict", "python", "json"]
OutputMode = Literal["exact", "whitespace", "float"]

_NoneType = type(None)
# The types that are data; anything else (Opaque, subclasses, arbitrary objects) equals nothing.
_PLAIN = frozenset(
    {_NoneType, bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset}
)

# Per mode, the kind of each plain type: two values can only be equal if their kinds agree.
_KINDS: dict[str, dict[type, str]] = {
    "strict": {t: t.__name__ for t in _PLAIN},
    "json": {
        **{t: t.__name__ for t in _PLAIN},
        int: "number", float: "number", list: "sequence", tuple: "sequence",
    },
    "python": {
        **{t: t.__name__ for t in _PLAIN},
        bool: "number", int: "number", float: "number", complex: "number",
        set: "set", frozenset: "set",
    },
}


_NUMBER = frozenset({bool, int, float, complex})


class _NotData(Exception):
    """A value that is not plain data was found where a key is needed: it equals nothing."""


def floats_close(expected: float, actual: float, rel_tol: float, abs_tol: float) -> bool:
    """Equal within tolerance; NaN equals NaN (an expected NaN is a legitimate answer)."""
    if math.isnan(expected) or math.isnan(actual):
        return math.isnan(expected) and math.isnan(actual)
    if expected == actual:  # also equal infinities
        return True
    return math.isclose(expected, actual, rel_tol=rel_tol, abs_tol=abs_tol)


def _as_float(x: int | float) -> float | None:
    try:
        return float(x)
    except OverflowError:  # an int beyond the float range is close to no float
        return None


def _numbers_equal(e: Any, a: Any, rel_tol: float, abs_tol: float) -> bool:
    """Two numbers of one kind (the mode already decided that their types may meet)."""
    te, ta = type(e), type(a)
    if te is complex or ta is complex:
        ce, ca = complex(e), complex(a)
        return floats_close(ce.real, ca.real, rel_tol, abs_tol) and floats_close(
            ce.imag, ca.imag, rel_tol, abs_tol
        )
    if te is float or ta is float:
        if e == a:  # exact, also for an int too large for a float
            return True
        fe, fa = _as_float(e), _as_float(a)
        return fe is not None and fa is not None and floats_close(fe, fa, rel_tol, abs_tol)
    return bool(e == a)  # bool and int: exact


def _key(x: Any, mode: ValueMode) -> Any:
    """A hashable stand-in for a dict key or set element: equal exactly when the two values are
    equal in ``mode`` without tolerance (NaN equal to NaN, the mode's kinds kept apart)."""
    t = type(x)
    if t not in _PLAIN:
        raise _NotData
    kind = _KINDS[mode][t]
    if t is float:
        return (kind, "nan" if math.isnan(x) else x)
    if t is complex:
        if mode == "python" and x.imag == 0:
            return (kind, "nan" if math.isnan(x.real) else x.real)  # 2+0j == 2
        return (kind, _key(x.real, mode), _key(x.imag, mode))
    if t is tuple or t is list:
        return (kind, tuple(_key(v, mode) for v in x))
    if t is frozenset or t is set:
        return (kind, frozenset(Counter(_key(v, mode) for v in x).items()))
    # bool, int, str, bytes, None: Python's own equality and hash are exact. In python mode
    # True, 1 and 1.0 share a kind, are == and hash alike, as Python's dicts and sets have them.
    return (kind, x)


def values_equal(
    expected: Any,
    actual: Any,
    mode: ValueMode = "strict",
    *,
    rel_tol: float = 1e-9,
    abs_tol: float = 1e-9,
) -> bool:
    """Whether ``actual`` equals ``expected`` in ``mode`` (see the module docstring).

    Reflexive on plain data and symmetric in its two value arguments.
    """
    try:
        return _equal(expected, actual, mode, rel_tol, abs_tol)
    except _NotData:
        return False


def _equal(e: Any, a: Any, mode: ValueMode, rel_tol: float, abs_tol: float) -> bool:
    te, ta = type(e), type(a)
    if te not in _PLAIN or ta not in _PLAIN:
        return False
    kinds = _KINDS[mode]
    if kinds[te] != kinds[ta]:
        return False
    if te in _NUMBER and ta in _NUMBER:
        return _numbers_equal(e, a, rel_tol, abs_tol)
    if te is list or te is tuple:
        return len(e) == len(a) and all(
            _equal(x, y, mode, rel_tol, abs_tol) for x, y in zip(e, a, strict=True)
        )
    if te is dict:
        return _dicts_equal(e, a, mode, rel_tol, abs_tol)
    if te is set or te is frozenset:
        if len(e) != len(a):
            return False
        return Counter(_key(x, mode) for x in e) == Counter(_key(y, mode) for y in a)
    return bool(e == a)  # str, bytes, None



def _dicts_equal(e: dict[Any, Any], a: dict[Any, Any], mode: ValueMode, rel_tol: float,
                 abs_tol: float) -> bool:
    if len(e) != len(a):
        return False
    # Keys by their exact stand-ins. A list per stand-in: two NaN keys are distinct dict keys
    # (NaN != NaN) but one stand-in; their values are matched in insertion order.
    by_key: dict[Any, list[Any]] = {}
    for k, v in a.items():
        by_key.setdefault(_key(k, mode), []).append(v)
    wanted: dict[Any, list[Any]] = {}
    for k, v in e.items():
        wanted.setdefault(_key(k, mode), []).append(v)
    if by_key.keys() != wanted.keys():
        return False
    for k, values in wanted.items():
        got = by_key[k]
        if len(got) != len(values) or not all(
            _equal(x, y, mode, rel_tol, abs_tol) for x, y in zip(values, got, strict=True)
        ):
            return False
    return True


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
