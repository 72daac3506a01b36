"""Typed values: round trips keep types apart; malformed data and non-data are rejected."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from sandloop.tasks.values import Opaque, ValueCodecError, decode, dumps, encode, loads


@pytest.mark.parametrize(
    "value",
    [None, True, False, 0, -5, 2**100, 1.5, -0.0, "héllo", b"\x00\xff", [1, [2, "x"]], (1, 2),
     (), {"a": 1, 2: (3,)}, {1, 2, 3}, frozenset({"a"}), 1 + 2j, [(1.0, None)]],
)
def test_round_trip_keeps_value_and_type(value: Any) -> None:
    back = loads(dumps(value))
    assert back == value
    assert type(back) is type(value)


def test_tuple_list_int_float_bool_stay_distinct() -> None:
    assert type(loads(dumps((1,)))) is tuple
    assert type(loads(dumps([1]))) is list
    assert type(loads(dumps(1.0))) is float
    assert type(loads(dumps(1))) is int
    assert loads(dumps(True)) is True


def test_non_finite_floats() -> None:
    assert math.isnan(loads(dumps(float("nan"))))
    assert loads(dumps(float("-inf"))) == float("-inf")


def test_subclasses_and_objects_become_opaque() -> None:
    class Sneaky(int):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = int.__hash__

    for obj in (Sneaky(3), object(), lambda: 1):
        enc = encode(obj)
        assert set(enc) == {"$opaque"}
        back = decode(enc)
        assert isinstance(back, Opaque)
        assert back != back  # equals nothing, not even itself
        with pytest.raises(TypeError):
            bool(back)


def test_strict_encode_rejects_non_data() -> None:
    with pytest.raises(ValueCodecError, match="cannot encode"):
        encode(object(), strict=True)


def test_sets_encode_deterministically() -> None:
    assert dumps({3, 1, 2}) == dumps({2, 3, 1})


@pytest.mark.parametrize(
    "data",
    [{"a": 1}, {"$tuple": 1}, {"$nope": []}, {"$dict": [[1]]}, {"$bytes": "zz"},
     {"$float": "1.5"}, {"$set": [[1]]}, {"$tuple": [], "$set": []}],
)
def test_malformed_data_is_rejected(data: Any) -> None:
    with pytest.raises(ValueCodecError):
        decode(data)


def test_depth_limit() -> None:
    deep: Any = []
    for _ in range(200):
        deep = [deep]
    with pytest.raises(ValueCodecError, match="deeper"):
        encode(deep)
    with pytest.raises(ValueCodecError):
        loads(json.dumps(deep))
