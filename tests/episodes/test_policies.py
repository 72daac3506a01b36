"""Scripted policies drive real episodes over real sandboxes: the fix earns 1, editing the tests
earns 0, a loop is stopped by the turn budget, fork bombs and full disks end as verdicts."""

from __future__ import annotations

import pytest

from sandloop.engine import Engine
from sandloop.episodes import EpisodeFinished, Snapshots, episode
from sandloop.episodes.check import check_repo_task
from sandloop.tasks.repo import RepoTask

pytestmark = pytest.mark.asyncio(loop_scope="module")

FAILING = "tests/test_merge.py::test_touching"


async def test_fixing_policy_earns_1(engine: Engine, spanlib: RepoTask) -> None:
    async with episode(engine, spanlib) as ep:
        assert "spanlib/core.py" in ep.observation["files"]
        assert "merge" in ep.observation["problem_statement"]
        listing = await ep.call("list_dir", path="spanlib")
        assert "core.py" in listing["entries"]
        first = await ep.call("run_tests")
        assert first["failed"] >= 1 and "test_touching" in first["output"]
        test = await ep.call("read_file", path="tests/test_merge.py")
        assert "def test_touching" in test["content"]
        src = (await ep.call("read_file", path="spanlib/core.py"))["content"]
        fixed = src.replace("start < out[-1][1]", "start <= out[-1][1]")
        assert fixed != src
        assert (await ep.call("write_file", path="spanlib/core.py", content=fixed))["ok"]
        again = await ep.call("run_tests")
        assert again["failed"] == 0 and again["passed"] == 5
        final = await ep.call("submit")
        assert ep.done and final["ended_by"] == "submit"
        assert final["reward"] == 1.0 and final["verdict"] == "resolved"
        assert final["tests"]["tests/test_merge.py::test_touching_chain"] == "passed"
        assert ep.turns == 7
        with pytest.raises(EpisodeFinished):
            await ep.call("run_tests")


async def test_engine_episode_is_the_same_api(engine: Engine, spanlib: RepoTask) -> None:
    # The spelling: `async with engine.episode(task) as ep: await ep.call(...)`.
    async with engine.episode(spanlib, max_turns=3) as ep:
        assert "spanlib/core.py" in ep.observation["files"]
        obs = await ep.call("run_tests")
        assert obs["failed"] >= 1 and not ep.done
        await ep.call("apply_patch", patch=spanlib.patch)
        final = await ep.call("submit")
        assert final["reward"] == 1.0 and ep.turns == 3


async def test_engine_episode_loads_episodes_only_when_used() -> None:
    # The engine may not import episodes (layers); the package root wires the method, and
    # `import sandloop.engine` does not pay for the episodes layer until one is opened.
    import subprocess
    import sys
    code = ("import sys, sandloop.engine, sandloop.tasks.repo as r\n"
            "assert 'sandloop.episodes' not in sys.modules\n"
            "e = sandloop.engine.Engine(slots=1)\n"
            "cm = e.episode(r.load_repo_tasks('repo-demo')[0], max_turns=2)\n"
            "assert 'sandloop.episodes' in sys.modules and hasattr(cm, '__aenter__')\n"
            "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout == "ok\n", r.stderr


async def test_hidden_tests_are_not_visible_before_grading(engine: Engine,
                                                           spanlib: RepoTask) -> None:
    async with episode(engine, spanlib) as ep:
        seen = await ep.call("read_file", path="tests/test_merge.py")
        assert "test_touching_chain" not in seen["content"]
        out = await ep.call("run", command="grep -r test_touching_chain . || echo none")
        assert out["stdout"].strip() == "none"


async def test_editing_the_tests_earns_0(engine: Engine, spanlib: RepoTask) -> None:
    async with episode(engine, spanlib) as ep:
        test = (await ep.call("read_file", path="tests/test_merge.py"))["content"]
        cheat = test.replace("assert merge([(1, 3), (3, 5)]) == [(1, 5)]", "assert True")
        assert cheat != test
        await ep.call("write_file", path="tests/test_merge.py", content=cheat)
        assert (await ep.call("run_tests"))["failed"] == 0  # the model fooled its own feedback
        final = await ep.call("submit")
        assert final["reward"] == 0.0 and final["verdict"] == "unresolved"
        assert final["tests"][FAILING] == "wrong_answer"


async def test_a_planted_conftest_is_removed_before_grading(engine: Engine,
                                                             spanlib: RepoTask) -> None:
    # Threat: a conftest.py that rewrites every report as passed. Grading deletes test
    # configuration the repository did not have; without that, this earns 1.
    hook = ("import pytest\n\n@pytest.hookimpl(hookwrapper=True)\n"
            "def pytest_runtest_makereport(item, call):\n    out = yield\n"
            "    r = out.get_result()\n    r.outcome = 'passed'\n")
    async with episode(engine, spanlib) as ep:
        await ep.call("write_file", path="tests/conftest.py", content=hook)
        assert (await ep.call("run_tests"))["failed"] == 0
        final = await ep.call("submit")
        assert final["reward"] == 0.0 and final["tests"][FAILING] == "wrong_answer"


async def test_a_plugin_planted_through_package_metadata_is_not_loaded(
        engine: Engine, spanlib: RepoTask) -> None:
    # Threat: no conftest, but a module of the repository declared a pytest plugin by a planted
    # *.dist-info (pytest autoloads `pytest11` entry points from anything on sys.path, and the
    # repository is on it). Grading deletes metadata the repository did not have and loads only
    # the environment's plugins; without that, this earns 1.
    hook = ("import pytest\n\n@pytest.hookimpl(hookwrapper=True)\n"
            "def pytest_runtest_makereport(item, call):\n    out = yield\n"
            "    r = out.get_result()\n    r.outcome = 'passed'\n    r.longrepr = None\n")
    meta = "Metadata-Version: 2.1\nName: zz-helper\nVersion: 1.0\n"
    async with episode(engine, spanlib) as ep:
        await ep.call("write_file", path="zz_helper.py", content=hook)
        for info in ("zz_helper-1.0.dist-info", "zz_helper.egg-info"):
            await ep.call("write_file", path=f"{info}/METADATA", content=meta)
            await ep.call("write_file", path=f"{info}/PKG-INFO", content=meta)
            await ep.call("write_file", path=f"{info}/entry_points.txt",
                          content="[pytest11]\nzz = zz_helper\n")
        final = await ep.call("submit")
        assert final["reward"] == 0.0 and final["tests"][FAILING] == "wrong_answer"
        assert final["tests"]["tests/test_merge.py::test_disjoint"] == "passed"


async def test_a_shadowing_pytest_module_is_not_imported_by_grading(
        engine: Engine, spanlib: RepoTask) -> None:
    # Threat: a pytest.py at the repository root that "passes" everything. Grading imports the
    # real pytest before the repository is on sys.path (and appends it, never prepends).
    fake = "import sys\n\ndef main(*a, **k):\n    print('all passed')\n    return 0\n"
    async with episode(engine, spanlib) as ep:
        await ep.call("write_file", path="pytest.py", content=fake)
        final = await ep.call("submit")
        assert final["reward"] == 0.0 and final["tests"][FAILING] == "wrong_answer"
        assert final["tests"]["tests/test_merge.py::test_disjoint"] == "passed"


async def test_looping_policy_is_stopped_by_the_turn_budget(engine: Engine,
                                                            spanlib: RepoTask) -> None:
    async with episode(engine, spanlib, max_turns=4) as ep:
        calls = 0
        while not ep.done:
            obs = await ep.call("read_file", path="README.md")
            calls += 1
            assert calls <= 4
        assert calls == 4 and obs["ended_by"] == "max_turns"
        assert obs["reward"] == 0.0 and obs["verdict"] == "unresolved"
        with pytest.raises(EpisodeFinished):
            await ep.call("submit")


async def test_fork_bomb_is_an_observation_and_the_episode_goes_on(
        engine: Engine, spanlib: RepoTask) -> None:
    async with episode(engine, spanlib) as ep:
        # The classic bomb backgrounds itself, so its shell exits 0 at once ("ok" is the
        # truth about that command); what matters is that none of it outlives the command.
        bomb = await ep.call("run", command=":(){ :|:& };:")
        assert not ep.done and bomb["exit_code"] is not None
        left = await ep.call("run", command="sleep 0.5; ls /proc | grep -c '^[0-9][0-9]*$'")
        assert left["status"] == "ok" and int(left["stdout"]) <= 4, left
        # In the foreground it hits the pids limit or the time limit: never "ok".
        held = await ep.call("run", command=":(){ :|:; };:")
        assert not ep.done and held["status"] in ("runtime_error", "timeout"), held
        await ep.call("apply_patch", patch=spanlib.patch)
        final = await ep.call("submit")
        assert final["reward"] == 1.0


async def test_filling_the_disk_ends_as_a_verdict(engine: Engine, spanlib: RepoTask) -> None:
    async with episode(engine, spanlib, workdir_mb=8) as ep:
        # Two files: the first reaches the per-file size limit (the work dir's size), the
        # second finds the work dir full.
        fill = await ep.call("run", command="dd if=/dev/zero of=fill bs=1M count=64; "
                                            "dd if=/dev/zero of=fill2 bs=1M count=64")
        assert fill["status"] == "runtime_error" and "No space" in fill["stderr"], fill
        # Writes are buffered until the next command: that is where "full" shows, as an
        # observation, not an exception.
        assert (await ep.call("write_file", path="more.txt", content="x" * 100_000))["ok"]
        after = await ep.call("run_tests")
        assert "did not fit" in after["error"] and not ep.done
        final = await ep.call("submit")
        assert ep.done and final["reward"] == 0.0
        assert final["verdict"] in ("unresolved", "error")


async def test_a_write_the_work_dir_refuses_is_an_observation(engine: Engine,
                                                              spanlib: RepoTask) -> None:
    # A file where the repository has a directory: the buffered write fails only at the next
    # command's flush. It was an exception there (HTTP 409 on submit, no grade, the call lost
    # from the log); it is the model's doing, so an observation, and submit still grades.
    async with episode(engine, spanlib) as ep:
        assert (await ep.call("write_file", path="tests", content="oops"))["ok"]
        after = await ep.call("run_tests")
        assert "could not be written" in after["error"] and not ep.done
        assert (await ep.call("write_file", path="spanlib", content="oops"))["ok"]
        final = await ep.call("submit")
        assert ep.done and "could not be written" in final["error"]
        assert final["verdict"] == "unresolved" and final["reward"] == 0.0
        assert final["tests"]["tests/test_merge.py::test_disjoint"] == "passed"
        assert ep.turns == 4


async def test_text_that_is_no_unicode_is_an_observation(engine: Engine,
                                                          spanlib: RepoTask) -> None:
    async with episode(engine, spanlib) as ep:
        bad = await ep.call("write_file", path="u.txt", content="x\ud800")
        assert "not valid Unicode" in bad["error"] and not ep.done
        assert (await ep.call("run", command="ls u.txt"))["exit_code"] != 0


async def test_bad_calls_are_observations(engine: Engine, spanlib: RepoTask) -> None:
    async with episode(engine, spanlib) as ep:
        assert "unknown tool" in (await ep.call("rm_rf", {}))["error"]
        assert "missing" in (await ep.call("read_file", {}))["error"]
        assert "error" in await ep.call("read_file", path="../etc/passwd")
        assert "no such" in (await ep.call("read_file", path="nope.py"))["error"]
        bad = await ep.call("apply_patch", patch="--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n")
        assert "error" in bad
        assert ep.turns == 5 and not ep.done


async def test_reads_and_writes_are_served_from_memory_between_runs(
        engine: Engine, spanlib: RepoTask) -> None:
    async with episode(engine, spanlib) as ep:
        view = ep._files
        assert view is not None
        await ep.call("read_file", path="spanlib/core.py")  # the snapshot: no jail step
        assert view.cached_reads == 1
        await ep.call("write_file", path="spanlib/extra.py", content="X = 1\n")
        await ep.call("write_file", path="spanlib/extra.py", content="X = 2\n")
        assert view.flushes == 0
        assert (await ep.call("read_file", path="spanlib/extra.py"))["content"] == "X = 2\n"
        out = await ep.call("run", command="cat spanlib/extra.py; echo Y > made.txt")
        assert out["stdout"] == "X = 2\n" and view.flushes == 1  # flushed before the run
        made = await ep.call("read_file", path="made.txt")  # a run's effect: asked the work dir
        assert made["content"] == "Y\n" and view.cached_reads == 2


async def test_setup_runs_once_per_task(engine: Engine, demo: dict[str, RepoTask]) -> None:
    task = demo["lrukit-get-refreshes"]
    assert task.setup is not None
    snaps = Snapshots(engine)
    for _ in range(2):
        from sandloop.episodes import Episode

        ep = Episode(engine, task, snapshots=snaps)
        obs = await ep.reset()
        assert "lrukit/_version.py" in obs["files"]  # made by the set-up command
        await ep.close()
    assert snaps.setups_run == 1


async def test_a_reset_withdrawn_mid_setup_does_not_fail_the_others(
        engine: Engine, demo: dict[str, RepoTask]) -> None:
    # Three episodes of one task reset at once; the first is withdrawn (cancelled) while the
    # shared set-up runs. The other two still get the snapshot, and set-up ran once.
    import asyncio

    task = demo["lrukit-get-refreshes"]
    snaps = Snapshots(engine)
    first = asyncio.ensure_future(snaps.get(task))
    others = [asyncio.ensure_future(snaps.get(task)) for _ in range(2)]
    while snaps.setups_run == 0:  # the set-up command has started
        await asyncio.sleep(0.005)
    first.cancel()
    got = await asyncio.gather(*others)
    assert first.cancelled()
    assert all("lrukit/_version.py" in g for g in got) and got[0] is got[1]
    assert snaps.setups_run == 1
    assert await snaps.get(task) is got[0]  # kept: a later reset runs no set-up


async def test_check_repo_task_accepts_the_bundled_set(engine: Engine,
                                                       demo: dict[str, RepoTask]) -> None:
    for task in demo.values():
        assert await check_repo_task(engine, task) == [], task.id


async def test_check_repo_task_finds_broken_tasks(engine: Engine, spanlib: RepoTask) -> None:
    data = spanlib.model_dump(exclude={"version"})
    # A fail-to-pass test that passes before the fix, and a gold patch that fixes nothing.
    moved = RepoTask(**{**data, "fail_to_pass": ("tests/test_merge.py::test_disjoint",),
                        "pass_to_pass": ("tests/test_span.py::test_contains",)})
    codes = {p.code for p in await check_repo_task(engine, moved)}
    assert codes == {"empty_passes"}
    no_fix = RepoTask(**{**data, "patch": spanlib.patch.replace("<=", "<")})  # type: ignore[union-attr]
    found = await check_repo_task(engine, no_fix)
    assert {p.code for p in found} == {"gold_fails_fail_to_pass"}
    assert {p.test for p in found} == set(spanlib.fail_to_pass)


async def test_time_budget_ends_the_episode_without_running_the_call(
        engine: Engine, spanlib: RepoTask) -> None:
    import asyncio

    async with episode(engine, spanlib, max_time_s=0.2) as ep:
        await asyncio.sleep(0.3)
        obs = await ep.call("run", command="echo should-not-run")
        assert obs["ended_by"] == "max_time" and "stdout" not in obs
        assert ep.done and obs["reward"] == 0.0


async def test_a_lost_sandbox_ends_the_episode_as_sandbox_error(spanlib: RepoTask) -> None:
    """A tool that fails fatally (the session's fork-server died) ends the episode with the
    infrastructure's verdict: reward null, never a 0 the policy would be trained on."""
    import os
    async with Engine(slots=1) as e, e.episode(spanlib) as ep:
        await ep.call("run", command="true")
        assert ep._session is not None
        ws = ep._session.workspace
        pool = ws.owner or e.backend.pool  # type: ignore[attr-defined]
        zygote = pool._slots[ws.slot].proc
        os.kill(zygote.pid, 9)  # fault injection: the slot holding the episode's files dies
        obs = await ep.call("run_tests")
        assert ep.done and obs["ended_by"] == "lost" and "gone" in obs["error"]
        assert obs["verdict"] == "sandbox_error" and obs["reward"] is None
        with pytest.raises(EpisodeFinished):
            await ep.call("submit")
