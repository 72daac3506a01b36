"""Typed signatures of Java, Go, Rust and TypeScript function tasks (pure)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sandloop.reward.call_harness import call_harness
from sandloop.tasks import CallTest, Task
from sandloop.tasks.signature import SignatureError, check_value, parse_type


def test_types_parse_and_print() -> None:
    assert str(parse_type(" list[ list[int] ] ")) == "list[list[int]]"
    assert parse_type("list[list[str]]").depth == 2 and parse_type("float").scalar == "float"
    for bad in ("integer", "list", "list[int", "list[int]]", "dict[str,int]", ""):
        with pytest.raises(SignatureError):
            parse_type(bad)


def test_values_must_fit_their_types() -> None:
    assert check_value(parse_type("list[float]"), [1, 2.5, {"$float": "nan"}], "a")[:2] == [1, 2.5]
    for t, v in [("int", True), ("int", 1.0), ("int", 2**63), ("bool", 1), ("str", [1]),
                 ("list[int]", {"$tuple": [1]}), ("float", 2**60), ("str", "\ud800")]:
        with pytest.raises(SignatureError):
            check_value(parse_type(t), v, "a")


def _task(lang: str, **kw: object) -> Task:
    fields: dict[str, object] = {
        "id": "t", "language": lang, "entry_point": "f",
        "signature": {"params": ["list[int]"], "returns": "int"},
        "hidden_tests": [CallTest(name="a", args=[[1, 2]], expected=3)]}
    fields.update(kw)
    return Task.model_validate(fields)


@pytest.mark.parametrize("lang", ["java", "go", "rust", "typescript"])
def test_typed_function_tasks_are_checked_when_loaded(lang: str) -> None:
    assert _task(lang).signature is not None
    cases: list[tuple[dict[str, object], str]] = [
        ({"signature": None}, "needs a signature"),
        ({"hidden_tests": [CallTest(name="a", args=[["x"]], expected=3)]}, "argument 0"),
        ({"hidden_tests": [CallTest(name="a", args=[[1]], expected="3")]}, "expected"),
        ({"hidden_tests": [CallTest(name="a", args=[], expected=3)]}, "0 arguments"),
        ({"hidden_tests": [CallTest(name="a", args=[[1]], kwargs={"b": 1}, expected=3)]},
         "keyword"),
        ({"entry_point": "f(); evil"}, "not an identifier"),
    ]
    for kw, says in cases:
        with pytest.raises(ValidationError, match=says):
            _task(lang, **kw)


def test_typescript_ints_stay_exact() -> None:
    _task("go", hidden_tests=[CallTest(name="a", args=[[2**62]], expected=3)])
    with pytest.raises(ValidationError, match="range of int"):
        _task("typescript", hidden_tests=[CallTest(name="a", args=[[2**62]], expected=3)])


def test_signature_only_where_it_is_used() -> None:
    with pytest.raises(ValidationError, match="signature is used only"):
        _task("python")
    with pytest.raises(ValidationError, match="supported for python"):
        _task("c", signature=None)
    # Stored task versions without the field are unchanged.
    plain = Task(id="p", entry_point="f", hidden_tests=[CallTest(name="a", args=[1])])
    assert "signature" not in plain.model_dump(exclude_none=True)


@pytest.mark.parametrize("lang", ["java", "go", "rust", "typescript"])
def test_string_literals_survive_each_languages_escapes(lang: str) -> None:
    # Quotes, backslashes, newlines, a NUL, non-ASCII and an astral character: never raw in
    # the generated source, where they could end a literal (Java reads \\u escapes first).
    tricky = 'a"b\\c\nd\x00e\u00e9\U0001F600\u2028'
    h = call_harness(lang, "", "f", ["str"], "str", [[tricky]])
    main = next(iter(h.files.values())) if lang != "typescript" else h.files["main.ts"]
    line = next(ln for ln in main.splitlines() if "f(" in ln and "a" in ln and "b" in ln)
    for raw in ("\n", "\x00", "\u00e9", "\U0001F600", "\u2028"):
        assert raw not in line
    if lang == "java":
        assert "\\u000a" not in line and "\\u0022" not in line and "\\u005c" not in line

