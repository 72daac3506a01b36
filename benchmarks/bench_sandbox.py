"""Sandbox throughput and latency: full isolation vs a bare, unisolated subprocess, in one run.

Prints per-run median and p99 wall time and runs/s at concurrency = cores for
  (a) a trivial Python program, (b) a 30-line solution with 5 asserts, (c) a C program
      (compile + run, isolated only),
each under full isolation (SandboxPool) and as ``subprocess.run([sys.executable, file])``,
and the ratio isolated/bare of the median wall time (target: <= 0.5). The two are measured in
alternating blocks (isolated, bare, isolated, ...), so that the drift of a shared machine's speed
over the run weighs on both sides alike instead of on whichever went second.

Then per language: for Python, JavaScript and bash the run's wall time and runs/s at
concurrency = cores; per compiled language (C, C++, Java, Go, Rust, TypeScript): the compile
step's wall time, the run step's, and runs/s of the compiled artifact at concurrency = cores
(compile once, run many: what the verifier does per test); for Java and Go, the start-up of the same artifact run
outside the sandbox (bare subprocess, same flags and environment), and the ratio.

    .venv/bin/python benchmarks/bench_sandbox.py [--runs N] [--languages-only]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable

from sandloop import Limits, Program, SandboxPool, Status
from sandloop.sandbox.languages import LanguageUnavailable, sandbox_env, spec_for

TRIVIAL = "pass\n"

SOLUTION = '''\
from collections import Counter


def top_k_frequent(words, k):
    """Return the k most frequent words, ties broken alphabetically."""
    counts = Counter(words)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return [w for w, _ in ranked[:k]]


def is_palindrome(s):
    cleaned = [c.lower() for c in s if c.isalnum()]
    return cleaned == cleaned[::-1]


def merge_intervals(intervals):
    out = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return out


assert top_k_frequent(["a", "b", "a", "c", "b", "a"], 2) == ["a", "b"]
assert is_palindrome("A man, a plan, a canal: Panama")
assert not is_palindrome("sandloop")
assert merge_intervals([[1, 3], [2, 6], [8, 10]]) == [[1, 6], [8, 10]]
assert merge_intervals([]) == []
'''

C_PROGRAM = """\
#include <stdio.h>
int main(void) {
    long s = 0;
    for (int i = 0; i < 1000000; i++) s += i % 7;
    printf("%ld\\n", s);
    return 0;
}
"""


C_STDOUT = "2999997\n"  # sum(i % 7 for i in range(1_000_000))


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


async def measure(n: int, conc: int, one: Callable[[], Awaitable[float]]) -> tuple[list[float], float]:
    lat: list[float] = []
    sem = asyncio.Semaphore(conc)

    async def job() -> None:
        async with sem:
            lat.append(await one())

    t = time.perf_counter()
    await asyncio.gather(*(job() for _ in range(n)))
    return lat, n / (time.perf_counter() - t)


async def interleaved(n: int, conc: int, blocks: int,
                      sides: list[Callable[[], Awaitable[float]]]) -> list[tuple[list[float], float]]:
    """``n`` runs of each side, in ``blocks`` alternating blocks; (latencies, runs/s) per side."""
    lats: list[list[float]] = [[] for _ in sides]
    spent = [0.0 for _ in sides]
    per = max(1, n // blocks)
    for _ in range(blocks):
        for i, one in enumerate(sides):
            t = time.perf_counter()
            lat, _ = await measure(per, conc, one)
            spent[i] += time.perf_counter() - t
            lats[i] += lat
    return [(lat, len(lat) / sec) for lat, sec in zip(lats, spent, strict=True)]


def bare_runner(source: str, tmp: str) -> Callable[[], Awaitable[float]]:
    path = os.path.join(tmp, f"prog{abs(hash(source))}.py")
    with open(path, "w") as f:
        f.write(source)

    async def one() -> float:
        def go() -> float:
            t = time.perf_counter()
            r = subprocess.run([sys.executable, path], capture_output=True)
            assert r.returncode == 0, r.stderr
            return time.perf_counter() - t

        return await asyncio.get_running_loop().run_in_executor(None, go)

    return one


def isolated_runner(pool: SandboxPool, program: Program,
                    stdout: str = "") -> Callable[[], Awaitable[float]]:
    """Times one run, which must succeed and print ``stdout`` (what is timed is the program)."""
    async def one() -> float:
        t = time.perf_counter()
        r = await pool.run(program, Limits(time_s=10))
        assert r.status is Status.OK, (r.status, r.stderr, r.error)
        assert r.stdout == stdout, (r.stdout[:200], r.stderr[-500:])
        return time.perf_counter() - t

    return one


# Reads a number, prints twice it: start-up plus a little I/O, per language.
DOUBLE = {
    "c": '#include <stdio.h>\nint main(){long n;scanf("%ld",&n);printf("%ld\\n",2*n);}\n',
    "cpp": '#include <iostream>\nint main(){long n;std::cin>>n;std::cout<<2*n<<"\\n";}\n',
    "java": 'import java.util.*;\npublic class Main { public static void main(String[] a) { '
            'System.out.println(2 * new Scanner(System.in).nextLong()); } }\n',
    "go": 'package main\nimport "fmt"\nfunc main() { var n int64; fmt.Scan(&n); '
          'fmt.Println(2 * n) }\n',
    "rust": 'use std::io::Read;\nfn main() { let mut s = String::new(); '
            'std::io::stdin().read_to_string(&mut s).unwrap(); '
            'println!("{}", 2 * s.trim().parse::<i64>().unwrap()); }\n',
    "typescript": 'const n: number = Number(require("fs").readFileSync(0, "utf8"));\n'
                  'console.log(2 * n);\n',
}
# The same program in the interpreted languages: no compile step, the run is the program.
DOUBLE_INTERPRETED = {
    "python": "print(2 * int(input()))\n",
    "javascript": 'console.log(2 * Number(require("fs").readFileSync(0, "utf8")));\n',
    "bash": "read n; echo $((2 * n))\n",
}
LANG_LIMITS = Limits(time_s=10, memory_mb=512)


async def language_rows(pool: SandboxPool, n: int, cores: int, tmp: str) -> None:
    print("(interpreted languages: the same program, read a number and print twice it; full "
          "isolation)")
    for lang, src in DOUBLE_INTERPRETED.items():
        try:
            spec_for(lang, limits=LANG_LIMITS).check_available()
        except LanguageUnavailable as e:
            print(f"  {lang:<11} skipped: {e}")
            continue
        prog = Program(language=lang, source=src, stdin="21")
        await measure(3, cores, isolated_runner(pool, prog, "42\n"))  # warm-up
        lat, rps = await measure(n, cores, isolated_runner(pool, prog, "42\n"))
        assert len(lat) == n, len(lat)
        print(f"  {lang:<11} compile       -   " + row("runs", lat, rps))
    print("(compiled languages: compile once, run many; full isolation)")
    for lang, src in DOUBLE.items():
        spec = spec_for(lang, limits=LANG_LIMITS)
        try:
            spec.check_available()
        except LanguageUnavailable as e:
            print(f"  {lang:<11} skipped: {e}")
            continue
        assert spec.compile is not None
        full = [await pool.run(Program(language=lang, source=src, stdin="21"), LANG_LIMITS)
                for _ in range(3)]
        assert all(r.status is Status.OK for r in full), [(r.status, r.compile) for r in full]
        compile_s = statistics.median(r.compile.wall_time_s for r in full if r.compile)
        built = await pool.run(Program(
            language="bash", source=spec.compile_script(), collect=[spec.binary],
            files={spec.main_file: src, **spec.compile_files}),
            Limits(time_s=30, memory_mb=1024, workdir_mb=256, stdout_bytes=64 << 20))
        artifact = built.files[spec.binary]
        prog = Program(language="bash", source=spec.run_script(), stdin="21",
                       files={spec.binary: artifact})
        await measure(3, cores, isolated_runner(pool, prog, "42\n"))  # warm-up
        lat, rps = await measure(n, cores, isolated_runner(pool, prog, "42\n"))
        print(f"  {lang:<11} compile {compile_s * 1000:7.0f} ms   run step "
              f"{statistics.median(r.wall_time_s for r in full) * 1000:6.1f} ms   "
              + row("artifact runs", lat, rps))
        if lang in ("java", "go"):
            lat_b = await bare_artifact(spec, artifact, n, cores, tmp)
            ratio = statistics.median(lat) / statistics.median(lat_b)
            print(f"  {'':<11} same artifact outside the sandbox: median "
                  f"{statistics.median(lat_b) * 1000:7.2f} ms   ratio sandboxed/bare {ratio:.2f}")


async def bare_artifact(spec: object, artifact: bytes, n: int, cores: int,
                        tmp: str) -> list[float]:
    """Median-able wall times of the artifact run as a plain subprocess (same argv, same
    environment, no isolation)."""
    from sandloop.sandbox.languages import WORK_DIR, LanguageSpec

    assert isinstance(spec, LanguageSpec)
    d = tempfile.mkdtemp(dir=tmp)
    path = os.path.join(d, spec.binary)
    with open(path, "wb") as f:
        f.write(artifact)
    os.chmod(path, 0o755)
    argv = [a.replace(WORK_DIR, d) for a in spec.run.argv]
    env = {**sandbox_env(spec.name), **spec.run_env, "HOME": d}

    async def one() -> float:
        def go() -> float:
            t = time.perf_counter()
            r = subprocess.run(argv, input=b"21", capture_output=True, env=env, cwd=d)
            assert r.returncode == 0, r.stderr
            return time.perf_counter() - t

        return await asyncio.get_running_loop().run_in_executor(None, go)

    await measure(3, cores, one)
    lat, _ = await measure(n, cores, one)
    return lat


def row(name: str, lat: list[float], rps: float) -> str:
    return (f"{name:<34} median {statistics.median(lat) * 1000:7.2f} ms   "
            f"p99 {pct(lat, 0.99) * 1000:7.2f} ms   {rps:7.1f} runs/s")


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--languages-only", action="store_true",
                    help="only the per-language compile/run figures")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    n = args.runs
    print(f"sandloop sandbox benchmark: {n} runs each, concurrency = {cores} (cores)\n")
    async with SandboxPool(int(os.environ.get("BENCH_SLOTS", cores))) as pool:
        with tempfile.TemporaryDirectory() as tmp:
            if args.languages_only:
                await language_rows(pool, max(10, n // 4), cores, tmp)
                return
            ratios = {}
            for label, src in (("trivial", TRIVIAL), ("30-line solution + 5 asserts", SOLUTION)):
                prog = Program(language="python", source=src)
                await measure(10, cores, isolated_runner(pool, prog))  # warm-up
                await measure(5, cores, bare_runner(src, tmp))
                (lat_i, rps_i), (lat_b, rps_b) = await interleaved(
                    n, cores, 10, [isolated_runner(pool, prog), bare_runner(src, tmp)])
                # Both sides ran as many programs as the figures below are of.
                assert len(lat_i) == len(lat_b) == max(1, n // 10) * 10, (len(lat_i), len(lat_b))
                print(f"({label})")
                print("  " + row("full isolation (sandloop)", lat_i, rps_i))
                print("  " + row("bare subprocess.run, no isolation", lat_b, rps_b))
                ratio = statistics.median(lat_i) / statistics.median(lat_b)
                ratios[label] = ratio
                print(f"  ratio isolated/bare median wall: {ratio:.2f}  "
                      f"(target <= 0.50)   throughput x{rps_i / rps_b:.2f}\n")
            cprog = Program(language="c", source=C_PROGRAM)
            n_c = max(10, n // 10)
            lat_c, rps_c = await measure(n_c, cores, isolated_runner(pool, cprog, C_STDOUT))
            assert len(lat_c) == n_c, len(lat_c)
            print("(C program, compile + run, full isolation)")
            print("  " + row("gcc -O2 + run (sandloop)", lat_c, rps_c))
            print()
            await language_rows(pool, max(10, n // 4), cores, tmp)


if __name__ == "__main__":
    asyncio.run(main())
