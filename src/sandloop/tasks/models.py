"""The task record: what a model is asked to write, and the tests that decide whether it did.

JSON form (one task per JSONL line, ``schema: "sandloop.task/v1"``) is documented in docs/tasks.md.
Records are frozen; ``version`` is a content hash, so any change to the prompt, tests, limits or
comparison yields a new version and stored results for the old one are never reused for it.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sandloop.tasks.signature import (
    INT_RANGE,
    SAFE_INT_RANGE,
    SignatureError,
    check_value,
    parse_type,
)
from sandloop.tasks.values import ValueCodecError, validate_encoded

SCHEMA = "sandloop.task/v1"

TestKind = Literal["function", "stdio", "script"]
Split = Literal["train", "eval"]
LANGUAGES = ("python", "c", "cpp", "javascript", "bash", "java", "go", "rust", "typescript")
# Languages whose function-call tests go through a typed signature (tasks/signature.py).
TYPED_CALL_LANGUAGES = ("java", "go", "rust", "typescript")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CallTest(_Frozen):
    """Call the entry point with ``args``/``kwargs``; compare its return value to ``expected``.

    ``args``, ``kwargs`` values and ``expected`` are typed values (see :mod:`sandloop.tasks.values`).
    ``expected`` never enters the sandbox: the comparison happens outside it.
    """

    kind: Literal["call"] = "call"
    name: str
    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    expected: Any = None
    weight: float = Field(1.0, ge=0)

    @field_validator("args", "expected")
    @classmethod
    def _typed(cls, v: Any) -> Any:
        try:
            validate_encoded(v)
        except ValueCodecError as e:
            raise ValueError(f"not a typed value: {e}") from None
        return v

    @field_validator("kwargs")
    @classmethod
    def _typed_kwargs(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key, x in v.items():
            try:
                validate_encoded(x)
            except ValueCodecError as e:
                raise ValueError(f"kwargs[{key!r}] is not a typed value: {e}") from None
        return v


class IOTest(_Frozen):
    """Run the program with ``stdin``; compare its stdout to ``expected_stdout`` outside the sandbox."""

    kind: Literal["io"] = "io"
    name: str
    stdin: str = ""
    expected_stdout: str
    weight: float = Field(1.0, ge=0)


class ScriptTest(_Frozen):
    """Test code (asserts, unittest, pytest-style functions) run by the trusted harness process.

    ``source`` is executed in a process that never runs the completion; there ``candidate`` and the
    entry-point name call the completion in a separate process and get plain data back. ``call``
    names what to run after the source: ``check`` (called with ``candidate``), a test function
    ``test_x`` (no arguments) or ``Class.test_method`` (a ``unittest.TestCase`` method). With
    ``call`` unset, executing the source without an exception is the pass condition.
    """

    kind: Literal["script"] = "script"
    name: str
    source: str
    call: str | None = None
    weight: float = Field(1.0, ge=0)


Test = Annotated[CallTest | IOTest | ScriptTest, Field(discriminator="kind")]


class TaskLimits(_Frozen):
    """Per-test time limit and whole-run memory for verifying one completion."""

    time_s: float = Field(3.0, gt=0, le=600, description="wall-clock limit per test, seconds")
    memory_mb: int = Field(512, ge=16, le=65536, description="memory for the whole run, MiB")


class Comparison(_Frozen):
    """How outputs are compared with expectations (outside the sandbox).

    ``values`` (function calls): ``strict`` — same types all the way down (``1`` != ``1.0`` !=
    ``True``, tuple != list), floats within tolerance; ``python`` — Python ``==`` on plain data
    (what an ``assert f(x) == y`` meant), floats within tolerance; ``json`` — like strict but
    tuples equal lists and ints equal floats (data that went through JSON; bools stay bools).
    Dict keys and set elements match exactly. docs/rewards.md ("Comparison") is the full rule.
    ``output`` (stdout): ``exact``; ``whitespace`` — same whitespace-separated tokens; ``float`` —
    tokens equal, numeric tokens within tolerance.
    """

    values: Literal["strict", "python", "json"] = "strict"
    output: Literal["exact", "whitespace", "float"] = "whitespace"
    rel_tol: float = Field(1e-9, ge=0)
    abs_tol: float = Field(1e-9, ge=0)


class Checker(_Frozen):
    """A program that judges stdout: run with argv ``input.txt output.txt answer.txt`` in its own
    sandbox; exit code 0 accepts, any other verdict rejects."""

    language: str = "python"
    source: str


class Signature(_Frozen):
    """The entry point's parameter and return types, for function-call tests in Java, Go, Rust
    and TypeScript: ``int``, ``float``, ``bool``, ``str`` or ``list[T]`` each
    (:mod:`sandloop.tasks.signature`; docs/tasks.md has each language's mapping)."""

    params: tuple[str, ...] = ()
    returns: str

    @field_validator("params")
    @classmethod
    def _params(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for t in v:
            try:
                parse_type(t)
            except SignatureError as e:
                raise ValueError(str(e)) from None
        return v

    @field_validator("returns")
    @classmethod
    def _returns(cls, v: str) -> str:
        try:
            parse_type(v)
        except SignatureError as e:
            raise ValueError(str(e)) from None
        return v


# An environment's name or id (envs.spec.NAME_RE; that layer is above this one).
_ENVIRONMENT_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


# Fields added after v1 tasks were stored: hashed only when set (Task.content_hash).
_OPTIONAL_IN_HASH = ("environment", "hash_seed", "signature")


def _hash(data: Any) -> str:
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class Task(_Frozen):
    """One task. ``public_tests`` may be shown to the model; ``hidden_tests`` must not be."""

    id: str = Field(min_length=1)
    version: str = ""
    language: str = "python"
    prompt: str = ""
    starter_code: str = Field(
        "", description="code the completion continues (HumanEval: the prompt)"
    )
    entry_point: str | None = None
    reference_solution: str | None = Field(
        None, description="a completion known to pass, assembled like any completion"
    )
    test_kind: TestKind = "function"
    public_tests: tuple[Test, ...] = ()
    hidden_tests: tuple[Test, ...] = ()
    checker: Checker | None = None
    comparison: Comparison = Field(default_factory=Comparison)
    limits: TaskLimits = Field(default_factory=TaskLimits)
    difficulty: float | str | None = None
    tags: tuple[str, ...] = ()
    split: Split = "eval"
    source: str | None = Field(None, description="where the task came from (dataset name)")
    environment: str | None = Field(
        None, description="the runtime environment its programs run in: a name or id "
                          "(docs/environments.md); default the language's built-in")
    signature: Signature | None = Field(
        None, description="entry point's types, for function tests in java, go, rust, "
                          "typescript")
    hash_seed: int | None = Field(
        None, ge=0, le=4294967295,
        description="PYTHONHASHSEED for its Python programs (set iteration order, hash()); "
                    "default the environment's ([determinism] hash_seed, 0)")

    @field_validator("environment")
    @classmethod
    def _environment(cls, v: str | None) -> str | None:
        if v is not None and not _ENVIRONMENT_RE.fullmatch(v):
            raise ValueError(f"environment {v!r} is not an environment name or id (lowercase "
                             "letters, digits, . _ -)")
        return v

    @field_validator("language")
    @classmethod
    def _language(cls, v: str) -> str:
        key = {"python3": "python", "py": "python", "c++": "cpp", "js": "javascript",
               "golang": "go", "rs": "rust", "ts": "typescript"}.get(
            v.strip().lower(), v.strip().lower()
        )
        if key not in LANGUAGES:
            raise ValueError(f"unsupported language {v!r}; choose one of {', '.join(LANGUAGES)}")
        return key

    @model_validator(mode="after")
    def _consistent(self) -> Task:
        tests = self.public_tests + self.hidden_tests
        if not tests:
            raise ValueError("a task needs at least one public or hidden test")
        names = [t.name for t in tests]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"test names must be unique; repeated: {sorted(dup)[:5]}")
        kinds = {t.kind for t in tests}
        if self.test_kind == "stdio":
            if kinds != {"io"}:
                raise ValueError("test_kind 'stdio' allows only tests of kind 'io'")
        else:
            if "io" in kinds:
                raise ValueError(f"test_kind {self.test_kind!r} does not allow 'io' tests")
            typed = self.test_kind == "function" and self.language in TYPED_CALL_LANGUAGES
            if self.language != "python" and not typed:
                raise ValueError(
                    f"test_kind {self.test_kind!r} is supported for python"
                    + (f" and {', '.join(TYPED_CALL_LANGUAGES)}" if self.test_kind == "function"
                       else "")
                    + "; use test_kind 'stdio' for other languages"
                )
            if not self.entry_point:
                raise ValueError(f"test_kind {self.test_kind!r} needs an entry_point")
            if typed:
                self._check_signature(tests)
        if self.signature is not None and not (
                self.test_kind == "function" and self.language in TYPED_CALL_LANGUAGES):
            raise ValueError("a signature is used only by function tasks in "
                             f"{', '.join(TYPED_CALL_LANGUAGES)}")
        if self.checker is not None and self.test_kind != "stdio":
            raise ValueError("a checker is only used with test_kind 'stdio'")
        expected = self.content_hash()
        if not self.version:
            object.__setattr__(self, "version", expected)
        elif self.version != expected:
            raise ValueError(
                f"version {self.version!r} does not match the content hash {expected!r}: the task "
                "changed since the version was written; drop 'version' to recompute it"
            )
        return self

    def _check_signature(self, tests: tuple[Test, ...]) -> None:
        """Every test's arguments and expected value fit the signature (else no completion
        could pass, or the harness could not be written)."""
        sig = self.signature
        if sig is None:
            raise ValueError(f"a function task in {self.language} needs a signature: "
                             '{"params": ["list[int]", "int"], "returns": "int"} '
                             "(docs/tasks.md)")
        if self.entry_point is not None and not _IDENT_RE.fullmatch(self.entry_point):
            raise ValueError(f"entry_point {self.entry_point!r} is not an identifier")
        params = [parse_type(t) for t in sig.params]
        returns = parse_type(sig.returns)
        ints = SAFE_INT_RANGE if self.language == "typescript" else INT_RANGE
        for t in tests:
            if not isinstance(t, CallTest):
                raise ValueError(f"test {t.name!r}: a {self.language} function task takes "
                                 "call tests only")
            if t.kwargs:
                raise ValueError(f"test {t.name!r}: keyword arguments are for python only; "
                                 "pass them in order in args")
            if len(t.args) != len(params):
                raise ValueError(f"test {t.name!r}: {len(t.args)} arguments for "
                                 f"{len(params)} parameters")
            try:
                for i, (a, p) in enumerate(zip(t.args, params, strict=True)):
                    check_value(p, a, f"test {t.name!r}: argument {i}", int_range=ints)
                check_value(returns, t.expected, f"test {t.name!r}: expected", int_range=ints)
            except SignatureError as e:
                raise ValueError(str(e)) from None

    def content_hash(self) -> str:
        """Hash of everything that affects scoring (not ``version`` itself). ``environment``
        and ``hash_seed`` count only when set, so that the versions of tasks stored before
        those fields existed stay what they were."""
        exclude = {"version"} | {f for f in _OPTIONAL_IN_HASH if getattr(self, f) is None}
        return _hash(self.model_dump(mode="json", exclude=exclude))

    @property
    def tests(self) -> tuple[Test, ...]:
        """Public then hidden tests."""
        return self.public_tests + self.hidden_tests

    def is_hidden(self, name: str) -> bool:
        """Whether the test called ``name`` is a hidden test."""
        return any(t.name == name for t in self.hidden_tests)

    def to_json(self) -> str:
        """One JSONL line in the native format."""
        data = {"schema": SCHEMA, **self.model_dump(mode="json")}
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"))
