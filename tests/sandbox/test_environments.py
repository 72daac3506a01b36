"""Runs in environments (issue 17): the sandbox mounts the environment at /opt/env and runs its
zygotes on the environment's interpreter, so the supervisor's virtualenv is not importable;
every slot and every pool share one hash seed; results record the environment's id; a numpy
environment built from the registry serves a task.

The built-in ``python`` environment is built into the session's store on first use
(tests/conftest.py points ``SANDLOOP_ENV_DIR`` at a temporary directory)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sandloop import SandboxPool
from sandloop.envs import EnvStore, load_spec
from sandloop.envs.errors import EnvNotFound
from sandloop.reward.verifier import Verifier
from sandloop.sandbox.models import Limits, Program, Status
from sandloop.tasks.models import Task

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="full isolation needs root"),
              pytest.mark.asyncio(loop_scope="module")]

ROOT = Path(__file__).resolve().parents[2]

# Things that differ between interpreters with different hash seeds: str/bytes/tuple hashes and
# the iteration order of sets of strings (and so of anything built from them).
DETERMINISM = (
    "words = ['alpha', 'beta', 'gamma', 'delta', 'epsilon', 'zeta', 'eta', 'theta']\n"
    "print(hash('abc'), hash(b'abc'), hash(('a', 1)))\n"
    "print(list(set(words)), list({w: 0 for w in set(words)}))\n"
    "print(list(frozenset('sandloop')))\n"
)


async def test_supervisor_packages_are_not_importable(pool: SandboxPool) -> None:
    # The supervisor's virtualenv holds sandloop, pydantic, fastapi, uvicorn: none may be
    # importable by a program; the default environment is the standard library only.
    src = ("import importlib.util, sys\n"
           "for m in ('sandloop', 'pydantic', 'fastapi', 'uvicorn', 'numpy'):\n"
           "    print(m, importlib.util.find_spec(m) is not None)\n"
           "print(sys.prefix, sys.base_prefix, sys.executable)\n"
           "print(sys.version)\n"
           "print(any('site-packages' in p for p in sys.path))\n")
    r = await pool.run(Program(source=src))
    assert r.status is Status.OK, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:5] == [f"{m} False" for m in ("sandloop", "pydantic", "fastapi", "uvicorn",
                                                 "numpy")]
    assert lines[5] == "/opt/env/python /opt/env/python /opt/env/python/bin/python3"
    # The copy of this interpreter runs, with its own libpython: the zygote's root has no
    # /proc, so $ORIGIN in its RUNPATH once failed and the host's /usr/lib libpython (another
    # patch release, whose frozen `site` knows no site-packages) was loaded instead.
    assert lines[6] == sys.version and lines[7] == "True"
    r = await pool.run(Program(source="import sandloop"))
    assert r.status is Status.RUNTIME_ERROR and "No module named 'sandloop'" in r.stderr


async def test_results_record_the_environment(pool: SandboxPool) -> None:
    assert pool.environment is not None and pool.environment.name == "python"
    py = await pool.run(Program(source="print(1)"))
    assert py.environment == pool.environment.id
    sh = await pool.run(Program(language="bash", source="echo 1"))
    bash_id = EnvStore().get("bash").id  # the built-in, built on first use
    assert sh.status is Status.OK and sh.environment == bash_id
    # Named explicitly, by name or id prefix: the same environment.
    by_id = await pool.run(Program(source="print(1)", environment=pool.environment.id[:12]))
    assert by_id.environment == pool.environment.id
    with pytest.raises(EnvNotFound, match="no environment 'no-such-env'"):
        await pool.run(Program(source="print(1)", environment="no-such-env"))
    with pytest.raises(ValueError, match="not an environment name"):
        Program(source="", environment="../etc")


HELLO = {
    "java": 'public class Main { public static void main(String[] a) { '
            'System.out.println("hi"); } }',
    "go": 'package main\nimport "fmt"\nfunc main() { fmt.Println("hi") }\n',
    "rust": 'fn main() { println!("hi"); }\n',
    "typescript": 'console.log("hi");\n',
    "c": '#include <stdio.h>\nint main(void) { puts("hi"); return 0; }\n',
}


@pytest.mark.parametrize("lang", list(HELLO))
async def test_every_language_records_its_builtin_environment(pool: SandboxPool,
                                                              lang: str) -> None:
    # Issue 17: "every result records the environment id it ran in". The compiled languages
    # run the host's toolchain (/usr): their built-in records which one.
    from sandloop.sandbox.languages import LanguageUnavailable, spec_for
    try:
        spec_for(lang).check_available()
    except LanguageUnavailable as e:  # pragma: no cover - `make` installs the toolchains
        pytest.skip(str(e))
    r = await pool.run(Program(language=lang, source=HELLO[lang]), Limits(time_s=10))
    assert r.status is Status.OK and r.stdout == "hi\n", (r.status, r.stderr, r.compile)
    assert r.environment is not None and r.environment == EnvStore().get(lang).id


async def test_shell_python3_is_the_environments(pool: SandboxPool) -> None:
    src = ("python3 -c 'import sys; print(sys.prefix, hash(\"abc\"))'\n"
           "readlink -f \"$(command -v python3)\"\n"
           "ls -d /root 2>/dev/null || echo no-root\n")
    r = await pool.run(Program(language="bash", source=src))
    assert r.status is Status.OK, r.stderr
    prefix, seed_hash = r.stdout.splitlines()[0].split()
    assert prefix == "/opt/env/python"
    assert r.stdout.splitlines()[1].startswith("/opt/env/python/bin/python3")
    assert r.stdout.splitlines()[2] == "no-root"
    # A fresh interpreter started from a shell has the zygote's hash seed.
    warm = await pool.run(Program(source="print(hash('abc'))"))
    assert warm.stdout.strip() == seed_hash


async def test_same_program_prints_identical_output_on_every_slot() -> None:
    outputs: list[str] = []
    for slots in (3, 2):  # two pools: two invocations, each with its own zygotes
        async with SandboxPool(slots) as pool:
            # Sequential runs rotate over the slots (FIFO hand-out): each slot serves three.
            for _ in range(3 * slots):
                r = await pool.run(Program(source=DETERMINISM))
                assert r.status is Status.OK, r.stderr
                outputs.append(r.stdout)
            shell = await pool.run(Program(language="bash",
                                           source=f"python3 - <<'EOF'\n{DETERMINISM}EOF\n"))
            outputs.append(shell.stdout)
    assert len(set(outputs)) == 1, set(outputs)
    # The default seed is 0 on every machine: the host's interpreter with PYTHONHASHSEED=0
    # prints the same (its version is the environment's: the built-in copies it).
    seeded = subprocess.run([sys.executable, "-c", DETERMINISM], capture_output=True, text=True,
                            timeout=60, env={"PYTHONHASHSEED": "0", "PATH": "/usr/bin:/bin"})
    assert seeded.stdout == outputs[0]


def _registry_has_numpy() -> bool:
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d",
                            d, "numpy==2.4.6"], capture_output=True, timeout=300)
    return r.returncode == 0


async def test_numpy_environment_serves_a_task() -> None:
    """Built once into the session's store (~15 s); a task naming it runs there, and its
    result records the environment's id; the default environment still has no numpy."""
    store = EnvStore()
    try:
        info = store.get("py-numpy")
        if not store.verify("py-numpy").ok:
            raise EnvNotFound("stale")
    except EnvNotFound:
        if not _registry_has_numpy():
            pytest.skip("no package registry reachable from this host (pip download failed)")
        info = store.build(load_spec(ROOT / "examples" / "envs" / "py-numpy.toml"))
    task = Task.model_validate({
        "id": "np-sum", "environment": "py-numpy", "entry_point": "total",
        "hidden_tests": [{"kind": "call", "name": "t1", "args": [[1, 2, 3]], "expected": 6}]})
    plain = task.model_copy(update={"environment": None})
    assert task.version != Task.model_validate(plain.model_dump(exclude={"version"})).version
    completion = "import numpy\ndef total(xs):\n    return int(numpy.asarray(xs).sum())\n"
    async with SandboxPool(1) as pool:
        verifier = Verifier(pool.run)
        res = await verifier.verify(task, completion)
        assert res.reward == 1.0, res.tests
        assert res.environment == info.id
        # The same completion in the default environment: numpy is not there.
        plain_task = Task.model_validate(plain.model_dump(exclude={"version"}))
        res2 = await verifier.verify(plain_task, completion)
        assert res2.reward == 0.0 and res2.environment == pool.environment.id  # type: ignore[union-attr]
        r = await pool.run(Program(source="import numpy, sys; print(numpy.__version__, "
                                          "numpy.__file__)", environment="py-numpy"),
                           Limits(time_s=20))
        assert r.status is Status.OK, r.stderr
        lib = f"python{sys.version_info.major}.{sys.version_info.minor}"
        assert r.stdout == f"2.4.6 /opt/env/python/lib/{lib}/site-packages/numpy/__init__.py\n"
        assert r.environment == info.id
        # A workspace (session) in the environment: its pool holds it, and every operation on
        # it goes there.
        ws = await pool.open_workspace(Limits(), environment="py-numpy")
        await pool.write_files(ws, {"a.py": "import numpy\nprint(numpy.ones(2).sum())\n"})
        r = await pool.run_in(ws, Program(language="bash", source="python3 a.py > out.txt"))
        assert r.status is Status.OK and r.environment == info.id, r.stderr
        assert await pool.read_files(ws, ["out.txt"]) == {"out.txt": b"2.0\n"}
        await pool.close_workspace(ws)

