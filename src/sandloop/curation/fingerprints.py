"""Fingerprints of tasks for near-duplicate and contamination checks (pure).

Code is compared after canonicalisation: docstrings dropped, every name the code itself binds
(functions, arguments, assigned variables, loop targets, imports' aliases) renamed by order of
first appearance, then printed by ``ast.unparse`` — so renamed identifiers, reformatting and
comments do not change it; builtins and library names are kept, so ``len(x)`` and ``sum(x)``
still differ. Prompts are compared as case-folded word sequences (Unicode words; in scripts
written without spaces, such as Chinese or Thai, each character is a word) with the task's own
identifiers replaced by one placeholder and all whitespace collapsed.
"""

from __future__ import annotations

import ast
import hashlib
import re
import unicodedata
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sandloop.curation.degenerate import entry_signature
from sandloop.reward.assemble import assemble
from sandloop.tasks import Task

__all__ = [
    "Fingerprint",
    "Match",
    "canonical_code",
    "code_tokens",
    "contamination",
    "fingerprint",
    "near_duplicates",
    "ngrams",
    "prompt_words",
]

# Scripts written without spaces between words: a run of them is one "word" of a whole
# sentence, which no other prompt shares, so each character counts as a word instead (word
# n-grams become character n-grams there). Hiragana, katakana, CJK ideographs (and their
# extensions), bopomofo, Thai, Lao, Myanmar, Khmer.
_SPACELESS = re.compile("[\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff"
                        "\u3100-\u312f\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
                        "\U00020000-\U0003ffff]")
_TOKEN = re.compile(r"\w+|[^\w\s]")
_ASCII_WORD = re.compile(r"[a-z0-9_]+")


class _Binder(ast.NodeVisitor):
    """Collects the names a program binds, in order of first appearance."""

    def __init__(self) -> None:
        self.names: dict[str, None] = {}

    def add(self, name: str) -> None:
        self.names.setdefault(name, None)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.add(node.name)
        self.generic_visit(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self.add(node.name)
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.add(node.name)
        self.generic_visit(node)

    def visit_arg(self, node: ast.arg) -> None:
        self.add(node.arg)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Store | ast.Del):
            self.add(node.id)

    def visit_alias(self, node: ast.alias) -> None:
        if node.asname:
            self.add(node.asname)


class _Renamer(ast.NodeTransformer):
    def __init__(self, mapping: dict[str, str]) -> None:
        self.mapping = mapping

    def _name(self, name: str) -> str:
        return self.mapping.get(name, name)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        node.name = self._name(node.name)
        _drop_docstring(node)
        return self.generic_visit(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.AST:
        node.name = self._name(node.name)
        _drop_docstring(node)
        return self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:
        node.name = self._name(node.name)
        _drop_docstring(node)
        return self.generic_visit(node)

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.arg = self._name(node.arg)
        node.annotation = None
        return node

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = self._name(node.id)
        return node

    def visit_alias(self, node: ast.alias) -> ast.AST:
        if node.asname:
            node.asname = self._name(node.asname)
        return node


def _drop_docstring(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Module
                    ) -> None:
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        node.body = body[1:] or [ast.Pass()]


def bound_names(code: str) -> list[str]:
    """Names ``code`` binds, in order of first appearance (empty if it does not parse)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return []
    b = _Binder()
    b.visit(tree)
    return list(b.names)


def canonical_code(code: str) -> str | None:
    """``code`` with docstrings dropped and its own names renamed ``v0, v1, ...``; None if it
    does not parse."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return None
    b = _Binder()
    b.visit(tree)
    mapping = {name: f"v{i}" for i, name in enumerate(b.names)}
    _drop_docstring(tree)
    tree = _Renamer(mapping).visit(tree)
    return ast.unparse(tree)


def code_tokens(code: str) -> list[str]:
    """Tokens of the canonical form of ``code`` (of the raw text when it does not parse)."""
    return _TOKEN.findall(canonical_code(code) or code)


def _words(text: str) -> list[str]:
    """Case-folded (NFKC) words of ``text``: runs of letters, digits, marks and ``_``, except
    that each character of a spaceless script is a word of its own."""
    if text.isascii():  # NFKC and casefold change nothing there but case: the same words
        return _ASCII_WORD.findall(text.lower())
    out: list[str] = []
    word: list[str] = []
    for ch in unicodedata.normalize("NFKC", text).casefold():
        if _SPACELESS.match(ch):
            if word:
                out.append("".join(word))
                word = []
            out.append(ch)
        elif ch == "_" or unicodedata.category(ch)[0] in "LNM":
            # Marks too: Devanagari's vowel signs and other combining marks are inside words.
            word.append(ch)
        elif word:
            out.append("".join(word))
            word = []
    if word:
        out.append("".join(word))
    return out


def prompt_words(text: str, identifiers: Iterable[str] = ()) -> list[str]:
    """Case-folded words of ``text``; words in ``identifiers`` become the placeholder ``_id``."""
    ids = {w for i in identifiers for w in _words(i)}
    return ["_id" if w in ids else w for w in _words(text)]


def ngrams(tokens: Sequence[str], n: int, *, whole_if_short: bool = True
           ) -> set[tuple[str, ...]]:
    """The set of ``n``-grams of ``tokens``; a shorter non-empty sequence is its own one n-gram
    (none with ``whole_if_short=False``)."""
    if not tokens:
        return set()
    if len(tokens) < n:
        return {tuple(tokens)} if whole_if_short else set()
    return {tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)}


@dataclass(frozen=True)
class Fingerprint:
    """What the duplicate and contamination checks compare of one task."""

    id: str
    prompt: tuple[str, ...]
    prompt_raw: tuple[str, ...]
    solution: tuple[str, ...]
    solution_hash: str | None


def fingerprint(task: Task) -> Fingerprint:
    """The fingerprint of ``task``: its prompt words (prompt, or starter code when the prompt is
    empty) with and without the entry point's and its parameters' names replaced, and the
    canonical tokens of its assembled reference solution."""
    ref = assemble(task, task.reference_solution).source if task.reference_solution else None
    sig = entry_signature(task)
    ids = set(_words(sig[0])) - {"def"} if sig else set()
    if task.entry_point:
        ids.update(_words(task.entry_point))
    text = task.prompt or task.starter_code
    words = tuple(prompt_words(text, ids))
    canon = canonical_code(ref) if ref is not None else None
    sol = tuple(_TOKEN.findall(canon or ref or ""))
    digest = hashlib.sha256(canon.encode()).hexdigest()[:16] if canon else None
    return Fingerprint(id=task.id, prompt=words, prompt_raw=tuple(prompt_words(text)),
                       solution=sol, solution_hash=digest)


@dataclass(frozen=True)
class Match:
    """``id`` resembles the earlier ``other`` (similarity in [0, 1] and what matched);
    ``other_index`` is ``other``'s position in the sequence it was found in (ids may repeat
    across sets, so the position says which set it is from)."""

    id: str
    other: str
    similarity: float
    why: str
    other_index: int = -1


def _jaccard(a: set[tuple[str, ...]], b: set[tuple[str, ...]]) -> float:
    if not a or not b:
        return 0.0
    return len(a & b) / len(a | b)


def near_duplicates(
    prints: Sequence[Fingerprint], *, first_new: int = 0, shingle: int = 5,
    prompt_threshold: float = 0.8, same_solution_threshold: float = 0.3,
) -> list[Match]:
    """Each fingerprint from index ``first_new`` on that nearly duplicates an earlier one.

    A later task duplicates an earlier one when their prompts' word ``shingle``-grams have
    Jaccard similarity >= ``prompt_threshold``, or when their canonical solutions are identical
    and the prompts' similarity is >= ``same_solution_threshold``. Fingerprints before
    ``first_new`` (an ``--against`` set) are only matched against, never flagged.
    """
    index: dict[tuple[str, ...], list[int]] = defaultdict(list)
    by_solution: dict[str, list[int]] = defaultdict(list)
    sets = [ngrams(p.prompt, shingle) for p in prints]
    out: list[Match] = []
    for i, p in enumerate(prints):
        if i >= first_new:
            candidates: set[int] = set()
            for g in sets[i]:
                candidates.update(index.get(g, ()))
            if p.solution_hash:
                candidates.update(by_solution.get(p.solution_hash, ()))
            best: Match | None = None
            for j in sorted(candidates):
                sim = _jaccard(sets[i], sets[j])
                same_sol = p.solution_hash is not None and p.solution_hash == prints[j].solution_hash
                if sim >= prompt_threshold:
                    why = f"prompt similarity {sim:.2f}" + (", same solution" if same_sol else "")
                elif same_sol and sim >= same_solution_threshold:
                    why = f"same solution, prompt similarity {sim:.2f}"
                else:
                    continue
                if best is None or sim > best.similarity:
                    best = Match(id=p.id, other=prints[j].id, similarity=sim, why=why,
                                 other_index=j)
            if best is not None:
                out.append(best)
        for g in sets[i]:
            index[g].append(i)
        if p.solution_hash:
            by_solution[p.solution_hash].append(i)
    return out


def contamination(
    evals: Sequence[Fingerprint], trains: Sequence[Fingerprint], *, n: int = 13,
    overlap: float = 0.2,
) -> list[Match]:
    """Eval fingerprints whose prompt or solution shares long n-grams with one train fingerprint.

    For each eval task, the share of its prompt ``n``-grams (and separately of its solution
    token ``n``-grams) found in a single train task is computed; at least ``overlap`` of either
    flags it, naming the train task with the largest share. A solution shorter than ``n``
    tokens has no n-grams: canonical code that short (``def v0(v1, v2): return v1 + v2``) is
    shared by unrelated tasks and shows no leak. A fingerprint is never matched with itself
    (the same object in both sequences); an equal one with the same id is another task.
    """
    out: list[tuple[int, Match]] = []
    # Leaks are literal: prompts are compared as written (no identifier replacement). A short
    # prompt is its own n-gram: a whole prompt found verbatim is a leak, however short.
    for kind in ("prompt_raw", "solution"):
        whole = kind == "prompt_raw"
        index: dict[tuple[str, ...], set[int]] = defaultdict(set)
        for j, t in enumerate(trains):
            for g in ngrams(getattr(t, kind), n, whole_if_short=whole):
                index[g].add(j)
        for i, e in enumerate(evals):
            grams = ngrams(getattr(e, kind), n, whole_if_short=whole)
            if not grams:
                continue
            counts: dict[int, int] = defaultdict(int)
            for g in grams:
                for j in index.get(g, ()):
                    if trains[j] is not e:
                        counts[j] += 1
            if not counts:
                continue
            j, c = max(counts.items(), key=lambda kv: (kv[1], -kv[0]))
            share = c / len(grams)
            if share >= overlap:
                what = "prompt" if kind == "prompt_raw" else kind
                out.append((i, Match(id=e.id, other=trains[j].id, similarity=share,
                                     why=f"{share:.0%} of its {what} {n}-grams",
                                     other_index=j)))
    # One match per eval task: the larger share.
    best: dict[int, Match] = {}
    for i, m in out:
        if i not in best or m.similarity > best[i].similarity:
            best[i] = m
    return [best[i] for i in sorted(best)]
