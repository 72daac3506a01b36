"""verl with sandloop. Either point verl's SandboxFusion path at `sandloop serve`:

    sandloop serve &
    python -m verl.trainer.main_ppo ... reward_model.sandbox_fusion.url=http://127.0.0.1:8080/run_code

or use sandloop's verifiers as the custom reward function:

    custom_reward_function.path=$(python -c 'import sandloop.integrations.verl as m; print(m.__file__)')
    custom_reward_function.name=compute_score        # compute_score_batch with reward_manager=batch

Run this file to see the call verl makes.
"""

import json

from sandloop.integrations.verl import compute_score

tests = json.dumps({"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]})
solution = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
print(compute_score(data_source="codecontests", solution_str=solution, ground_truth=tests,
                    extra_info={"index": 0}))   # {'score': 1.0, 'pass_fraction': 1.0, ...}
