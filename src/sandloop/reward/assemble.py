"""Turn a model completion into the program that is tested (pure, no execution).

Rules (documented in docs/rewards.md):

* A Markdown code fence is unwrapped: the first fenced block is the code.
* For function tasks, a completion that does not define the entry point continues the task's
  starter code (HumanEval: it is appended to the prompt). One that does define it is used as is,
  after the starter code when that code is complete on its own (so the prompt's imports and helper
  functions stay available; the completion's definition replaces the stub).
* In Java, Go, Rust and TypeScript the completion is the whole file (for function tasks, the
  file that defines the entry point; reward/call_harness.py).
* Nothing usable (empty, or whitespace only) is a format error.
"""

from __future__ import annotations

import ast
import re

from pydantic import BaseModel, ConfigDict

from sandloop.tasks import Task

__all__ = ["Assembled", "assemble", "defines", "extract_code", "response_after_prompt"]

# Chat-template tokens a trainer may leave in a decoded query: <|im_end|>, </s>, and
# DeepSeek's full-width-bar tokens (U+FF5C).
_SPECIAL = re.compile(r"<\|[A-Za-z0-9_.:-]{1,40}\|>|</s>|<s>|<\uff5c[^\uff5c]{1,40}\uff5c>")
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+#.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


class Assembled(BaseModel):
    """The program to test, and how it was obtained from the completion."""

    model_config = ConfigDict(frozen=True)

    source: str
    how: str  # "appended", "standalone", "standalone+starter", "program"
    fenced: bool = False
    format_error: str | None = None


def response_after_prompt(query: str, prompt: str | None) -> str:
    """The response part of a decoded query (what follows the prompt; OpenRLHF passes prompt +
    response as one string), with chat-template special tokens removed."""
    text = query
    if prompt:
        i = query.find(prompt)
        if i >= 0:
            text = query[i + len(prompt):]
    return _SPECIAL.sub("", text)


def extract_code(completion: str) -> tuple[str, bool]:
    """The code in ``completion``: the first fenced block if there is one, else the text itself."""
    if "```" not in completion:
        return completion, False
    m = _FENCE.search(completion)
    if m is None:
        return completion, False
    return m.group(2), True


def defines(code: str, name: str) -> bool:
    """Whether ``code`` parses and binds ``name`` at top level (def, class, assignment, import),
    or defines it as a method of ``class Solution`` (LeetCode style)."""
    try:
        module = ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    for node in module.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name == name:
                return True
            if isinstance(node, ast.ClassDef) and node.name == "Solution" and any(
                isinstance(m, ast.FunctionDef) and m.name == name for m in node.body
            ):
                return True
        elif isinstance(node, ast.Assign):
            if name in _names(node.targets):
                return True
        elif isinstance(node, ast.Import | ast.ImportFrom) and name in {
            a.asname or a.name for a in node.names
        }:
            return True
    return False


def _names(targets: list[ast.expr]) -> set[str]:
    return {t.id for t in targets if isinstance(t, ast.Name)}


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True


def assemble(task: Task, completion: str) -> Assembled:
    """The program that tests of ``task`` run for ``completion``."""
    code, fenced = extract_code(completion)
    if not code.strip():
        return Assembled(source="", how="program", fenced=fenced,
                         format_error="the completion contains no code")
    if task.test_kind == "stdio" or not task.entry_point or task.language != "python":
        # Java, Go, Rust and TypeScript function tasks: the completion is the whole file that
        # defines the entry point (the harness is compiled next to it).
        return Assembled(source=code, how="program", fenced=fenced)
    starter = task.starter_code
    if defines(code, task.entry_point):
        if starter.strip() and _parses(starter):
            return Assembled(source=f"{starter}\n\n{code}", how="standalone+starter",
                             fenced=fenced)
        return Assembled(source=code, how="standalone", fenced=fenced)
    # Appended verbatim, as HumanEval does: a completion may continue the prompt's last line.
    return Assembled(source=starter + code, how="appended", fenced=fenced)
