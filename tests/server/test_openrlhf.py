"""OpenRLHF's remote reward protocol: POST {query, prompts, labels} -> {rewards, scores, extra_logs}."""

from __future__ import annotations

import json

import httpx
from live import LiveServer

PROMPT = "<|im_start|>user\nWrite has_close_elements.<|im_end|>\n<|im_start|>assistant\n"
GOOD = ("```python\ndef has_close_elements(numbers, threshold):\n"
        "    return any(abs(a - b) < threshold for i, a in enumerate(numbers)"
        " for b in numbers[i + 1:])\n```<|im_end|>")


def test_get_reward(server: LiveServer) -> None:
    io_label = json.dumps({"inputs": ["2 3\n"], "outputs": ["5\n"]})
    body = {"query": [PROMPT + GOOD, PROMPT + "```python\ndef x(:\n```<|im_end|>",
                      "Q: add\nA: ```python\nprint(sum(map(int, input().split())))\n```</s>"],
            "prompts": [PROMPT, PROMPT, "Q: add\nA: "],
            "labels": ["HumanEval/0", "HumanEval/0", io_label]}
    r = httpx.post(f"{server.url}/get_reward", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["rewards"] == [1.0, 0.0, 1.0]
    assert out["scores"] == [1.0, 0.0, 1.0]
    assert out["extra_logs"]["compile_error"] == [0.0, 1.0, 0.0]
    bad = httpx.post(f"{server.url}/get_reward", json={**body, "labels": ["HumanEval/0"]})
    assert bad.status_code == 400
