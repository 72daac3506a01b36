"""The closed loop: sample tasks → generate → execute and verify in the sandbox → reward → update.

``run_training(TrainConfig(...))`` drives TRL's ``GRPOTrainer`` with sandloop's TRL reward adapter
(:func:`sandloop.integrations.trl.sandloop_reward`) as its only reward function. Around it:

* tasks come from the curation layer's :class:`~sandloop.curation.TaskSampler` (levels opened in
  order, zero-variance groups counted and drawn less) through
  :class:`~sandloop.integrations.curriculum.CurriculumIndices`, which TRL asks for each step's
  prompts (groups of ``num_generations`` completions per task);
* every rollout is appended to ``rollouts.jsonl`` (the monitor's log format) and fed to the
  monitor layer (:class:`~sandloop.train.monitoring.RunMonitor`: detectors and hidden-test
  audits, alerts to ``alerts.jsonl``, ``report.html`` at the end, live figures to a server's
  dashboard with ``server_url``), one line per step to ``metrics.jsonl``;
* the eval split is scored before and after training (``eval.json``), never sampled for training.

torch, transformers and trl are imported here, so this module is only imported by the
``sandloop train`` command itself (the ``train`` extra).
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import TrainerCallback

from sandloop.curation.sampler import UNIFORM_CURRICULUM, TaskSampler, level_of
from sandloop.integrations.curriculum import CurriculumIndices
from sandloop.integrations.scorer import ScoreItem, Scorer
from sandloop.integrations.trl import completion_text, sandloop_reward
from sandloop.monitor.detectors import Thresholds
from sandloop.monitor.records import rollout_from_dict
from sandloop.reward import CompletionResult, RewardConfig, Verdict
from sandloop.reward.scoring import Completion
from sandloop.tasks import Task
from sandloop.train.evaluate import generate, pass_rate_ci
from sandloop.train.monitoring import LivePoster, RunMonitor, first_alert_steps
from sandloop.train.records import JsonlWriter, rollout_record
from sandloop.train.tiny import build_tiny, char_tokenizer, prompt_text, sft_warmup
from sandloop.train.toyset import TOY_SET, load_task_set, weaken

__all__ = ["TrainConfig", "TrainError", "run_training", "train_sampler"]


class TrainError(RuntimeError):
    """The run cannot start as configured; the message says what to change."""


@dataclass(frozen=True)
class TrainConfig:
    """Everything a run depends on (written to ``DIR/config.json``)."""

    out: Path
    model: str = "tiny"
    steps: int = 60
    seed: int = 0
    tasks: str = TOY_SET
    reward: Literal["proper", "weak"] = "proper"
    partial_credit: bool = False
    compile_error_reward: float = 0.0
    # 32 x 8 = 256 completions a step: at 16 prompts the tiny policy's 60 steps gained +0.31 on
    # the eval split here, at 32 +0.42 (the same step time: generation and update are batched).
    prompts_per_step: int = 32
    num_generations: int = 8
    learning_rate: float = 7e-4
    lr_scheduler: str = "constant"
    temperature: float = 1.5
    max_completion_length: int = 32
    # The tiny model's warm-up runs until the policy passes ``sft_target`` of a probe of
    # ``sft_probe`` training tasks (sampled at ``temperature``, checked every
    # ``sft_check_every`` steps), at most ``sft_steps`` steps (None: always ``sft_steps``). A
    # target rather than a step count: how fast the same seed learns depends on the machine's
    # floating-point kernels (200 steps gave 0.15 on one VM and 0.40 on another), and GRPO needs
    # a policy that passes some tasks of each group but not all.
    sft_steps: int = 400
    sft_target: float | None = 0.15
    sft_check_every: int = 20
    sft_probe: int = 48
    sft_learning_rate: float = 3e-3
    eval_samples: int = 4
    eval_temperature: float | None = None  # None: ``temperature``
    eval_limit: int | None = None
    shuffle_rewards: bool = False
    audit_every: int = 5
    audit_sample: int = 16
    audit_min_failures: int = 4
    server_url: str | None = None
    run_id: str | None = None
    slots: int | None = None
    save_checkpoints: bool = True
    tiny_hidden: int = 128
    tiny_layers: int = 2

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "out": str(self.out)}


# -- pieces wired into TRL ---------------------------------------------------------------------

class _RecordingScorer(Scorer):
    """A Scorer that keeps the full results of its last call (the adapter returns rewards only;
    the rollout log needs verdicts and pass counts)."""

    last: list[CompletionResult]

    async def ascore(self, items: Sequence[ScoreItem], *,
                     step: int | None = None) -> list[CompletionResult]:
        self.last = await super().ascore(items, step=step)
        return self.last


def train_sampler(train_tasks: Sequence[Task], seed: int) -> TaskSampler:
    """The loop's curriculum: levels opened in order and kept in the mix, uniform over the open
    tasks, a task whose last group had zero variance drawn at a quarter of the weight (the
    settings the figures of docs/training.md were measured with)."""
    return TaskSampler(train_tasks, curriculum=UNIFORM_CURRICULUM, weighting="task",
                       flat_weight=0.25, levels=True, seed=seed)


@dataclass
class _StepStats:
    """Per-step figures gathered by the reward function and the callback, flushed to metrics."""

    pending: dict[int, dict[str, Any]] = field(default_factory=dict)
    step_begin: float = 0.0
    reward_begin: float = 0.0
    reward_end: float = 0.0


class _MetricsCallback(TrainerCallback):  # type: ignore[misc]
    def __init__(self, stats: _StepStats, metrics: JsonlWriter) -> None:
        self.stats, self.metrics = stats, metrics

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.stats.step_begin = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        step = state.global_step - 1
        s = self.stats
        row = s.pending.setdefault(step, {"step": step})
        now = time.perf_counter()
        row["generation_s"] = max(0.0, s.reward_begin - s.step_begin)
        row["update_s"] = max(0.0, now - s.reward_end)
        row["step_s"] = now - s.step_begin

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kw: Any) -> None:
        step = state.global_step - 1
        row = self.stats.pending.pop(step, None)
        if row is None:
            return
        for k, v in (logs or {}).items():
            if isinstance(v, int | float) and k not in row:
                row["trl/" + k] = v
        self.metrics.write(row)


# -- the run -----------------------------------------------------------------------------------

def _load_model(cfg: TrainConfig, train_tasks: Sequence[Task], scorer: Scorer,
                probes: list[dict[str, Any]]) -> tuple[Any, Any, list[float]]:
    """The model and tokenizer, and the tiny model's warm-up losses (its probes of the
    training split appended to ``probes``: steps, pass rate)."""
    if cfg.model == "tiny":
        tok = char_tokenizer()
        model = build_tiny(cfg.seed, tok, hidden=cfg.tiny_hidden, layers=cfg.tiny_layers)
        pairs = [(t.prompt, t.reference_solution, level_of(t)) for t in train_tasks
                 if t.reference_solution]
        if not pairs:
            raise TrainError("--model tiny needs reference solutions in the training split for "
                             "its warm-up; use a task set with reference_solution fields")
        probe = random.Random(cfg.seed + 3).sample(list(train_tasks),
                                                   min(cfg.sft_probe, len(train_tasks)))
        target = cfg.sft_target

        def done(steps: int) -> bool:
            rate = _pass_rate(model, tok, scorer, probe, cfg, seed=cfg.seed + 3)
            probes.append({"steps": steps, "pass_rate": rate})
            return target is not None and rate >= target

        losses = sft_warmup(model, tok, pairs, steps=cfg.sft_steps, seed=cfg.seed,
                            lr=cfg.sft_learning_rate,
                            check_every=cfg.sft_check_every if target is not None else 0,
                            done=done)
        return model, tok, losses
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(cfg.model)
    if not path.is_dir():
        raise TrainError(f"--model {cfg.model!r}: not 'tiny' and not a local model directory "
                         "(a Hugging Face model saved with save_pretrained)")
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(path)
    return model, tok, []


def _pass_rate(model: Any, tok: Any, scorer: Scorer, tasks: Sequence[Task], cfg: TrainConfig,
               seed: int) -> float:
    """The share of ``tasks`` one sampled completion each passes."""
    samples = generate(model, tok, [prompt_text(t.prompt) for t in tasks], n=1,
                       max_new_tokens=cfg.max_completion_length, temperature=cfg.temperature,
                       seed=seed)
    results = scorer.score([ScoreItem(label=t.id, completion=cs[0])
                            for t, cs in zip(tasks, samples, strict=True)])
    return sum(r.verdict is Verdict.PASSED for r in results) / max(1, len(results))


def _evaluate(model: Any, tok: Any, scorer: Scorer, tasks: Sequence[Task],
              cfg: TrainConfig, seed: int) -> dict[str, Any]:
    temperature = cfg.temperature if cfg.eval_temperature is None else cfg.eval_temperature
    samples = generate(model, tok, [prompt_text(t.prompt) for t in tasks], n=cfg.eval_samples,
                       max_new_tokens=cfg.max_completion_length, temperature=temperature,
                       seed=seed)
    items = [ScoreItem(label=t.id, completion=c) for t, cs in zip(tasks, samples, strict=True)
             for c in cs]
    results = scorer.score(items)
    per_task: list[float] = []
    infra = 0
    by_tier: dict[int, list[float]] = {}
    for j, t in enumerate(tasks):
        rs = results[j * cfg.eval_samples:(j + 1) * cfg.eval_samples]
        infra += sum(r.verdict is Verdict.SANDBOX_ERROR for r in rs)
        frac = sum(r.verdict is Verdict.PASSED for r in rs) / len(rs)
        per_task.append(frac)
        by_tier.setdefault(level_of(t), []).append(frac)
    summary = pass_rate_ci(per_task)
    summary["samples_per_task"] = cfg.eval_samples
    summary["infra_failures"] = infra
    summary["by_tier"] = {str(k): sum(v) / len(v) for k, v in sorted(by_tier.items())}
    return summary


def run_training(cfg: TrainConfig, sampler: TaskSampler | None = None) -> dict[str, Any]:
    """Run one loop; returns the summary also written to ``DIR/summary.json``. ``sampler``
    (built over the training split's tasks) replaces the default :func:`train_sampler`."""
    from trl import GRPOConfig, GRPOTrainer

    out = cfg.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg.to_json(), indent=2) + "\n")
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)

    tasks = load_task_set(cfg.tasks)
    train_tasks = [t for t in tasks if t.split == "train"]
    eval_tasks = [t for t in tasks if t.split == "eval"]
    if not train_tasks or not eval_tasks:
        raise TrainError(f"task set {cfg.tasks!r} has {len(train_tasks)} train and "
                         f"{len(eval_tasks)} eval tasks; it needs both splits (field 'split')")
    if cfg.eval_limit is not None:
        eval_tasks = random.Random(cfg.seed).sample(eval_tasks, min(cfg.eval_limit,
                                                                    len(eval_tasks)))
    cur = sampler or train_sampler(train_tasks, cfg.seed)
    unknown = set(cur.tasks) - {t.id for t in train_tasks}
    if unknown:
        raise TrainError(f"the sampler holds {len(unknown)} tasks outside the training split "
                         f"(e.g. {sorted(unknown)[0]!r}); build it from the train split")
    weak = cfg.reward == "weak"
    label_of = {t.id: ("weak:" + t.id if weak else t.id) for t in train_tasks}
    level = {t.id: level_of(t) for t in train_tasks}
    extra = [weaken(t) for t in train_tasks] if weak else []
    reward_cfg = RewardConfig(mode="fraction" if cfg.partial_credit else "binary",
                              compile_error_reward=cfg.compile_error_reward)
    scorer = _RecordingScorer(tasks=[*tasks, *extra], reward=reward_cfg, slots=cfg.slots,
                              client="sandloop-train")
    rollouts = JsonlWriter(out / "rollouts.jsonl")
    metrics = JsonlWriter(out / "metrics.jsonl")
    alerts = JsonlWriter(out / "alerts.jsonl")
    poster = (LivePoster(cfg.server_url, cfg.run_id or out.name,
                         api_key=os.environ.get("SANDLOOP_API_KEY") or None)
              if cfg.server_url else None)

    async def proper_score(items: Sequence[Completion]) -> list[CompletionResult]:
        # The audit's ground truth: the real task (hidden tests), whatever the training reward.
        return await Scorer.ascore(scorer, [ScoreItem(label=c.task_id, completion=c.completion)
                                            for c in items])

    monitor = RunMonitor(alerts, proper_score, known=frozenset(level),
                         audit_every=cfg.audit_every, audit_sample=cfg.audit_sample,
                         seed=cfg.seed,
                         thresholds=Thresholds(audit_min_failures=cfg.audit_min_failures),
                         poster=poster)
    try:
        sft_probes: list[dict[str, Any]] = []
        model, tok, sft_losses = _load_model(cfg, train_tasks, scorer, sft_probes)
        if cfg.save_checkpoints and cfg.model == "tiny":
            model.save_pretrained(out / "checkpoints" / "sft")
            tok.save_pretrained(out / "checkpoints" / "sft")
        before = _evaluate(model, tok, scorer, eval_tasks, cfg, seed=cfg.seed + 1)

        stats = _StepStats()
        counters = {"infra_failures": 0, "rollouts": 0}
        shuffle_rng = random.Random(cfg.seed + 7)
        adapter = sandloop_reward(scorer, label_column="task_id")

        async def sandloop_train_reward(prompts: list[Any] | None = None,
                                        completions: list[Any] | None = None,
                                        completion_ids: list[Any] | None = None,
                                        **kwargs: Any) -> list[float | None]:
            stats.reward_begin = time.perf_counter()
            runs_before = scorer.runs
            rewards = await adapter(prompts=prompts, completions=completions,
                                    completion_ids=completion_ids, **kwargs)
            results = scorer.last
            sandbox_s = time.perf_counter() - stats.reward_begin
            state = kwargs.get("trainer_state")
            step = int(state.global_step) if state is not None else 0
            base_ids: list[str] = kwargs["base_id"]
            texts = [completion_text(c) for c in completions or []]
            g = cfg.num_generations
            groups: dict[int, tuple[str, list[float | None]]] = {}
            records = []
            for i, (tid, text, res, r) in enumerate(zip(base_ids, texts, results, rewards,
                                                        strict=True)):
                group = step * cfg.prompts_per_step + i // g
                rec = rollout_record(step, tid, text, res, group=group, reward=r)
                rec["difficulty"] = f"tier{level[tid]}"
                rollouts.write(rec)
                records.append(rollout_from_dict(rec))
                groups.setdefault(group, (tid, []))[1].append(r)
            dropped_before = cur.dropped_groups
            cur.filter_groups([(tid, vals, gid) for gid, (tid, vals) in groups.items()])
            known = [r for r in rewards if r is not None]
            infra = len(rewards) - len(known)
            counters["infra_failures"] += infra
            counters["rollouts"] += len(rewards)
            mean = sum(known) / len(known) if known else 0.0
            row: dict[str, Any] = {
                "step": step,
                "reward_mean": mean,
                "reward_std": (sum((x - mean) ** 2 for x in known) / len(known)) ** 0.5
                if known else 0.0,
                "pass_rate": sum(res.verdict is Verdict.PASSED for res in results)
                / max(1, len(results)),
                "infra_failures": infra,
                "groups": len(groups),
                "zero_variance_groups": cur.dropped_groups - dropped_before,
                "dropped_total": cur.dropped_groups,
                "open_tiers": cur.open_levels(),
                "sandbox_s": sandbox_s,
                # Sandbox runs the step's scoring took: identical completions of the step run
                # once, and those scored in an earlier step come from the scorer's cache.
                "sandbox_runs": scorer.runs - runs_before,
            }
            row.update(await monitor.observe_step(step, records))
            stats.pending[step] = {**stats.pending.get(step, {}), **row}
            stats.reward_end = time.perf_counter()
            given = list(rewards)
            if cfg.shuffle_rewards:
                # The control: the same rewards, detached from the completions that earned them.
                shuffle_rng.shuffle(given)
            return given

        sandloop_train_reward.__name__ = "sandloop_reward"

        from datasets import Dataset

        ds = Dataset.from_dict({
            "prompt": [prompt_text(t.prompt) for t in train_tasks],
            "task_id": [label_of[t.id] for t in train_tasks],
            "base_id": [t.id for t in train_tasks],
        })
        index_of = {t.id: i for i, t in enumerate(train_tasks)}
        args = GRPOConfig(
            output_dir=str(out / "trl"), max_steps=cfg.steps, seed=cfg.seed,
            per_device_train_batch_size=cfg.prompts_per_step * cfg.num_generations,
            num_generations=cfg.num_generations, gradient_accumulation_steps=1,
            max_completion_length=cfg.max_completion_length, temperature=cfg.temperature,
            learning_rate=cfg.learning_rate, lr_scheduler_type=cfg.lr_scheduler, beta=0.0,
            logging_steps=1, save_strategy="no", report_to="none", disable_dropout=True,
            bf16=False, dataloader_num_workers=0, remove_unused_columns=False,
        )

        class _Trainer(GRPOTrainer):  # type: ignore[misc]
            def _get_train_sampler(self, dataset: Any = None) -> CurriculumIndices:
                # Drawn lazily: each step's tasks see the rewards reported up to then.
                return CurriculumIndices(cur, index_of, prompts=cfg.prompts_per_step,
                                         generations=cfg.num_generations, steps=cfg.steps,
                                         seed=cfg.seed)

        trainer = _Trainer(model=model, processing_class=tok, args=args, train_dataset=ds,
                           reward_funcs=[sandloop_train_reward],
                           callbacks=[_MetricsCallback(stats, metrics)])
        t0 = time.perf_counter()
        trainer.train()
        train_s = time.perf_counter() - t0
        model = trainer.model
        if cfg.save_checkpoints:
            model.save_pretrained(out / "checkpoints" / "final")
            tok.save_pretrained(out / "checkpoints" / "final")
        after = _evaluate(model, tok, scorer, eval_tasks, cfg, seed=cfg.seed + 2)
        evaluation = {"before": before, "after": after,
                      "delta": (after["pass_rate"] or 0.0) - (before["pass_rate"] or 0.0)}
        (out / "eval.json").write_text(json.dumps(evaluation, indent=2) + "\n")
        summary: dict[str, Any] = {
            "steps": cfg.steps, "reward": cfg.reward, "train_s": train_s,
            "sft_loss_last": sft_losses[-1] if sft_losses else None,
            "sft_steps_done": len(sft_losses),
            "sft_probes": sft_probes,
            "eval": {"before": before["pass_rate"], "after": after["pass_rate"]},
            "zero_variance_groups": cur.dropped_groups, **counters,
        }
        analysis = monitor.finish(out / "report.html",
                                  {"eval_before": before["pass_rate"],
                                   "eval_after": after["pass_rate"]},
                                  title=f"sandloop train: {out.name}")
        summary["alerts"] = len(analysis.alerts)
        summary["first_alert_step"] = first_alert_steps(analysis.alerts)
        summary["audited"] = monitor.audited
        if poster is not None:
            summary["posted_rollouts"] = poster.posted
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary
    finally:
        for w in (rollouts, metrics, alerts):
            w.close()
        scorer.close()
