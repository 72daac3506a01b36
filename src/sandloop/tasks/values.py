"""Typed values: a JSON encoding of plain Python data that keeps the types apart.

Function-call tests carry their arguments and expected return values in this form, and the
sandboxed harness sends return values back in it. Plain JSON would lose exactly what a type-strict
comparison needs (``(1, 2)`` vs ``[1, 2]``, ``1`` vs ``1.0`` vs ``True``) and could not say "this was
not plain data at all" — the always-equal object of a reward hack. So:

* ``None``, ``bool``, ``int``, finite ``float``, ``str`` and ``list`` map to their JSON forms
  (JSON keeps ``1`` and ``1.0`` apart, and Python's ``json`` keeps big ints exact);
* everything else is a one-key object whose key starts with ``$``: ``{"$tuple": [...]}``,
  ``{"$dict": [[k, v], ...]}``, ``{"$set": [...]}``, ``{"$frozenset": [...]}``,
  ``{"$bytes": "<hex>"}``, ``{"$float": "nan"|"inf"|"-inf"}``, ``{"$complex": [re, im]}``;
* any other object (including subclasses of the types above) becomes ``{"$opaque": "<type name>"}``,
  which decodes to an :class:`Opaque` that equals nothing.

Only exact types are encoded (``type(v) is int``), so an ``int`` subclass with a rigged ``__eq__``
cannot pass for an ``int``.

This module is standard-library only: the harness copies its source into the sandbox verbatim.
"""

from __future__ import annotations

import json
import math
from typing import Any

if __name__ == "sandloop.tasks.values":
    from sandloop.errors import InputError as _CodecBase
else:  # the verbatim copy inside the sandbox (``_sl_values``): standard library only
    _CodecBase = ValueError  # type: ignore[misc,assignment]

__all__ = [
    "MAX_DEPTH",
    "Opaque",
    "ValueCodecError",
    "decode",
    "dumps",
    "encode",
    "loads",
    "validate_encoded",
]

MAX_DEPTH = 64

_TAGS = ("$tuple", "$dict", "$set", "$frozenset", "$bytes", "$float", "$complex", "$opaque")


class ValueCodecError(_CodecBase):
    """A value cannot be encoded, or an encoded value is malformed."""


class Opaque:
    """Stand-in for an object that was not plain data. It equals nothing and has no truth value."""

    __slots__ = ("type_name",)

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name

    def __eq__(self, other: object) -> bool:
        return False

    def __ne__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return id(self)

    def __bool__(self) -> bool:
        # A test such as ``assert candidate(x)`` must not pass on an object we cannot inspect.
        raise TypeError(f"opaque value of type {self.type_name!r} has no truth value")

    def __repr__(self) -> str:
        return f"<opaque {self.type_name}>"


def _float(v: float) -> Any:
    if math.isfinite(v):
        return v
    if math.isnan(v):
        return {"$float": "nan"}
    return {"$float": "inf" if v > 0 else "-inf"}


def encode(value: Any, *, strict: bool = False, _depth: int = 0) -> Any:
    """Encode ``value`` into typed JSON-able data.

    With ``strict=True`` anything that is not plain data raises :class:`ValueCodecError` (used for
    test arguments, which must be data); otherwise it becomes ``{"$opaque": type name}``.
    """
    if _depth > MAX_DEPTH:
        raise ValueCodecError(f"value nested deeper than {MAX_DEPTH} levels")
    t = type(value)
    d = _depth + 1
    if value is None or t is bool or t is int or t is str:
        return value
    if t is float:
        return _float(value)
    if t is list:
        return [encode(x, strict=strict, _depth=d) for x in value]
    if t is tuple:
        return {"$tuple": [encode(x, strict=strict, _depth=d) for x in value]}
    if t is dict:
        return {
            "$dict": [
                [encode(k, strict=strict, _depth=d), encode(x, strict=strict, _depth=d)]
                for k, x in value.items()
            ]
        }
    if t is set or t is frozenset:
        tag = "$set" if t is set else "$frozenset"
        items = [encode(x, strict=strict, _depth=d) for x in value]
        # Sets have no order; sort the encoded forms so equal sets encode identically.
        items.sort(key=lambda x: json.dumps(x, sort_keys=True))
        return {tag: items}
    if t is bytes:
        # Hex, not base64: importing base64 costs ~5 ms in every sandbox run.
        return {"$bytes": value.hex()}
    if t is complex:
        return {"$complex": [_float(value.real), _float(value.imag)]}
    if strict:
        raise ValueCodecError(
            f"cannot encode a value of type {t.__name__!r}: only None, bool, int, float, str, "
            "bytes, complex, list, tuple, dict, set and frozenset are data"
        )
    name = getattr(t, "__qualname__", "?")
    return {"$opaque": name if type(name) is str else "?"}


def _dec_float(x: Any) -> float:
    if type(x) is float:
        return x
    if type(x) is int:
        # JSON writers of other languages may print 2.0 as 2; inside $complex that is unambiguous.
        return float(x)
    if type(x) is dict and len(x) == 1 and "$float" in x:
        s = x["$float"]
        if s in ("nan", "inf", "-inf"):
            return float(s)
    raise ValueCodecError(f"malformed float {x!r}")


def decode(data: Any, *, _depth: int = 0) -> Any:
    """Decode typed JSON data (as produced by :func:`encode`) back into Python values."""
    if _depth > MAX_DEPTH:
        raise ValueCodecError(f"value nested deeper than {MAX_DEPTH} levels")
    t = type(data)
    d = _depth + 1
    if data is None or t is bool or t is int or t is str or t is float:
        return data
    if t is list:
        return [decode(x, _depth=d) for x in data]
    if t is not dict or len(data) != 1:
        raise ValueCodecError(
            f"malformed typed value {str(data)[:80]!r}: objects must have exactly one '$' tag"
        )
    ((tag, body),) = data.items()
    if tag == "$tuple" and type(body) is list:
        return tuple(decode(x, _depth=d) for x in body)
    if tag == "$dict" and type(body) is list:
        out: dict[Any, Any] = {}
        for pair in body:
            if type(pair) is not list or len(pair) != 2:
                raise ValueCodecError(f"malformed $dict entry {str(pair)[:80]!r}")
            key = decode(pair[0], _depth=d)
            try:
                out[key] = decode(pair[1], _depth=d)
            except TypeError as e:  # unhashable key
                raise ValueCodecError(f"unhashable $dict key: {e}") from None
        return out
    if tag in ("$set", "$frozenset") and type(body) is list:
        try:
            items = [decode(x, _depth=d) for x in body]
            return set(items) if tag == "$set" else frozenset(items)
        except TypeError as e:
            raise ValueCodecError(f"unhashable {tag} element: {e}") from None
    if tag == "$bytes" and type(body) is str:
        try:
            return bytes.fromhex(body)
        except ValueError as e:
            raise ValueCodecError(f"malformed $bytes: {e}") from None
    if tag == "$float":
        return _dec_float(data)
    if tag == "$complex" and type(body) is list and len(body) == 2:
        return complex(_dec_float(body[0]), _dec_float(body[1]))
    if tag == "$opaque" and type(body) is str:
        return Opaque(body[:200])
    raise ValueCodecError(
        f"unknown or malformed typed value tag {tag!r}; known tags: {', '.join(_TAGS)}"
    )


def validate_encoded(data: Any) -> None:
    """Raise :class:`ValueCodecError` unless ``data`` is a well-formed typed value."""
    decode(data)


def dumps(value: Any, *, strict: bool = False) -> str:
    """Encode ``value`` and serialise it as compact JSON."""
    return json.dumps(encode(value, strict=strict), separators=(",", ":"), allow_nan=False)


def loads(text: str | bytes) -> Any:
    """Parse JSON text and decode the typed value in it."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ValueCodecError(f"not valid JSON: {e}") from None
    return decode(data)
