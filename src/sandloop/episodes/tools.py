"""The tools a model may call in an episode, as OpenAI function-calling JSON schemas.

``TOOLS`` is what ``POST /v1/episodes`` returns as ``tools`` and what trainer adapters hand to
the model's chat template. ``check_arguments`` validates one call's arguments against its
schema's required fields and types (a bad call is an observation with an ``error``, never an
exception: the model must be able to recover from its own mistakes).
"""

from __future__ import annotations

from typing import Any

__all__ = ["TOOLS", "TOOL_NAMES", "check_arguments", "tool_schemas"]


def _fn(name: str, description: str, properties: dict[str, Any],
        required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties,
                       "required": list(required), "additionalProperties": False}}}


_PATH = {"type": "string", "description": "path relative to the repository root"}

TOOLS: tuple[dict[str, Any], ...] = (
    _fn("read_file", "Read a text file of the repository.", {"path": _PATH}, ("path",)),
    _fn("write_file", "Create or replace a file of the repository with the given content.",
        {"path": _PATH, "content": {"type": "string"}}, ("path", "content")),
    _fn("apply_patch", "Apply a unified diff (--- a/PATH, +++ b/PATH, @@ hunks) to the "
        "repository; all-or-nothing.", {"patch": {"type": "string"}}, ("patch",)),
    _fn("list_dir", "List a directory of the repository (entries ending in / are "
        "directories).", {"path": {**_PATH, "default": "."}}),
    _fn("run", "Run a bash command in the repository root (time, memory and output limited); "
        "returns status, exit_code, stdout and stderr.",
        {"command": {"type": "string"}}, ("command",)),
    _fn("run_tests", "Run the repository's tests; returns passed and failed counts and the "
        "output.", {}),
    _fn("submit", "Finish the episode: the final repository is graded by the hidden tests.",
        {}),
)

TOOL_NAMES = tuple(t["function"]["name"] for t in TOOLS)
_BY_NAME = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
_TYPES = {"string": str, "integer": int, "object": dict, "boolean": bool}


def tool_schemas() -> list[dict[str, Any]]:
    """A fresh copy of the tool schemas (callers may annotate theirs)."""
    import copy

    return copy.deepcopy(list(TOOLS))


def check_arguments(tool: str, arguments: Any) -> str | None:
    """Why ``arguments`` do not fit ``tool``'s schema, or None when they do."""
    params = _BY_NAME.get(tool)
    if params is None:
        return f"unknown tool {tool!r}; the tools are: {', '.join(TOOL_NAMES)}"
    if not isinstance(arguments, dict):
        return f"{tool}: arguments must be a JSON object"
    props: dict[str, Any] = params["properties"]
    extra = sorted(set(arguments) - set(props))
    if extra:
        return f"{tool}: unknown argument(s) {extra}; it takes {sorted(props) or 'none'}"
    for name in params["required"]:
        if name not in arguments:
            return f"{tool}: missing required argument {name!r}"
    for name, value in arguments.items():
        want = _TYPES[props[name]["type"]]
        if not isinstance(value, want) or (want is int and isinstance(value, bool)):
            return f"{tool}: argument {name!r} must be a {props[name]['type']}"
    return None
