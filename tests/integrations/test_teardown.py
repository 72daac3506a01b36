"""Tear-down without noise: the adapters' embedded engines close at interpreter exit silently."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent("""
    import asyncio, atexit, sys
    from sandloop.integrations import openrlhf, verl
    from sandloop.integrations._common import _scorers, default_scorer
    from sandloop.integrations.trl import sandloop_reward
    gt = {"inputs": ["1\\n"], "outputs": ["1\\n"]}
    assert verl.compute_score("codecontests", "print(input())", gt)["score"] == 1.0
    r = asyncio.run(sandloop_reward()(prompts=["p"], completions=["print(input())"],
                                      ground_truth=[gt]))
    assert r == [1.0], r
    mode = sys.argv[1]
    if mode == "explicit":
        atexit.register(lambda: [s.close() for s in list(_scorers.values())])
    print("scored", len(_scorers))
""")


@pytest.mark.parametrize("mode", ["implicit", "explicit"])
def test_adapters_close_at_exit_without_noise(tmp_path: Path, mode: str) -> None:
    script = tmp_path / "use_adapters.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "SANDLOOP_TASK_SETS": ""}
    r = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "scored 1"
    assert r.stderr == ""
