"""The source of the bundled repository set ``repo-demo`` (src/sandloop/data/repo_tasks.jsonl).

Each task is a small, real-looking Python library with one bug: the repository before the fix,
the fixed files (the gold patch is their diff), and the hidden tests added at grading time (the
test patch is their diff). Regenerate the data file after editing this module:

    PYTHONPATH=src python tests/tasks/bundled_repo_source.py > src/sandloop/data/repo_tasks.jsonl

tests/tasks/test_repo_tasks.py checks that the shipped file matches this source.
"""

from __future__ import annotations

import sys
from typing import Any

from sandloop.tasks.patches import make_patch
from sandloop.tasks.repo import RepoTask

SPANLIB: dict[str, Any] = {
    "id": "spanlib-touching-intervals",
    "problem_statement": (
        "spanlib.merge() does not merge intervals that touch.\n\n"
        "    >>> merge([(1, 3), (3, 5)])\n    [(1, 3), (3, 5)]\n\n"
        "Intervals are closed, so (1, 3) and (3, 5) share the point 3 and should merge into "
        "(1, 5). tests/test_merge.py::test_touching shows the failure."),
    "files": {
        "README.md": "# spanlib\n\nClosed integer intervals: merge, span length, containment.\n",
        "spanlib/__init__.py": "from spanlib.core import contains, merge, span_length\n\n"
                               "__all__ = [\"contains\", \"merge\", \"span_length\"]\n",
        "spanlib/core.py": '''"""Closed intervals (start, end) with start <= end."""

from __future__ import annotations

Interval = tuple[int, int]


def merge(intervals: list[Interval]) -> list[Interval]:
    """Merge overlapping intervals; the result is sorted and disjoint."""
    out: list[Interval] = []
    for start, end in sorted(intervals):
        if out and start < out[-1][1]:
            last_start, last_end = out[-1]
            out[-1] = (last_start, max(last_end, end))
        else:
            out.append((start, end))
    return out


def span_length(intervals: list[Interval]) -> int:
    """How many integer points the intervals cover together."""
    return sum(end - start + 1 for start, end in merge(intervals))


def contains(intervals: list[Interval], x: int) -> bool:
    """Whether any interval contains x."""
    return any(start <= x <= end for start, end in intervals)
''',
        "tests/test_merge.py": '''from spanlib import merge


def test_disjoint():
    assert merge([(5, 6), (1, 2)]) == [(1, 2), (5, 6)]


def test_overlap():
    assert merge([(1, 4), (2, 6), (8, 9)]) == [(1, 6), (8, 9)]


def test_touching():
    assert merge([(1, 3), (3, 5)]) == [(1, 5)]
''',
        "tests/test_span.py": '''from spanlib import contains, span_length


def test_span_length():
    assert span_length([(1, 2), (5, 5)]) == 3


def test_contains():
    assert contains([(1, 2)], 2) and not contains([(1, 2)], 3)
''',
    },
    "fixed": {"spanlib/core.py": "        if out and start < out[-1][1]:\n",
              "_to": "        if out and start <= out[-1][1]:\n"},
    "hidden": {"tests/test_merge.py": '''

def test_touching_chain():
    assert merge([(7, 9), (1, 3), (3, 5), (5, 7)]) == [(1, 9)]


def test_span_of_touching():
    from spanlib import span_length
    assert span_length([(1, 3), (3, 5)]) == 5
'''},
    "fail_to_pass": ["tests/test_merge.py::test_touching", "tests/test_merge.py::test_touching_chain",
                     "tests/test_merge.py::test_span_of_touching"],
    "pass_to_pass": ["tests/test_merge.py::test_disjoint", "tests/test_merge.py::test_overlap",
                     "tests/test_span.py::test_span_length", "tests/test_span.py::test_contains"],
}

SLUGKIT: dict[str, Any] = {
    "id": "slugkit-collapse-separators",
    "problem_statement": (
        "slugkit.slugify() leaves runs of separators and separators at the ends:\n\n"
        "    >>> slugify('Hello,  World!')\n    'hello---world-'\n\n"
        "Expected 'hello-world': every run of characters that are not letters or digits becomes "
        "one separator, and the slug never starts or ends with one."),
    "files": {
        "README.md": "# slugkit\n\nURL slugs from titles.\n",
        "slugkit/__init__.py": "from slugkit.slug import slugify\n\n__all__ = [\"slugify\"]\n",
        "slugkit/slug.py": '''"""Turn titles into URL slugs."""

from __future__ import annotations

import re
import unicodedata

_NOT_WORD = re.compile(r"[^a-z0-9]")


def slugify(text: str, sep: str = "-") -> str:
    """Lower-case ASCII slug of text, words joined by sep."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return _NOT_WORD.sub(sep, ascii_text.lower())
''',
        "tests/test_slug.py": '''from slugkit import slugify


def test_simple():
    assert slugify("Hello") == "hello"


def test_accents():
    assert slugify("Crème") == "creme"


def test_punctuation():
    assert slugify("Hello,  World!") == "hello-world"
''',
    },
    "fixed": {"slugkit/slug.py": '_NOT_WORD = re.compile(r"[^a-z0-9]")\n',
              "_to": '_NOT_WORD = re.compile(r"[^a-z0-9]+")\n',
              "_also": ("    return _NOT_WORD.sub(sep, ascii_text.lower())\n",
                        "    return _NOT_WORD.sub(sep, ascii_text.lower()).strip(sep)\n")},
    "hidden": {"tests/test_slug.py": '''

def test_custom_separator():
    assert slugify("  a b  c ", sep="_") == "a_b_c"


def test_only_punctuation():
    assert slugify("!!!") == ""
'''},
    "fail_to_pass": ["tests/test_slug.py::test_punctuation", "tests/test_slug.py::test_custom_separator",
                     "tests/test_slug.py::test_only_punctuation"],
    "pass_to_pass": ["tests/test_slug.py::test_simple", "tests/test_slug.py::test_accents"],
}

LRUKIT: dict[str, Any] = {
    "id": "lrukit-get-refreshes",
    "problem_statement": (
        "lrukit.LRUCache evicts the wrong entry: get() does not mark a key as recently used, so "
        "after\n\n    c = LRUCache(2); c.put('a', 1); c.put('b', 2); c.get('a'); c.put('c', 3)\n\n"
        "'a' is evicted instead of 'b'. The package's version module is generated by the "
        "set-up step (tools/write_version.py)."),
    "setup": "python tools/write_version.py",
    "files": {
        "README.md": "# lrukit\n\nA small least-recently-used cache.\n\nRun `python "
                     "tools/write_version.py` once before importing the package.\n",
        "tools/write_version.py": '''"""Write lrukit/_version.py (the set-up step)."""

from pathlib import Path

Path("lrukit/_version.py").write_text('__version__ = "1.4.2"\\n')
''',
        "lrukit/__init__.py": "from lrukit._version import __version__\nfrom lrukit.cache import "
                              "LRUCache\n\n__all__ = [\"LRUCache\", \"__version__\"]\n",
        "lrukit/cache.py": '''"""A least-recently-used cache over an OrderedDict."""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LRUCache(Generic[K, V]):
    """Holds at most capacity entries; putting one more evicts the least recently used."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._data: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K, default: V | None = None) -> V | None:
        if key not in self._data:
            return default
        return self._data[key]

    def put(self, key: K, value: V) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        if len(self._data) > self.capacity:
            self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data
''',
        "tests/test_cache.py": '''import pytest

from lrukit import LRUCache, __version__


def test_version():
    assert __version__ == "1.4.2"


def test_capacity():
    c = LRUCache(2)
    for k in "abc":
        c.put(k, 1)
    assert len(c) == 2 and "a" not in c


def test_bad_capacity():
    with pytest.raises(ValueError):
        LRUCache(0)


def test_get_refreshes():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    c.get("a")
    c.put("c", 3)
    assert "a" in c and "b" not in c
''',
    },
    "fixed": {"lrukit/cache.py": "        return self._data[key]\n",
              "_to": "        self._data.move_to_end(key)\n        return self._data[key]\n"},
    "hidden": {"tests/test_cache.py": '''

def test_get_missing_does_not_insert():
    c = LRUCache(1)
    assert c.get("x", 5) == 5 and "x" not in c


def test_many_gets():
    c = LRUCache(3)
    for k in "abc":
        c.put(k, k)
    for k in "aab":
        c.get(k)
    c.put("d", "d")
    assert sorted(c._data) == ["a", "b", "d"]
'''},
    "fail_to_pass": ["tests/test_cache.py::test_get_refreshes", "tests/test_cache.py::test_many_gets"],
    "pass_to_pass": ["tests/test_cache.py::test_version", "tests/test_cache.py::test_capacity",
                     "tests/test_cache.py::test_bad_capacity",
                     "tests/test_cache.py::test_get_missing_does_not_insert"],
}

HUMANSIZE: dict[str, Any] = {
    "id": "humansize-unit-boundary",
    "problem_statement": (
        "humansize.format_size() is off by one at unit boundaries: format_size(1024) gives "
        "'1024 B' but should give '1.0 KiB' (and format_size(1048576) should give '1.0 MiB')."),
    "files": {
        "README.md": "# humansize\n\nHuman-readable byte counts (binary units).\n",
        "humansize/__init__.py": "from humansize.units import format_size, parse_size\n\n"
                                 "__all__ = [\"format_size\", \"parse_size\"]\n",
        "humansize/units.py": '''"""Byte counts in binary units: 1 KiB = 1024 B."""

from __future__ import annotations

UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_size(n: int) -> str:
    """'512 B', '1.5 KiB', '2.0 GiB'."""
    if n < 0:
        raise ValueError("size must be >= 0")
    size = float(n)
    unit = 0
    while size > 1024 and unit < len(UNITS) - 1:
        size /= 1024
        unit += 1
    return f"{int(size)} B" if unit == 0 else f"{size:.1f} {UNITS[unit]}"


def parse_size(text: str) -> int:
    """Inverse of format_size (rounded to whole bytes)."""
    number, unit = text.split()
    return round(float(number) * 1024 ** UNITS.index(unit))
''',
        "tests/test_units.py": '''import pytest

from humansize import format_size, parse_size


def test_bytes():
    assert format_size(512) == "512 B"


def test_kib():
    assert format_size(1536) == "1.5 KiB"


def test_negative():
    with pytest.raises(ValueError):
        format_size(-1)


def test_parse():
    assert parse_size("1.5 KiB") == 1536


def test_boundary():
    assert format_size(1024) == "1.0 KiB"
''',
    },
    "fixed": {"humansize/units.py": "    while size > 1024 and unit < len(UNITS) - 1:\n",
              "_to": "    while size >= 1024 and unit < len(UNITS) - 1:\n"},
    "hidden": {"tests/test_units.py": '''

def test_mib_boundary():
    assert format_size(1024 ** 2) == "1.0 MiB"


def test_round_trip():
    assert parse_size(format_size(1024 ** 3)) == 1024 ** 3
'''},
    "fail_to_pass": ["tests/test_units.py::test_boundary", "tests/test_units.py::test_mib_boundary"],
    "pass_to_pass": ["tests/test_units.py::test_bytes", "tests/test_units.py::test_kib",
                     "tests/test_units.py::test_negative", "tests/test_units.py::test_parse",
                     "tests/test_units.py::test_round_trip"],
}

SOURCES = (SPANLIB, SLUGKIT, LRUKIT, HUMANSIZE)


def build(src: dict[str, Any]) -> RepoTask:
    """The task record of one source entry."""
    files: dict[str, str] = src["files"]
    fixed = dict(src["fixed"])
    to, also = fixed.pop("_to"), fixed.pop("_also", None)
    (path, old), = fixed.items()
    assert old in files[path], (src["id"], old)
    new_text = files[path].replace(old, to)
    if also is not None:
        assert also[0] in new_text
        new_text = new_text.replace(also[0], also[1])
    hidden = {p: files[p] + extra for p, extra in src["hidden"].items()}
    return RepoTask(
        id=src["id"], problem_statement=src["problem_statement"], files=files,
        setup=src.get("setup"), patch=make_patch(files, {path: new_text}),
        test_patch=make_patch(files, hidden), fail_to_pass=tuple(src["fail_to_pass"]),
        pass_to_pass=tuple(src["pass_to_pass"]), tags=("python", "bugfix"), source="repo-demo")


def render() -> str:
    """The JSONL text of the bundled set."""
    return "".join(build(s).to_json() + "\n" for s in SOURCES)




if __name__ == "__main__":
    sys.stdout.write(render())
