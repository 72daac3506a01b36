"""Unified diffs as data: parse them, apply them to in-memory files, and make them.

Pure functions (no processes, no files on disk): repository tasks carry their gold fix and their
deciding tests as unified diffs (``git diff`` / ``diff -u`` output), and grading applies them to
file contents held by the supervisor, so the result never depends on tools inside the sandbox.

Application is strict about context (every context and removed line must match, at the hunk's
position or shifted by up to ``fuzz_lines`` lines: line numbers in hand-written diffs drift), and
all-or-nothing: a patch that does not apply changes no file.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from sandloop.errors import InputError, TaskError

__all__ = ["FilePatch", "Hunk", "PatchError", "apply_patch", "make_patch", "parse_patch",
           "patched_paths"]

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_NULL = "/dev/null"


class PatchError(TaskError, InputError):
    """A diff is malformed or does not apply; the message names the file and the hunk."""


@dataclass(frozen=True)
class Hunk:
    """One ``@@`` block: ``lines`` keep their prefix (`` ``, ``-``, ``+``), without newlines."""

    old_start: int
    lines: tuple[str, ...]
    # Whether the old / new side ends without a final newline ("\ No newline at end of file").
    old_no_eol: bool = False
    new_no_eol: bool = False


@dataclass(frozen=True)
class FilePatch:
    """The changes to one file. ``old_path`` is None for a new file, ``new_path`` for a deletion."""

    old_path: str | None
    new_path: str | None
    hunks: tuple[Hunk, ...] = field(default_factory=tuple)

    @property
    def path(self) -> str:
        """The file this patch leaves (or, for a deletion, removes)."""
        p = self.new_path if self.new_path is not None else self.old_path
        assert p is not None
        return p


def _strip(name: str) -> str | None:
    name = name.split("\t", 1)[0].strip()
    if name == _NULL:
        return None
    if name.startswith(("a/", "b/")):
        name = name[2:]
    return name


def parse_patch(text: str) -> list[FilePatch]:
    """Parse a unified diff (several files; ``git diff`` headers allowed) into file patches."""
    lines = text.splitlines()
    out: list[FilePatch] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith("--- ") or i + 1 >= len(lines) \
                or not lines[i + 1].startswith("+++ "):
            i += 1
            continue
        old, new = _strip(lines[i][4:]), _strip(lines[i + 1][4:])
        if old is None and new is None:
            raise PatchError(f"line {i + 1}: a file patch from /dev/null to /dev/null")
        i += 2
        hunks: list[Hunk] = []
        while i < len(lines) and lines[i].startswith("@@"):
            m = _HUNK.match(lines[i])
            if m is None:
                raise PatchError(f"line {i + 1}: malformed hunk header {lines[i]!r}")
            old_len = int(m.group(2)) if m.group(2) is not None else 1
            new_len = int(m.group(4)) if m.group(4) is not None else 1
            i += 1
            body: list[str] = []
            seen_old = seen_new = 0
            old_no_eol = new_no_eol = False
            while i < len(lines) and (seen_old < old_len or seen_new < new_len
                                      or lines[i].startswith("\\")):
                line = lines[i]
                if line.startswith("\\"):
                    last = body[-1][:1] if body else " "
                    if last in (" ", "-"):
                        old_no_eol = True
                    if last in (" ", "+"):
                        new_no_eol = True
                    i += 1
                    continue
                tag = line[:1] or " "  # some tools drop the space of an empty context line
                if tag not in (" ", "-", "+"):
                    raise PatchError(f"line {i + 1}: unexpected {line[:40]!r} inside a hunk of "
                                     f"{new or old}; the hunk header's line counts are wrong")
                body.append(tag + line[1:])
                seen_old += tag != "+"
                seen_new += tag != "-"
                i += 1
            if seen_old != old_len or seen_new != new_len:
                raise PatchError(f"hunk of {new or old} ends early: expected {old_len} old and "
                                 f"{new_len} new lines, got {seen_old} and {seen_new}")
            hunks.append(Hunk(int(m.group(1)), tuple(body), old_no_eol, new_no_eol))
        out.append(FilePatch(old, new, tuple(hunks)))
    if not out and text.strip():
        raise PatchError("no file patches found: expected unified diff headers '--- a/PATH' "
                         "and '+++ b/PATH' followed by '@@' hunks")
    return out


def patched_paths(text: str) -> list[str]:
    """Every path a diff touches (old and new names)."""
    paths: list[str] = []
    for fp in parse_patch(text):
        for p in (fp.old_path, fp.new_path):
            if p is not None and p not in paths:
                paths.append(p)
    return paths


def _apply_file(fp: FilePatch, before: str | None, fuzz_lines: int) -> str | None:
    if fp.old_path is None:
        if before is not None:
            raise PatchError(f"{fp.path}: the patch creates it, but it already exists")
        src: list[str] = []
        had_eol = True
    else:
        if before is None:
            raise PatchError(f"{fp.old_path}: no such file to patch")
        src = before.split("\n")
        had_eol = before.endswith("\n")
        if had_eol:
            src.pop()
    result = list(src)
    offset = 0  # how far earlier hunks moved later lines
    final_no_eol = not had_eol
    for n, h in enumerate(fp.hunks, 1):
        old = [ln[1:] for ln in h.lines if ln[0] != "+"]
        new = [ln[1:] for ln in h.lines if ln[0] != "-"]
        want = (h.old_start - 1 if h.old_start > 0 else 0) + offset
        at = None
        for delta in sorted(range(-fuzz_lines, fuzz_lines + 1), key=abs):
            pos = want + delta
            if 0 <= pos <= len(result) - len(old) and result[pos:pos + len(old)] == old:
                at = pos
                break
        if at is None:
            first = next((ln for ln in old if ln.strip()), old[0] if old else "")
            raise PatchError(f"{fp.path}: hunk {n} (at line {h.old_start}) does not apply: its "
                             f"context is not in the file (first old line {first[:60]!r})")
        result[at:at + len(old)] = new
        offset += len(new) - len(old)
        if h.new_no_eol:
            final_no_eol = True
        elif h.old_no_eol and at + len(new) == len(result):
            final_no_eol = False
    if fp.new_path is None:
        if result:
            raise PatchError(f"{fp.old_path}: the patch deletes it but leaves lines in it")
        return None
    text = "\n".join(result)
    return text if final_no_eol or not result else text + "\n"


def apply_patch(files: Mapping[str, str], patch: str, *,
                fuzz_lines: int = 3) -> dict[str, str | None]:
    """Apply ``patch`` to ``files`` (path -> text); return the changed files.

    The returned mapping holds each changed path with its new content, or None for a file the
    patch deletes (or renames away). Raises :class:`PatchError` if any hunk does not apply; then
    nothing is changed.
    """
    changed: dict[str, str | None] = {}
    for fp in parse_patch(patch):
        src_path = fp.old_path
        current = None
        if src_path is not None:
            current = changed[src_path] if src_path in changed else files.get(src_path)
        after = _apply_file(fp, current, fuzz_lines)
        if fp.old_path is not None and fp.new_path is not None and fp.old_path != fp.new_path:
            changed[fp.old_path] = None
        changed[fp.path] = after
    return changed


def make_patch(before: Mapping[str, str], after: Mapping[str, str | None]) -> str:
    """A unified diff (git style paths ``a/``, ``b/``) turning ``before`` into ``after``.

    ``after`` lists only changed files; None deletes one.
    """
    chunks: list[str] = []
    for path in sorted(after):
        old, new = before.get(path), after[path]
        if old == new:
            continue
        a = (old or "").splitlines(keepends=True)
        b = (new or "").splitlines(keepends=True)
        diff = list(difflib.unified_diff(a, b, f"a/{path}" if old is not None else _NULL,
                                         f"b/{path}" if new is not None else _NULL))
        for line in diff:
            chunks.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(chunks)
