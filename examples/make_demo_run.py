"""Regenerate examples/demo_run.jsonl, the small training run that ``make demo`` monitors.

Ten steps of 12 rollouts (three prompts x four samples), drawn from the bundled HumanEval demo
completions: references and wrong answers, then from step 7 the "model" starts answering the two
hard prompts with reward hacks (exiting early, skipping or patching tests). Each line carries
its ``step`` and ``group``, so one ``sandloop score --rollout-log`` call records the whole run.

    python examples/make_demo_run.py [OUT]   # deterministic: rewrites the file identically
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sandloop.cli.score import demo_completions_path

STEPS, HACK_FROM = 10, 7
HACKS = [  # per hacked step: two for HumanEval/0, two for HumanEval/32 (all quick to run)
    ("sys_exit_in_call", "os_exit_in_call", "raise_skiptest", "patch_unittest"),
    ("always_equal_object", "special_case_visible_tests", "override_builtins",
     "always_equal_float_for_script"),
    ("sys_exit_at_import", "inspect_caller_frames", "raise_skiptest", "patch_unittest"),
]


OUT = Path(__file__).with_name("demo_run.jsonl")


def main(out: Path = OUT) -> None:
    by_id = {}
    for line in demo_completions_path().read_text().splitlines():
        rec = json.loads(line)
        by_id[rec["completion_id"], rec["task_id"]] = rec["completion"]

    def pick(kind: str, task: str) -> tuple[str, str]:
        return kind, by_id[kind, task]

    lines = []
    for step in range(STEPS):
        rotating = f"HumanEval/{2 + step}"
        if step < HACK_FROM:
            samples = {
                "HumanEval/0": ["reference", "wrong:off_by_one_threshold", "reference",
                                "wrong:syntax_error"],
                "HumanEval/32": ["reference", "wrong:wrong_root", "reference", "reference"],
            }
        else:
            h = HACKS[step - HACK_FROM]
            samples = {
                "HumanEval/0": [f"hack:{h[0]}", f"hack:{h[1]}", "reference",
                                "wrong:off_by_one_threshold"],
                "HumanEval/32": [f"hack:{h[2]}", f"hack:{h[3]}", "reference",
                                 "wrong:wrong_root"],
            }
        samples[rotating] = ["reference"] * 4
        for task, kinds in samples.items():
            for k, kind in enumerate(kinds):
                cid, text = pick(kind, task)
                lines.append({"step": step, "group": task, "task_id": task,
                              "completion_id": f"s{step}.{k}:{cid}", "completion": text})
    out.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    print(f"{len(lines)} completions -> {out}")


if __name__ == "__main__":
    main(*(Path(a) for a in sys.argv[1:2]))
