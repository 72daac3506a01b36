"""TRL GRPO with sandloop as the reward (run: python examples/trl_grpo_reward.py).

Without TRL installed, this calls the reward function exactly as GRPOTrainer does.
"""

import asyncio

from sandloop.integrations import Scorer
from sandloop.integrations.trl import sandloop_reward

scorer = Scorer(task_sets=("humaneval",))          # or Scorer(url="http://127.0.0.1:8080")
reward = sandloop_reward(scorer)

# The real thing: GRPOTrainer(model, reward_funcs=[reward], train_dataset=ds), where each row
# of ds has a "task_id" column (or "tests" with {"inputs", "outputs"}).

completions = ["    return any(abs(a - b) < threshold for i, a in enumerate(numbers)"
               " for b in numbers[i + 1:])\n", "    return True\n"]
rewards = asyncio.run(reward(prompts=["", ""], completions=completions,
                             completion_ids=[[0], [1]], task_id=["HumanEval/0"] * 2))
print(rewards)   # [1.0, 0.0]
scorer.close()
