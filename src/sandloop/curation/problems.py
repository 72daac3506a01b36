"""The problem vocabulary of task validation, and the verdict a task's problems add up to (pure).

The nine codes are a stable contract (docs/curation.md): tools filter on them. Each has a default
severity; ``reject`` problems keep a task out of a curated set, ``review`` problems keep it in but
ask a person to look.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "DEFAULT_SEVERITY",
    "Problem",
    "ProblemCode",
    "Severity",
    "TaskReport",
    "TaskVerdict",
    "verdict_of",
]


class ProblemCode(StrEnum):
    """What is wrong with a task (the stable vocabulary)."""

    NO_TESTS = "no_tests"
    REFERENCE_FAILS = "reference_fails"
    FLAKY = "flaky"
    TRIVIAL_PASS = "trivial_pass"
    WEAK_TESTS = "weak_tests"
    SLOW_REFERENCE = "slow_reference"
    DUPLICATE = "duplicate"
    CONTAMINATED = "contaminated"
    NONDETERMINISTIC = "nondeterministic"


Severity = Literal["reject", "review"]
TaskVerdict = Literal["keep", "review", "reject"]

# Why these defaults: a task whose reward can be wrong (no hidden tests, a failing or flaky
# reference, a degenerate answer that passes, a verdict that depends on the hash seed) teaches the
# wrong thing, so it is rejected; a duplicate or contaminated copy wastes compute or inflates eval
# scores, so it is rejected too. Weak tests and a slow reference make rewards noisier, not wrong:
# the task stays, marked for review.
DEFAULT_SEVERITY: Mapping[ProblemCode, Severity] = {
    ProblemCode.NO_TESTS: "reject",
    ProblemCode.REFERENCE_FAILS: "reject",
    ProblemCode.FLAKY: "reject",
    ProblemCode.TRIVIAL_PASS: "reject",
    ProblemCode.WEAK_TESTS: "review",
    ProblemCode.SLOW_REFERENCE: "review",
    ProblemCode.DUPLICATE: "reject",
    ProblemCode.CONTAMINATED: "reject",
    ProblemCode.NONDETERMINISTIC: "reject",
}


class Problem(BaseModel):
    """One defect found in a task."""

    model_config = ConfigDict(frozen=True)

    code: ProblemCode
    severity: Severity
    detail: str

    @classmethod
    def of(cls, code: ProblemCode, detail: str,
           severity: Mapping[ProblemCode, Severity] | None = None) -> Problem:
        """A problem with the severity ``severity`` gives ``code`` (else the default)."""
        sev = (severity or {}).get(code, DEFAULT_SEVERITY[code])
        return cls(code=code, severity=sev, detail=detail)


def verdict_of(problems: Iterable[Problem]) -> TaskVerdict:
    """``reject`` if any problem rejects, ``review`` if any asks for review, else ``keep``."""
    sevs = {p.severity for p in problems}
    if "reject" in sevs:
        return "reject"
    if "review" in sevs:
        return "review"
    return "keep"


class TaskReport(BaseModel):
    """The validation result of one task (one line of ``sandloop tasks validate --json``)."""

    model_config = ConfigDict(frozen=True)

    id: str
    version: str
    verdict: TaskVerdict
    problems: list[Problem] = Field(default_factory=list)
    skipped: list[str] = Field(
        default_factory=list, description="checks not run, with the reason (e.g. no reference)"
    )
    mutation_score: float | None = None
    mutants: int = 0
    mutants_killed: int = 0
    surviving_mutants: list[str] = Field(default_factory=list)
    reference_time_s: float | None = None
    time_limit_s: float | None = None
    difficulty: float | str | None = None
    split: str = "eval"
    tags: list[str] = Field(default_factory=list)

    @classmethod
    def build(cls, *, id: str, version: str, problems: list[Problem],
              **extra: Any) -> TaskReport:
        """A report whose verdict follows from ``problems``."""
        return cls(id=id, version=version, verdict=verdict_of(problems), problems=problems,
                   **extra)

    @property
    def codes(self) -> set[str]:
        """The problem codes of this report."""
        return {p.code.value for p in self.problems}
