"""JSON Lines: one object per non-blank line, with errors that name the line."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from sandloop.errors import InputError


class JsonLineError(InputError):
    """A line is not a JSON object. ``line`` is 1-based; callers add the file and their type."""

    def __init__(self, line: int, reason: str) -> None:
        self.line, self.reason = line, reason
        super().__init__(f"line {line}: {reason}")


def json_objects(lines: Iterable[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line number, object) for each non-blank line."""
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise JsonLineError(lineno, f"not valid JSON ({e.msg} at column {e.colno})") from None
        except RecursionError:  # [[[[...]]]]: the decoder's recursion limit, not a crash
            raise JsonLineError(lineno, "JSON nested too deeply") from None
        if not isinstance(obj, dict):
            raise JsonLineError(lineno, f"expected a JSON object, got {type(obj).__name__}")
        yield lineno, obj
