"""Property test of the integrity invariant against a live server on 127.0.0.1: nothing a request
or a program can do yields a 5xx or a ``sandbox_error`` result.

``sandbox_error`` is the infrastructure's fault: its reward is null, excluded from training. A
request or program that could reach it on purpose would dodge its negative rewards, so bad
requests must be 4xx naming the field and program behaviour must be a verdict. Hypothesis
generates requests aimed at the layout of the work dir (file maps with conflicting, long,
non-UTF-8 or escaping names), at the limits (out of range, above what the host gives), at
priorities (beyond 64 bits) and at sessions whose programs sabotage their own work dir before
the next write, read or run. Complements test_fuzz.py (schemathesis, driven by the OpenAPI
description). Bounded: small limits and example counts, so it runs in well under a minute.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, currently_in_test_context, event, given, settings
from hypothesis import strategies as st
from live import LiveServer

from sandloop.server import ServerConfig

SETTINGS = settings(
    max_examples=150, deadline=timedelta(seconds=30), database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                           HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    # A journal, so that a priority or key reaches SQLite if validation lets it through.
    journal = tmp_path_factory.mktemp("fuzz") / "jobs.db"
    config = ServerConfig(slots=2, max_time_s=2, max_memory_mb=256, journal=journal)
    with LiveServer(config) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        yield c
        # Every run the fuzzing caused, streamed or not, is counted here.
        metrics = c.get("/metrics").text
        infra = [ln for ln in metrics.splitlines()
                 if ln.startswith("sandloop_infra_failures_total")]
        assert infra and float(infra[0].split()[-1]) == 0, infra


# -- strategies ---------------------------------------------------------------------------------
# Requests the server accepts (so that programs do run: rejecting everything would test nothing
# but validation), a third of them with one field made invalid.
SAFE_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"),
                    max_size=30)
GOOD_TEXT = st.one_of(SAFE_TEXT, st.sampled_from(["x" * 5000, "é€😀", "", "\n"]))
BAD_TEXT = st.sampled_from(["\udc80", "a\ud800", "\udfff\udfff"])
GOOD_COMPONENT = st.one_of(
    st.sampled_from(["a", "b", "a.txt", "main", "solution.py", "é", "x" * 255, "€" * 85,
                     " ", "-", "\n", ".hidden", "..."]),
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="/\0"),
            min_size=1, max_size=8).filter(lambda c: c not in (".", "..")),
)
GOOD_NAMES = st.lists(GOOD_COMPONENT, min_size=1, max_size=3).map("/".join)
BAD_NAMES = st.one_of(
    st.builds(lambda lead, name: lead + name, st.sampled_from(["/", "./", "../"]), GOOD_NAMES),
    st.builds(lambda name, bad: f"{name}/{bad}", GOOD_NAMES,
              st.sampled_from(["..", ".", "", "\udc80", "a\0b", "x" * 256, "€" * 86])),
    st.just("main.py/x"), st.just("/".join(["d" * 200] * 6)),
)
GOOD_FILES = st.dictionaries(GOOD_NAMES, GOOD_TEXT, max_size=4)
BAD_FILES = st.one_of(
    st.builds(lambda d, n: {**d, n: "x"}, GOOD_FILES, BAD_NAMES),
    st.builds(lambda d, n, t: {**d, n: t}, GOOD_FILES, GOOD_NAMES, BAD_TEXT),
    st.builds(lambda d, n: {**d, n: "1", f"{n}/b": "2"}, GOOD_FILES, GOOD_NAMES),  # conflict
)

# Programs that leave their work dir in a state the next step must survive.
SABOTAGE = [
    "chmod 000 .", "chmod 555 .", "rm -f solution.py; mkdir -p solution.py/x",
    "mkdir -p ro; chmod 000 ro", "ln -sf /etc/passwd link; ln -sfn /etc dir",
    "head -c 20000000 /dev/zero > fill 2>/dev/null; true", "mkfifo fifo",
    "for i in $(seq 100); do : > f$i; done 2>/dev/null; true", "echo x > a", "mkdir -p a/b",
    "rm -rf ./* ./.[!.]* 2>/dev/null; true", "exec 1>&-; exec 2>&-", "kill -9 $$",
    "chmod -R 000 . 2>/dev/null; true", "cat /dev/zero > /tmp/z 2>/dev/null; true",
    "ln -s . loop; mkdir -p x; ln -s ../x x/up",
]
GOOD_PROGRAMS = st.one_of(
    st.sampled_from(["print(1)", "import os; os.chmod('.', 0)", "raise SystemExit(125)",
                     "import os; os.mkdir('main.py')", "open('big', 'wb').write(b'x' * 10**8)",
                     "import os; os.kill(os.getpid(), 9)", "while True: pass",
                     "import sys; sys.stdout.write('\\udc80')", "import os; os.close(1)",
                     "print(open('a').read())", "import sys; sys.exit(-1)"]),
    GOOD_TEXT,
)
# Within the schema and this server's maxima (time 2 s, memory 256 MiB), edges included.
GOOD_LIMIT_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "time_s": st.one_of(st.floats(0.05, 1.5), st.just(1e-9)),
    "cpu_time_s": st.one_of(st.none(), st.floats(0.01, 1.5), st.just(1e-300)),
    "memory_mb": st.integers(8, 256),
    "max_processes": st.integers(1, 4096),
    "cpus": st.floats(0.001, 2),
    "cpu_weight": st.integers(1, 10000),
    "stdout_bytes": st.integers(0, 1 << 20),
    "stderr_bytes": st.integers(0, 1 << 20),
    "output_limit_bytes": st.one_of(st.none(), st.integers(0, 10**30)),
    "workdir_mb": st.integers(1, 4),
    "workdir_inodes": st.integers(16, 64),
    "open_files": st.one_of(st.integers(16, 65536), st.just(65536)),
    "compile_time_s": st.floats(0.1, 2),
    "compile_memory_mb": st.integers(64, 256),
    "compile_output_mb": st.integers(1, 1024),
}
BASE_LIMITS = {"time_s": 1, "memory_mb": 128, "compile_time_s": 2, "compile_memory_mb": 256}
GOOD_LIMITS = st.fixed_dictionaries({}, optional=GOOD_LIMIT_FIELDS).map(
    lambda d: {**BASE_LIMITS, **d})
BAD_LIMITS = st.builds(lambda d, kv: {**d, kv[0]: kv[1]}, GOOD_LIMITS, st.sampled_from([
    ("time_s", -1), ("time_s", 1e300), ("memory_mb", 7), ("memory_mb", 10**6),
    ("open_files", 65537), ("open_files", 2**64), ("workdir_mb", 0), ("cpus", 0),
    ("max_processes", 0), ("bogus", 1), ("workdir_inodes", 2**40), ("stdout_bytes", -1),
]))
GOOD_PRIORITY = st.one_of(st.integers(-(2**31), 2**31 - 1),
                          st.sampled_from(["eval", "train", "background"]))
BAD_PRIORITY = st.one_of(st.integers(2**31, 2**70), st.integers(-(2**70), -(2**31) - 1),
                         st.sampled_from([10**100, -(2**63) - 1, "nope", 1.5, None]))
GOOD_LANGUAGE = st.sampled_from(["python", "python", "bash", "py", "c"])
BAD_LANGUAGE = st.sampled_from(["brainfuck", ""])

RUN = st.fixed_dictionaries({
    "language": GOOD_LANGUAGE, "source": GOOD_PROGRAMS, "files": GOOD_FILES,
    "limits": GOOD_LIMITS, "priority": GOOD_PRIORITY, "stdin": st.none() | GOOD_TEXT,
    "argv": st.lists(GOOD_TEXT, max_size=2), "collect": st.lists(GOOD_NAMES, max_size=2)})
BAD_RUN_FIELD = st.one_of(
    st.tuples(st.just("language"), BAD_LANGUAGE), st.tuples(st.just("source"), BAD_TEXT),
    st.tuples(st.just("files"), BAD_FILES), st.tuples(st.just("limits"), BAD_LIMITS),
    st.tuples(st.just("priority"), BAD_PRIORITY), st.tuples(st.just("stdin"), BAD_TEXT),
    st.tuples(st.just("argv"), st.lists(BAD_TEXT | st.just("a\0b"), min_size=1, max_size=1)),
    st.tuples(st.just("collect"), st.lists(BAD_NAMES, min_size=1, max_size=1)),
)


def spoil(good: st.SearchStrategy[dict[str, Any]],
          bad: st.SearchStrategy[tuple[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """``good``, a third of the time with one field replaced by ``bad``."""
    return st.builds(lambda g, b: g if b is None else {**g, b[0]: b[1]},
                     good, st.one_of(st.none(), st.none(), bad))


FILES = spoil(st.fixed_dictionaries({"f": GOOD_FILES}),
              st.tuples(st.just("f"), BAD_FILES)).map(lambda d: d["f"])
PROGRAMS = spoil(st.fixed_dictionaries({"p": GOOD_PROGRAMS}),
                 st.tuples(st.just("p"), BAD_TEXT)).map(lambda d: d["p"])
NAMES = st.one_of(GOOD_NAMES, GOOD_NAMES, BAD_NAMES)
LIMITS = st.one_of(GOOD_LIMITS, GOOD_LIMITS, BAD_LIMITS)


def post(c: httpx.Client, method: str, url: str, body: dict[str, Any]) -> httpx.Response:
    # ensure_ascii: a lone surrogate travels as the JSON escape "\udc80", as a client sends it.
    return c.request(method, url, content=json.dumps(body, ensure_ascii=True),
                     headers={"content-type": "application/json"})


def check(r: httpx.Response, what: str) -> Any:
    assert r.status_code < 500, f"{what}: {r.status_code} {r.text[:500]}"
    body = r.json() if r.status_code < 400 else {}
    if currently_in_test_context():  # --hypothesis-show-statistics: how much really ran
        event(f"{what.split()[0]}: {r.status_code} {body.get('status', '')}")
    if r.status_code >= 400:
        assert r.json().get("error"), f"{what}: a 4xx must say why: {r.text[:300]}"
        return None
    body = r.json()
    results = body.get("results") if isinstance(body, dict) else None
    for res in results if isinstance(results, list) else [body]:
        if isinstance(res, dict) and "status" in res:
            assert res["status"] != "sandbox_error", f"{what}: {res.get('error')}"
            compiled = res.get("compile") or {}
            assert compiled.get("status") != "sandbox_error", f"{what}: {compiled}"
    return body


# -- properties -----------------------------------------------------------------------------------
@SETTINGS
@given(body=spoil(RUN, BAD_RUN_FIELD))
def test_runs_never_fail_as_the_infrastructure(client: httpx.Client, body: dict[str, Any]) -> None:
    check(post(client, "POST", "/v1/run", body), "run")


@SETTINGS
@given(items=st.lists(spoil(RUN, BAD_RUN_FIELD).map(
    lambda d: {k: v for k, v in d.items() if k != "priority"}), min_size=1, max_size=3))
def test_batches_never_fail_as_the_infrastructure(
        client: httpx.Client, items: list[dict[str, Any]]) -> None:
    check(post(client, "POST", "/v1/batch", {"requests": items}), "batch")


OPS = st.lists(st.one_of(
    st.tuples(st.just("command"), st.one_of(st.sampled_from(SABOTAGE), SAFE_TEXT, BAD_TEXT)),
    st.tuples(st.just("code"), PROGRAMS),
    st.tuples(st.just("write"), FILES),
    st.tuples(st.just("run_files"), FILES),
    st.tuples(st.just("read"), st.lists(NAMES, min_size=1, max_size=3)),
), min_size=1, max_size=6)


@settings(SETTINGS, max_examples=60)
@given(ops=OPS, open_limits=LIMITS)
def test_sessions_survive_what_their_programs_do(
        client: httpx.Client, ops: list[tuple[str, Any]], open_limits: dict[str, Any]) -> None:
    r = post(client, "POST", "/v1/sessions", {"limits": open_limits})
    if check(r, "open") is None:
        return  # invalid limits: refused with a 4xx, as it should be
    sid = r.json()["id"]
    try:
        for op, arg in ops:
            what = f"{op} {arg!r}"[:200]
            if op in ("command", "code"):
                r = post(client, "POST", f"/v1/sessions/{sid}/run",
                         {op: arg, "limits": BASE_LIMITS})
            elif op == "write":
                r = post(client, "PUT", f"/v1/sessions/{sid}/files", {"files": arg})
                assert r.status_code != 409 or "cannot write" in r.json()["error"], r.text
            elif op == "run_files":
                # A program's files, laid out in a work dir an earlier step may have broken.
                r = post(client, "POST", f"/v1/sessions/{sid}/run",
                         {"code": "print(1)", "limits": BASE_LIMITS})
                check(r, what)
                r = post(client, "POST", "/v1/run",
                         {"source": "print(1)", "files": arg, "limits": BASE_LIMITS})
            else:
                r = post(client, "POST", f"/v1/sessions/{sid}/files/read", {"paths": arg})
            check(r, what)
        # Whatever happened, the session still runs programs.
        r = post(client, "POST", f"/v1/sessions/{sid}/run",
                 {"code": "print('alive')", "limits": BASE_LIMITS})
        assert check(r, "alive")["status"] in ("ok", "runtime_error"), r.text
    finally:
        client.delete(f"/v1/sessions/{sid}")


# A language the server does not run is answered SandboxError on purpose (the trainer's
# configuration, not the program: docs/server.md), so only served languages are generated.
@SETTINGS
@given(code=PROGRAMS, language=st.sampled_from(["python", "python3", "bash", "cpp"]),
       files=st.dictionaries(NAMES, st.sampled_from(["eA==", "", "!!"]), max_size=3),
       fetch=st.lists(NAMES, max_size=2), memory=st.integers(-2, 300))
def test_sandboxfusion_requests_never_fail_as_the_infrastructure(
        client: httpx.Client, code: str, language: str, files: dict[str, str],
        fetch: list[str], memory: int) -> None:
    body = {"code": code, "language": language, "files": files, "fetch_files": fetch,
            "memory_limit_MB": memory, "run_timeout": 1}
    r = post(client, "POST", "/run_code", body)
    assert r.status_code < 500, r.text[:500]
    if r.status_code == 200:
        assert r.json()["status"] != "SandboxError", r.text[:500]


def test_the_reported_cases_are_4xx_or_verdicts(client: httpx.Client, tmp_path: Path) -> None:
    """The cases of the issue, each named, so a regression says which one came back."""
    assert post(client, "POST", "/v1/run", {"source": "1", "files": {"a": "", "a/b": ""}}
                ).status_code == 422
    r = client.post("/v1/run", content=b'{"source": "1", "files": {"a\\udc80": ""}}',
                    headers={"content-type": "application/json"})
    assert r.status_code == 422 and "files" in r.json()["error"], r.text
    r = post(client, "POST", "/v1/run",
             {"source": "print(1)", "limits": {**BASE_LIMITS, "open_files": 65536}})
    assert check(r, "open_files")["status"] == "ok"
    r = post(client, "POST", "/v1/run", {"source": "1", "priority": 10**100})
    assert r.status_code == 422 and "priority" in r.json()["error"], r.text
    sid = post(client, "POST", "/v1/sessions", {"limits": BASE_LIMITS}).json()["id"]
    try:
        for sabotage, status in (("rm -f solution.py; mkdir solution.py", 409),
                                 ("chmod 555 .", 200), ("chmod 000 .", 200)):
            check(post(client, "POST", f"/v1/sessions/{sid}/run", {"command": sabotage}),
                  sabotage)
            r = post(client, "PUT", f"/v1/sessions/{sid}/files",
                     {"files": {"solution.py": "print(1)"}})
            assert r.status_code == status, (sabotage, r.text)
            if status == 409:
                assert "solution.py" in r.json()["error"]
                check(post(client, "POST", f"/v1/sessions/{sid}/run",
                           {"command": "rm -rf solution.py"}), "cleanup")
    finally:
        client.delete(f"/v1/sessions/{sid}")
