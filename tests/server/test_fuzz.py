"""Schemathesis fuzzing of the OpenAPI description against a live server: no 5xx, no crash,
and every reply, errors included (404/405/413/422 too), in the shape the description gives
(errors: ErrorBody, ``{"error", "code"}``).

Runs the schemathesis CLI (its pytest plugin does not load under this pytest) against a real
server on 127.0.0.1 with small limits so generated programs cannot run long.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import httpx
from live import LiveServer

from sandloop.server import ServerConfig


def test_no_server_errors(tmp_path: Path) -> None:
    st = shutil.which("st", path=str(Path(sys.executable).parent)) or "st"
    with LiveServer(ServerConfig(slots=2, max_time_s=2, max_memory_mb=256)) as srv:
        p = subprocess.run(
            [st, "run", f"{srv.url}/openapi.json", "--checks",
             "not_a_server_error,response_schema_conformance,content_type_conformance,"
             "status_code_conformance,unsupported_method",
             "--max-examples", "6", "--request-timeout", "30", "--no-color",
             "--suppress-health-check", "all", "--phases", "examples,fuzzing"],
            capture_output=True, text=True, timeout=240, cwd=tmp_path)
        assert httpx.get(f"{srv.url}/healthz").status_code == 200  # still alive
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    assert "Tested:" in p.stdout and "failed" not in p.stdout.split("Test cases:")[-1]
