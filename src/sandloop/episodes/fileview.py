"""An episode's files as the supervisor knows them between runs: reads served from memory,
writes buffered until something runs in the work dir.

Why this is sound: a session holds no process between runs (docs/engine.md), so the work dir
changes only through this view's own writes or through a run. Until the first run, every file
is the prepared snapshot's; a file read or written since the last run is known exactly. A run
(``run``, ``run_tests``, ``list_dir``, grading) may change anything, so the view flushes its
buffered writes before it and forgets everything after it.

Why it matters: each read or write of the work dir is a jailed process (~10-60 ms of a slot);
serving ``read_file``/``write_file`` from memory keeps their latency flat with 128 episodes on
2 cores, and many edits between two runs reach the work dir in one write.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sandloop.engine import Session

__all__ = ["FileView"]


class FileView:
    """Known file contents of one session, and writes not yet in its work dir."""

    def __init__(self, session: Session, base: Mapping[str, bytes], *,
                 flush_bytes: int = 1 << 20) -> None:
        self.session = session
        self._base: Mapping[str, bytes] | None = base  # the snapshot, until the first run
        self._known: dict[str, bytes] = {}
        self._pending: dict[str, bytes] = {}
        self._pending_bytes = 0
        self.flush_bytes = flush_bytes
        self.reads = self.cached_reads = self.flushes = 0

    def known(self, path: str) -> bytes | None:
        """The file's content if known without asking the work dir."""
        got = self._known.get(path)
        if got is None and self._base is not None:
            got = self._base.get(path)
        return got

    async def read(self, paths: Sequence[str]) -> dict[str, bytes]:
        """Regular files among ``paths`` (missing ones left out), from memory where known."""
        out: dict[str, bytes] = {}
        ask = []
        for p in paths:
            got = self.known(p)
            if got is None:
                ask.append(p)
            else:
                out[p] = got
        self.reads += len(paths)
        self.cached_reads += len(paths) - len(ask)
        if ask:
            fresh = await self.session.read_files(ask)
            self._known.update(fresh)
            out.update(fresh)
        return out

    async def write(self, files: Mapping[str, bytes]) -> None:
        """Buffer ``files``; flushed before the next run, or now past ``flush_bytes``. Raises
        SessionFull (from a flush) when they do not fit."""
        for p, data in files.items():
            self._pending_bytes += len(data) - len(self._pending.get(p, b""))
            self._pending[p] = data
            self._known[p] = data
        if self._pending_bytes > self.flush_bytes:
            await self.flush()

    async def flush(self) -> None:
        """Write the buffered files into the work dir. On SessionFull the buffer is dropped and
        everything forgotten (the work dir may hold part of it), then the error is raised."""
        if not self._pending:
            return
        pending, self._pending, self._pending_bytes = self._pending, {}, 0
        self.flushes += 1
        try:
            await self.session.write_files(pending)
        except BaseException:
            self.forget()
            raise

    def forget(self) -> None:
        """After a run: nothing is known any more (buffered writes must be flushed first)."""
        assert not self._pending, "flush() before a run"
        self._base = None
        self._known.clear()
