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

from sandloop.tasks.values import ValueCodecError, validate_encoded

SCHEMA = "sandloop.task/v1"

TestKind = Literal["function", "stdio", "script"]
Split = Literal["train", "eval"]
LANGUAGES = ("python", "c", "cpp", "javascript", "bash", "java", "go", "rust", "typescript")


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


# An environment's name or id (envs.spec.NAME_RE; that layer is above this one).
_ENVIRONMENT_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")


# Fields added after v1 tasks were stored: hashed only when set (Task.content_hash).
_OPTIONAL_IN_HASH = ("environment", "hash_seed")


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
            if self.language != "python":
                raise ValueError(
                    f"test_kind {self.test_kind!r} is supported for python only; "
                    "use test_kind 'stdio' for other languages"
                )
            if not self.entry_point:
                raise ValueError(f"test_kind {self.test_kind!r} needs an entry_point")
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
