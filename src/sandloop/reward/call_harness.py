"""Function-call harnesses for Java, Go, Rust and TypeScript (code generation; pure).

For a function task in one of those languages the verifier compiles, once, a program made of
the completion and a generated harness. The harness holds every test's arguments as literals of
the task's signature types (:mod:`sandloop.tasks.signature`), and each test run (``argv[1]`` =
the test's index) calls the entry point with that test's arguments and writes the return value,
as one typed value (:mod:`sandloop.tasks.values`), on the result channel (fd 3):
``{"value": ...}``. Expected values never enter the sandbox: the verifier decodes the value and
compares it outside (``sandloop.reward.compare``).

The completion shares the harness's process, so it could write a record of its own; that buys
nothing a return value would not (it does not know the expected value), and the verifier reads
the last record, which the harness writes after the call returned. An exception, panic or exit
is the run's status (``runtime_error``), never a value.

Per language (docs/tasks.md, "Function calls in compiled languages"):

- java: the completion is ``Solution.java`` declaring ``class Solution``; the harness
  (``Main.java``) calls ``new Solution().<entry>(...)`` (static or instance method); javac
  finds ``Solution.java`` by its class name.
- go: the completion is ``solution.go`` (``package main``, a function ``<entry>``, no ``main``);
  the harness is ``main.go``.
- rust: the completion is ``solution.rs`` (a function ``<entry>``, no ``main``), included by the
  harness's ``main.rs`` (``include!``), so its ``use`` lines are the crate's.
- typescript: the completion comes first in ``main.ts`` and the harness is appended (one
  compiled file, its line numbers are the completion's); a function ``<entry>``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sandloop.tasks.signature import SigType, parse_type
from sandloop.tasks.values import decode

__all__ = ["CallHarness", "call_harness"]


@dataclass(frozen=True)
class CallHarness:
    """The files of the program to compile: ``files`` (file name -> text); for Go, the
    further ``sources`` the build must name besides the main file; ``run_prefix``, bash lines
    that go before each test's run step."""

    files: dict[str, str]
    sources: tuple[str, ...] = field(default_factory=tuple)
    run_prefix: str = ""


def call_harness(language: str, completion: str, entry: str, params: Sequence[str],
                 returns: str, calls: Sequence[Sequence[Any]]) -> CallHarness:
    """The program that runs ``entry`` on each of ``calls`` (a list of typed-value argument
    lists, already checked against ``params``: ``Task`` does that)."""
    ptypes = [parse_type(p) for p in params]
    rtype = parse_type(returns)
    args = [[decode(a) for a in call] for call in calls]
    if language == "java":
        # The JVM's stdout is the result channel (see _JAVA_MAIN).
        return CallHarness({"Main.java": _java(entry, ptypes, args),
                            "Solution.java": completion}, run_prefix="exec 1>&3\n")
    if language == "go":
        return CallHarness({"main.go": _go(entry, ptypes, args), "solution.go": completion},
                           ("solution.go",))
    if language == "rust":
        return CallHarness({"main.rs": _rust(entry, ptypes, args), "solution.rs": completion})
    if language == "typescript":
        sep = "" if completion.endswith("\n") else "\n"
        return CallHarness({"main.ts": completion + sep + _typescript(entry, ptypes, rtype,
                                                                        args)})
    raise ValueError(f"no function-call harness for {language!r}")


def _float_repr(x: float) -> str:
    text = repr(float(x))
    return text if any(c in text for c in ".e") else text + ".0"


# -- Java ---------------------------------------------------------------------------------------

_JAVA_TYPES = {"int": "long", "float": "double", "bool": "boolean", "str": "String"}


def _java_type(t: SigType) -> str:
    return _JAVA_TYPES[t.scalar] + "[]" * t.depth


def _quoted(codes: Sequence[int], ascii_control: str, other: Callable[[int], str]) -> str:
    """A double-quoted literal of the code points (or UTF-16 units) ``codes``: printable ASCII
    as is, quote and backslash escaped, other ASCII as ``ascii_control % code``, the rest as
    ``other(code)`` (each language's own escape)."""
    out = ['"']
    for o in codes:
        if o in (0x22, 0x5C):
            out.append("\\" + chr(o))
        elif 0x20 <= o < 0x7F:
            out.append(chr(o))
        elif o < 0x80:
            out.append(ascii_control % o)
        else:
            out.append(other(o))
    out.append('"')
    return "".join(out)


def _java_string(s: str) -> str:
    # Java turns \\uXXXX escapes into characters before it reads the source, so an escaped
    # quote or newline would end the literal: ASCII controls go as octal escapes, and only
    # characters above ASCII as \\uXXXX (UTF-16 units, surrogate pairs for the rest).
    return _quoted(_utf16_units(s), "\\%03o", lambda u: f"\\u{u:04x}")


def _utf16_units(s: str) -> list[int]:
    data = s.encode("utf-16-be")
    return [int.from_bytes(data[i:i + 2], "big") for i in range(0, len(data), 2)]


def _java_literal(t: SigType, v: Any) -> str:
    if t.item is not None:
        items = ", ".join(_java_literal(t.item, x) for x in v)
        return f"new {_java_type(t)}{{{items}}}"
    if t.name == "int":
        return f"{v}L" if v != -(2**63) else "Long.MIN_VALUE"
    if t.name == "float":
        x = float(v)
        if math.isnan(x):
            return "Double.NaN"
        if math.isinf(x):
            return "Double.POSITIVE_INFINITY" if x > 0 else "Double.NEGATIVE_INFINITY"
        return _float_repr(x)
    if t.name == "bool":
        return "true" if v else "false"
    return _java_string(v)


_JAVA_MAIN = """\
// sandloop's function-call harness (reward/call_harness.py): calls Solution.%(entry)s with test
// argv[0]'s arguments and writes the typed return value on the result channel (fd 3).
public class Main {
%(cases)s
    static Object __slCall(int i) throws Throwable {
        switch (i) {
%(switch)s
            default: throw new IllegalArgumentException("no test " + i);
        }
    }

    static void __slEnc(StringBuilder b, Object v) {
        if (v == null) { b.append("null"); }
        else if (v instanceof Long || v instanceof Integer || v instanceof Short
                 || v instanceof Byte) { b.append(((Number) v).longValue()); }
        else if (v instanceof Double || v instanceof Float) {
            double d = ((Number) v).doubleValue();
            if (Double.isNaN(d)) b.append("{\\"$float\\":\\"nan\\"}");
            else if (Double.isInfinite(d)) b.append(d > 0 ? "{\\"$float\\":\\"inf\\"}"
                                                          : "{\\"$float\\":\\"-inf\\"}");
            else b.append(Double.toString(d));
        }
        else if (v instanceof Boolean) { b.append(((Boolean) v) ? "true" : "false"); }
        else if (v instanceof String) { __slStr(b, (String) v); }
        else if (v instanceof long[]) { long[] a = (long[]) v; b.append('[');
            for (int i = 0; i < a.length; i++) { if (i > 0) b.append(','); b.append(a[i]); }
            b.append(']'); }
        else if (v instanceof int[]) { int[] a = (int[]) v; b.append('[');
            for (int i = 0; i < a.length; i++) { if (i > 0) b.append(','); b.append(a[i]); }
            b.append(']'); }
        else if (v instanceof double[]) { double[] a = (double[]) v; b.append('[');
            for (int i = 0; i < a.length; i++) { if (i > 0) b.append(','); __slEnc(b, a[i]); }
            b.append(']'); }
        else if (v instanceof boolean[]) { boolean[] a = (boolean[]) v; b.append('[');
            for (int i = 0; i < a.length; i++) { if (i > 0) b.append(','); __slEnc(b, a[i]); }
            b.append(']'); }
        else if (v instanceof Object[]) { Object[] a = (Object[]) v; b.append('[');
            for (int i = 0; i < a.length; i++) { if (i > 0) b.append(','); __slEnc(b, a[i]); }
            b.append(']'); }
        else if (v instanceof java.util.List) { b.append('['); boolean first = true;
            for (Object x : (java.util.List<?>) v) { if (!first) b.append(',');
                first = false; __slEnc(b, x); }
            b.append(']'); }
        else { b.append("{\\"$opaque\\":"); __slStr(b, v.getClass().getName()); b.append('}'); }
    }

    static void __slStr(StringBuilder b, String s) {
        b.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (c == '"' || c == '\\\\') { b.append('\\\\').append(c); }
            else if (c < 0x20 || c >= 0x7f) { b.append(String.format("\\\\u%%04x", (int) c)); }
            else { b.append(c); }
        }
        b.append('"');
    }

    public static void main(String[] args) throws Throwable {
        // Java cannot open a descriptor by number (and /proc/self/fd/3 is not ours to reopen):
        // the run step makes the result channel its stdout, and the completion's System.out
        // goes to stderr.
        java.io.PrintStream chan = new java.io.PrintStream(
            new java.io.FileOutputStream(java.io.FileDescriptor.out), false, "UTF-8");
        System.setOut(new java.io.PrintStream(
            new java.io.FileOutputStream(java.io.FileDescriptor.err), true, "UTF-8"));
        Object r = __slCall(Integer.parseInt(args[0]));
        StringBuilder b = new StringBuilder("{\\"value\\":");
        __slEnc(b, r);
        b.append("}\\n");
        chan.print(b);
        chan.flush();
    }
}
"""


def _java(entry: str, params: list[SigType], calls: list[list[Any]]) -> str:
    # One method per test: a method's bytecode is limited to 64 KiB, and literals of large
    # arguments would overflow one shared method.
    cases = "\n".join(
        f"    static Object __slT{i}() throws Throwable {{\n"
        f"        return new Solution().{entry}("
        + ", ".join(_java_literal(t, v) for t, v in zip(params, args, strict=True))
        + ");\n    }"
        for i, args in enumerate(calls))
    switch = "\n".join(f"            case {i}: return __slT{i}();" for i in range(len(calls)))
    return _JAVA_MAIN % {"entry": entry, "cases": cases, "switch": switch}


# -- Go -----------------------------------------------------------------------------------------

_GO_TYPES = {"int": "int", "float": "float64", "bool": "bool", "str": "string"}


def _go_type(t: SigType) -> str:
    return "[]" * t.depth + _GO_TYPES[t.scalar]


def _go_string(s: str) -> str:
    return _quoted([ord(c) for c in s], "\\x%02x",
                   lambda o: f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}")


def _go_literal(t: SigType, v: Any) -> str:
    if t.item is not None:
        return f"{_go_type(t)}{{" + ", ".join(_go_literal(t.item, x) for x in v) + "}"
    if t.name == "int":
        return f"int({v})"
    if t.name == "float":
        x = float(v)
        if math.isnan(x):
            return "math.NaN()"
        if math.isinf(x):
            return f"math.Inf({1 if x > 0 else -1})"
        return f"float64({_float_repr(x)})"
    if t.name == "bool":
        return "true" if v else "false"
    return _go_string(v)


_GO_MAIN = """\
// sandloop's function-call harness (reward/call_harness.py): calls %(entry)s with test
// os.Args[1]'s arguments and writes the typed return value on the result channel (fd 3).
package main

import (
	__slJSON "encoding/json"
	"math"
	__slOS "os"
	__slReflect "reflect"
	__slStrconv "strconv"
	__slStrings "strings"
)

var _ = math.NaN

func __slCall(i int) interface{} {
	switch i {
%(switch)s
	}
	panic("no such test")
}

func __slEnc(b *__slStrings.Builder, v __slReflect.Value) {
	switch v.Kind() {
	case __slReflect.Int, __slReflect.Int8, __slReflect.Int16, __slReflect.Int32, __slReflect.Int64:
		b.WriteString(__slStrconv.FormatInt(v.Int(), 10))
	case __slReflect.Uint, __slReflect.Uint8, __slReflect.Uint16, __slReflect.Uint32, __slReflect.Uint64:
		b.WriteString(__slStrconv.FormatUint(v.Uint(), 10))
	case __slReflect.Float32, __slReflect.Float64:
		f := v.Float()
		if math.IsNaN(f) {
			b.WriteString(`{"$float":"nan"}`)
		} else if math.IsInf(f, 1) {
			b.WriteString(`{"$float":"inf"}`)
		} else if math.IsInf(f, -1) {
			b.WriteString(`{"$float":"-inf"}`)
		} else {
			s := __slStrconv.FormatFloat(f, 'g', -1, 64)
			if !__slStrings.ContainsAny(s, ".e") {
				s += ".0"
			}
			b.WriteString(s)
		}
	case __slReflect.Bool:
		if v.Bool() {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case __slReflect.String:
		s, _ := __slJSON.Marshal(v.String())
		b.Write(s)
	case __slReflect.Slice, __slReflect.Array:
		b.WriteString("[")
		for i := 0; i < v.Len(); i++ {
			if i > 0 {
				b.WriteString(",")
			}
			__slEnc(b, v.Index(i))
		}
		b.WriteString("]")
	case __slReflect.Interface, __slReflect.Ptr:
		if v.IsNil() {
			b.WriteString("null")
		} else {
			__slEnc(b, v.Elem())
		}
	case __slReflect.Invalid:
		b.WriteString("null")
	default:
		s, _ := __slJSON.Marshal(v.Type().String())
		b.WriteString(`{"$opaque":`)
		b.Write(s)
		b.WriteString("}")
	}
}

func main() {
	i, err := __slStrconv.Atoi(__slOS.Args[1])
	if err != nil {
		panic(err)
	}
	r := __slCall(i)
	var b __slStrings.Builder
	b.WriteString(`{"value":`)
	__slEnc(&b, __slReflect.ValueOf(r))
	b.WriteString("}\\n")
	out := __slOS.NewFile(3, "channel")
	if _, err := out.WriteString(b.String()); err != nil {
		panic(err)
	}
}
"""


def _go(entry: str, params: list[SigType], calls: list[list[Any]]) -> str:
    switch = "\n".join(
        f"\tcase {i}:\n\t\treturn {entry}("
        + ", ".join(_go_literal(t, v) for t, v in zip(params, args, strict=True)) + ")"
        for i, args in enumerate(calls))
    return _GO_MAIN % {"entry": entry, "switch": switch}


# -- Rust ---------------------------------------------------------------------------------------


def _rust_string(s: str) -> str:
    return _quoted([ord(c) for c in s], "\\x%02x", lambda o: f"\\u{{{o:x}}}")


def _rust_literal(t: SigType, v: Any) -> str:
    # Unsuffixed numbers: the entry point's own parameter types decide (i32 or i64, f32 or
    # f64), and a value out of an i32's range is rustc's compile error.
    if t.item is not None:
        return "vec![" + ", ".join(_rust_literal(t.item, x) for x in v) + "]"
    if t.name == "int":
        return str(v)
    if t.name == "float":
        x = float(v)
        if math.isnan(x):
            return "f64::NAN"
        if math.isinf(x):
            return "f64::INFINITY" if x > 0 else "f64::NEG_INFINITY"
        return _float_repr(x)
    if t.name == "bool":
        return "true" if v else "false"
    return f"String::from({_rust_string(v)})"


_RUST_MAIN = """\
// sandloop's function-call harness (reward/call_harness.py): calls %(entry)s with test
// argv[1]'s arguments and writes the typed return value on the result channel (fd 3).
include!("solution.rs");

trait SandloopValue {
    fn sandloop_enc(&self, b: &mut String);
}
macro_rules! sandloop_int {
    ($($t:ty),*) => { $(impl SandloopValue for $t {
        fn sandloop_enc(&self, b: &mut String) { b.push_str(&self.to_string()); }
    })* };
}
sandloop_int!(i8, i16, i32, i64, i128, isize, u8, u16, u32, u64, u128, usize);
macro_rules! sandloop_float {
    ($($t:ty),*) => { $(impl SandloopValue for $t {
        fn sandloop_enc(&self, b: &mut String) {
            let f = *self as f64;
            if f.is_nan() { b.push_str("{\\"$float\\":\\"nan\\"}"); }
            else if f.is_infinite() {
                b.push_str(if f > 0.0 { "{\\"$float\\":\\"inf\\"}" } else { "{\\"$float\\":\\"-inf\\"}" });
            } else {
                let s = format!("{:?}", f);
                b.push_str(&s);
                if !s.contains('.') && !s.contains('e') { b.push_str(".0"); }
            }
        }
    })* };
}
sandloop_float!(f32, f64);
impl SandloopValue for bool {
    fn sandloop_enc(&self, b: &mut String) { b.push_str(if *self { "true" } else { "false" }); }
}
impl SandloopValue for str {
    fn sandloop_enc(&self, b: &mut String) {
        b.push('"');
        for c in self.chars() {
            match c {
                '"' => b.push_str("\\\\\\""),
                '\\\\' => b.push_str("\\\\\\\\"),
                c if (c as u32) < 0x20 => b.push_str(&format!("\\\\u{:04x}", c as u32)),
                c => b.push(c),
            }
        }
        b.push('"');
    }
}
impl SandloopValue for String {
    fn sandloop_enc(&self, b: &mut String) { self.as_str().sandloop_enc(b); }
}
impl<T: SandloopValue + ?Sized> SandloopValue for &T {
    fn sandloop_enc(&self, b: &mut String) { (**self).sandloop_enc(b); }
}
impl<T: SandloopValue> SandloopValue for [T] {
    fn sandloop_enc(&self, b: &mut String) {
        b.push('[');
        for (i, x) in self.iter().enumerate() {
            if i > 0 { b.push(','); }
            x.sandloop_enc(b);
        }
        b.push(']');
    }
}
impl<T: SandloopValue> SandloopValue for Vec<T> {
    fn sandloop_enc(&self, b: &mut String) { self.as_slice().sandloop_enc(b); }
}
impl<T: SandloopValue> SandloopValue for Option<T> {
    fn sandloop_enc(&self, b: &mut String) {
        match self { Some(x) => x.sandloop_enc(b), None => b.push_str("null") }
    }
}

fn main() {
    let i: usize = std::env::args().nth(1).expect("test index").parse().expect("test index");
    let mut b = String::from("{\\"value\\":");
    match i {
%(arms)s
        _ => panic!("no test {}", i),
    }
    b.push_str("}\\n");
    use std::io::Write as _;
    use std::os::unix::io::FromRawFd as _;
    let mut out = unsafe { std::fs::File::from_raw_fd(3) };
    out.write_all(b.as_bytes()).expect("result channel");
}
"""


def _rust(entry: str, params: list[SigType], calls: list[list[Any]]) -> str:
    arms = "\n".join(
        f"        {i} => {{ let r = {entry}("
        + ", ".join(_rust_literal(t, v) for t, v in zip(params, args, strict=True))
        + "); SandloopValue::sandloop_enc(&r, &mut b); }"
        for i, args in enumerate(calls))
    return _RUST_MAIN % {"entry": entry, "arms": arms}


# -- TypeScript ---------------------------------------------------------------------------------


def _ts_literal(t: SigType, v: Any) -> str:
    if t.item is not None:
        return "[" + ", ".join(_ts_literal(t.item, x) for x in v) + "]"
    if t.name == "int":
        return str(v)
    if t.name == "float":
        x = float(v)
        if math.isnan(x):
            return "NaN"
        if math.isinf(x):
            return "Infinity" if x > 0 else "-Infinity"
        return _float_repr(x)
    if t.name == "bool":
        return "true" if v else "false"
    # JSON string literals are JavaScript string literals (ensure_ascii: \\uXXXX escapes).
    return json.dumps(v)


def _ts_type_tree(t: SigType) -> str:
    return json.dumps(t.scalar if t.item is None else ["list", json.loads(_ts_type_tree(t.item))])


_TS_HARNESS = """
// ---- sandloop's function-call harness (reward/call_harness.py): calls %(entry)s with test
// process.argv[2]'s arguments and writes the typed return value on the result channel (fd 3).
function __slEnc(v: any, t: any): string {
    if (Array.isArray(t)) {
        if (!Array.isArray(v)) return __slEnc(v, "any");
        return "[" + v.map((x: any) => __slEnc(x, t[1])).join(",") + "]";
    }
    if (v === null || v === undefined) return "null";
    if (typeof v === "bigint") return v.toString();
    if (typeof v === "number") {
        if (Number.isNaN(v)) return '{"$float":"nan"}';
        if (!Number.isFinite(v)) return v > 0 ? '{"$float":"inf"}' : '{"$float":"-inf"}';
        // A number is an int where the signature says int and it is integral; else a float.
        if (t === "int" && Number.isInteger(v)) return BigInt(v).toString();
        const s = String(v);
        return /[.e]/.test(s) ? s : s + ".0";
    }
    if (typeof v === "boolean") return v ? "true" : "false";
    if (typeof v === "string") return JSON.stringify(v);
    if (Array.isArray(v)) return "[" + v.map((x: any) => __slEnc(x, "any")).join(",") + "]";
    let name = "object";
    try { name = String((v && v.constructor && v.constructor.name) || typeof v); } catch (e) {}
    return JSON.stringify({"$opaque": name});
}
const __slCases: Array<() => any> = [
%(cases)s
];
{
    const __slValue = __slCases[Number(process.argv[2])]();
    const __slOut = Buffer.from('{"value":' + __slEnc(__slValue, %(rtype)s) + "}\\n", "utf8");
    const __slFs = require("fs");
    let __slDone = 0;
    while (__slDone < __slOut.length) {
        __slDone += __slFs.writeSync(3, __slOut, __slDone, __slOut.length - __slDone);
    }
}
"""


def _typescript(entry: str, params: list[SigType], rtype: SigType,
                calls: list[list[Any]]) -> str:
    cases = "\n".join(
        f"    () => {entry}("
        + ", ".join(_ts_literal(t, v) for t, v in zip(params, args, strict=True)) + "),"
        for args in calls)
    return _TS_HARNESS % {"entry": entry, "cases": cases, "rtype": _ts_type_tree(rtype)}
