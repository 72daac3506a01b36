"""Failures the sandbox swallows (it carries on) are logged at debug level for operators."""

from __future__ import annotations

import logging

import pytest

from sandloop import Limits, Program, SandboxPool, Status
from sandloop.sandbox import cgroups


async def test_an_unreadable_cpu_counter_is_logged_fault_injected(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # Fault injection: the run group's CPU counter cannot be read. The supervisor keeps
    # watching (the wall deadline and RLIMIT_CPU still hold) and says so in its log.
    def unreadable(self: cgroups.Cgroup) -> float:
        raise OSError(5, "Input/output error")

    caplog.set_level(logging.DEBUG, logger="sandloop.sandbox.slot")
    async with SandboxPool(1) as pool:
        monkeypatch.setattr(cgroups.Cgroup, "cpu_s", unreadable)
        r = await pool.run(Program(source="import time; time.sleep(0.3); print('done')"),
                           Limits(time_s=5))
    assert r.status is Status.OK and r.stdout == "done\n"
    assert any("cannot read the CPU time" in m and "Input/output error" in m
               for m in caplog.messages), caplog.messages
