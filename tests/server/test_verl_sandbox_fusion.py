"""verl's own SandboxFusion client (from the ``verl`` wheel, unmodified) against a live server.

verl's top-level package imports ray and torch; its ``reward_score.sandbox_fusion`` modules need
only ``requests``. We import those modules from the installed wheel without running the parent
packages' ``__init__`` (empty stand-in parents with the real ``__path__``), so the code under test
is verl's file as shipped.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from live import LiveServer

from sandloop.server import ServerConfig


def _verl_sandbox_fusion() -> Any:
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("verl is not installed (pip install --no-deps verl)")
    root = Path(next(iter(spec.submodule_search_locations)))
    saved = {k: v for k, v in sys.modules.items() if k == "verl" or k.startswith("verl.")}
    try:
        for name, sub in (("verl", ""), ("verl.utils", "utils"),
                          ("verl.utils.reward_score", "utils/reward_score")):
            if name not in sys.modules:
                m = types.ModuleType(name)
                m.__path__ = [str(root / sub)]
                sys.modules[name] = m
        return importlib.import_module("verl.utils.reward_score.sandbox_fusion")
    finally:
        for k in [k for k in sys.modules if k == "verl" or k.startswith("verl.")]:
            if k not in saved and not k.startswith("verl.utils.reward_score.sandbox_fusion"):
                del sys.modules[k]


ECHO_SUM = "a, b = map(int, input().split())\nprint(a + b)\n"


def test_verl_check_correctness(server: LiveServer) -> None:
    sfm = _verl_sandbox_fusion()
    utils = sys.modules["verl.utils.reward_score.sandbox_fusion.utils"]
    url = f"{server.url}/run_code"
    io = {"inputs": ["1 2\n", "5 7\n"], "outputs": ["3\n", "12\n"]}
    res, meta = utils.check_correctness(url, io, ECHO_SUM, timeout=5, memory_limit_mb=256)
    assert res == [True, True], meta
    res, meta = utils.check_correctness(url, io, "print(3)", timeout=5)
    assert res == [True, False] and meta[1]["status"] == "wrong_answer"
    res, meta = utils.check_correctness(url, io, "raise ValueError()", timeout=5)
    assert res == [-2, -2] and meta[0]["status"] == "runtime_error"
    res, meta = utils.check_correctness(url, {"inputs": ["1 2\n"], "outputs": ["3\n"]},
                                        "while True: pass", timeout=1)
    assert res == [-3] and meta[0]["status"] == "timeout"
    cpp_ok = "#include <cstdio>\nint main(){int a,b;scanf(\"%d %d\",&a,&b);printf(\"%d\\n\",a+b);}"
    res, _ = utils.check_correctness(url, io, cpp_ok, timeout=10, language="cpp")
    assert res == [True, True]
    res, meta = utils.check_correctness(url, io, "int main({", timeout=10, language="cpp")
    assert res == [-4, -4] and meta[0]["status"] == "compile_error"
    # Memory blow-up: a failed run (runtime error in verl's terms), not a sandbox error.
    res, _ = utils.check_correctness(url, {"inputs": [""], "outputs": [""]},
                                     "x = bytearray(400 << 20)", timeout=5, memory_limit_mb=64)
    assert res == [-2]
    # verl's compute_score (continuous): the fraction of the first 10 tests passed.
    score, _ = sfm.compute_score(url, None, 256, f"```python\n{ECHO_SUM}```",
                                 json.dumps(io), continuous=True, timeout=5)
    assert score == 1.0
    # Languages sandloop does not run are a SandboxError (-1), not the program's fault.
    resp, err = utils.call_sandbox_api(url, "<?php echo 1;", None, 5, 5, 256, language="php")
    assert err is None and resp["status"] == "SandboxError"


def test_verl_with_key_in_url(tmp_path: Path) -> None:
    from sandloop.server import add_key

    keys = tmp_path / "keys.json"
    token = add_key(keys, "verl-run")
    sfm = _verl_sandbox_fusion()
    utils = sys.modules["verl.utils.reward_score.sandbox_fusion.utils"]
    with LiveServer(ServerConfig(slots=2), keys_file=keys) as srv:
        io = {"inputs": ["1 2\n"], "outputs": ["3\n"]}
        res, meta = utils.check_correctness(f"{srv.url}/run_code", io, ECHO_SUM, timeout=5)
        assert res == [-1] and "401" in str(meta[0]["api_request_error"])
        res, _ = utils.check_correctness(f"{srv.url}/k/{token}/run_code", io, ECHO_SUM, timeout=5)
        assert res == [True]
        assert sfm.compute_score(f"{srv.url}/run_code?api_key={token}", None, 256,
                                 f"```python\n{ECHO_SUM}```", json.dumps(io))[0] == 1.0
