"""OpenRLHF with sandloop. Either the HTTP remote reward:

    sandloop serve &
    ... --reward.remote_url http://127.0.0.1:8080/get_reward --data.label_key task

or the in-process reward-function file:

    ... --reward.remote_url $(python -c 'import sandloop.integrations.openrlhf as m; print(m.__file__)')

Run this file to see the call OpenRLHF makes.
"""

import json

from sandloop.integrations.openrlhf import reward_func

label = json.dumps({"inputs": ["2 3\n"], "outputs": ["5\n"]})
prompt = "<|im_start|>user\nAdd two numbers.<|im_end|>\n<|im_start|>assistant\n"
response = "```python\nprint(sum(map(int, input().split())))\n```<|im_end|>"
print(reward_func(queries=[prompt + response], prompts=[prompt], labels=[label]))
