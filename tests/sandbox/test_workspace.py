"""Workspaces: persistent work dirs for multi-turn sessions, bound to one slot."""

from __future__ import annotations

import asyncio
import os

import pytest

from sandloop import Limits, Program, SandboxPool, Status
from sandloop.sandbox.pool import WorkspaceLost

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_files_and_state_persist_between_runs(pool: SandboxPool) -> None:
    ws = await pool.open_workspace(Limits(workdir_mb=8))
    try:
        await pool.write_files(ws, {"sol.py": "def f(x):\n    return 2 * x\n", "d/data.txt": "21"})
        r = await pool.run_in(ws, Program(language="bash", source="python3 -c 'import sol; print(sol.f(int(open(\"d/data.txt\").read())))' > out.txt; cat out.txt"))
        assert r.status is Status.OK, (r.stderr, r.error)
        assert r.stdout == "42\n"
        r = await pool.run_in(ws, Program(source="import os\nprint(sorted(os.listdir('.')))"))
        assert "out.txt" in r.stdout and "sol.py" in r.stdout
        got = await pool.read_files(ws, ["out.txt", "missing", "d/data.txt"])
        assert got == {"out.txt": b"42\n", "d/data.txt": b"21"}
    finally:
        await pool.close_workspace(ws)
    with pytest.raises(WorkspaceLost):
        await pool.run_in(ws, Program(source="pass"))


async def test_program_file_stays_out_of_the_workspace(pool: SandboxPool) -> None:
    ws = await pool.open_workspace()
    try:
        await pool.write_files(ws, {"main.py": "print('user file')\n", "helper.py": "X = 7\n"})
        r = await pool.run_in(ws, Program(source="import helper, os\nprint(helper.X, sorted(os.listdir('.')))"))
        assert r.stdout == "7 ['helper.py', 'main.py']\n", r.stderr
        r = await pool.run_in(ws, Program(language="bash", source="python main.py; ls"))
        assert r.stdout == "user file\nhelper.py\nmain.py\n", r.stderr
        r = await pool.run_in(ws, Program(language="c", source="int main(void){return 0;}"))
        assert r.status is Status.OK
        assert sorted(await pool.read_files(ws, ["main", "main.c", "main.py"])) == ["main.py"]
    finally:
        await pool.close_workspace(ws)


async def test_workspaces_are_isolated_from_each_other_and_from_plain_runs(pool: SandboxPool) -> None:
    a, b = await pool.open_workspace(), await pool.open_workspace()
    try:
        await pool.write_files(a, {"secret.txt": "only-a"})
        r = await pool.run_in(b, Program(source="import os\nprint(os.listdir('.'))"))
        assert "secret" not in r.stdout
        r = await pool.run(Program(source="import os\nprint(os.listdir('.'), os.path.exists('/.zygote/work'))"))
        assert "secret" not in r.stdout and r.stdout.endswith("False\n")
    finally:
        await pool.close_workspace(a)
        await pool.close_workspace(b)


async def test_workspace_symlink_is_not_followed_on_read(pool: SandboxPool) -> None:
    ws = await pool.open_workspace()
    try:
        await pool.run_in(ws, Program(language="bash", source="ln -s /etc/passwd link; ln -s /proc/1/environ env"))
        assert await pool.read_files(ws, ["link", "env"]) == {}
    finally:
        await pool.close_workspace(ws)


async def test_workspace_size_limit_holds(pool: SandboxPool) -> None:
    ws = await pool.open_workspace(Limits(workdir_mb=2))
    try:
        r = await pool.run_in(ws, Program(source="open('big', 'wb').write(b'x' * (8 << 20))"))
        assert r.status is Status.RUNTIME_ERROR
    finally:
        await pool.close_workspace(ws)


async def test_many_idle_workspaces_and_plain_runs_interleave(pool: SandboxPool) -> None:
    spaces = [await pool.open_workspace(Limits(workdir_mb=1, workdir_inodes=64)) for _ in range(20)]
    try:
        await asyncio.gather(*(pool.write_files(ws, {"n": str(i)}) for i, ws in enumerate(spaces)))
        results = await asyncio.gather(
            *(pool.run_in(ws, Program(language="bash", source="cat n")) for ws in spaces),
            *(pool.run(Program(source="print('plain')")) for _ in range(10)))
        assert [r.stdout for r in results[:20]] == [str(i) for i in range(20)]
        assert all(r.stdout == "plain\n" for r in results[20:])
    finally:
        for ws in spaces:
            await pool.close_workspace(ws)


async def test_slot_restart_loses_workspace_with_clear_error_injected() -> None:
    # Fault injection: kill the zygote that holds the workspace.
    async with SandboxPool(1) as pool:
        ws = await pool.open_workspace()
        await pool.write_files(ws, {"a": "1"})
        slot = pool._slots[ws.slot]
        assert slot.proc is not None
        os.kill(slot.proc.pid, 9)
        slot.proc.wait()
        assert (await pool.run(Program(source="print(1)"))).stdout == "1\n"  # slot replaced
        with pytest.raises(WorkspaceLost, match="restarted"):
            await pool.run_in(ws, Program(source="pass"))


async def test_slot_dying_under_a_workspace_run_is_workspace_lost_injected() -> None:
    # Fault injection: the zygote dies while a run of the workspace is in it. The workspace's
    # files died with it, so the run says so (it returned that run's sandbox_error, and only
    # the next call found the workspace gone: an episode took the dead run as feedback).
    async with SandboxPool(1) as pool:
        ws = await pool.open_workspace()
        slot = pool._slots[ws.slot]
        assert slot.proc is not None
        zygote = slot.proc

        async def kill_soon() -> None:
            await asyncio.sleep(0.3)
            os.kill(zygote.pid, 9)

        killer = asyncio.ensure_future(kill_soon())
        with pytest.raises(WorkspaceLost, match="failed under it"):
            await pool.run_in(ws, Program(source="import time\ntime.sleep(5)"), Limits(time_s=10))
        await killer
        with pytest.raises(WorkspaceLost):
            await pool.write_files(ws, {"a": "1"})


async def test_sessions_interleaved_on_one_slot_stay_apart() -> None:
    # One slot: every turn of both sessions (and plain runs between them) is served by the
    # slot's prepared children, each binding only its own session's dir.
    lim = Limits(workdir_mb=8)  # one tmpfs size: every prepared child fits every request
    async with SandboxPool(1) as one:
        a = await one.open_workspace(lim)
        await one.run(Program(source="pass"), lim)  # a prepared child now exists, without b
        b = await one.open_workspace(lim)
        await one.write_files(b, {"b.txt": "B"})  # the first run of b: not in that child
        await one.write_files(a, {"a.txt": "A"})
        probe = Program(source="import os\nprint(sorted(os.listdir('.')), os.statvfs('.').f_blocks)")
        for _ in range(3):
            ra, rb = await one.run_in(a, probe, lim), await one.run_in(b, probe, lim)
            rp = await one.run(probe, lim)
            # 2048 blocks of 4 KiB: each is its own 8 MiB tmpfs, not the zygote's private one.
            assert ra.stdout == "['a.txt'] 2048\n", ra
            assert rb.stdout == "['b.txt'] 2048\n", rb
            assert rp.stdout == "['main.py'] 2048\n", rp
        await one.close_workspace(a)
        await one.close_workspace(b)


NO_OVERLAY = ("this kernel mounts no overlayfs (the pool logged it): workspaces get copies, "
              "tested by the copy_injected case")
BASE = {**{f"pkg/m{i}.py": f"X = {i}\n".encode() for i in range(200)},
        "README.md": b"original\n", "bin/tool.sh": b"echo tool\n"}
# Everything a session may do to the files it started with.
VANDAL = ("echo changed > README.md; rm pkg/m1.py; chmod 000 pkg/m2.py; ln pkg/m3.py hard;"
          "echo appended >> pkg/m3.py; mv bin bin2; truncate -s 0 pkg/m4.py; mkdir -p pkg/new;"
          "touch pkg/new/x; ls pkg | wc -l")
LOOK = ("cat README.md; ls pkg | wc -l; cat pkg/m2.py pkg/m3.py pkg/m4.py; cat bin/tool.sh;"
        "ls bin2 hard 2>&1 | wc -l")


@pytest.mark.parametrize("cow", [True, False], ids=["overlay", "copy_injected"])
async def test_sessions_opened_from_the_same_files_never_see_each_others_changes(
        cow: bool) -> None:
    """One slot, so every workspace shares its base. Without the upper layer (a session writing
    into the base), the second and third workspaces would see the first one's changes.
    ``copy_injected``: the pool told overlays are unavailable, as a zygote would say."""
    async with SandboxPool(1) as pool:
        if not cow:
            pool.cow = False
        a = await pool.open_workspace(Limits(workdir_mb=8), base=BASE)
        if cow and pool.cow is False:
            pytest.skip(NO_OVERLAY)
        b = await pool.open_workspace(Limits(workdir_mb=8), base=BASE)
        assert pool.cow is cow and pool.bases_built == (1 if cow else 0)
        r = await pool.run_in(a, Program(language="bash", source=VANDAL))
        assert r.status is Status.OK and r.stdout == "200\n", (r.stdout, r.stderr)
        assert (await pool.read_files(a, ["README.md", "pkg/m3.py"])) == {
            "README.md": b"changed\n", "pkg/m3.py": b"X = 3\nappended\n"}
        c = await pool.open_workspace(Limits(workdir_mb=8), base=BASE)
        want = "original\n200\nX = 2\nX = 3\nX = 4\necho tool\n2\n"
        for ws in (b, c):
            r = await pool.run_in(ws, Program(language="bash", source=LOOK))
            assert r.stdout == want, (r.stdout, r.stderr)
        assert pool.bases_built == (1 if cow else 0)  # the base was written once
        assert list(pool.workspace_bases().values()) == [(cow, 1 if cow else 0)]
        for ws in (a, b, c):
            await pool.close_workspace(ws)
        d = await pool.open_workspace(Limits(workdir_mb=8), base=BASE)
        r = await pool.run_in(d, Program(language="bash", source=LOOK))
        assert r.stdout == want, (r.stdout, r.stderr)
        await pool.close_workspace(d)


async def test_a_session_on_shared_files_still_has_its_own_size_limit() -> None:
    async with SandboxPool(1) as pool:
        ws = await pool.open_workspace(Limits(workdir_mb=4), base=BASE)
        r = await pool.run_in(ws, Program(language="bash", source=(
            "dd if=/dev/zero of=a bs=1M count=3 2>/dev/null; "
            "dd if=/dev/zero of=b bs=1M count=3 2>&1 | grep -o 'No space'; cat README.md")))
        assert r.stdout == "No space\noriginal\n", (r.stdout, r.stderr)
        # Deleting a shared file frees nothing of the limit (it was never counted) but is
        # this session's alone.
        other = await pool.open_workspace(Limits(workdir_mb=4), base=BASE)
        assert (await pool.read_files(other, ["README.md"])) == {"README.md": b"original\n"}


async def test_a_base_is_written_again_after_its_slot_restarts_injected() -> None:
    # Fault injection: kill the zygote that holds the base.
    async with SandboxPool(1) as pool:
        ws = await pool.open_workspace(base=BASE)
        if pool.cow is False:
            pytest.skip(NO_OVERLAY)
        slot = pool._slots[ws.slot]
        assert slot.proc is not None
        os.kill(slot.proc.pid, 9)
        slot.proc.wait()
        assert (await pool.run(Program(source="print(1)"))).stdout == "1\n"  # slot replaced
        again = await pool.open_workspace(base=BASE)
        assert (await pool.read_files(again, ["README.md"])) == {"README.md": b"original\n"}
        assert pool.bases_built == 2
