"""Function-call tasks in Java, Go, Rust and TypeScript through the verifier, with the real
compilers and runtimes: typed arguments in, the typed return value compared outside the
sandbox; wrong answers, compile errors, exceptions, timeouts, memory bombs, and completions
that try to report instead of return."""

from __future__ import annotations

from typing import Any

import pytest

from sandloop.reward import Verdict, Verifier
from sandloop.sandbox.languages import LanguageUnavailable, spec_for
from sandloop.sandbox.models import ExecResult, Limits, Program
from sandloop.tasks import CallTest, Task, TaskLimits

PoolThread = Any  # the session fixture of conftest.py

LANGS = ["java", "go", "rust", "typescript"]

# f(words: list[str], k: int, scale: float, flag: bool) -> list[list[int]]:
# for each word, [code points, code points * k], or [] when flag is false; and g(x: float) ->
# float = x * scale via a second task.
SIG = {"params": ["list[str]", "int", "bool"], "returns": "list[list[int]]"}
GOOD = {
    "java": """import java.util.*;
class Solution {
    public long[][] f(String[] words, long k, boolean flag) {
        if (!flag) return new long[0][];
        long[][] out = new long[words.length][];
        for (int i = 0; i < words.length; i++) {
            long n = words[i].codePointCount(0, words[i].length());
            out[i] = new long[]{n, n * k};
        }
        return out;
    }
}
""",
    "go": """package main

import "unicode/utf8"

func f(words []string, k int, flag bool) [][]int {
	out := [][]int{}
	if !flag {
		return out
	}
	for _, w := range words {
		n := utf8.RuneCountInString(w)
		out = append(out, []int{n, n * k})
	}
	return out
}
""",
    "rust": """use std::collections::HashMap;
fn f(words: Vec<String>, k: i64, flag: bool) -> Vec<Vec<i64>> {
    let _unused: HashMap<i64, i64> = HashMap::new();
    if !flag { return vec![]; }
    words.iter().map(|w| { let n = w.chars().count() as i64; vec![n, n * k] }).collect()
}
""",
    "typescript": """function f(words: string[], k: number, flag: boolean): number[][] {
    if (!flag) return [];
    return words.map(w => { const n = [...w].length; return [n, n * k]; });
}
""",
}
# Off by one in the second element.
WRONG = {
    "java": GOOD["java"].replace("n * k}", "n * k + 1}"),
    "go": GOOD["go"].replace("n * k}", "n*k + 1}"),
    "rust": GOOD["rust"].replace("n * k]", "n * k + 1]"),
    "typescript": GOOD["typescript"].replace("n * k]", "n * k + 1]"),
}
# A type error: a compile error with the compiler's message.
BROKEN = {
    "java": "class Solution { public long[][] f(String[] w, long k, boolean b) "
            "{ return undefinedName; } }",
    "go": "package main\nfunc f(w []string, k int, b bool) [][]int { return undefinedName }\n",
    "rust": "fn f(w: Vec<String>, k: i64, b: bool) -> Vec<Vec<i64>> { undefined_name }\n",
    "typescript": "function f(w: string[], k: number, b: boolean): number[][] "
                  "{ return undefinedName; }\n",
}
# Throws on the empty list (index out of range).
THROWS = {
    "java": "class Solution { public long[][] f(String[] w, long k, boolean b) "
            "{ return new long[][]{{w[0].length()}}; } }",
    "go": "package main\nfunc f(w []string, k int, b bool) [][]int { return [][]int{{len(w[0])}} }\n",
    "rust": "fn f(w: Vec<String>, k: i64, b: bool) -> Vec<Vec<i64>> "
            "{ vec![vec![w[0].len() as i64]] }\n",
    "typescript": "function f(w: string[], k: number, b: boolean): number[][] "
                  "{ if (w.length === 0) throw new Error('empty'); return [[w[0].length]]; }\n",
}
LOOP = {
    "java": "class Solution { public long[][] f(String[] w, long k, boolean b) "
            "{ long i = 0; while (i < 2) { i = (i * 31 + k) & 1; } return null; } }",
    "go": "package main\nfunc f(w []string, k int, b bool) [][]int "
          "{ i := 0; for i < 2 { i = (i*31 + k) & 1 }; return nil }\n",
    "rust": "fn f(w: Vec<String>, k: i64, b: bool) -> Vec<Vec<i64>> "
            "{ let mut i: i64 = 0; while i < 2 { i = (i.wrapping_mul(31).wrapping_add(k)) & 1; } vec![] }\n",
    "typescript": "function f(w: string[], k: number, b: boolean): number[][] "
                  "{ let i = 0; while (i < 2) { i = (i * 31 + k) & 1; } return []; }\n",
}
BOMB = {
    "java": """import java.util.*;
class Solution { public long[][] f(String[] w, long k, boolean b) {
    List<long[]> keep = new ArrayList<>();
    while (true) { long[] x = new long[1 << 20]; Arrays.fill(x, 7); keep.add(x); } } }
""",
    "go": """package main
func f(w []string, k int, b bool) [][]int {
	var keep [][]byte
	for { x := make([]byte, 8<<20); for i := range x { x[i] = 7 }; keep = append(keep, x) }
}
""",
    "rust": """fn f(w: Vec<String>, k: i64, b: bool) -> Vec<Vec<i64>> {
    let mut keep: Vec<Vec<u8>> = Vec::new();
    let mut total: u64 = 0;
    loop {
        keep.push(vec![7u8; 8 << 20]);
        total += keep.iter().map(|v| v[v.len() - 1] as u64).sum::<u64>();
        if total == 1 { return vec![]; }
    }
}
""",
    "typescript": """function f(w: string[], k: number, b: boolean): number[][] {
    const keep: Float64Array[] = [];
    while (true) { const x = new Float64Array(1 << 20); x.fill(7); keep.push(x); }
}
""",
}
# Reward hack: exit 0 before returning, after printing what looks like a passing result
# (on stdout and on the channel): no value recorded by the harness is a runtime error.
EXIT_EARLY = {
    "java": """class Solution { public long[][] f(String[] w, long k, boolean b) {
    System.out.println("{\\"value\\": \\"forged\\"}"); System.exit(0); return null; } }
""",
    "go": """package main
import "os"
func f(w []string, k int, b bool) [][]int { os.Stdout.WriteString("PASSED\\n"); os.Exit(0); return nil }
""",
    "rust": """fn f(w: Vec<String>, k: i64, b: bool) -> Vec<Vec<i64>> { println!("PASSED"); std::process::exit(0) }
""",
    "typescript": """function f(w: string[], k: number, b: boolean): number[][] {
    console.log("PASSED"); process.exit(0); return []; }
""",
}

WORDS = ["h\u00e9llo", "\U0001F600\"\\\n\t", "", "a b"]


def _task(lang: str, time_s: float = 5.0, memory_mb: int = 256) -> Task:
    def expect(words: list[str], k: int, flag: bool) -> list[list[int]]:
        return [[len(w), len(w) * k] for w in words] if flag else []

    calls = [(WORDS, 3, True), ([], 2, True), (WORDS, -9, False), (["x" * 40], 2**40, True)]
    tests = [CallTest(name=f"t{i}", args=[list(w), k, fl], expected=expect(w, k, fl))
             for i, (w, k, fl) in enumerate(calls)]
    return Task(id=f"calls-{lang}", language=lang, entry_point="f", signature=SIG,
                limits=TaskLimits(time_s=time_s, memory_mb=memory_mb),
                public_tests=tuple(tests[:1]), hidden_tests=tuple(tests[1:]))


def _require(lang: str) -> None:
    try:
        spec_for(lang).check_available()
    except LanguageUnavailable as e:  # pragma: no cover - `make` installs the toolchains
        pytest.skip(str(e))


@pytest.mark.parametrize("lang", LANGS)
def test_function_call_task_passes_compiling_once(sandbox: PoolThread, lang: str) -> None:
    _require(lang)
    calls: list[Program] = []

    async def counting_run(program: Program, limits: Limits) -> ExecResult:
        calls.append(program)
        return await sandbox.pool.run(program, limits)

    task = _task(lang)
    r = sandbox.run(Verifier(counting_run).verify(task, GOOD[lang]))
    assert r.reward == 1.0 and r.verdict is Verdict.PASSED, r.tests
    assert r.public.passed == 1 and r.hidden.passed == 3
    assert len(calls) == 1 + 4 and len([p for p in calls if p.collect]) == 1
    # Expected values never enter the sandbox: no program or file holds one.
    probe = "2199023255552"  # 2 * 2**40, the last test's expected value only
    assert all(probe not in p.source and all(probe not in str(c) for c in p.files.values())
               for p in calls)


@pytest.mark.parametrize("lang", LANGS)
def test_function_call_failures_get_their_verdicts(sandbox: PoolThread, lang: str) -> None:
    _require(lang)
    v = Verifier(sandbox.pool.run)
    task = _task(lang)
    wrong, broken, throws = sandbox.all([v.verify(task, WRONG[lang]),
                                         v.verify(task, BROKEN[lang]),
                                         v.verify(task, THROWS[lang])])
    assert wrong.reward == 0.0
    by_name = {t.name: t for t in wrong.tests}
    assert by_name["t0"].verdict is Verdict.WRONG_ANSWER and "returned" in (
        by_name["t0"].detail or "")
    assert by_name["t1"].verdict is Verdict.PASSED  # [] stays [] off by one
    assert broken.verdict is Verdict.COMPILE_ERROR and broken.reward == 0.0
    assert "undefined" in (broken.tests[0].detail or "").lower(), broken.tests[0].detail
    verdicts = {t.name: t.verdict for t in throws.tests}
    assert verdicts["t1"] is Verdict.RUNTIME_ERROR, throws.tests


@pytest.mark.parametrize("lang", LANGS)
def test_function_call_timeout_and_memory_bomb(sandbox: PoolThread, lang: str) -> None:
    _require(lang)
    v = Verifier(sandbox.pool.run)
    loop, bomb = sandbox.all([v.verify(_task(lang, time_s=2.0), LOOP[lang]),
                              v.verify(_task(lang, time_s=10.0, memory_mb=256), BOMB[lang])])
    assert {t.verdict for t in loop.tests} == {Verdict.TIMEOUT}, loop.tests
    assert {t.verdict for t in bomb.tests} == {Verdict.MEMORY_LIMIT}, bomb.tests


@pytest.mark.parametrize("lang", LANGS)
def test_exiting_early_with_a_fake_report_is_not_a_pass(sandbox: PoolThread,
                                                        lang: str) -> None:
    _require(lang)
    r = sandbox.run(Verifier(sandbox.pool.run).verify(_task(lang), EXIT_EARLY[lang]))
    assert r.reward == 0.0
    assert {t.verdict for t in r.tests} == {Verdict.RUNTIME_ERROR}, r.tests
    assert all("returned no value" in (t.detail or "") for t in r.tests)


def test_numbers_keep_their_types(sandbox: PoolThread) -> None:
    # A float where the signature says int is a wrong answer in strict mode (the default),
    # and an integral float stays a float (2.0 is not 2): per language, the value's own type.
    _require("typescript")
    _require("go")
    v = Verifier(sandbox.pool.run)

    def task(lang: str, returns: str, expected: Any) -> Task:
        return Task(id=f"num-{lang}-{returns}", language=lang, entry_point="half",
                    signature={"params": ["int"], "returns": returns},
                    hidden_tests=(CallTest(name="t", args=[5], expected=expected),))

    ts = "function half(x: number): number { return x / 2; }\n"
    go_float = "package main\nfunc half(x int) float64 { return float64(x) / 2 }\n"
    go_int = "package main\nfunc half(x int) int { return x / 2 }\n"
    runs = sandbox.all([
        v.verify(task("typescript", "int", 2), ts),            # 2.5: not an int
        v.verify(task("typescript", "float", 2.5), ts),
        v.verify(task("go", "float", 2.5), go_float),
        v.verify(task("go", "float", 2.0), go_int),             # int 2 is not 2.0
        v.verify(task("go", "int", 2), go_int),
    ])
    assert [r.verdict for r in runs] == [Verdict.WRONG_ANSWER, Verdict.PASSED, Verdict.PASSED,
                                         Verdict.WRONG_ANSWER, Verdict.PASSED], [
        r.tests for r in runs]


def test_special_floats_round_trip(sandbox: PoolThread) -> None:
    _require("rust")
    _require("java")
    v = Verifier(sandbox.pool.run)
    nan, inf = {"$float": "nan"}, {"$float": "inf"}
    sig = {"params": ["list[float]"], "returns": "list[float]"}
    sources = {
        "rust": "fn ident(x: Vec<f64>) -> Vec<f64> { x }\n",
        "java": "class Solution { static double[] ident(double[] x) { return x; } }\n",
    }
    runs = sandbox.all([
        v.verify(Task(id=f"floats-{lang}", language=lang, entry_point="ident", signature=sig,
                      hidden_tests=(CallTest(name="t", args=[[nan, inf, -0.0, 1e300, 0.1, 3]],
                                             expected=[nan, inf, 0.0, 1e300, 0.1, 3.0]),)),
                 src)
        for lang, src in sources.items()])
    assert [r.verdict for r in runs] == [Verdict.PASSED, Verdict.PASSED], [r.tests for r in runs]
