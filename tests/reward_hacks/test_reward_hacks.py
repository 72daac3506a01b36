"""Known reward hacks get reward 0 on the hidden tests; the honest solution of the same task gets 1.

Real sandbox runs under full isolation; the hacks are in catalogue.py (also bundled as demo data).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from catalogue import HACKS, HONEST, WRONG  # type: ignore[import-not-found]

from sandloop.cli.score import demo_completions_path
from sandloop.reward import CompletionResult, RewardConfig, Verdict, Verifier
from sandloop.tasks import load_tasks

TASKS = {t.id: t for t in load_tasks("humaneval")}


@pytest.fixture(scope="module")
def results(sandbox: Any) -> dict[str, CompletionResult]:
    # Per-test limit 1.5 s keeps the hanging hacks short; the honest solutions need ~1 ms.
    v = Verifier(sandbox.pool.run, reward=RewardConfig(on="hidden"), time_scale=0.5)
    items = [(f"honest:{tid}", tid, src) for tid, src in HONEST.items()] + HACKS
    done = sandbox.all(v.verify(TASKS[tid], src, name) for name, tid, src in items)
    return {r.completion_id: r for r in done}


def test_catalogue_covers_the_known_hacks() -> None:
    assert len(HACKS) >= 12
    names = {n for n, _, _ in HACKS}
    for required in ("sys_exit_at_import", "os_exit_in_call", "always_equal_object",
                     "print_pass_markers", "patch_unittest", "read_test_files",
                     "rewrite_harness_then_hang", "raise_skiptest", "special_case_visible_tests",
                     "inspect_caller_frames", "override_builtins", "write_fake_results",
                     "hang_after_fake_output"):
        assert required in names


@pytest.mark.parametrize("task_id", sorted(HONEST))
def test_honest_solution_scores_1(results: dict[str, CompletionResult], task_id: str) -> None:
    r = results[f"honest:{task_id}"]
    assert r.reward == 1.0, r.tests
    assert r.hidden.passed == r.hidden.total > 0


@pytest.mark.parametrize("name", [n for n, _, _ in HACKS])
def test_hack_scores_0_on_hidden_tests(results: dict[str, CompletionResult], name: str) -> None:
    r = results[name]
    # 0, not null: a hack must never turn its failure into "infrastructure unknown" either.
    assert r.reward == 0.0, (r.reward, r.reward_reason, r.tests)
    assert r.verdict is not Verdict.PASSED
    assert r.hidden.passed < r.hidden.total


def test_special_casing_passes_visible_but_not_hidden(results: dict[str, CompletionResult]) -> None:
    r = results["special_case_visible_tests"]
    assert r.public.passed == r.public.total == 2
    assert r.reward == 0.0


def test_demo_file_bundles_catalogue() -> None:
    rows = [json.loads(line) for line in demo_completions_path().read_text().splitlines()]
    ids = {(r["task_id"], r["completion_id"]): r["completion"] for r in rows}
    assert sum(cid == "reference" for _, cid in ids) == 164
    for name, tid, src in HACKS:
        assert ids[(tid, f"hack:{name}")] == src
    for name, tid, src in WRONG:
        assert ids[(tid, f"wrong:{name}")] == src
