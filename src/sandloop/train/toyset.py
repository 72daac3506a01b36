"""The bundled toy curriculum: tasks a from-scratch character model can learn on a CPU.

Three tiers, easy to hard, each in the native task format and judged only by execution:

1. ``print``: "print 42" → ``print(42)``; one stdin/stdout test.
2. ``expr``: "sum of 3 and 4" → ``print(3+4)`` (sum, product, difference); the printed value is
   compared, so ``print(7)`` passes too.
3. ``func``: "f returns x times 3" → ``def f(x): return x*3``; call tests, one public and three
   hidden, compared as typed values outside the sandbox.

A fixed share of each tier is the ``eval`` split (chosen by a hash of the id, so adding tasks
never moves old ones); the loop never samples it for training. The set is generated here and
bundled as ``sandloop/data/toy_curriculum.jsonl``; a test checks that the two agree.
"""

from __future__ import annotations

import hashlib
import operator
from importlib import resources
from pathlib import Path

from sandloop.tasks import CallTest, IOTest, Task, TaskLimits, load_tasks

__all__ = ["TOY_SET", "build_toy_tasks", "toy_path", "weaken"]

TOY_SET = "toy"
_EVAL_EVERY = 5  # one task in five is held out for evaluation
_LIMITS = TaskLimits(time_s=2.0, memory_mb=128)
_OPS = (("sum", "+", operator.add), ("product", "*", operator.mul),
        ("difference", "-", operator.sub))
_FUNC_OPS = (("plus", "+", operator.add), ("times", "*", operator.mul),
             ("minus", "-", operator.sub))


def _split(task_id: str) -> str:
    h = int(hashlib.sha256(task_id.encode()).hexdigest()[:8], 16)
    return "eval" if h % _EVAL_EVERY == 0 else "train"


def _stdio(tid: str, tier: int, prompt: str, ref: str, out: str) -> Task:
    return Task(id=tid, prompt=prompt, reference_solution=ref, test_kind="stdio",
                public_tests=(IOTest(name="out", expected_stdout=out + "\n"),),
                limits=_LIMITS, difficulty=float(tier), tags=(f"tier{tier}",),
                split=_split(tid), source=TOY_SET)


def build_toy_tasks() -> list[Task]:
    """The toy curriculum, in a fixed order (tier 1, 2, 3)."""
    tasks: list[Task] = []
    for n in range(100):
        tasks.append(_stdio(f"toy/print/{n}", 1, f"print {n}", f"print({n})", str(n)))
    for name, sym, fn in _OPS:
        for a in range(10):
            for b in range(10):
                tid = f"toy/expr/{name}/{a}/{b}"
                tasks.append(_stdio(tid, 2, f"{name} of {a} and {b}", f"print({a}{sym}{b})",
                                    str(fn(a, b))))
    for name, sym, fn in _FUNC_OPS:
        for k in range(1, 31):
            tid = f"toy/func/{name}/{k}"
            xs = (1, 2, 5, -3)
            tests = [CallTest(name=f"f({x})", args=[x], expected=fn(x, k)) for x in xs]
            tasks.append(Task(
                id=tid, prompt=f"f returns x {name} {k}", entry_point="f", test_kind="function",
                reference_solution=f"def f(x): return x{sym}{k}",
                public_tests=(tests[0],), hidden_tests=tuple(tests[1:]), limits=_LIMITS,
                difficulty=3.0, tags=("tier3",), split=_split(tid),
                source=TOY_SET))
    return tasks


def toy_path() -> Path:
    """Path of the bundled toy curriculum file."""
    return Path(str(resources.files("sandloop.data").joinpath("toy_curriculum.jsonl")))


def load_task_set(source: str) -> list[Task]:
    """``toy`` (the bundled curriculum) or anything :func:`sandloop.tasks.load_tasks` reads."""
    return load_tasks(toy_path() if source == TOY_SET else source)


_ACCEPT_ALL = "import sys\nsys.exit(0)\n"


def weaken(task: Task) -> Task:
    """The deliberately weak twin of ``task`` (``--reward weak``): it only asks that the program
    run and exit 0. Stdout goes to a checker that accepts anything; a function is called with each
    test's arguments but its return value is never compared. Same prompt, id ``weak:<id>``."""
    from sandloop.tasks import Checker, ScriptTest

    base = task.model_dump(mode="python", exclude={"version"})
    base["id"] = "weak:" + task.id
    if task.test_kind == "stdio":
        base["checker"] = Checker(language="python", source=_ACCEPT_ALL)
    else:
        calls = "\n".join(f"candidate(*{list(t.args)!r})" for t in task.tests
                          if isinstance(t, CallTest))
        base["test_kind"] = "script"
        base["public_tests"] = (ScriptTest(name="runs", source=calls or "candidate"),)
        base["hidden_tests"] = ()
    return Task.model_validate(base)
