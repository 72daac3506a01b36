"""Typed signatures of entry points in Java, Go, Rust and TypeScript (pure; data only).

A function-call task in one of those languages names its entry point's parameter types and its
return type in a small language-neutral notation:

    int            a 64-bit signed integer
    float          a 64-bit float (NaN and infinities included)
    bool
    str            a Unicode string
    list[T]        a list of T (nested lists too: list[list[int]])

The verifier compiles a harness that calls the entry point with each test's arguments, written
as literals of those types in the task's language, and sends the typed return value back; the
comparison happens outside the sandbox (docs/tasks.md, "Function calls in compiled languages",
has the per-language mapping). Arguments and expected values must fit the declared types: a
task that could never pass is refused when it is loaded.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from sandloop.errors import InputError, TaskError
from sandloop.tasks.values import ValueCodecError, decode

__all__ = ["INT_RANGE", "SAFE_INT_RANGE", "SCALARS", "SigType", "SignatureError", "check_value", "parse_type"]

SCALARS = ("int", "float", "bool", "str")
INT_RANGE = (-(2**63), 2**63 - 1)
# TypeScript's numbers hold integers exactly only up to 2^53 - 1.
SAFE_INT_RANGE = (-(2**53 - 1), 2**53 - 1)
# Nested deeper than this is no test's argument: the bound keeps code generation simple.
MAX_NESTING = 8

_TYPE_RE = re.compile(r"\s*(int|float|bool|str|list)\s*")


class SignatureError(TaskError, InputError):
    """A type that is not in the notation, or a value that does not fit its declared type."""


@dataclass(frozen=True)
class SigType:
    """A parsed type: a scalar (``item`` None), or ``list`` of ``item``."""

    name: str
    item: SigType | None = None

    def __str__(self) -> str:
        return f"list[{self.item}]" if self.item is not None else self.name

    @property
    def depth(self) -> int:
        """How many lists deep (``list[list[int]]``: 2)."""
        return 0 if self.item is None else 1 + self.item.depth

    @property
    def scalar(self) -> str:
        """The innermost scalar type's name."""
        return self.name if self.item is None else self.item.scalar


def parse_type(text: str) -> SigType:
    """Parse ``int``, ``float``, ``bool``, ``str`` or ``list[T]``."""
    t, rest = _parse(text, 0)
    if rest.strip():
        raise SignatureError(f"type {text!r}: unexpected {rest.strip()!r} at the end; types are "
                             f"{', '.join(SCALARS)} or list[T]")
    return t


def _parse(text: str, depth: int) -> tuple[SigType, str]:
    if depth > MAX_NESTING:
        raise SignatureError(f"type {text!r} nests lists deeper than {MAX_NESTING}")
    m = _TYPE_RE.match(text)
    if m is None:
        raise SignatureError(f"type {text!r} is not one of {', '.join(SCALARS)} or list[T]")
    name, rest = m.group(1), text[m.end():]
    if name != "list":
        return SigType(name), rest
    if not rest.startswith("["):
        raise SignatureError(f"type {text!r}: list needs its item type, as in list[int]")
    item, rest = _parse(rest[1:], depth + 1)
    rest = rest.lstrip()
    if not rest.startswith("]"):
        raise SignatureError(f"type {text!r}: missing ']'")
    return SigType("list", item), rest[1:]


def check_value(t: SigType, encoded: Any, what: str, *, int_range: tuple[int, int] = INT_RANGE
                ) -> Any:
    """The decoded value of the typed value ``encoded`` if it fits ``t`` (an ``int`` fits a
    ``float``; ints within ``int_range``); else SignatureError naming ``what``."""
    try:
        value = decode(encoded)
    except ValueCodecError as e:
        raise SignatureError(f"{what}: {e}") from None
    _check(t, value, what, int_range)
    return value


def _check(t: SigType, v: Any, what: str, int_range: tuple[int, int] = INT_RANGE) -> None:
    kind = type(v)
    if t.item is not None:
        if kind is not list:
            raise SignatureError(f"{what}: {t} expected, got {kind.__name__}")
        for i, x in enumerate(v):
            _check(t.item, x, f"{what}[{i}]", int_range)
        return
    ok = {
        "int": kind is int and int_range[0] <= v <= int_range[1],
        "float": kind is float or (kind is int and abs(v) <= 2**53),
        "bool": kind is bool,
        "str": kind is str and _encodable(v),
    }[t.name]
    if not ok:
        if kind is int and t.name == "int":
            raise SignatureError(f"{what}: {v} is outside the range of int here "
                                 f"[{int_range[0]}, {int_range[1]}]")
        if kind is str and t.name == "str":
            raise SignatureError(f"{what}: a string with a lone surrogate is not Unicode text")
        raise SignatureError(f"{what}: {t} expected, got {kind.__name__} {v!r:.60}")


def _encodable(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def is_special_float(x: float) -> bool:
    """NaN or an infinity (written with the language's constants, not as a literal)."""
    return math.isnan(x) or math.isinf(x)
