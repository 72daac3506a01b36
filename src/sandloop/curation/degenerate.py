"""Degenerate completions: answers that solve nothing, which no task's tests should pass (pure).

If one of them earns reward 1, the tests accept an answer that ignores the problem and a policy
will find it. For function tasks they keep the entry point's signature (taken from the reference
solution or the starter code); for stdin/stdout tasks they are whole programs.
"""

from __future__ import annotations

import ast
import copy

from pydantic import BaseModel, ConfigDict

from sandloop.reward.assemble import assemble
from sandloop.tasks import Task

__all__ = ["Degenerate", "degenerate_completions", "entry_signature"]


class Degenerate(BaseModel):
    """One degenerate completion and its short name (``return_true``, ``exit0``, ...)."""

    model_config = ConfigDict(frozen=True)

    name: str
    completion: str


# Function bodies, by name. ``identity`` returns the first argument unchanged.
_BODIES: tuple[tuple[str, str], ...] = (
    ("pass", "pass"),
    ("return_none", "return None"),
    ("return_0", "return 0"),
    ("return_1", "return 1"),
    ("return_empty_str", "return ''"),
    ("return_empty_list", "return []"),
    ("return_true", "return True"),
    ("return_false", "return False"),
    ("identity", "return {first}"),
    ("exit0", "import sys\n    sys.exit(0)"),
)

_PROGRAMS: dict[str, tuple[tuple[str, str], ...]] = {
    "python": (("print_nothing", "pass\n"), ("exit0", "import sys\nsys.exit(0)\n"),
               ("echo_input", "import sys\nsys.stdout.write(sys.stdin.read())\n"),
               ("print_0", "print(0)\n")),
    "c": (("print_nothing", "int main(void) { return 0; }\n"),),
    "cpp": (("print_nothing", "int main() { return 0; }\n"),),
    "javascript": (("print_nothing", "process.exit(0);\n"),),
    "bash": (("print_nothing", "exit 0\n"), ("echo_input", "cat\n")),
}


def _find_def(code: str, name: str) -> tuple[ast.FunctionDef | ast.AsyncFunctionDef, bool] | None:
    """The definition of ``name`` in ``code`` and whether it is a method of ``class Solution``."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return node, False
        if isinstance(node, ast.ClassDef) and node.name == "Solution":
            for m in node.body:
                if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef) and m.name == name:
                    return m, True
    return None


def entry_signature(task: Task) -> tuple[str, str | None, bool] | None:
    """``(def line, first argument, is_method)`` of the task's entry point, from the reference
    (assembled) or the starter code; None when neither defines it."""
    if not task.entry_point:
        return None
    candidates = [task.starter_code]
    if task.reference_solution is not None:
        candidates.insert(0, assemble(task, task.reference_solution).source)
    for code in candidates:
        found = _find_def(code, task.entry_point)
        if found is None:
            continue
        fn, is_method = found
        args = copy.deepcopy(fn.args)
        # Annotations may name types the degenerate program does not import; they decide nothing.
        for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
            if a is not None:
                a.annotation = None
        positional = [a.arg for a in (*args.posonlyargs, *args.args)]
        if is_method and positional:
            positional = positional[1:]
        first = positional[0] if positional else (args.vararg.arg + "[0]" if args.vararg else None)
        return f"def {fn.name}({ast.unparse(args)}):", first, is_method
    return None


def degenerate_completions(task: Task) -> list[Degenerate]:
    """The degenerate completions that apply to ``task`` (empty when no signature is known)."""
    if task.test_kind == "stdio":
        return [Degenerate(name=n, completion=src)
                for n, src in _PROGRAMS.get(task.language, ())]
    sig = entry_signature(task)
    if sig is None:
        return []
    header, first, is_method = sig
    out: list[Degenerate] = []
    for name, body in _BODIES:
        if "{first}" in body:
            if first is None:
                continue
            body = body.format(first=first)
        fn = f"{header}\n    {body}\n"
        if is_method:
            fn = "class Solution:\n" + "".join(f"    {ln}\n" for ln in fn.splitlines())
        out.append(Degenerate(name=name, completion=fn))
    # Exiting while the module loads, before any test calls the function.
    out.append(Degenerate(name="exit0_on_import",
                          completion=f"import sys\nsys.exit(0)\n{header}\n    pass\n"))
    return out
