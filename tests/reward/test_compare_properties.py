"""Property tests of the value comparator over every typed value, in every mode.

What they hold ``values_equal`` to (docs/rewards.md, "Comparison"):

* reflexive on every typed value, before and after the typed-JSON round trip the harness uses;
* symmetric;
* with zero tolerance, equal exactly when an independent canonical form is equal (the mode's
  kinds merged, NaN = NaN, -0.0 = 0.0, dicts and sets unordered);
* tolerant only where documented: a one-ulp change of a float is accepted (with the default
  tolerance) only outside dict keys and set elements; a bool turned int, an int turned float, a
  tuple turned list, a set turned frozenset is accepted only in the modes that merge those kinds;
  any other change is rejected in every mode. ``True`` never equals ``1`` in strict mode.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandloop.reward.compare import ValueMode, values_equal
from sandloop.tasks.values import decode, dumps, encode, loads

MODES: tuple[ValueMode, ...] = ("strict", "json", "python")

# -- strategies ------------------------------------------------------------------------------

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**300), max_value=2**300),
    st.floats(),  # NaN, +-inf, -0.0, subnormals included
    st.complex_numbers(),
    st.text(max_size=6),
    st.binary(max_size=6),
)
HASHABLE = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3).map(tuple), st.frozensets(inner, max_size=3)),
    max_leaves=6,
)


def _containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(HASHABLE, inner, max_size=3),
        st.sets(HASHABLE, max_size=3),
        st.frozensets(HASHABLE, max_size=3),
    )


VALUES = st.recursive(SCALARS, _containers, max_leaves=10)

# A small domain, so that two independent draws are often equal in some mode.
_TINY_SCALARS = st.sampled_from(
    [None, True, False, 0, 1, 2, 0.0, -0.0, 1.0, 2.0, float("nan"), float("inf"), 1 + 0j, 1j,
     complex(float("nan"), 0.0), "", "a", b"", b"a"]
)
_TINY_HASHABLE = st.recursive(
    _TINY_SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=2).map(tuple), st.frozensets(inner, max_size=2)),
    max_leaves=3,
)
TINY = st.recursive(
    _TINY_SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=2),
        st.lists(inner, max_size=2).map(tuple),
        st.dictionaries(_TINY_HASHABLE, inner, max_size=2),
        st.sets(_TINY_HASHABLE, max_size=2),
        st.frozensets(_TINY_HASHABLE, max_size=2),
    ),
    max_leaves=4,
)

PROPS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _through_harness_channel(v: Any) -> Any:
    """What the host gets back when the completion returns ``v``: the worker encodes it, the
    driver frames it as JSON and records it on the channel, the host decodes it."""
    record = json.dumps({"status": "ok", "value": encode(v)}, separators=(",", ":"), allow_nan=False)
    return decode(json.loads(record)["value"])


# -- reflexive, round trip, symmetric ---------------------------------------------------------


@PROPS
@given(VALUES)
def test_every_typed_value_survives_the_round_trip(v: Any) -> None:
    back = _through_harness_channel(v)
    # Same typed encoding: every type (bool, tuple, frozenset, -0.0, NaN, bytes...) kept.
    assert dumps(back) == dumps(v)


@PROPS
@given(VALUES)
def test_reflexive_in_every_mode(v: Any) -> None:
    back = _through_harness_channel(v)
    for mode in MODES:
        assert values_equal(v, v, mode), mode
        assert values_equal(v, back, mode), mode
        assert values_equal(back, v, mode, rel_tol=0.0, abs_tol=0.0), mode


@PROPS
@given(TINY, TINY)
def test_symmetric_and_strict_is_the_finest(a: Any, b: Any) -> None:
    for mode in MODES:
        for tol in (0.0, 1e-9):
            assert values_equal(a, b, mode, rel_tol=tol, abs_tol=tol) == values_equal(
                b, a, mode, rel_tol=tol, abs_tol=tol
            ), mode
    if values_equal(a, b, "strict"):
        assert values_equal(a, b, "json") and values_equal(a, b, "python")


# -- an independent definition, zero tolerance ------------------------------------------------


def _f(x: float) -> Any:
    return "nan" if math.isnan(x) else x + 0.0  # -0.0 + 0.0 == 0.0


def _canon(v: Any, mode: ValueMode) -> Any:
    """A canonical form: equal forms <=> equal values in ``mode`` with zero tolerance."""
    t = type(v)
    if t in (bool, int, float, complex):
        if mode == "python":  # Python ==: True == 1 == 1.0 == 1+0j
            c = complex(v)
            return ("num", _f(c.real), _f(c.imag))
        if mode == "json" and t in (int, float):
            return ("num", _f(float(v)))
        if t is complex:
            return ("complex", _f(v.real), _f(v.imag))
        return (t.__name__, _f(v) if t is float else v)
    if t in (list, tuple):
        return ("seq" if mode == "json" else t.__name__, tuple(_canon(x, mode) for x in v))
    if t in (set, frozenset):
        tag = "set" if mode == "python" else t.__name__
        return (tag, tuple(sorted(repr(_canon(x, mode)) for x in v)))
    if t is dict:
        return ("dict", tuple(sorted((repr(_canon(k, mode)), repr(_canon(x, mode)))
                                     for k, x in v.items())))
    return (t.__name__, v)


@PROPS
@given(TINY, TINY)
def test_zero_tolerance_equality_is_canonical_equality(a: Any, b: Any) -> None:
    for mode in MODES:
        expect = repr(_canon(a, mode)) == repr(_canon(b, mode))
        assert values_equal(a, b, mode, rel_tol=0.0, abs_tol=0.0) == expect, mode


# -- tolerant only where documented -----------------------------------------------------------

Path = tuple[tuple[str, int], ...]


def _sites(v: Any, path: Path = (), in_key: bool = False) -> Iterator[tuple[Path, Any, bool]]:
    """Every sub-value, where it is, and whether it sits in a dict key or set element."""
    yield path, v, in_key
    t = type(v)
    if t in (list, tuple):
        for i, x in enumerate(v):
            yield from _sites(x, (*path, ("i", i)), in_key)
    elif t in (set, frozenset):
        for i, x in enumerate(v):
            yield from _sites(x, (*path, ("i", i)), True)
    elif t is dict:
        for i, (k, x) in enumerate(v.items()):
            yield from _sites(k, (*path, ("k", i)), True)
            yield from _sites(x, (*path, ("v", i)), in_key)


def _replace(v: Any, path: Path, new: Any) -> Any:
    if not path:
        return new
    (step, i), rest = path[0], path[1:]
    if type(v) is dict:
        items = list(v.items())
        k, x = items[i]
        items[i] = (_replace(k, rest, new), x) if step == "k" else (k, _replace(x, rest, new))
        return dict(items)
    items = list(v)
    items[i] = _replace(items[i], rest, new)
    return type(v)(items)


def _nudged(x: float) -> float:
    """One ulp towards zero (away from it for zero): within any tolerance, never equal."""
    return math.nextafter(x, 0.0) if x != 0 else math.nextafter(x, 1.0)


def _changed(x: Any) -> Any:
    """A value of the same type that no mode and no tolerance may call equal to ``x``."""
    t = type(x)
    if t is bool:
        return not x
    if t is int:
        return x + 1
    if t is float:
        if math.isnan(x):
            return 1.0
        return -x if math.isinf(x) else x + max(1.0, abs(x))
    if t is complex:
        return complex(_changed(x.real), x.imag)
    if t is str:
        return x + "x"
    if t is bytes:
        return x + b"x"
    return 0  # None


_NEW = b"<grown>"  # longer than any generated bytes: never already present


def _grown(x: Any) -> Any:
    """The container with one more element: equal to ``x`` in no mode."""
    if type(x) is dict:
        return {**x, _NEW: None}
    if type(x) in (set, frozenset):
        return type(x)({*x, _NEW})
    return type(x)([*x, _NEW])


# (name, applicable?, change, accepted in modes) - the accepting modes with the default tolerance.
ALL, NONE = frozenset(MODES), frozenset[str]()
Mutation = tuple[str, Callable[[Any, bool], bool], Callable[[Any], Any], frozenset[str]]
MUTATIONS: list[Mutation] = [
    ("bool->int", lambda x, k: type(x) is bool, int, frozenset({"python"})),
    ("int->float", lambda x, k: type(x) is int and abs(x) <= 2**53, float,
     frozenset({"json", "python"})),
    ("tuple->list", lambda x, k: type(x) is tuple and not k, list, frozenset({"json"})),
    ("list->tuple", lambda x, k: type(x) is list, tuple, frozenset({"json"})),
    ("set->frozenset", lambda x, k: type(x) is set, frozenset, frozenset({"python"})),
    ("frozenset->set", lambda x, k: type(x) is frozenset and not k, set, frozenset({"python"})),
    ("change", lambda x, k: type(x) in (type(None), bool, int, float, complex, str, bytes),
     _changed, NONE),
    ("grow", lambda x, k: type(x) in (list, tuple, dict, set, frozenset), _grown, NONE),
]


@PROPS
@given(VALUES, st.data())
def test_tolerant_only_where_documented(v: Any, data: st.DataObject) -> None:
    sites = list(_sites(v))
    path, leaf, in_key = data.draw(st.sampled_from(sites))
    candidates: list[tuple[str, Any, frozenset[str], frozenset[str]]] = [
        (name, change(leaf), modes, modes) for name, ok, change, modes in MUTATIONS
        if ok(leaf, in_key)
    ]
    if type(leaf) in (float, complex):
        re = leaf.real
        if math.isfinite(re):
            n = _nudged(re) if type(leaf) is float else complex(_nudged(re), leaf.imag)
            # Within tolerance as a value; exact as a key or set element; never at zero tolerance.
            candidates.append(("nudge", n, NONE if in_key else ALL, NONE))
    name, new, with_tol, without_tol = data.draw(st.sampled_from(candidates))
    w = _replace(v, path, new)
    for mode in MODES:
        got = values_equal(v, w, mode)
        assert got == (mode in with_tol), (name, mode, w)
        assert values_equal(w, v, mode) == got, (name, mode, "symmetry")
        assert values_equal(v, w, mode, rel_tol=0.0, abs_tol=0.0) == (mode in without_tol), (
            name, mode, "zero tolerance")


@PROPS
@given(VALUES)
def test_true_never_equals_one_in_strict_mode(v: Any) -> None:
    for b, i in ((True, 1), (False, 0)):
        for container in (lambda x: x, lambda x: [v, x], lambda x: {"k": x}, lambda x: (x, v),
                          lambda x: {x: v}, lambda x: frozenset({x})):
            assert not values_equal(container(b), container(i), "strict")
            assert not values_equal(container(b), container(i), "json")
            assert values_equal(container(b), container(i), "python")


def test_booleans_are_answers_in_every_mode() -> None:
    """The regression: a correct bool (or a container of bools) was a wrong answer."""
    for mode in MODES:
        for v in (True, False, [True, False], (True,), {"a": True, "b": False}, {True: [False]},
                  {True, False}, frozenset({False}), [[True], {"x": (False, None)}]):
            assert values_equal(v, v, mode), (mode, v)
            assert values_equal(v, loads(dumps(v)), mode), (mode, v)
        assert not values_equal(True, False, mode)
        assert not values_equal([True], [False], mode)
        assert not values_equal({"a": True}, {"a": False}, mode)
