"""The manifest of a built tree: every entry's path, kind, mode and content hash.

An environment's id hashes its resolved spec together with this manifest, so any changed byte,
mode bit, added, removed or retargeted file gives a different id; ``verify`` re-scans the tree
and compares. Ownership and timestamps are left out on purpose: they differ between machines and
copies without changing what a program sees.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from sandloop.envs.errors import EnvBuildError

_CHUNK = 1 << 20


@dataclass(frozen=True)
class Entry:
    """One path in the tree: ``kind`` is ``f`` (file), ``d`` (directory) or ``l`` (symlink);
    ``digest`` is the file's sha256 or the link's target."""

    path: str
    kind: str
    mode: int
    size: int
    digest: str

    def line(self) -> str:
        return f"{self.kind}\t{self.mode:04o}\t{self.size}\t{self.digest}\t{self.path}"

    @classmethod
    def parse(cls, line: str) -> Entry:
        kind, mode, size, digest, path = line.split("\t", 4)
        return cls(path, kind, int(mode, 8), int(size), digest)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def scan(root: Path) -> list[Entry]:
    """Every entry under ``root``, sorted by path. Refuses what a tree must not hold (devices,
    sockets, fifos): a mounted runtime has no use for them and they could reach host objects."""
    out: list[Entry] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        base = Path(dirpath)
        for name in sorted(dirnames + filenames):
            p = base / name
            rel = p.relative_to(root).as_posix()
            if "\t" in rel or "\n" in rel:
                raise EnvBuildError(f"{rel!r}: a tab or newline in a file name cannot be "
                                    "recorded in the manifest; rename it")
            st = os.lstat(p)
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                out.append(Entry(rel, "l", 0o777, 0, os.readlink(p)))
            elif stat.S_ISDIR(st.st_mode):
                out.append(Entry(rel, "d", mode, 0, ""))
            elif stat.S_ISREG(st.st_mode):
                out.append(Entry(rel, "f", mode, st.st_size, _sha256(p)))
            else:
                raise EnvBuildError(f"{rel}: not a file, directory or symlink; an environment "
                                    "tree holds only those")
    out.sort(key=lambda e: e.path)
    return out


def render(entries: list[Entry]) -> str:
    """The manifest file's text (one tab-separated line per entry)."""
    return "".join(e.line() + "\n" for e in entries)


def parse(text: str) -> list[Entry]:
    return [Entry.parse(line) for line in text.splitlines() if line]


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


@dataclass(frozen=True)
class Difference:
    """What changed in a tree since it was built."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]

    @property
    def clean(self) -> bool:
        return not (self.added or self.removed or self.changed)

    def summary(self, limit: int = 10) -> str:
        parts = []
        for what, paths in (("modified", self.changed), ("added", self.added),
                            ("removed", self.removed)):
            if paths:
                shown = ", ".join(paths[:limit]) + (" ..." if len(paths) > limit else "")
                parts.append(f"{len(paths)} {what}: {shown}")
        return "; ".join(parts) or "no difference"


def compare(expected: list[Entry], actual: list[Entry]) -> Difference:
    exp = {e.path: e for e in expected}
    act = {e.path: e for e in actual}
    return Difference(
        added=tuple(sorted(set(act) - set(exp))),
        removed=tuple(sorted(set(exp) - set(act))),
        changed=tuple(sorted(p for p in set(exp) & set(act) if exp[p] != act[p])),
    )
