"""A task's own hash seed (Task.hash_seed), in real sandboxes: its Python programs run with
that PYTHONHASHSEED on every slot, also after a worker was replaced."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from sandloop.reward import Verdict, Verifier
from sandloop.tasks import CallTest, IOTest, Task, TaskLimits

PoolThread = Any  # the session fixture of conftest.py

WORDS = ["apple", "banana", "cherry", "date", "elderberry", "fig", "grape", "kiwi", "lemon"]
PRINT_SET = f"print(list({set(WORDS)!r}))\n"


def _set_order(seed: int) -> str:
    """What the program prints under PYTHONHASHSEED=seed, outside the sandbox."""
    env = dict(os.environ, PYTHONHASHSEED=str(seed))
    return subprocess.run([sys.executable, "-S", "-c", PRINT_SET], env=env, check=True,
                          capture_output=True, text=True).stdout


def _stdio_task(seed: int | None, expected: str) -> Task:
    return Task(id=f"set-order-{seed}", test_kind="stdio", hash_seed=seed,
                hidden_tests=(IOTest(name="t", expected_stdout=expected),),
                comparison={"output": "exact"})


def test_tasks_with_different_seeds_print_different_orders_on_every_slot(
        sandbox: PoolThread) -> None:
    seeds = (1, 2, 3)
    expected = {s: _set_order(s) for s in seeds}
    # The seeds chosen give three different orders, or the test would prove nothing.
    assert len(set(expected.values())) == len(seeds)
    v = Verifier(sandbox.pool.run)
    # Each task six times at once: runs spread over every slot of the pool.
    runs = [(s, _stdio_task(s, expected[s])) for s in seeds for _ in range(6)]
    results = sandbox.all(v.verify(t, PRINT_SET) for _, t in runs)
    bad = [(s, r.tests[0].detail) for (s, _), r in zip(runs, results, strict=True)
           if r.verdict is not Verdict.PASSED]
    assert bad == []


def test_the_seed_is_part_of_the_task_version() -> None:
    plain = _stdio_task(None, "x")
    assert "hash_seed" not in plain.model_dump(exclude_none=True)
    assert _stdio_task(1, "x").version != _stdio_task(2, "x").version != plain.version
    with pytest.raises(ValueError, match="hash_seed"):
        _stdio_task(-1, "x")


def test_a_replaced_worker_keeps_the_seed(sandbox: PoolThread) -> None:
    # The first test times out, so the second runs in a worker started afresh: it must see the
    # task's seed too, not a random one.
    source = ("import time\n"
              "def f(slow):\n"
              "    if slow:\n"
              "        time.sleep(30)\n"
              f"    return list({set(WORDS)!r})\n")
    seed = 5
    env = dict(os.environ, PYTHONHASHSEED=str(seed))
    order = subprocess.run([sys.executable, "-S", "-c", f"print(repr(list({set(WORDS)!r})))"],
                           env=env, check=True, capture_output=True, text=True).stdout
    expected = eval(order)  # a list of str literals, printed by our own interpreter
    task = Task(id="seeded-call", entry_point="f", hash_seed=seed,
                limits=TaskLimits(time_s=1.0),
                hidden_tests=(CallTest(name="slow", args=[True], expected=expected),
                              *(CallTest(name=f"fast{i}", args=[False], expected=expected)
                                for i in range(3))))
    v = Verifier(sandbox.pool.run, max_timeouts=0)
    r = sandbox.run(v.verify(task, source))
    assert [o.verdict for o in r.tests] == [Verdict.TIMEOUT] + [Verdict.PASSED] * 3, r.tests
