"""The curation layer's TaskSampler as each trainer's sampler: TRL's index iterable (and the
reward adapter's feedback, scored in the real sandbox), verl's curriculum-sampler interface.

verl's sampler is driven with objects of verl's batch shape (``non_tensor_batch`` of numpy
arrays as verl's DataProto carries them): verl itself imports torch, absent here."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

from sandloop.curation.sampler import TaskSampler
from sandloop.integrations.curriculum import CurriculumIndices, groups_of, task_id_of_row
from sandloop.integrations.scorer import Scorer
from sandloop.integrations.trl import sandloop_reward
from sandloop.integrations.verl_curriculum import VerlCurriculumSampler
from sandloop.train.toyset import build_toy_tasks

TOY = [t for t in build_toy_tasks() if t.split == "train"]


def test_indices_are_groups_of_one_row_drawn_lazily() -> None:
    tasks = TOY[:6]
    sampler = TaskSampler(tasks, seed=0)
    index_of = {t.id: i for i, t in enumerate(tasks)}
    it = CurriculumIndices(sampler, index_of, prompts=3, generations=4, steps=2)
    assert len(it) == 24
    rows = iter(it)
    first = [next(rows) for _ in range(12)]
    assert all(first[k] == first[k - k % 4] for k in range(12))  # 3 groups of 4 repeats
    # feedback between steps changes what the next step draws: only t0 keeps weight
    zero = {t.id: "unsolved" for t in tasks[1:]}
    sampler.curriculum = {"medium": 1.0, "unsolved": 0.0, "saturated": 0.0, "easy": 0.0,
                          "hard": 0.0}
    sampler.filter_groups([(tid, [0.0] * 8, tid) for tid in zero])
    assert set(list(rows)) == {0}
    with pytest.raises(ValueError, match="no dataset row"):
        CurriculumIndices(sampler, {}, prompts=1, steps=1)


def test_groups_of_runs_and_named_groups() -> None:
    assert groups_of(["a", "a", "b", "a"], [1.0, 0.0, 1.0, None]) == [
        ("a", [1.0, 0.0], 0), ("b", [1.0], 1), ("a", [None], 2)]
    assert groups_of(["a", "b", "a"], [1.0, 0.0, 0.0], ["u1", "u2", "u1"]) == [
        ("a", [1.0, 0.0], "u1"), ("b", [0.0], "u2")]


def test_trl_reward_reports_each_prompt_group_to_the_curriculum() -> None:
    tasks = TOY[:2]
    sampler = TaskSampler(tasks, seed=0)
    a, b = tasks
    with Scorer(tasks=tasks, slots=2) as scorer:
        reward = sandloop_reward(scorer, curriculum=sampler)
        comps = [a.reference_solution, "print(1234)", b.reference_solution, b.reference_solution]
        rewards = asyncio.run(reward(prompts=[a.prompt, a.prompt, b.prompt, b.prompt],
                                     completions=comps, task_id=[a.id, a.id, b.id, b.id]))
    assert rewards == [1.0, 0.0, 1.0, 1.0]
    assert sampler.kept_groups == 1 and sampler.dropped_groups == 1  # b's group: all 1
    assert sampler.difficulty[b.id].passes == 2 and sampler.difficulty[a.id].trials == 2


def _verl_rows(n: int) -> list[dict[str, object]]:
    return [{"prompt": f"p{i}", "reward_model": {"ground_truth": f"task/{i % 3}"},
             "extra_info": {"index": i}} for i in range(n)]


def test_verl_sampler_draws_rows_by_task_and_learns_from_batches() -> None:
    rows = _verl_rows(9)
    s = VerlCurriculumSampler(rows, {"train_batch_size": 4, "seed": 1})
    assert len(s) == 9 and sorted(s.index_of) == ["task/0", "task/1", "task/2"]
    drawn = list(s)
    assert len(drawn) == 9 and all(0 <= i < 9 for i in drawn)
    # one step of verl: 2 prompts x rollout.n=3, rewards in non_tensor_batch["score"]
    ids = ["task/0"] * 3 + ["task/1"] * 3
    batch = SimpleNamespace(non_tensor_batch={
        "reward_model": np.array([{"ground_truth": t} for t in ids], dtype=object),
        "extra_info": np.array([{"index": 0}] * 6, dtype=object),
        "uid": np.array(["u0"] * 3 + ["u1"] * 3, dtype=object),
        "score": np.array([1.0, 1.0, 1.0, 1.0, 0.0, 1.0])})
    s.update(batch)
    assert s.sampler.dropped_groups == 1 and s.sampler.kept_groups == 1
    assert s.sampler.difficulty["task/0"].trials == 3


def test_verl_sampler_reads_token_level_scores_without_a_score_column() -> None:
    class Scores:  # the one tensor method the sampler calls (torch is absent here)
        def __init__(self, rows: list[list[float]]) -> None:
            self.rows = rows

        def sum(self, dim: int) -> Scores:
            return Scores([[sum(r)] for r in self.rows])

        def tolist(self) -> list[float]:
            return [r[0] for r in self.rows]

    s = VerlCurriculumSampler(_verl_rows(3), {"train_batch_size": 1})
    batch = SimpleNamespace(
        non_tensor_batch={"reward_model": np.array([{"ground_truth": "task/2"}] * 2,
                                                   dtype=object)},
        batch={"token_level_scores": Scores([[0.0, 1.0], [0.0, 0.0]])})
    s.update(batch)
    assert s.sampler.kept_groups == 1


def test_task_id_of_row() -> None:
    assert task_id_of_row({"reward_model": {"ground_truth": "HumanEval/1"}}, 5) == "HumanEval/1"
    tests = '{"inputs": ["1"], "outputs": ["1"]}'
    assert task_id_of_row({"reward_model": {"ground_truth": tests}}, 5) == "row:5"
    assert task_id_of_row({"reward_model": {"ground_truth": tests},
                           "extra_info": {"task_id": "mine/7"}}, 5) == "mine/7"
    assert task_id_of_row(object(), 2) == "row:2"
