"""Pool-level behaviour: isolation policy, opt-out, unavailable hosts, lifecycle."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

from sandloop import Limits, Program, SandboxPool, Status
from sandloop.sandbox import host


def _python_for_all() -> str:
    """An interpreter other users can run: unisolated runs are not root (see unisolated.py)."""
    return "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


async def test_unisolated_opt_out_is_labelled() -> None:
    async with SandboxPool(1, isolation="none", python=_python_for_all()) as pool:
        r = await pool.run(Program(source="print(6*7)"), Limits(time_s=5))
    assert r.status is Status.OK and r.stdout == "42\n" and r.isolation == "none"


@pytest.mark.skipif(os.geteuid() != 0, reason="only root has another uid to switch to")
async def test_unisolated_runs_are_not_root() -> None:
    src = "import os; print(os.getuid(), os.geteuid(), os.getgid(), os.getgroups())"
    # A directory of root's that others may enter but not write to, as /etc: a root program
    # could create a file there, the dropped uid cannot. Ours, in /tmp (pytest's tmp_path
    # lies under a 0700 directory the uid cannot reach), so that a failure changes no host
    # file, and on a writable file system (where /etc is read-only, as in the cgroup v2 guest,
    # the refusal would say nothing of the uid).
    with tempfile.TemporaryDirectory(prefix="sbx-none-") as d:
        os.chmod(d, 0o755)
        probe = shlex.quote(os.path.join(d, "probe"))
        async with SandboxPool(2, isolation="none", python=_python_for_all()) as pool:
            assert pool.unisolated is not None and pool.unisolated.uid is not None
            a, b = await pool.run_batch([Program(source=src), Program(source=src)])
            sh = await pool.run(Program(language="bash", source=f"id -u; touch {probe}"))
        assert not os.listdir(d)
    for r in (a, b):
        uid, euid, gid, groups = r.stdout.split(maxsplit=3)
        assert uid == euid == gid != "0" and groups.strip() == "[]", r.stdout
        assert pool.uid_base <= int(uid) < pool.uid_base + 2
    assert sh.stdout.split()[0] != "0" and "Permission denied" in sh.stderr, sh.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="only root has another uid to switch to")
async def test_unisolated_interpreter_other_users_cannot_run(tmp_path: Path) -> None:
    # A runtime in a directory only root may enter (a venv under /root here): the unprivileged
    # run cannot start it, and says so rather than fall back to root.
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "python3").symlink_to(_python_for_all())
    async with SandboxPool(1, isolation="none", python=str(private / "python3")) as pool:
        r = await pool.run(Program(source="print(1)"))
        sh = await pool.run(Program(language="bash", source="echo fine"))
    assert r.status is Status.SANDBOX_ERROR and r.error is not None
    assert "does not run as uid" in r.error and "python=" in r.error, r.error
    assert sh.status is Status.OK and sh.stdout == "fine\n"  # needs no interpreter of ours


@pytest.mark.skipif(os.geteuid() != 0, reason="only root has another uid to switch to")
async def test_unisolated_default_interpreter_falls_back_when_others_cannot_run_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The usual set-up as root: sandloop's own interpreter under /root (0700). Not named by the
    # caller, it is replaced by one the run uid can start (the real one behind a venv link, else
    # the built-in environment's), rather than every Python run being a sandbox_error.
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    link = private / "python3"
    link.symlink_to(_python_for_all())
    wrapper = private / "wrapper"  # not a link: only the environment's interpreter is left
    wrapper.write_text(f"#!/bin/sh\nexec {_python_for_all()} \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.delenv("SANDLOOP_PYTHON", raising=False)
    for default, expect in ((link, os.path.realpath(link)), (wrapper, None)):
        monkeypatch.setattr(sys, "executable", str(default))
        async with SandboxPool(1, isolation="none") as pool:
            r = await pool.run(Program(source="import sys; print(sys.executable)"))
            assert pool.unisolated is not None and pool.unisolated.python_error is None
        assert r.status is Status.OK, (r.status, r.error)
        ran_on = r.stdout.strip()
        assert not ran_on.startswith(str(private)), ran_on
        if expect is not None:
            assert ran_on == expect
        else:
            assert ran_on.endswith("/tree/python/bin/python3"), ran_on  # the environment's


@pytest.mark.skipif(os.geteuid() != 0, reason="only root has another uid to switch to")
async def test_unisolated_collect_does_not_follow_planted_links() -> None:
    # The supervisor (root) reads collected files back from a directory the program (not root)
    # owns: a symlink or a hard link to a root-only file must not be read for it.
    src = ("import os\n"
           "os.symlink('/etc/shadow', 'link.txt')\n"
           "os.mkdir('d'); os.symlink('/etc', 'd/etc')\n"
           "open('ok.txt', 'w').write('mine')\n")
    async with SandboxPool(1, isolation="none", python=_python_for_all()) as pool:
        r = await pool.run(Program(source=src, collect=["link.txt", "d/etc/shadow", "ok.txt"]))
    assert r.status is Status.OK, r.stderr
    assert r.files == {"ok.txt": b"mine"}
    assert sorted(r.missing_files) == ["d/etc/shadow", "link.txt"]


async def test_missing_feature_gives_sandbox_error_injected(monkeypatch: pytest.MonkeyPatch) -> None:
    # Fault injection: pretend the host has no cgroups.
    real = host.probe

    def no_cgroups() -> host.HostReport:
        rep = real()
        feats = tuple(host.Feature(f.name, False, "injected: not mounted", "mount them")
                      if f.name == "cgroups" else f for f in rep.features)
        return host.HostReport(feats, None, "unavailable", ("cgroups",))

    monkeypatch.setattr(host, "probe", no_cgroups)
    async with SandboxPool(1) as pool:
        r = await pool.run(Program(source="print(1)"))
    assert r.status is Status.SANDBOX_ERROR and r.stdout == ""
    assert r.error is not None and "cgroups" in r.error and "--no-isolation" in r.error


async def test_pool_close_removes_cgroups_and_dirs() -> None:
    async with SandboxPool(2) as pool:
        await pool.run(Program(source="pass"))
        names = [s.name for s in pool._slots]
        base = Path("/sys/fs/cgroup/sandloop"
                    if Path("/sys/fs/cgroup/cgroup.controllers").exists()  # cgroup v2
                    else "/sys/fs/cgroup/memory/sandloop")
        assert all((base / n).exists() for n in names)
    for n in names:
        assert not (base / n).exists()
        assert not Path(f"/run/sandloop/{n}").exists()


async def test_killed_idle_zygote_is_replaced_before_the_next_run_injected() -> None:
    # Fault injection: kill the zygote of every slot between runs. The pool notices when it
    # takes the slot and restarts it first: the next run is not lost to it.
    async with SandboxPool(1) as pool:
        assert (await pool.run(Program(source="print(1)"))).status is Status.OK
        for s in pool._slots:
            assert s.proc is not None
            os.kill(s.proc.pid, 9)
            s.proc.wait()
        r = await pool.run(Program(source="print(2)"))
        assert r.status is Status.OK and r.stdout == "2\n"


def test_invalid_program_rejected() -> None:
    with pytest.raises(ValueError, match="unsupported language"):
        Program(language="cobol", source="")
    with pytest.raises(ValueError, match="relative path"):
        Program(source="", files={"/etc/passwd": "x"})
    with pytest.raises(ValueError, match=r"'\.\.'"):
        Program(source="", files={"a/../../x": "x"})


async def test_configured_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    system_python = "/usr/bin/python3"
    if not os.path.exists(system_python):
        pytest.skip("no system python3")
    # The built-in environment is a copy of the configured interpreter, mounted at /opt/env.
    monkeypatch.setenv("SANDLOOP_PYTHON", system_python)
    import subprocess

    want = subprocess.run([system_python, "-c", "import sys; print(sys.version)"],
                          capture_output=True, text=True, check=True).stdout
    code = "import sys; print(sys.executable); print(sys.version)"
    async with SandboxPool(1) as pool:
        r = await pool.run(Program(source=code))
        shell = await pool.run(Program(language="bash", source=f"python -c '{code}'"))
    assert r.status is Status.OK and r.stdout == f"/opt/env/python/bin/python3\n{want}", r
    assert shell.stdout.splitlines()[1:] == want.splitlines()


async def test_pool_grows_under_demand_and_shrinks_when_idle() -> None:
    import asyncio

    async with SandboxPool(1, max_slots=3, idle_shrink_s=0.3) as pool:
        assert pool.slots_now == 1
        sleepers = [Program(source="import time; time.sleep(0.4)")] * 6
        most = 1

        async def watch() -> None:
            nonlocal most
            while True:
                most = max(most, pool.slots_now)
                await asyncio.sleep(0.02)

        # Sampled while the batch runs: on a loaded machine the grown slots could already be
        # idle for idle_shrink_s, and gone, by the time the batch returns.
        watcher = asyncio.ensure_future(watch())
        t = asyncio.get_running_loop().time()
        try:
            rs = await pool.run_batch(sleepers, Limits(time_s=5))
        finally:
            watcher.cancel()
        assert all(r.status is Status.OK for r in rs)
        assert most > 1
        assert asyncio.get_running_loop().time() - t < 6 * 0.4  # ran in parallel
        for _ in range(40):
            await asyncio.sleep(0.1)
            if pool.slots_now == 1:
                break
        assert pool.slots_now == 1
        assert (await pool.run(Program(source="print(3)"))).stdout == "3\n"


async def test_zygote_memory_growth_recycles_the_slot_injected(monkeypatch: pytest.MonkeyPatch) -> None:
    # Fault injection: pretend the zygote's RSS grew past the bound.
    from sandloop.sandbox.slot import Slot

    async with SandboxPool(1, max_zygote_rss_mb=1) as pool:
        slot = pool._slots[0]
        first = slot.zygote_pid
        monkeypatch.setattr(Slot, "zygote_rss_mb", lambda self: 10_000.0)
        slot.runs = 63
        assert (await pool.run(Program(source="print(1)"))).stdout == "1\n"
        assert slot.zygote_pid != first


async def test_cancelled_run_is_killed_before_the_slot_is_reused() -> None:
    import asyncio

    async with SandboxPool(1) as pool:
        task = asyncio.create_task(pool.run(Program(source="import time; time.sleep(30)"),
                                            Limits(time_s=60)))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        uid = str(pool.uid_base)
        left = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/status") as f:
                    if next(ln for ln in f if ln.startswith("Uid:")).split()[1] == uid:
                        left.append(pid)
            except (OSError, StopIteration):
                continue
        assert left == []
        r = await pool.run(Program(source="print('next')"))
        assert r.stdout == "next\n" and r.wall_time_s < 5


async def test_run_cancelled_mid_request_leaves_a_slot_that_answers_at_once() -> None:
    # Cancelled while the zygote's reply to the run request was awaited, the slot is abandoned
    # and restarted. The restarted zygote's socket reuses the old fd number; a reader left
    # registered for the old one hid the new socket from epoll and the next run stalled 30 s
    # ending as sandbox_error.
    import asyncio

    async with SandboxPool(1) as pool:
        for delay in (0.0, 0.001, 0.005):
            task = asyncio.create_task(pool.run(Program(source="import time; time.sleep(30)"),
                                                Limits(time_s=60)))
            await asyncio.sleep(delay)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            t0 = time.monotonic()
            r = await pool.run(Program(source="print('next')"), Limits(time_s=10))
            assert r.status is Status.OK, (delay, r.status, r.error)
            assert time.monotonic() - t0 < 15, delay


async def test_preload_is_configurable() -> None:
    probe = Program(source="import sys\nprint('unittest' in sys.modules, 'collections' in sys.modules)")
    async with SandboxPool(1) as pool:
        assert (await pool.run(probe, Limits(time_s=5))).stdout == "False True\n"
    async with SandboxPool(1, preload=("unittest", "no_such_module_is_ignored")) as pool:
        assert (await pool.run(probe, Limits(time_s=5))).stdout == "True True\n"


async def test_on_end_is_called_once_after_the_program_and_before_the_result() -> None:
    # A scheduler hands the CPU on at on_end: it must come after the program has ended, and
    # once, for the last step only (not for a compile step).
    events: list[str] = []
    async with SandboxPool(1) as pool:
        t0 = time.monotonic()
        r = await pool.run(Program(source="import time; time.sleep(0.3)"), Limits(time_s=5),
                           on_end=lambda: events.append(f"end {time.monotonic() - t0:.2f}"))
        events.append("result")
        assert r.status is Status.OK and len(events) == 2 and events[1] == "result"
        assert float(events[0].split()[1]) >= 0.3, events
        events.clear()
        if shutil.which("gcc"):
            r = await pool.run(Program(language="c", source="int main(void){return 0;}"),
                               Limits(time_s=10), on_end=lambda: events.append("end"))
            assert r.status is Status.OK and events == ["end"]


def _anon_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(ln for ln in f if ln.startswith("RssAnon:")).split()[1])


async def test_a_zygote_holds_little_beyond_its_preload() -> None:
    # Every run forks the zygote: its page tables are copied, then unmapped at the run's exit,
    # for each MiB of its memory. Started as a script, it held its ~2 MiB syntax tree for life
    # (and the heap's free pages that compiling left); compare with a plain interpreter that
    # imports the same modules and stays idle.
    import subprocess
    import sys

    from sandloop.sandbox.slot import DEFAULT_PRELOAD

    plain = subprocess.Popen(
        [sys.executable, "-I", "-c",
         f"import {', '.join(DEFAULT_PRELOAD)}, ctypes, json, socket, select, platform, "
         "struct, resource, signal, array\nprint(flush=True)\nimport sys; sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert plain.stdout is not None
        plain.stdout.readline()  # its imports are done
        async with SandboxPool(1) as pool:
            await pool.run(Program(source="pass"))
            zygote = _anon_kib(pool._slots[0].zygote_pid)
        extra = zygote - _anon_kib(plain.pid)
        assert extra < 1536, f"the zygote holds {extra} KiB more than its imports need"
    finally:
        plain.communicate(b"")


async def test_a_wall_limit_that_ends_before_the_program_starts_is_a_timeout() -> None:
    # time_s below the set-up time: the supervisor kills the prepared child before the request
    # reached it. That was taken for a child lost while idle, retried once, then reported as a
    # sandbox_error (about 1 run in 20 at 0.1 ms) -- a verdict any request could dodge into.
    async with SandboxPool(2) as pool:
        results = await pool.run_batch(
            [Program(source="print(1)", files={"a.txt": "x" * 5000})] * 90,
            [Limits(time_s=t) for t in (1e-4, 2e-4, 5e-4) * 30])
    statuses = {r.status for r in results}
    assert statuses <= {Status.TIMEOUT, Status.OK}, [r.error for r in results if r.error]


async def test_warm_modules_are_loaded_by_every_zygote_with_their_hash() -> None:
    from sandloop.sandbox import warm

    mods = {"_sl_probe_ok": "import math\nX = math.factorial(5)\n",
            "_sl_probe_broken": "raise RuntimeError('at import')\n"}
    probe = ("import sys\n"
             "m = sys.modules.get('_sl_probe_ok')\n"
             "print(m.X, m.__warm_hash__, '_sl_probe_broken' in sys.modules)\n")
    async with SandboxPool(2, warm_modules=mods) as pool:
        rs = [await pool.run(Program(source=probe), Limits(time_s=5)) for _ in range(4)]
    assert {r.stdout for r in rs} == {f"120 {warm.source_hash(mods['_sl_probe_ok'])} False\n"}
    # A pool given none holds none, whatever is registered.
    async with SandboxPool(1, warm_modules={}) as pool:
        r = await pool.run(Program(source="import sys; print('_sl_probe_ok' in sys.modules)"))
    assert r.stdout == "False\n"
    with pytest.raises(ValueError, match="plain identifier"):
        warm.register("os.path", "")
