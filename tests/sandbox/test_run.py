"""End-to-end behaviour of the sandbox through SandboxPool: statuses, limits, languages, I/O."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import pytest

from sandloop import ExecResult, Limits, Program, SandboxPool, Status

pytestmark = pytest.mark.asyncio(loop_scope="module")

FAST = Limits(time_s=3, memory_mb=128)


async def run(pool: SandboxPool, source: str, language: str = "python", limits: Limits = FAST,
              **kw: object) -> ExecResult:
    return await pool.run(Program(language=language, source=source, **kw), limits)  # type: ignore[arg-type]


async def test_ok_with_stdout_and_measurements(pool: SandboxPool) -> None:
    r = await run(pool, "print('hello')")
    assert r.status is Status.OK and r.exit_code == 0 and r.signal is None
    assert r.stdout == "hello\n" and r.stderr == ""
    assert 0 < r.wall_time_s < 3 and r.cpu_time_s >= 0 and r.peak_memory_mb > 0
    assert r.isolation == "full"


async def test_runtime_error_keeps_traceback_of_program_only(pool: SandboxPool) -> None:
    r = await run(pool, "def f():\n    raise ValueError('boom')\nf()\n")
    assert r.status is Status.RUNTIME_ERROR and r.exit_code == 1
    assert 'File "/sandbox/main.py", line 2' in r.stderr and "ValueError: boom" in r.stderr
    assert "zygote" not in r.stderr and "runpy" not in r.stderr


async def test_sys_exit_codes(pool: SandboxPool) -> None:
    assert (await run(pool, "import sys; sys.exit(0)")).status is Status.OK
    r = await run(pool, "import sys; sys.exit(3)")
    assert r.status is Status.RUNTIME_ERROR and r.exit_code == 3
    r = await run(pool, "import sys; sys.exit('bad input')")
    assert r.exit_code == 1 and "bad input" in r.stderr


async def test_stdin_and_files_and_collect(pool: SandboxPool) -> None:
    src = ("import sys, json\n"
           "data = json.load(open('data/in.json'))\n"
           "n = int(sys.stdin.read())\n"
           "open('out.txt', 'w').write(str(n * data['k']))\n")
    r = await pool.run(Program(source=src, stdin="6\n", files={"data/in.json": '{"k": 7}'},
                               collect=["out.txt", "missing.txt"]), FAST)
    assert r.status is Status.OK, r.stderr
    assert r.files == {"out.txt": b"42"}


async def test_result_channel_fd3(pool: SandboxPool) -> None:
    r = await run(pool, "import os\nos.write(3, b'{\"v\": 1}')\nprint('x')\n")
    assert r.status is Status.OK and r.channel == b'{"v": 1}' and r.stdout == "x\n"


async def test_timeout_wall(pool: SandboxPool) -> None:
    r = await run(pool, "import time\ntime.sleep(30)\n", limits=Limits(time_s=0.5))
    assert r.status is Status.TIMEOUT and 0.5 <= r.wall_time_s < 3


async def test_timeout_cpu_limit(pool: SandboxPool) -> None:
    r = await run(pool, "while True: pass\n", limits=Limits(time_s=10, cpu_time_s=0.5))
    assert r.status is Status.TIMEOUT and r.wall_time_s < 5


async def test_memory_limit(pool: SandboxPool) -> None:
    src = "x = []\nwhile True:\n    x.append(bytearray(8 << 20))\n"
    r = await run(pool, src, limits=Limits(memory_mb=64))
    assert r.status is Status.MEMORY_LIMIT
    assert 50 <= r.peak_memory_mb <= 80


async def test_output_truncated_but_ok(pool: SandboxPool) -> None:
    r = await run(pool, "print('a' * 10000)", limits=Limits(stdout_bytes=100))
    assert r.status is Status.OK and r.stdout_truncated and len(r.stdout) == 100


async def test_output_flood_is_killed(pool: SandboxPool) -> None:
    r = await run(pool, "while True: print('y' * 1000)",
                  limits=Limits(stdout_bytes=1000, stderr_bytes=1000, time_s=5))
    assert r.status is Status.OUTPUT_LIMIT and r.wall_time_s < 4


async def test_process_limit(pool: SandboxPool) -> None:
    src = ("import os\nn = 0\n"
           "try:\n    for _ in range(100):\n        if os.fork() == 0:\n            import time; time.sleep(5)\n"
           "        n += 1\nexcept OSError as e:\n    print('blocked after', n)\n")
    r = await run(pool, src, limits=Limits(max_processes=8, time_s=3))
    assert "blocked after" in r.stdout
    assert int(r.stdout.split()[-1]) <= 8


async def test_workdir_size_limit(pool: SandboxPool) -> None:
    src = ("try:\n    open('big', 'wb').write(b'x' * (20 << 20))\nexcept OSError as e:\n"
           "    print('errno', e.errno)\n")
    r = await run(pool, src, limits=Limits(workdir_mb=4))
    assert r.stdout.startswith("errno") or r.signal is not None


async def test_each_run_is_fresh(pool: SandboxPool) -> None:
    await run(pool, "open('left.txt', 'w').write('x'); open('/tmp/left', 'w').write('x')")
    for _ in range(3):
        r = await run(pool, "import os\nprint(os.path.exists('left.txt'), os.path.exists('/tmp/left'))")
        assert r.stdout == "False False\n"


async def test_python_state_does_not_leak_between_runs(pool: SandboxPool) -> None:
    await run(pool, "import math\nmath.pi = 3\nimport json\njson.dumps = None\n")
    for _ in range(3):
        r = await run(pool, "import math, json\nprint(math.pi, json.dumps([1]))")
        assert r.stdout == "3.141592653589793 [1]\n"


async def test_python_std_streams_behave_like_a_plain_run(pool: SandboxPool) -> None:
    # The streams are built once in the zygote over fds of the same kinds (memfd stdin, pipe
    # stdout/stderr); a run must see them as `python main.py < file | cat` would.
    src = ("import sys\n"
           "print(sys.stdin.seekable(), sys.stdout.seekable(), sys.stdout.isatty(),\n"
           "      sys.stdin.fileno(), sys.stdout.fileno(), sys.stderr.fileno(),\n"
           "      sys.stdout.encoding, sys.stderr.line_buffering)\n"
           "print(sys.stdin.readline().strip(), sys.stdin.read().split())\n"
           "sys.stdin.seek(0); print(sys.stdin.read(3))\n"
           "print('é', file=sys.stderr)\n")
    for _ in range(2):  # the second run gets the same stream objects' fresh copies
        r = await pool.run(Program(source=src, stdin="first\n1 2 3\n"), FAST)
        assert r.status is Status.OK, r.stderr
        assert r.stdout == ("True False False 0 1 2 utf-8 True\nfirst ['1', '2', '3']\nfir\n")
        assert r.stderr == "é\n"


async def test_non_daemon_threads_finish_before_exit(pool: SandboxPool) -> None:
    # As with `python main.py`: the program's end waits for its non-daemon threads (threading
    # is not preloaded; the program imports it, here through queue).
    src = ("import queue, threading, time\n"
           "q = queue.Queue()\n"
           "def work():\n"
           "    time.sleep(0.2)\n"
           "    q.put(42)\n"
           "    print('worker done', flush=True)\n"
           "threading.Thread(target=work).start()\n"
           "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
           "print('main done', flush=True)\n")
    r = await run(pool, src)
    assert r.status is Status.OK, r.stderr
    assert r.stdout == "main done\nworker done\n" and r.wall_time_s < 3


async def test_each_python_run_has_its_own_random_state(pool: SandboxPool) -> None:
    # Every child is forked from the same warm interpreter: without a reseed per child, all
    # runs would draw the same "random" numbers (and repeat-k sampling would be meaningless).
    src = "import random\nprint(random.random(), random.getrandbits(64))"
    outs = [r.stdout for r in await pool.run_batch([Program(source=src)] * 6, FAST)]
    assert all(o for o in outs) and len(set(outs)) == len(outs)


@pytest.mark.parametrize(
    ("language", "source", "expected"),
    [
        ("c", '#include <stdio.h>\nint main(void){printf("%d\\n", 6*7);return 0;}\n', "42\n"),
        ("cpp", "#include <iostream>\nint main(){std::cout<<6*7<<std::endl;}\n", "42\n"),
        ("javascript", "console.log(6*7)\n", "42\n"),
        ("bash", "echo $((6*7))\n", "42\n"),
    ],
)
async def test_languages(pool: SandboxPool, language: str, source: str, expected: str) -> None:
    r = await run(pool, source, language=language, limits=Limits(time_s=10))
    assert r.status is Status.OK, (r.stderr, r.compile)
    assert r.stdout == expected
    if language in ("c", "cpp"):
        assert r.compile is not None and r.compile.status is Status.OK


async def test_compile_error(pool: SandboxPool) -> None:
    r = await run(pool, "int main(void) { return nope; }\n", language="c")
    assert r.status is Status.COMPILE_ERROR
    assert r.compile is not None and "nope" in r.compile.stderr


async def test_c_memory_bomb(pool: SandboxPool) -> None:
    src = ("#include <stdlib.h>\n#include <string.h>\nint main(void){for(;;){char*p=malloc(1<<20);"
           "if(!p)return 3;memset(p,1,1<<20);}}\n")
    r = await run(pool, src, language="c", limits=Limits(memory_mb=48))
    assert r.status is Status.MEMORY_LIMIT


async def test_batch_keeps_input_order(pool: SandboxPool) -> None:
    progs = [Program(source=f"import time; time.sleep({0.2 if i % 2 == 0 else 0}); print({i})")
             for i in range(6)]
    rs = await pool.run_batch(progs, FAST)
    assert [r.stdout.strip() for r in rs] == [str(i) for i in range(6)]


async def test_environment_is_clean(pool: SandboxPool) -> None:
    os.environ["SANDLOOP_TEST_SECRET"] = "s3cret"
    try:
        r = await run(pool, "import os\nprint(sorted(os.environ))")
    finally:
        del os.environ["SANDLOOP_TEST_SECRET"]
    assert "SANDLOOP_TEST_SECRET" not in r.stdout and "HOME" in r.stdout


async def test_no_process_or_mount_left_behind(pool: SandboxPool) -> None:
    await run(pool, "import os, time\nif os.fork() == 0:\n    os.setsid(); time.sleep(60)\n")
    uids = {str(pool.uid_base + i) for i in range(pool.size)}
    leftovers = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as f:
                uid_line = next(ln for ln in f if ln.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        if uid_line.split()[1] in uids:
            leftovers.append(pid)
    assert leftovers == []
    with open("/proc/self/mountinfo") as f:
        assert "sandloop" not in f.read()  # slot mounts live only in each zygote's namespace


async def test_work_dir_root_is_reset_between_runs(pool: SandboxPool) -> None:
    # A run owns /sandbox: it may chmod it or tag it; the next run must get a pristine dir.
    src = ("import os\nos.mkdir('d'); open('d/f', 'w').write('x'); os.symlink('/etc/passwd', 'l')\n"
           "try:\n    os.setxattr('.', 'user.note', b'left')\nexcept OSError:\n    pass\n"
           "os.chmod('.', 0o500)\n")
    for _ in range(pool.size + 1):
        await run(pool, src)
    for _ in range(pool.size):
        r = await run(pool, "import os\nprint(sorted(os.listdir('.')), oct(os.stat('.').st_mode & 0o777),"
                            " os.listxattr('.'))\nopen('w', 'w').write('ok')\n")
        assert r.status is Status.OK, r.stderr
        assert r.stdout == "['main.py'] 0o755 []\n"


def _run_groups(slot_names: set[str]) -> dict[str, Path]:
    """The run groups of these slots that exist now (cpu hierarchy), by name."""
    base = Path("/sys/fs/cgroup/cpu/sandloop")
    return {p.name: p for p in base.iterdir()
            if p.is_dir() and p.name.rpartition("r")[0] in slot_names} if base.is_dir() else {}


async def _observe_run_group(pool: SandboxPool, limits: Limits
                             ) -> tuple[ExecResult, str, tuple[str, str, str]]:
    """Run a program that sleeps a second and, meanwhile, find the run group holding its
    processes: (result, group name, (cpu.shares, memory limit, cgroup.procs))."""
    slots = {s.name for s in pool._slots}
    prog = "print(open('/proc/self/cgroup').read())\nimport time; time.sleep(1)"
    task = asyncio.create_task(run(pool, prog, limits=limits))
    seen: dict[str, tuple[str, str, str]] = {}
    for _ in range(200):
        await asyncio.sleep(0.01)
        for name, d in _run_groups(slots).items():
            mem = Path(f"/sys/fs/cgroup/memory/sandloop/{name}")
            with contextlib.suppress(OSError):
                seen[name] = ((d / "cpu.shares").read_text().strip(),
                              (mem / "memory.limit_in_bytes").read_text().strip(),
                              (mem / "cgroup.procs").read_text())
        if any(v[2].strip() for v in seen.values()):
            break
    r = await task
    assert r.status is Status.OK, r
    (name,) = [n for n, v in seen.items() if v[2].strip()]
    return r, name, seen[name]


async def test_each_run_has_its_own_cgroup_with_its_limits_gone_after_the_run(
        pool: SandboxPool) -> None:
    slots = {s.name for s in pool._slots}
    r, name, (shares, mem_limit, procs) = await _observe_run_group(
        pool, Limits(time_s=5, memory_mb=200, cpu_weight=500))
    # The run sees its groups as the root of its own cgroup namespace, not the host's names.
    lines = r.stdout.split()
    assert lines and all(line.endswith(":/") for line in lines), lines
    # It was in a group of its own, named after its slot and run ...
    assert name.rpartition("r")[0] in slots
    # ... with the run's limits, holding only the run's processes (never the zygote) ...
    assert shares == "5120" and int(mem_limit) == 200 << 20
    zygotes = {s.zygote_pid for s in pool._slots}
    assert procs.split() and not zygotes & {int(p) for p in procs.split()}
    # ... and the group was gone when the result came back.
    assert not any(Path(f"/sys/fs/cgroup/{c}/sandloop/{name}").exists()
                   for c in ("memory", "pids", "cpu", "cpuacct", "freezer"))
    # The next runs get other groups, with their own limits (each slot made its next group
    # ahead, with the limits of its last run, and changes them while they are still empty).
    for limits, want in ((Limits(time_s=5, memory_mb=300), ("1024", 300 << 20)),
                         (Limits(time_s=5, memory_mb=100, cpu_weight=200), ("2048", 100 << 20))):
        for _ in range(pool.size):
            ahead = {s.name: s._ready_cg[0].name for s in pool._slots if s._ready_cg is not None}
            _, other, (shares, mem_limit, _) = await _observe_run_group(pool, limits)
            assert other != name and (shares, int(mem_limit)) == want
            # A slot that had made a group ahead used it, its limits changed in place.
            slot_name = other.rpartition("r")[0]
            assert ahead.get(slot_name, other) == other, (other, ahead)


def _shmem_mb() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Shmem:"):
                return int(line.split()[1]) // 1024
    raise AssertionError("no Shmem in /proc/meminfo")


async def test_a_finished_runs_files_are_freed_promptly_on_an_idle_slot(pool: SandboxPool) -> None:
    # The run's tmpfs lives in its mount namespace; what it wrote must not stay in memory
    # while the slot waits for its next run.
    await run(pool, "pass")
    await asyncio.sleep(0.3)
    base = _shmem_mb()
    r = await run(pool, "open('big', 'wb').write(b'x' * (48 << 20))",
                  limits=Limits(time_s=5, memory_mb=256, workdir_mb=64))
    assert r.status is Status.OK, r
    for _ in range(100):
        if _shmem_mb() - base < 16:
            break
        await asyncio.sleep(0.01)
    assert _shmem_mb() - base < 16, f"{_shmem_mb() - base} MiB still held after the run"
