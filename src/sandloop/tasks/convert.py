"""Static (never executed) rewriting of test code into function-call tests.

An ``assert candidate(<literal args>) == <literal>`` in a test script is turned into a
:class:`CallTest`, so that the expected value stays outside the sandbox and is compared there.
Whatever cannot be converted this way stays a :class:`ScriptTest`, run by the trusted harness
process (which never executes the completion). Only :func:`ast.literal_eval` is applied to test
code here: loading a task never runs it.
"""

from __future__ import annotations

import ast
import doctest
from typing import Any

from sandloop.tasks.models import CallTest, ScriptTest
from sandloop.tasks.values import ValueCodecError, encode

__all__ = ["doctest_calls", "expand_script", "literal_call", "split_asserts", "split_check"]


def _literal(node: ast.expr) -> tuple[bool, Any]:
    try:
        value = ast.literal_eval(node)
        encode(value, strict=True)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError, ValueCodecError):
        return False, None
    return True, value


def literal_call(node: ast.expr, callees: set[str]) -> tuple[list[Any], dict[str, Any]] | None:
    """If ``node`` is ``name(<literals>)`` with ``name`` in ``callees``, its encoded args/kwargs."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        return None
    if node.func.id not in callees:
        return None
    args: list[Any] = []
    for a in node.args:
        if isinstance(a, ast.Starred):
            return None
        ok, v = _literal(a)
        if not ok:
            return None
        args.append(encode(v, strict=True))
    kwargs: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None:  # **mapping
            return None
        ok, v = _literal(kw.value)
        if not ok:
            return None
        kwargs[kw.arg] = encode(v, strict=True)
    return args, kwargs


def _assert_pair(stmt: ast.stmt, callees: set[str]) -> tuple[list[Any], dict[str, Any], Any] | None:
    """``assert f(lits) == lit`` (either side) -> (args, kwargs, encoded expected)."""
    if not isinstance(stmt, ast.Assert):
        return None
    test = stmt.test
    if not (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Eq)
    ):
        return None
    for call_side, value_side in ((test.left, test.comparators[0]), (test.comparators[0], test.left)):
        call = literal_call(call_side, callees)
        if call is None:
            continue
        ok, expected = _literal(value_side)
        if ok:
            return call[0], call[1], encode(expected, strict=True)
    return None


def _is_noop(stmt: ast.stmt) -> bool:
    # ``assert True, "This prints if this assert fails"`` is HumanEval boilerplate; ``pass`` and
    # bare docstrings test nothing either.
    if isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Constant):
        return bool(stmt.test.value)
    if isinstance(stmt, ast.Pass):
        return True
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)


def _tests_something(stmts: list[ast.stmt]) -> bool:
    for stmt in stmts:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Assert | ast.Call | ast.Raise):
                return True
    return False


def split_check(
    test_source: str, *, prefix: str = "check", callees: frozenset[str] = frozenset({"candidate"})
) -> tuple[list[CallTest], list[ScriptTest]]:
    """Split a HumanEval-style ``def check(candidate): ...`` into call tests and a residual script.

    Returns (call tests, script tests). The residual script keeps the module-level code and every
    statement of ``check`` that was not converted, in order; it is dropped if it tests nothing.
    Unparseable source or a source without ``check`` is returned whole as one script test.
    """
    whole = [ScriptTest(name=prefix, source=test_source, call="check")]
    try:
        module = ast.parse(test_source)
    except SyntaxError:
        return [], whole
    checks = [n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if len(checks) != 1 or not checks[0].args.args:
        return [], whole
    check = checks[0]
    names = set(callees) | {check.args.args[0].arg}
    calls: list[CallTest] = []
    residual: list[ast.stmt] = []
    for stmt in check.body:
        pair = _assert_pair(stmt, names)
        if pair is not None:
            args, kwargs, expected = pair
            calls.append(
                CallTest(
                    name=f"{prefix}:L{stmt.lineno}", args=args, kwargs=kwargs, expected=expected
                )
            )
        elif not _is_noop(stmt):
            residual.append(stmt)
    scripts: list[ScriptTest] = []
    if _tests_something(residual):
        check.body = residual
        scripts.append(
            ScriptTest(name=f"{prefix}:rest", source=ast.unparse(module), call="check")
        )
    if not calls and not scripts:
        return [], whole
    return calls, scripts


def split_asserts(
    lines: list[str], entry_point: str, *, prefix: str, setup: str = ""
) -> tuple[list[CallTest], list[ScriptTest]]:
    """MBPP-style top-level assert lines -> call tests where possible, else one script test each."""
    calls: list[CallTest] = []
    scripts: list[ScriptTest] = []
    for i, line in enumerate(lines):
        name = f"{prefix}{i}"
        try:
            body = ast.parse(line).body
        except SyntaxError:
            body = []
        pair = _assert_pair(body[0], {entry_point}) if len(body) == 1 else None
        if pair is not None and not setup.strip():
            args, kwargs, expected = pair
            calls.append(CallTest(name=name, args=args, kwargs=kwargs, expected=expected))
        else:
            source = f"{setup}\n{line}\n" if setup.strip() else f"{line}\n"
            scripts.append(ScriptTest(name=name, source=source))
    return calls, scripts


def doctest_calls(prompt: str, entry_point: str, *, prefix: str = "doc") -> list[CallTest]:
    """``>>> entry_point(<literals>)`` examples with a literal expected output -> call tests."""
    try:
        module = ast.parse(prompt)
    except SyntaxError:
        return []
    doc = None
    for node in module.body:
        if isinstance(node, ast.FunctionDef) and node.name == entry_point:
            doc = ast.get_docstring(node)
    if not doc:
        return []
    try:
        examples = doctest.DocTestParser().get_examples(doc)
    except ValueError:
        return []
    out: list[CallTest] = []
    for ex in examples:
        try:
            expr = ast.parse(ex.source.strip(), mode="eval").body
        except SyntaxError:
            continue
        call = literal_call(expr, {entry_point})
        if call is None or not ex.want.strip():
            continue
        try:
            want = ast.parse(ex.want.strip(), mode="eval").body
        except SyntaxError:
            continue
        ok, expected = _literal(want)
        if ok:
            out.append(
                CallTest(
                    name=f"{prefix}{len(out)}",
                    args=call[0],
                    kwargs=call[1],
                    expected=encode(expected, strict=True),
                )
            )
    return out


def expand_script(source: str, *, prefix: str = "") -> list[ScriptTest]:
    """One script test per test found in ``source``: ``check``, ``test_*`` functions and
    ``test*`` methods of classes (unittest.TestCase subclasses). Found statically, so the harness
    can account for every test that was expected to run."""
    try:
        module = ast.parse(source)
    except SyntaxError as e:
        raise ValueError(f"test script does not parse: {e}") from None
    found: list[str] = []
    for node in module.body:
        if isinstance(node, ast.FunctionDef) and (
            node.name == "check" or node.name.startswith("test")
        ):
            found.append(node.name)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name.startswith("test"):
                    found.append(f"{node.name}.{item.name}")
    if not found:
        return [ScriptTest(name=prefix or "script", source=source)]
    return [ScriptTest(name=f"{prefix}{n}", source=source, call=n) for n in found]
