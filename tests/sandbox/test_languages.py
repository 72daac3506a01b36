"""Java, Go, Rust and TypeScript end to end through SandboxPool: hello world, stdin/stdout, a
compile error with the compiler's message, a timeout, a memory bomb (memory_limit from the
cgroup, not a runtime error), and the runtimes sized to the run's limits."""

from __future__ import annotations

import pytest

from sandloop import ExecResult, Limits, Program, SandboxPool, Status
from sandloop.sandbox.languages import LanguageUnavailable, spec_for

pytestmark = pytest.mark.asyncio(loop_scope="module")

NEW = ("java", "go", "rust", "typescript")


def _require(lang: str) -> None:
    try:
        spec_for(lang).check_available()
    except LanguageUnavailable as e:  # pragma: no cover - `make` installs the toolchains
        pytest.skip(str(e))


HELLO = {
    "java": 'public class Main { public static void main(String[] a) { '
            'System.out.println("hello, world"); } }',
    "go": 'package main\nimport "fmt"\nfunc main() { fmt.Println("hello, world") }\n',
    "rust": 'fn main() { println!("hello, world"); }\n',
    "typescript": 'const greeting: string = "hello, world";\nconsole.log(greeting);\n',
}

# Sum of the integers on stdin, a helper class/struct/type included: programs as models write them.
STDIN = {
    "java": """import java.io.*;
import java.util.*;
public class Main {
    static class Acc { long total; void add(long v) { total += v; } }
    public static void main(String[] args) throws IOException {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        Acc acc = new Acc();
        String line;
        while ((line = in.readLine()) != null)
            for (String t : line.trim().split("\\\\s+")) if (!t.isEmpty()) acc.add(Long.parseLong(t));
        System.out.println(acc.total);
    }
}
""",
    "go": """package main
import ("bufio"; "fmt"; "os")
type acc struct{ total int64 }
func main() {
    r := bufio.NewReader(os.Stdin)
    a := acc{}
    for { var v int64; if _, err := fmt.Fscan(r, &v); err != nil { break }; a.total += v }
    fmt.Println(a.total)
}
""",
    "rust": """use std::io::Read;
struct Acc { total: i64 }
fn main() {
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s).unwrap();
    let mut a = Acc { total: 0 };
    for t in s.split_whitespace() { a.total += t.parse::<i64>().unwrap(); }
    println!("{}", a.total);
}
""",
    "typescript": """import * as fs from "fs";
interface Acc { total: number }
const acc: Acc = { total: 0 };
for (const t of fs.readFileSync(0, "utf8").split(/\\s+/)) if (t) acc.total += Number(t);
console.log(acc.total);
""",
}

# A type error each compiler must reject, and the words of its message.
COMPILE_ERROR = {
    "java": ('public class Main { public static void main(String[] a) { int x = "s"; } }',
             "incompatible types"),
    "go": ('package main\nfunc main() { var x int = "s"; _ = x }\n', "cannot use"),
    "rust": ('fn main() { let x: i32 = "s"; }\n', "mismatched types"),
    # Type stripping alone would run this: tsc's type check must refuse it.
    "typescript": ('let x: number = "s";\nconsole.log(x);\n', "TS2322"),
}

LOOP = {
    "java": "public class Main { public static void main(String[] a) { long i = 0; "
            "while (true) { i++; } } }",
    "go": "package main\nfunc main() { i := 0; for { i++ } }\n",
    "rust": "fn main() { let n = std::env::args().count() as u64; let mut i: u64 = 0; "
            "loop { i = i.wrapping_add(n); if i == 0 { println!(\"wrapped\"); } } }\n",
    "typescript": "let i = 0;\nwhile (true) { i++; }\n",
}

# Keeps allocating and touching memory that stays reachable.
BOMB = {
    "java": """import java.util.*;
public class Main { public static void main(String[] a) {
    List<long[]> keep = new ArrayList<>();
    while (true) { long[] b = new long[1 << 20]; Arrays.fill(b, 7); keep.add(b); } } }
""",
    "go": """package main
func main() {
    var keep [][]byte
    for { b := make([]byte, 8<<20); for i := range b { b[i] = 7 }; keep = append(keep, b) }
}
""",
    "rust": """fn main() {
    let mut keep: Vec<Vec<u8>> = Vec::new();
    let mut total: u64 = 0;
    loop {
        keep.push(vec![7u8; 8 << 20]);
        total += keep.iter().map(|v| v[v.len() - 1] as u64).sum::<u64>();
        if total == 1 { println!("{}", total); }
    }
}
""",
    "typescript": """const keep: Float64Array[] = [];
while (true) { const b = new Float64Array(1 << 20); b.fill(7); keep.push(b); }
""",
}


async def run(pool: SandboxPool, lang: str, source: str, limits: Limits | None = None,
              **kw: object) -> ExecResult:
    _require(lang)
    return await pool.run(Program(language=lang, source=source, **kw),  # type: ignore[arg-type]
                          limits or Limits(time_s=10, memory_mb=256))


@pytest.mark.parametrize("lang", NEW)
async def test_hello_world(pool: SandboxPool, lang: str) -> None:
    r = await run(pool, lang, HELLO[lang])
    assert r.status is Status.OK, (r.error, r.stderr, r.compile and r.compile.stderr)
    assert r.stdout == "hello, world\n"
    assert r.compile is not None and r.compile.status is Status.OK
    assert r.isolation == "full"


@pytest.mark.parametrize("lang", NEW)
async def test_stdin_to_stdout(pool: SandboxPool, lang: str) -> None:
    r = await run(pool, lang, STDIN[lang], stdin="1 2 3\n4 5\n10000000000\n")
    assert r.status is Status.OK, (r.error, r.stderr, r.compile and r.compile.stderr)
    assert r.stdout.strip() == "10000000015"


@pytest.mark.parametrize("lang", NEW)
async def test_compile_error_carries_the_compilers_message(pool: SandboxPool, lang: str) -> None:
    source, says = COMPILE_ERROR[lang]
    r = await run(pool, lang, source)
    assert r.status is Status.COMPILE_ERROR, (r.status, r.error)
    assert r.compile is not None and says in r.compile.stderr, r.compile.stderr
    assert r.stdout == ""


@pytest.mark.parametrize("lang", NEW)
async def test_endless_loop_is_a_timeout(pool: SandboxPool, lang: str) -> None:
    r = await run(pool, lang, LOOP[lang], Limits(time_s=1.5, memory_mb=256))
    assert r.status is Status.TIMEOUT, (r.status, r.stderr, r.compile and r.compile.stderr)


@pytest.mark.parametrize("lang", NEW)
async def test_memory_bomb_is_memory_limit(pool: SandboxPool, lang: str) -> None:
    # The runtimes' own limits (the JVM's heap, Go's GOMEMLIMIT, V8's heap) must not turn
    # the cgroup's verdict into a runtime error.
    r = await run(pool, lang, BOMB[lang], Limits(time_s=10, memory_mb=256))
    assert r.status is Status.MEMORY_LIMIT, (r.status, r.stderr[-500:],
                                             r.compile and r.compile.stderr)


async def test_java_without_class_main_is_a_compile_error(pool: SandboxPool) -> None:
    r = await run(pool, "java", "class Solution { public static void main(String[] a) {} }")
    assert r.status is Status.COMPILE_ERROR
    assert r.compile is not None and "class Main" in r.compile.stderr


async def test_runtimes_follow_the_run_limits(pool: SandboxPool) -> None:
    java = ("public class Main { public static void main(String[] a) { Runtime r = "
            "Runtime.getRuntime(); System.out.println(r.maxMemory() >> 20); "
            "System.out.println(r.availableProcessors()); } }")
    r = await run(pool, "java", java, Limits(time_s=10, memory_mb=300, cpus=2))
    assert r.status is Status.OK, (r.stderr, r.compile and r.compile.stderr)
    heap, procs = (int(x) for x in r.stdout.split())
    assert 250 <= heap <= 300 and procs == 2
    go = ('package main\nimport ("fmt"; "os"; "runtime")\nfunc main() { '
          'fmt.Println(runtime.GOMAXPROCS(0), os.Getenv("GOMEMLIMIT")) }\n')
    r = await run(pool, "go", go, Limits(time_s=10, memory_mb=300, cpus=1.5))
    assert r.status is Status.OK, (r.stderr, r.compile and r.compile.stderr)
    assert r.stdout.split() == ["2", "270MiB"]


@pytest.mark.parametrize("lang", NEW)
async def test_program_arguments_and_runtime_error(pool: SandboxPool, lang: str) -> None:
    src = {
        "java": 'public class Main { public static void main(String[] a) { '
                'System.out.println(a[0]); System.exit(3); } }',
        "go": 'package main\nimport ("fmt"; "os")\nfunc main() { fmt.Println(os.Args[1]); '
              'os.Exit(3) }\n',
        "rust": 'fn main() { println!("{}", std::env::args().nth(1).unwrap()); '
                'std::process::exit(3); }\n',
        "typescript": 'console.log(process.argv[2]);\nprocess.exit(3);\n',
    }[lang]
    r = await run(pool, lang, src, argv=["arg-1"])
    assert r.status is Status.RUNTIME_ERROR and r.exit_code == 3, (r.stderr, r.compile)
    assert r.stdout == "arg-1\n"
