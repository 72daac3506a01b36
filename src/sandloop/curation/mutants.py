"""AST mutants of a reference solution, for mutation testing of a task's tests (pure).

A test suite that passes a changed program has not pinned down the behaviour that changed. The
mutation operators are the classic ones: comparison and arithmetic operator swaps, boolean
operator swaps, off-by-one integer constants and indexes, flipped booleans, swapped library
calls (``min``/``max``, ``any``/``all``, ``upper``/``lower``, ...), dropped statements, dropped
``if``/``else`` branches and changed return values (None, constants, negated, off by one). Only code inside function bodies is mutated
(docstrings are left alone). Mutants are deduplicated by their source and never equal the
original text; an equivalent mutant (same behaviour, different code) cannot be told apart and
counts as a survivor, so the score is a lower bound.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Callable, Iterator

from pydantic import BaseModel, ConfigDict

__all__ = ["Mutant", "generate_mutants"]


class Mutant(BaseModel):
    """One mutated program: its full source and what was changed where."""

    model_config = ConfigDict(frozen=True)

    source: str
    description: str
    operator: str


_CMP_SWAPS: dict[type[ast.cmpop], tuple[type[ast.cmpop], ...]] = {
    ast.Lt: (ast.LtE, ast.Gt),
    ast.LtE: (ast.Lt, ast.GtE),
    ast.Gt: (ast.GtE, ast.Lt),
    ast.GtE: (ast.Gt, ast.LtE),
    ast.Eq: (ast.NotEq,),
    ast.NotEq: (ast.Eq,),
    ast.In: (ast.NotIn,),
    ast.NotIn: (ast.In,),
    ast.Is: (ast.IsNot,),
    ast.IsNot: (ast.Is,),
}
_BIN_SWAPS: dict[type[ast.operator], tuple[type[ast.operator], ...]] = {
    ast.Add: (ast.Sub,),
    ast.Sub: (ast.Add,),
    ast.Mult: (ast.FloorDiv, ast.Add),
    ast.Div: (ast.Mult,),
    ast.FloorDiv: (ast.Mult, ast.Div),
    ast.Mod: (ast.FloorDiv,),
    ast.Pow: (ast.Mult,),
    ast.BitAnd: (ast.BitOr,),
    ast.BitOr: (ast.BitAnd,),
    ast.LShift: (ast.RShift,),
    ast.RShift: (ast.LShift,),
}
_SYM: dict[type[ast.AST], str] = {
    ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
    ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not", ast.Add: "+",
    ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**",
    ast.BitAnd: "&", ast.BitOr: "|", ast.LShift: "<<", ast.RShift: ">>", ast.And: "and",
    ast.Or: "or",
}

# A site: (operator name, description, the edit to apply to the node found at the same position
# in a fresh copy of the tree).
_Edit = Callable[[ast.AST], None]
_Site = tuple[str, str, _Edit]


def _is_docstring(stmt: ast.stmt) -> bool:
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
            and isinstance(stmt.value.value, str))


def _set_op(field: str, new: type[ast.AST], index: int | None = None) -> _Edit:
    def edit(node: ast.AST) -> None:
        if index is None:
            setattr(node, field, new())
        else:
            getattr(node, field)[index] = new()
    return edit


def _set_attr(field: str, value: object) -> _Edit:
    def edit(node: ast.AST) -> None:
        setattr(node, field, value)
    return edit


def _drop(field: str, index: int) -> _Edit:
    def edit(node: ast.AST) -> None:
        body = getattr(node, field)
        body[index] = ast.Pass()
    return edit


def _sites(node: ast.AST) -> Iterator[_Site]:
    """The mutations possible at ``node`` itself (not its children)."""
    line = getattr(node, "lineno", "?")
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            for new in _CMP_SWAPS.get(type(op), ()):
                yield ("comparison", f"line {line}: {_SYM[type(op)]} -> {_SYM[new]}",
                       _set_op("ops", new, i))
    elif isinstance(node, ast.BinOp | ast.AugAssign):
        for new_op in _BIN_SWAPS.get(type(node.op), ()):
            yield ("arithmetic", f"line {line}: {_SYM[type(node.op)]} -> {_SYM[new_op]}",
                   _set_op("op", new_op))
    elif isinstance(node, ast.BoolOp):
        new_b: type[ast.boolop] = ast.Or if isinstance(node.op, ast.And) else ast.And
        yield ("boolean", f"line {line}: {_SYM[type(node.op)]} -> {_SYM[new_b]}",
               _set_op("op", new_b))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        yield ("boolean", f"line {line}: 'not' dropped", _unwrap_not)
    elif isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, bool):
            yield ("constant", f"line {line}: {v} -> {not v}", _set_attr("value", not v))
        elif isinstance(v, int):
            yield ("constant", f"line {line}: {v} -> {v + 1}", _set_attr("value", v + 1))
            yield ("constant", f"line {line}: {v} -> {v - 1}", _set_attr("value", v - 1))
    elif isinstance(node, ast.Return) and node.value is not None and not (
        isinstance(node.value, ast.Constant) and node.value.value is None
    ):
        yield ("return", f"line {line}: return value -> None", _set_attr("value", None))
        for text in _RETURNS:
            yield ("return", f"line {line}: return value -> {text.format(e='...')}",
                   _return_expr(text))
    elif isinstance(node, ast.Call):
        name = node.func.id if isinstance(node.func, ast.Name) else (
            node.func.attr if isinstance(node.func, ast.Attribute) else None)
        if name in _CALL_SWAPS:
            yield ("call", f"line {line}: {name}() -> {_CALL_SWAPS[name]}()",
                   _swap_call(_CALL_SWAPS[name]))
    elif isinstance(node, ast.Subscript) and not isinstance(node.slice, ast.Slice) and \
            isinstance(node.ctx, ast.Load):
        for op_, sym in ((ast.Add, "+"), (ast.Sub, "-")):
            yield ("index", f"line {line}: index {sym} 1", _shift_index(op_))
    if isinstance(node, ast.If):
        if node.orelse:
            yield ("branch", f"line {line}: else branch dropped", _set_attr("orelse", []))
        yield ("branch", f"line {line}: if branch dropped", _set_attr("body", [ast.Pass()]))
    for field in ("body", "orelse", "finalbody"):
        stmts = getattr(node, field, None)
        if not isinstance(stmts, list):
            continue
        for i, stmt in enumerate(stmts):
            if _is_docstring(stmt) or isinstance(stmt, ast.Pass | ast.FunctionDef |
                                                 ast.AsyncFunctionDef | ast.ClassDef):
                continue
            if isinstance(node, ast.If) and field == "body" and len(stmts) == 1:
                continue  # the same as dropping the branch
            yield ("statement", f"line {getattr(stmt, 'lineno', '?')}: statement dropped",
                   _drop(field, i))


# Changed return values besides None (``{e}`` is the original expression).
_RETURNS = ("0", "1", "''", "[]", "True", "False", "not ({e})", "({e}) + 1", "({e}) - 1")
_CALL_SWAPS = {
    "min": "max", "max": "min", "any": "all", "all": "any", "sum": "len", "sorted": "list",
    "upper": "lower", "lower": "upper", "startswith": "endswith", "endswith": "startswith",
    "isupper": "islower", "islower": "isupper", "lstrip": "rstrip", "rstrip": "lstrip",
    "find": "rfind", "rfind": "find", "floor": "ceil", "ceil": "floor", "abs": "int",
}


def _return_expr(text: str) -> _Edit:
    def edit(node: ast.AST) -> None:
        assert isinstance(node, ast.Return) and node.value is not None
        expr = ast.parse(text.format(e=ast.unparse(node.value)), mode="eval").body
        node.value = expr
    return edit


def _swap_call(new: str) -> _Edit:
    def edit(node: ast.AST) -> None:
        assert isinstance(node, ast.Call)
        if isinstance(node.func, ast.Name):
            node.func.id = new
        elif isinstance(node.func, ast.Attribute):
            node.func.attr = new
    return edit


def _shift_index(op: type[ast.operator]) -> _Edit:
    def edit(node: ast.AST) -> None:
        assert isinstance(node, ast.Subscript)
        node.slice = ast.BinOp(left=node.slice, op=op(), right=ast.Constant(1))
    return edit


def _unwrap_not(node: ast.AST) -> None:
    # ``not x`` becomes ``not not x``: same type, opposite truth, and the parent keeps its node.
    assert isinstance(node, ast.UnaryOp)
    node.operand = ast.UnaryOp(op=ast.Not(), operand=node.operand)


def _function_nodes(tree: ast.Module, module_level: bool = False,
                    skip: frozenset[str] = frozenset()) -> list[ast.AST]:
    """Every node inside a function body (docstrings excluded), in a stable order; with
    ``module_level``, the module's own statements too (a whole program). Top-level functions
    named in ``skip`` (and what they contain) are left out."""
    out: list[ast.AST] = []
    skipped = {id(n) for top in tree.body
               if isinstance(top, ast.FunctionDef | ast.AsyncFunctionDef) and top.name in skip
               for n in ast.walk(top)}
    if module_level:
        out.append(tree)  # its statements are sites
        for stmt in tree.body:
            if not _is_docstring(stmt) and not isinstance(stmt, ast.FunctionDef |
                                                          ast.AsyncFunctionDef | ast.ClassDef):
                out.extend(n for n in ast.walk(stmt)
                           if not isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and id(fn) not in skipped:
            out.append(fn)  # its own body statements are sites
            for stmt in fn.body:
                if not _is_docstring(stmt):
                    out.extend(n for n in ast.walk(stmt)
                               if not isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))
    return out


def generate_mutants(source: str, *, limit: int = 30, module_level: bool = False,
                     skip: frozenset[str] = frozenset()) -> list[Mutant]:
    """Up to ``limit`` distinct mutants of ``source`` (a whole Python program), spread over all
    the mutation sites (every k-th site when there are more than ``limit``). Empty when the
    source does not parse or has no function to mutate. ``module_level`` also mutates the
    module's top-level statements (for stdin/stdout programs). Top-level functions named in
    ``skip`` are not mutated (helpers the task's prompt gives, which its tests use too)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    original = ast.unparse(tree)
    nodes = _function_nodes(tree, module_level, skip)
    sites: list[tuple[int, _Site]] = [(i, s) for i, n in enumerate(nodes) for s in _sites(n)]
    out: list[Mutant] = []
    seen = {original}
    # Spread the sample over the whole program: with too many sites, take every k-th first and
    # fill up from the rest.
    step = max(1, len(sites) // max(1, limit))
    order = list(range(0, len(sites), step)) + [i for i in range(len(sites)) if i % step]
    for k in order:
        if len(out) >= limit:
            break
        index, (op, desc, edit) = sites[k]
        mutated = copy.deepcopy(tree)
        edit(_function_nodes(mutated, module_level, skip)[index])
        try:
            text = ast.unparse(ast.fix_missing_locations(mutated))
            compile(text, "<mutant>", "exec")
        except (SyntaxError, ValueError, TypeError, RecursionError):
            continue
        if text in seen:
            continue
        seen.add(text)
        out.append(Mutant(source=text, description=desc, operator=op))
    return out
