"""Grading a repository's final state: restore the tests, add the hidden ones, run the deciding
tests, and turn per-test outcomes into a verdict and a reward.

The grading run is one Python program (``runner_source``) executed in the episode's work dir.
It starts before any of the model's code can run again (a session holds no process between
runs), and before importing anything from the repository it:

- rewrites every original test file and test configuration, then the hidden tests on top
  (computed by the supervisor from ``test_patch``), so a model that edited the tests gains
  nothing;
- deletes test configuration the model added (``conftest.py`` anywhere, ``pytest.ini``, ...),
  which could otherwise mark failures as passes or deselect tests;
- deletes every ``__pycache__`` (no planted bytecode for a restored test module) and every
  package metadata directory (``*.dist-info``, ``*.egg-info``) the repository did not have;
- imports pytest from the interpreter's own packages before the repository is on ``sys.path``
  (the repository is appended, not prepended: a model's ``pytest.py`` shadows nothing);
- turns off pytest's plugin autoload and loads the environment's ``pytest11`` plugins itself,
  also before the repository is on ``sys.path``: a planted ``*.dist-info/entry_points.txt``
  naming a module of the repository would otherwise be loaded as a plugin that passes
  every test.

Limit, stated plainly: the tests import the model's code into the same process, so code that
deliberately attacks the test process (patching pytest's reporting from inside an imported
module) is not stopped here; the report channel is a per-grading random marker on a duplicate
of stdout. docs/episodes.md ("Grading") lists what is and is not defended.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from sandloop.sandbox.models import ExecResult, Status
from sandloop.tasks.repo import RepoTask

__all__ = ["Grade", "Grading", "Shaping", "TestOutcome", "grading_program", "parse_report",
           "public_counts", "shape_reward"]

TestOutcome = Literal["passed", "wrong_answer", "runtime_error", "timeout", "missing",
                      "sandbox_error"]

_RUNNER = r'''
import json, os, shutil, sys
NONCE = __NONCE__
WRITE = json.loads(__WRITE__)
KNOWN = set(json.loads(__KNOWN__))
IDS = json.loads(__IDS__)
CONFIG = {"conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml",
          "sitecustomize.py", "usercustomize.py"}
_out = os.dup(1)


def report(data):
    os.write(_out, ("\n" + NONCE + json.dumps(data) + "\n").encode())


os.chdir("/sandbox")
try:
    for root, dirs, files in os.walk(".", topdown=True):
        for d in list(dirs):
            p = os.path.normpath(os.path.join(root, d))
            meta = d.endswith((".dist-info", ".egg-info")) and not any(
                k.startswith(p + "/") for k in KNOWN)
            if d == "__pycache__" or meta:
                shutil.rmtree(p, ignore_errors=True)
                dirs.remove(d)
        for f in files:
            p = os.path.normpath(os.path.join(root, f))
            if (f in CONFIG or f.endswith(".pth")) and p not in KNOWN:
                os.remove(p)
    for p, content in WRITE.items():
        if os.path.islink(p) or os.path.isfile(p):
            os.remove(p)
        elif os.path.isdir(p):
            shutil.rmtree(p)
        if content is None:
            continue
        d = os.path.dirname(p)
        if d:
            if os.path.islink(d) or os.path.isfile(d):
                os.remove(d)
            os.makedirs(d, exist_ok=True)
        with open(p, "w", encoding="utf-8") as fh:
            fh.write(content)
except OSError as e:
    report({"error": "restore", "detail": f"{type(e).__name__}: {e}"})
    os._exit(3)

sys.dont_write_bytecode = True
sys.path[:] = [p for p in sys.path if p not in ("", ".", "/sandbox", "/tmp")]
os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
import pytest  # noqa: E402  (before the repository is importable)
from importlib.metadata import entry_points  # noqa: E402

PLUGINS = []
for ep in entry_points(group="pytest11"):  # the environment's own plugins only
    try:
        PLUGINS.append(ep.load())
    except Exception:
        pass
sys.path.append("/sandbox")


class Collector:
    def __init__(self):
        self.results = {}

    def pytest_runtest_logreport(self, report):
        nid = report.nodeid
        if report.failed:
            self.results[nid] = "failed" if report.when == "call" else "error"
        elif report.skipped:
            self.results.setdefault(nid, "skipped")
        elif report.when == "call":
            self.results.setdefault(nid, "passed")


c = Collector()
code = pytest.main(["-q", "-p", "no:cacheprovider", "-o", "addopts=", "--rootdir", "/sandbox",
                    *IDS], plugins=[c, *PLUGINS])
report({"results": c.results, "exit": int(code)})
os._exit(0)
'''


@dataclass(frozen=True)
class Grading:
    """A prepared grading run: the program's source and the marker its report carries."""

    source: str
    nonce: str


def grading_program(task: RepoTask) -> Grading:
    """The trusted grading program for ``task`` (a fresh random report marker each time)."""
    nonce = "SANDLOOP-GRADE-" + secrets.token_hex(16) + ":"
    src = (_RUNNER.replace("__NONCE__", repr(nonce))
           .replace("__WRITE__", repr(json.dumps(task.graded_files())))
           .replace("__KNOWN__", repr(json.dumps(sorted(task.files))))
           .replace("__IDS__", repr(json.dumps(list(task.tests)))))
    return Grading(src, nonce)


@dataclass(frozen=True)
class Shaping:
    """Reward shaping for episodes (docs/rewards.md, "Episodes").

    ``partial_credit``: the reward is the fraction of fail-to-pass tests that pass (still 0 if
    any pass-to-pass test broke) instead of all-or-nothing. ``turn_penalty``: subtracted per
    tool call, floored at 0. ``pass_to_pass_required``: with False, broken pass-to-pass tests
    do not zero the reward (they still show in the verdict).
    """

    partial_credit: bool = False
    turn_penalty: float = 0.0
    pass_to_pass_required: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"partial_credit": self.partial_credit, "turn_penalty": self.turn_penalty,
                "pass_to_pass_required": self.pass_to_pass_required}


@dataclass(frozen=True)
class Grade:
    """The outcome of grading: per-test outcomes, the verdict and the reward.

    ``verdict``: ``resolved`` (every deciding test passes), ``unresolved``, ``error`` (the
    grading run produced no report: the repository's code broke the test process, or the work
    dir was too full to restore the tests), or ``sandbox_error`` (the infrastructure failed:
    reward None, never 0).
    """

    verdict: str
    reward: float | None
    tests: dict[str, TestOutcome] = field(default_factory=dict)
    fail_to_pass: tuple[int, int] = (0, 0)  # passed, total
    pass_to_pass: tuple[int, int] = (0, 0)
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "reward": self.reward, "tests": dict(self.tests),
                "fail_to_pass": {"passed": self.fail_to_pass[0], "total": self.fail_to_pass[1]},
                "pass_to_pass": {"passed": self.pass_to_pass[0], "total": self.pass_to_pass[1]},
                "detail": self.detail}


_OUTCOME: dict[str, TestOutcome] = {"passed": "passed", "failed": "wrong_answer",
                                    "error": "runtime_error", "skipped": "wrong_answer"}


def _find_report(stdout: str, nonce: str) -> dict[str, Any] | None:
    found = None
    for line in stdout.splitlines():
        if line.startswith(nonce):
            try:
                found = json.loads(line[len(nonce):])
            except json.JSONDecodeError:
                continue
    return found if isinstance(found, dict) else None


def parse_report(task: RepoTask, result: ExecResult, nonce: str, shaping: Shaping,
                 turns: int) -> Grade:
    """Turn the grading run's result into a :class:`Grade` (pure)."""
    if result.status is Status.SANDBOX_ERROR:
        return Grade("sandbox_error", None, {t: "sandbox_error" for t in task.tests},
                     detail=result.error or "the grading run failed in the infrastructure")
    data = _find_report(result.stdout, nonce)
    if data is None or "results" not in data:
        missing: TestOutcome = "timeout" if result.status is Status.TIMEOUT else "missing"
        why = (data or {}).get("detail") or {
            Status.TIMEOUT: "the tests ran past their time limit",
            Status.MEMORY_LIMIT: "the tests ran out of memory",
            Status.OUTPUT_LIMIT: "the tests printed too much output"}.get(
                result.status, "the test process ended without a report")
        if data is not None and data.get("error") == "restore":
            why = f"cannot restore the tests (work dir full?): {why}"
        tests = {t: missing for t in task.tests}
        return _graded(task, tests, shaping, turns, error=why)
    raw = data["results"] if isinstance(data["results"], dict) else {}
    tests = {t: _OUTCOME.get(str(raw.get(t)), "missing") for t in task.tests}
    if result.status is Status.TIMEOUT:
        tests = {t: ("timeout" if o == "missing" else o) for t, o in tests.items()}
    return _graded(task, tests, shaping, turns)


def _graded(task: RepoTask, tests: Mapping[str, TestOutcome], shaping: Shaping, turns: int,
            error: str | None = None) -> Grade:
    f2p = sum(tests[t] == "passed" for t in task.fail_to_pass)
    p2p = sum(tests[t] == "passed" for t in task.pass_to_pass)
    nf, np_ = len(task.fail_to_pass), len(task.pass_to_pass)
    reward = shape_reward(f2p, nf, p2p, np_, shaping, turns)
    if error is not None:
        verdict = "error"
    else:
        verdict = "resolved" if f2p == nf and p2p == np_ else "unresolved"
    return Grade(verdict, reward, dict(tests), (f2p, nf), (p2p, np_), error or "")


def shape_reward(f2p_passed: int, f2p_total: int, p2p_passed: int, p2p_total: int,
                 shaping: Shaping, turns: int) -> float:
    """The episode's reward from its test counts (pure; docs/rewards.md)."""
    if shaping.pass_to_pass_required and p2p_passed < p2p_total:
        base = 0.0
    elif shaping.partial_credit:
        base = f2p_passed / f2p_total if f2p_total else 1.0
    else:
        base = 1.0 if f2p_passed == f2p_total else 0.0
    return max(0.0, base - shaping.turn_penalty * turns)


def public_counts(output: str) -> tuple[int, int]:
    """(passed, failed) from a pytest summary line (``3 passed, 1 failed`` ...); errors count
    as failed. Feedback only: nothing here decides a reward."""
    passed = failed = 0
    for n, word in re.findall(r"(\d+) (passed|failed|errors?)\b", output):
        if word == "passed":
            passed = int(n)
        else:
            failed += int(n)
    return passed, failed

