"""Nothing a request or a program can do yields ``sandbox_error``.

``sandbox_error`` means the infrastructure failed; its reward is null (excluded from training),
so a program that could reach it on purpose would dodge its negative rewards. Requests the
sandbox could not lay out are validation errors naming the field; what a program does to its
own work dir is a verdict (``runtime_error``) or, for a plain file write into a session,
``WorkspaceWriteError``. Each test here fails if its defence is removed.
"""

from __future__ import annotations

import re
import resource

import pytest
from pydantic import ValidationError

from sandloop import Limits, Program, SandboxPool, Status
from sandloop.sandbox.languages import spec_for
from sandloop.sandbox.models import LANGUAGES, OWN_FILES, check_file_names
from sandloop.sandbox.pool import WorkspaceWriteError

aio = pytest.mark.asyncio(loop_scope="module")


# -- requests: validation errors that name the field -------------------------------------------
@pytest.mark.parametrize(("fields", "where", "says"), [
    ({"files": {"a": "x", "a/b": "y"}}, "files", "conflict"),
    ({"files": {"a/b/c": "x", "a/b": "y"}}, "files", "conflict"),
    ({"files": {"a\udc80": "x"}}, "files", "surrogate"),
    ({"files": {"a": "x\udc80"}}, "files", "surrogate"),
    ({"files": {"x" * 256: "x"}}, "files", "255 bytes"),
    ({"files": {"/".join(["d" * 200] * 6): "x"}}, "files", "1024 bytes"),
    ({"files": {"main.py/x": "x"}}, "files", "program's own file"),
    ({"source": "print('\ud800')"}, "source", "surrogate"),
    ({"stdin": "\udfff"}, "stdin", "surrogate"),
    ({"argv": ["ok", "a\udc80"]}, "argv", "argv[1]"),
    ({"argv": ["a\0b"]}, "argv", "NUL"),
    ({"collect": ["out\udc80"]}, "collect", "surrogate"),
])
def test_requests_no_sandbox_can_lay_out_are_validation_errors(
        fields: dict[str, object], where: str, says: str) -> None:
    with pytest.raises(ValidationError) as e:
        Program(**{"source": "pass", **fields})  # type: ignore[arg-type]
    err = e.value.errors()[0]
    assert err["loc"] == (where,) and says in err["msg"], err


def test_compiled_languages_reserve_their_binary_name() -> None:
    with pytest.raises(ValidationError, match="program's own file"):
        Program(language="c", source="int main(){}", files={"main/data": "x"})
    Program(language="python", source="pass", files={"main/data": "x"})  # no binary in Python


def test_own_files_match_the_language_specs() -> None:
    for lang in LANGUAGES:
        spec = spec_for(lang)
        assert set(OWN_FILES[lang]) == spec.own_files, lang


def test_file_names_that_can_coexist_pass() -> None:
    check_file_names(["a/b", "a/c", "ab", "a b/é", "x" * 255])


# -- runs: the host's limits, and files that do not fit ---------------------------------------
@aio
async def test_open_files_above_the_hard_limit_is_clamped_not_a_failure(
        pool: SandboxPool) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    r = await pool.run(Program(source="import resource\nprint(resource.getrlimit(7)[0])"),
                       Limits(open_files=65536))
    assert r.status is Status.OK, (r.error, r.stderr)
    want = 65536 if hard == resource.RLIM_INFINITY else min(65536, hard)
    assert int(r.stdout) == want


@pytest.mark.parametrize(("files", "limits"), [
    ({"big": b"x" * (2 << 20)}, Limits(workdir_mb=1)),
    ({f"f{i}": b"" for i in range(40)}, Limits(workdir_inodes=16)),
])
@aio
async def test_files_that_do_not_fit_the_work_dir_are_a_verdict(
        pool: SandboxPool, files: dict[str, str | bytes], limits: Limits) -> None:
    r = await pool.run(Program(source="print(1)", files=files), limits)
    assert r.status is Status.RUNTIME_ERROR, (r.status, r.error)
    assert r.error is None and "files could not be written" in r.stderr


@aio
async def test_a_source_bigger_than_the_work_dir_is_a_verdict(pool: SandboxPool) -> None:
    r = await pool.run(Program(source="#" + "x" * (2 << 20)), Limits(workdir_mb=1))
    assert r.status is Status.RUNTIME_ERROR and "main.py" in r.stderr, (r.status, r.error)


# -- sessions: what a program leaves in its work dir --------------------------------------------
@aio
async def test_a_program_that_locks_its_work_dir_does_not_break_the_next_run(
        pool: SandboxPool) -> None:
    ws = await pool.open_workspace()
    try:
        r = await pool.run_in(ws, Program(language="bash", source="chmod 000 ."))
        assert r.status is Status.OK, r.stderr
        r = await pool.run_in(ws, Program(source="print('next')"))
        assert (r.status, r.stdout) == (Status.OK, "next\n"), (r.error, r.stderr)
        await pool.write_files(ws, {"x.py": "1"})
        assert await pool.read_files(ws, ["x.py"]) == {"x.py": b"1"}
    finally:
        await pool.close_workspace(ws)


@pytest.mark.parametrize(("setup", "name", "why"), [
    ("rm -f solution.py; mkdir solution.py", "solution.py", "Is a directory"),
    ("mkdir ro; chmod 555 ro", "ro/x", "Permission denied"),
    ("ln -s /etc/passwd link", "link", "symbolic links"),
    ("echo file > d", "d/x", "Not a directory|File exists"),
])
@aio
async def test_writes_a_program_blocked_are_workspace_errors_and_run_verdicts(
        pool: SandboxPool, setup: str, name: str, why: str) -> None:
    ws = await pool.open_workspace()
    try:
        r = await pool.run_in(ws, Program(language="bash", source=setup))
        assert r.status is Status.OK, r.stderr
        with pytest.raises(WorkspaceWriteError) as e:
            await pool.write_files(ws, {name: "print(1)"})
        assert name in str(e.value) and re.search(why, str(e.value)), e.value
        r = await pool.run_in(ws, Program(source="print(1)", files={name: "1"}))
        assert r.status is Status.RUNTIME_ERROR and name in r.stderr, (r.status, r.error)
        r = await pool.run_in(ws, Program(source="print('still usable')"))
        assert r.status is Status.OK, (r.error, r.stderr)
    finally:
        await pool.close_workspace(ws)


@aio
async def test_workspace_write_rejects_names_that_conflict(pool: SandboxPool) -> None:
    ws = await pool.open_workspace()
    try:
        with pytest.raises(ValueError, match="conflict"):
            await pool.write_files(ws, {"a": "1", "a/b": "2"})
    finally:
        await pool.close_workspace(ws)


@aio
@pytest.mark.parametrize("limits", [Limits(time_s=1e-9), Limits(memory_mb=8),
                                    Limits(max_processes=1, cpus=0.001)])
async def test_file_operations_do_not_inherit_the_programs_limits(
        pool: SandboxPool, limits: Limits) -> None:
    ws = await pool.open_workspace(limits)
    try:
        await pool.write_files(ws, {"data.bin": b"x" * (4 << 20)})
        got = await pool.read_files(ws, ["data.bin"])
        assert len(got["data.bin"]) == 4 << 20
    finally:
        await pool.close_workspace(ws)
