"""Environment specs: exact pins only, locks, reserved variables, file paths, YAML, built-ins."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandloop.envs import SpecError, builtin_spec, load_spec, parse_spec
from sandloop.envs.spec import Pin

H = "sha256:" + "a" * 64


def test_pin_parses_name_version_and_hashes() -> None:
    p = Pin.parse(f"NumPy==2.4.6 --hash={H}")
    assert (p.name, p.version, p.hashes) == ("numpy", "2.4.6", (H,))
    assert p.requirement() == f"numpy==2.4.6 --hash={H}"


@pytest.mark.parametrize("bad", ["numpy", "numpy>=2", "numpy==2.*", "numpy[extra]==1.0",
                                 "numpy~=2.4", "numpy==2.4 --hash=md5:abc"])
def test_loose_or_odd_pins_are_refused(bad: str) -> None:
    with pytest.raises(SpecError):
        Pin.parse(bad)


def test_toml_spec_with_lock_file(tmp_path: Path) -> None:
    (tmp_path / "req.lock").write_text(f"# a lock\nsix==1.17.0 \\\n    --hash={H}\n")
    (tmp_path / "e.toml").write_text(
        'name = "data"\n[python]\npackages = ["numpy==2.4.6"]\nlock = "req.lock"\n'
        'preload = ["numpy"]\n[env]\nOMP_NUM_THREADS = "1"\n[determinism]\nhash_seed = 7\n'
        'timezone = "Europe/Paris"\n[files]\n"data/a.txt" = "x"\n')
    spec = load_spec(tmp_path / "e.toml")
    assert spec.python is not None
    assert [p.name for p in spec.python.packages] == ["numpy", "six"]
    assert spec.python.packages[1].hashes == (H,)
    assert spec.determinism.env_vars() == {"PYTHONHASHSEED": "7", "LANG": "C.UTF-8",
                                           "LC_ALL": "C.UTF-8", "TZ": "Europe/Paris"}
    assert spec.determinism.env_vars(hash_seed=3)["PYTHONHASHSEED"] == "3"


def test_yaml_spec(tmp_path: Path) -> None:
    pytest.importorskip("yaml")
    (tmp_path / "e.yaml").write_text("name: y\npython:\n  packages: [six==1.17.0]\n")
    spec = load_spec(tmp_path / "e.yaml")
    assert spec.python is not None and spec.python.packages[0].version == "1.17.0"


@pytest.mark.parametrize("data, needle", [
    ({"name": "Bad Name"}, "name"),
    ({"name": "abcdef12"}, "looks like an environment id"),
    ({"name": "x", "env": {"PYTHONHASHSEED": "1"}}, "determinism"),
    ({"name": "x", "env": {"LD_PRELOAD": "/x.so"}}, "LD_PRELOAD"),
    ({"name": "x", "files": {"../escape": "x"}}, "relative path"),
    ({"name": "x", "files": {"python/bin/python3": "x"}}, "runtimes"),
    ({"name": "x", "files": {"a": "x", "a/b": "y"}}, "'a' and 'a/b' conflict"),
    ({"name": "x", "files": {"d/e/f": "x", "d": "y"}}, "'d' and 'd/e/f' conflict"),
    ({"name": "x", "python": {"packages": ["six==1", "Six==2"]}}, "twice"),
    ({"name": "x", "python": {"version": "3"}}, "major.minor"),
    ({"name": "x", "determinism": {"hash_seed": -1}}, "hash_seed"),
    ({"name": "x", "surprise": 1}, "surprise"),
])
def test_bad_specs_name_the_field(data: dict[str, object], needle: str, tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=needle):
        parse_spec(data, tmp_path)


def test_missing_lock_file_says_paths_are_relative(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="relative to the spec file"):
        parse_spec({"name": "x", "python": {"lock": "nope.lock"}}, tmp_path)


def test_invalid_toml_is_a_spec_error(tmp_path: Path) -> None:
    (tmp_path / "e.toml").write_text("name = \n")
    with pytest.raises(SpecError, match="not valid TOML"):
        load_spec(tmp_path / "e.toml")


def test_builtin_python_is_interpreter_only() -> None:
    spec = builtin_spec("python")
    assert spec.python is not None and spec.python.packages == ()
    assert builtin_spec("c").python is None
    with pytest.raises(SpecError, match="built-ins"):
        builtin_spec("cobol")


def test_probe_outcomes_that_differ_are_reported() -> None:
    from sandloop.envs.probes import PROBES, compare
    probe = PROBES[0]
    same = compare(probe, [("ok", "a\n")] * 4)
    assert same.deterministic and same.variants == (("ok", "a\n", 4),)
    differs = compare(probe, [("ok", "a\n"), ("ok", "b\n"), ("ok", "a\n"), ("timeout", "")])
    assert not differs.deterministic
    assert differs.variants[0] == ("ok", "a\n", 2)  # the most frequent first
    assert {v[:2] for v in differs.variants} == {("ok", "a\n"), ("ok", "b\n"), ("timeout", "")}
