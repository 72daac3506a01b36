"""Integer priorities are bounded: one no journal can store is the caller's error, at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandloop import Program, Status
from sandloop.engine import Engine
from sandloop.engine.engine import PRIORITY_MAX, PRIORITY_MIN


async def test_priorities_out_of_range_are_refused_and_the_bounds_work(tmp_path: Path) -> None:
    async with Engine(slots=1, journal=tmp_path / "j.db") as e:
        for bad in (10**100, PRIORITY_MAX + 1, PRIORITY_MIN - 1):
            with pytest.raises(ValueError, match=r"priority .* out of range"):
                await e.run(Program(source="pass"), priority=bad, key=f"k{bad}")
        for ok in (PRIORITY_MIN, PRIORITY_MAX):
            r = await e.run(Program(source="pass"), priority=ok, key=f"k{ok}")
            assert r.status is Status.OK, r.error
