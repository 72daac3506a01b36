"""Adversarial suite: shared host fixtures, one warm SandboxPool, and the after-every-test host audit.

Every attack runs through the real sandbox (``SandboxPool``, full isolation). Around each test the
``host_audit`` fixture checks, from the host side, that the defence left nothing behind:

* no live (or zombie) process owned by the pool's slot uids (the pool claims a uid range no
  other live pool uses, so concurrent test runs on the host cannot blur this);
* host mounts unchanged (``/proc/self/mountinfo`` and ``/proc/mounts``), the zygotes' own mount
  tables back to their baseline (no extra work dir or tmpfs left mounted), and the slot's
  no work dir left in the zygote (one-shot runs get a tmpfs that dies with them);
* under ``/sys/fs/cgroup/*/sandloop`` only this pool's slot groups among those created by this
  process: no run's own group (removed before its result came back; only the next run's, made
  ahead and still empty), no group of a dead pool
  (groups of other live pools on the host are tolerated), and each slot group holding only its
  zygote and at most its prepared, still-root next child;
* the host sentinel file byte-for-byte untouched;
* the loopback TCP listener, the abstract and the path unix listeners never connected to;
* the host "service" process (which holds a secret in its environment) still alive;
* every zygote still alive with the same pid and its slot not broken;
* no marker file the attacks try to drop on the host;
* no host-global state changed (``host_global_state``: hostname, domainname and every other
  sysctl, network interfaces and routes, kernel modules, /etc files naming the host), checked
  after every test and once more after the pool closed, which fails the session.

Demonstrations that an attack *does* work without the defence use ``SandboxPool(isolation="none")``
and their own listeners/decoys, so the audited sentinels stay untouched.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from sec_helpers import (
    SLOTS,
    HostWorld,
    Listener,
    PoolInfo,
    _pool_owner_pid,
    _read,
    cgroup_procs,
    host_global_state,
    host_markers,
    host_state_changes,
    leftover_work_files,
    mount_table,
    proc_info,
    procs_of_uids,
    sandloop_cgroups,
    stable_keys,
    unisolated_pool,
    wait_no_slot_procs,
)

from sandloop.sandbox.models import Program, Status
from sandloop.sandbox.pool import SandboxPool


@pytest.fixture(scope="session")
def host_world() -> Iterator[HostWorld]:
    """Secrets, a sentinel file, listeners and a secret-holding service on the host.

    Created *before* the pool starts, so a zygote that inherited the test process's environment
    or file descriptors would carry them into every sandbox.
    """
    token = secrets.token_hex(8)
    secret = f"sandloop-secret-{token}"
    secret_env = "SANDLOOP_SEC_SECRET_TOKEN"
    os.environ[secret_env] = secret
    # World-readable on purpose: only the sandbox's mount namespace and pivot_root keep it out.
    d = Path(f"/var/tmp/sandloop-sec-{token}")
    d.mkdir(mode=0o755)
    sentinel = d / "sentinel.txt"
    text = f"HOST-SENTINEL {token} do not read\n"
    sentinel.write_text(text)
    sentinel.chmod(0o644)
    tcp = Listener(socket.AF_INET, ("127.0.0.1", 0))
    abstract_name = f"sandloop-sec-{token}"
    abstract = Listener(socket.AF_UNIX, "\0" + abstract_name)
    unix_path = str(d / "service.sock")
    unix = Listener(socket.AF_UNIX, unix_path)
    os.chmod(unix_path, 0o777)
    # A long-lived host process holding the secret in its environment (a "host service").
    service = subprocess.Popen(
        ["sleep", "100000"], env={"PATH": "/usr/bin:/bin", secret_env: secret},
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    world = HostWorld(secret, secret_env, d, sentinel, text, tcp, abstract, abstract_name,
                      unix_path, unix, service)
    try:
        yield world
    finally:
        for lst in (tcp, abstract, unix):
            lst.close()
        service.kill()
        service.wait()
        shutil.rmtree(d, ignore_errors=True)
        os.environ.pop(secret_env, None)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def sandbox(host_world: HostWorld) -> AsyncIterator[PoolInfo]:
    """One warm full-isolation pool for the whole suite (plus the unisolated opt-out pool)."""
    if os.geteuid() != 0:  # pragma: no cover - full isolation needs root
        pytest.skip("the adversarial suite needs root (full isolation)")
    host_mounts = mount_table()
    proc_mounts = _read("/proc/mounts")
    # Taken twice: what moved in between moves by itself and is not compared.
    first = host_global_state()
    await asyncio.sleep(0.2)
    host_state = stable_keys(first, host_global_state())
    # Pools other test modules of this session still hold (session-scoped) are not strays.
    preexisting = {g for groups in sandloop_cgroups().values() for g in groups}
    pool = SandboxPool(SLOTS)
    await pool.start()
    assert pool.isolation_level == "full", pool.report.problem() if pool.report else "?"
    slots = pool._slots
    zygotes = {s.index: s.zygote_pid for s in slots}
    # Warm every slot once, so that the baseline includes the slot's reusable work tmpfs.
    warm = await pool.run_batch([Program(source="pass")] * SLOTS)
    assert all(r.status is Status.OK for r in warm), warm
    info = PoolInfo(
        pool=pool, unisolated=await unisolated_pool(SLOTS),
        uids={pool.uid_base + i for i in range(SLOTS)}, zygotes=zygotes,
        zygote_mounts={i: mount_table(str(pid)) for i, pid in zygotes.items()},
        host_mounts=host_mounts, host_proc_mounts=proc_mounts, preexisting=preexisting,
        host_state=host_state,
    )
    ours = {s.name for s in slots}
    try:
        yield info
    finally:
        await pool.close()
        await info.unisolated.close()
    # After close: nothing of the pool may remain, anywhere.
    leftovers = [g for groups in sandloop_cgroups().values() for g in groups if g in ours]
    assert not leftovers, f"cgroups outlived the pool: {leftovers}"
    assert not procs_of_uids(info.uids), procs_of_uids(info.uids)
    for pid in zygotes.values():
        assert not Path(f"/proc/{pid}").exists() or "Z" in _read(f"/proc/{pid}/stat").split()[2]
    assert mount_table() == host_mounts
    for s in slots:
        assert not s.base.exists(), f"slot dir {s.base} outlived the pool"
    changed = host_state_changes(host_state, host_global_state())
    assert not changed, "the suite changed host-global state:\n  " + "\n  ".join(changed)


@pytest.fixture(autouse=True)
def host_audit(sandbox: PoolInfo, host_world: HostWorld) -> Iterator[None]:
    before_sentinel = host_world.sentinel_state()
    before_markers = host_markers()
    yield
    problems: list[str] = []
    left = wait_no_slot_procs(sandbox.uids)
    if left:
        problems.append(f"processes of the slot uids outlived the run: {left}")
    if mount_table() != sandbox.host_mounts:
        problems.append("host mount table changed: "
                        f"{sorted(set(mount_table()) ^ set(sandbox.host_mounts))}")
    if _read("/proc/mounts") != sandbox.host_proc_mounts:
        problems.append("/proc/mounts changed")
    for i, pid in sandbox.zygotes.items():
        if not Path(f"/proc/{pid}").exists():
            problems.append(f"zygote of slot {i} (pid {pid}) died")
            continue
        now = mount_table(str(pid))
        if now != sandbox.zygote_mounts[i]:
            problems.append(f"zygote {i} mount table changed (work dir or tmpfs left mounted): "
                            f"{sorted(set(now) ^ set(sandbox.zygote_mounts[i]))}")
    for s in sandbox.pool._slots:
        # The zygote wipes the reusable work dir right after it reaps the run, which can be
        # a moment after the result came back: give it a second.
        left_files = leftover_work_files(s.works_root, wait_s=1.0)
        if left_files:
            problems.append(f"slot {s.index} keeps work dirs after the run: {left_files}")
        if s.broken or s.proc is None or s.zygote_pid != sandbox.zygotes[s.index]:
            problems.append(f"slot {s.index} was broken or restarted by the attack")
    ours = {s.name for s in sandbox.pool._slots}
    # Each slot may have the next run's group made ahead: allowed while no process is in it.
    ahead = {s._ready_cg[0].name for s in sandbox.pool._slots if s._ready_cg is not None}
    for g in ahead:
        if any(cgroup_procs(g).values()):
            problems.append(f"the group made ahead for the next run already holds processes: "
                            f"{cgroup_procs(g)}")
    # Each slot's runs take turns in its shared pids/cpu/cpuacct groups: empty between runs.
    shared = {s._shared.name for s in sandbox.pool._slots if s._shared is not None}
    for g in shared:
        if any(cgroup_procs(g).values()):
            problems.append(f"a slot's shared run groups hold processes between runs: "
                            f"{cgroup_procs(g)}")
    me = os.getpid()
    for ctrl, groups in sandloop_cgroups().items():
        for g in groups:
            owner = _pool_owner_pid(g)
            if g in ours or g in ahead or g in shared or g in sandbox.preexisting:
                continue
            if owner == me:
                problems.append(f"stray cgroup {ctrl}/sandloop/{g} created by this process")
            elif owner is None or not Path(f"/proc/{owner}").exists():
                problems.append(f"cgroup {ctrl}/sandloop/{g} of a dead pool")
    for s in sandbox.pool._slots:
        zygote = sandbox.zygotes[s.index]
        for ctrl, pids in cgroup_procs(s.name).items():
            # Besides the zygote, only its prepared next child may wait here: still root (no
            # process of the slot uid exists between runs) and a direct child of the zygote.
            strangers = []
            for p in pids:
                if p == zygote:
                    continue
                info = proc_info(p)
                if info and (info.get("PPid") != str(zygote) or info["Uid"].split()[0] != "0"):
                    strangers.append((p, info.get("Name"), info.get("Uid"), info.get("PPid")))
            if strangers or zygote not in pids or len(pids) > 2:
                problems.append(f"cgroup {ctrl} of slot {s.index} holds more than the zygote "
                                f"and its prepared child: {pids} {strangers}")
    if host_world.sentinel_state() != before_sentinel:
        problems.append("the host sentinel file was modified")
    for lst, what in ((host_world.tcp, "loopback TCP"), (host_world.abstract, "abstract unix"),
                      (host_world.unix, "path unix")):
        if lst.accepted:
            problems.append(f"the host {what} listener received {lst.accepted} connection(s)")
    if host_world.service.poll() is not None:
        problems.append("the host service process was killed")
    changed = host_state_changes(sandbox.host_state, host_global_state())
    if changed:
        problems.append("host-global state changed: " + "; ".join(changed))
    new_markers = sorted(set(host_markers()) - set(before_markers))
    if new_markers:
        problems.append(f"attack files appeared on the host: {new_markers}")
    assert not problems, "host audit failed:\n  " + "\n  ".join(problems)


