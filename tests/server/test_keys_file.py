"""A keys file that is not one (nested thousands deep, a JSON array, not UTF-8) is a
KeysFileError naming the file, for the loader, for ``add_key`` and for ``sandloop serve`` /
``sandloop add-key`` (exit 2, one line), never a RecursionError or an internal error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandloop.server.auth import KeysFileError, KeyStore, add_key

BAD = {
    "deep.json": b"[" * 100_000 + b"]" * 100_000,
    "deepobj.json": b'{"keys": ' + b'{"a": ' * 50_000 + b"1" + b"}" * 50_000 + b"}",
    "array.json": b'[{"id": "a", "sha256": "' + b"0" * 64 + b'"}]',
    "number.json": b"5",
    "notutf8.json": bytes(range(256)),
}


@pytest.fixture
def bad_files(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for name, data in BAD.items():
        (tmp_path / name).write_bytes(data)
        out[name] = tmp_path / name
    return out


def test_load_refuses_what_is_not_a_keys_file(bad_files: dict[str, Path]) -> None:
    for name, path in bad_files.items():
        with pytest.raises(KeysFileError) as e:
            KeyStore.load(path)
        assert str(path) in str(e.value), name
        assert "\n" not in str(e.value)
    with pytest.raises(KeysFileError, match="nested too deeply"):
        KeyStore.load(bad_files["deep.json"])


def test_add_key_refuses_and_leaves_the_file_alone(bad_files: dict[str, Path]) -> None:
    for name, path in bad_files.items():
        before = path.read_bytes()
        with pytest.raises(KeysFileError):
            add_key(path, "new")
        assert path.read_bytes() == before, name


def test_add_key_still_adds_to_a_good_file(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    add_key(path, "a")
    add_key(path, "b", max_runs=3)
    assert [p.id for p in KeyStore.load(path).policies()] == ["a", "b"]
    assert [k["id"] for k in json.loads(path.read_text())["keys"]] == ["a", "b"]


@pytest.mark.parametrize("name", ["deep.json", "array.json"])
def test_cli_serve_and_add_key_exit_2(bad_files: dict[str, Path], name: str,
                                      tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    for argv in (["serve", "--port", "1", "--api-keys-file", str(bad_files[name])],
                 ["add-key", "--keys-file", str(bad_files[name]), "--id", "x"]):
        r = subprocess.run([sys.executable, "-m", "sandloop", *argv], capture_output=True,
                           text=True, timeout=60, cwd=tmp_path, env=env)
        assert r.returncode == 2, (argv, r.stderr)
        assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("sandloop: error: "), r.stderr
        assert name in lines[0], r.stderr
