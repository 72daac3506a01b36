"""The README's Python snippets are parts of runnable files under examples/; run each file, and
check that every snippet the README shows is still, verbatim, in the file it names."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Each example and a line its output must contain (what the example demonstrates).
EXAMPLES = {
    "engine_basics.py": ["run: ok 1", "stream: 3 9", "session: 45"],
    "engine_sync.py": ["run: hi", "map: ['0', '1', '2']", "session: 7"],
    "engine_journal.py": ["run: recorded", "nothing was left unfinished"],
    "pool_basics.py": ["ok cba", "batch: [('ok', 'c++ ok')]", "hi"],
    "workspaces.py": ["ok HELLO"],
    "episode_basics.py": ["submit: 0.0 unresolved"],
    "episode_rollout.py": ["reward=1.0"],
}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_runs(name: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    r = subprocess.run([sys.executable, str(ROOT / "examples" / name)], capture_output=True,
                       text=True, timeout=180, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    for line in EXAMPLES[name]:
        assert line in r.stdout, (line, r.stdout)


def _readme_snippets() -> list[tuple[str, str]]:
    text = (ROOT / "README.md").read_text()
    return [(m.group(1), m.group(2)) for m in
            re.finditer(r"```python\n# examples/(\S+)\n(.*?)```", text, re.S)]


def test_every_readme_python_block_is_an_example() -> None:
    text = (ROOT / "README.md").read_text()
    blocks = text.count("```python\n")
    snippets = _readme_snippets()
    # A block without its "# examples/FILE" line could rot unnoticed.
    assert blocks == len(snippets) >= 3
    for name, body in snippets:
        assert name in EXAMPLES, f"README shows examples/{name}, which no test runs"
        source = (ROOT / "examples" / name).read_text()
        assert body in source, f"the README's snippet of examples/{name} differs from the file"
