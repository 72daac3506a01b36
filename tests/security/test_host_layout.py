"""A Python program runs in a fork of the warm zygote: nothing of the zygote that names the host's
layout may be reachable from it (frames, globals, modules, the garbage collector's objects).

The mount and cgroup namespaces hide the host's paths; the zygote knew them (its slot directory
under /run/sandloop, its cgroup paths, the jail library in ~/.cache/sandloop, its own file), and
before the child unwound the zygote's frames, ``sys._getframe().f_back`` reached all of them.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
from sec_helpers import PoolInfo, attack, limits, report

from sandloop.sandbox import zygote as zygote_module
from sandloop.sandbox.host import runtime_binds
from sandloop.sandbox.models import Program, Status

pytestmark = pytest.mark.asyncio(loop_scope="session")

CHECKOUT = Path(__file__).resolve().parents[2]

# The program's frame is the bottom one, as in `python main.py`, where the runner can make it so:
# Python 3.9 and 3.12 run it under the runner's frame and the zygote's (see program._RUNNER).
AT_TOP_LEVEL = sys.version_info[:2] not in ((3, 9), (3, 12))

# Walks every frame, the globals and locals of each, every module, __main__, sys.argv and
# sys.orig_argv, then every object the collector knows of (frozen ones included, after
# gc.unfreeze()), and prints where it found any of the needles it was given. The needles
# arrive hex-encoded, and the containers holding them are skipped, so that the probe does not
# find its own input.
LAYOUT_PROBE = r"""
import gc, json, sys, types
needles = tuple(bytes.fromhex(h).decode() for h in json.loads(sys.stdin.read()))
mine = {id(n) for n in needles}
hits = []
def where(s):
    if isinstance(s, bytes):
        s = s.decode("latin-1")
    if not isinstance(s, str) or id(s) in mine:
        return None
    return next((n for n in needles if n in s), None)
def scan(obj, path, depth=0):
    if obj is needles or depth > 3:
        return
    n = where(obj)
    if n:
        hits.append([path, n, (obj if isinstance(obj, str) else repr(obj))[:200]])
        return
    if isinstance(obj, dict):
        for k, v in list(obj.items()):
            scan(k, path + ":key", depth + 1)
            scan(v, f"{path}[{str(k)[:40]}]", depth + 1)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for i, v in enumerate(list(obj)[:10000]):
            scan(v, f"{path}[{i}]", depth + 1)
    elif isinstance(obj, types.FunctionType):
        scan(obj.__code__.co_filename, path + ".co_filename", depth + 1)
    elif isinstance(obj, types.CodeType):
        scan(obj.co_filename, path + ".co_filename", depth + 1)
    elif isinstance(obj, types.ModuleType):
        scan(getattr(obj, "__file__", None), path + ".__file__", depth + 1)
f = sys._getframe()
i = 0
while f is not None:
    scan(f.f_code.co_filename, f"frame{i}.co_filename")
    scan(f.f_locals, f"frame{i}.f_locals")
    scan(f.f_globals, f"frame{i}.f_globals")
    f = f.f_back
    i += 1
scan(dict(sys.modules), "sys.modules")
scan(vars(sys.modules["__main__"]), "__main__")
scan(sys.argv, "sys.argv")
scan(getattr(sys, "orig_argv", []), "sys.orig_argv")
scan(dict(__import__("os").environ), "os.environ")
gc.unfreeze()
objs = gc.get_objects()
for j, o in enumerate(objs):
    if o is objs or o is hits:
        continue
    if isinstance(o, dict):
        scan(o, f"gc[{type(o).__name__}]", 2)
    elif isinstance(o, (list, tuple, set, frozenset)):
        scan(o, f"gc[{type(o).__name__}]", 2)
    elif isinstance(o, (types.FunctionType, types.ModuleType, types.CodeType)):
        scan(o, f"gc[{type(o).__name__}]", 2)
    elif isinstance(o, type):
        pass
    else:
        d = getattr(o, "__dict__", None)
        if isinstance(d, dict):
            scan(d, f"gc[{type(o).__name__}].__dict__", 2)
zygote_modules = [n for n in sys.modules if n.startswith("sandloop_zygote")]
print(json.dumps({"frames": i, "hits": hits[:50], "objects": len(objs),
                  "zygote_modules": zygote_modules}))
"""


def _needles(sandbox: PoolInfo) -> list[str]:
    pool = sandbox.pool
    slot = pool._slots[0]
    assert slot.cg is not None
    found = [
        str(slot.config.base_dir),  # /run/sandloop (or its fallback)
        str(slot.base),  # the slot's own directory there
        pool.pool_id,  # names every cgroup of the pool: .../sandloop/<pool_id>-s<i>
        os.path.dirname(slot.cg.procs_files[0]),
        "/sys/fs/cgroup",
        zygote_module.PACKAGE_DIR,  # where sandloop lives on the host: the zygote's files
        os.path.dirname(zygote_module.PACKAGE_DIR),  # and protocol.py's
    ]
    if pool.jail.path:  # the C helper (not with SANDLOOP_JAIL=python)
        found += [pool.jail.path, os.path.dirname(pool.jail.path)]  # ~/.cache/sandloop/...
    return found + _host_paths(sandbox)


def _host_paths(sandbox: PoolInfo) -> list[str]:
    """Where the supervisor lives on the host: its checkout, its virtualenv and interpreter,
    the home directory, the environment store. None may show inside the sandbox."""
    env = sandbox.pool.environment
    assert env is not None
    paths = {str(CHECKOUT), sys.prefix, sys.base_prefix, sys.exec_prefix,
             os.path.realpath(sys.base_prefix), os.path.dirname(os.path.realpath(sys.executable)),
             str(env.root), str(env.root.parent.parent), os.path.realpath(env.root)}
    home = os.path.expanduser("~")
    if home not in ("/", ""):
        paths.add(home + "/")
    # The runtime the sandbox gets on purpose (/usr, ...) is no secret: a supervisor running
    # on the system's Python (a venv made by /usr/bin/python3) has /usr as its base prefix.
    binds, _links = runtime_binds(None)
    shown = [b.rstrip("/") for b in binds]
    return sorted(p for p in paths if p not in ("/", "")
                  and not any(p.rstrip("/") == b or p.startswith(b + "/") for b in shown))


# What a program sees of the root: the names in /, every symlink's target (outside /proc and
# the host's /usr), the mount table, its interpreter's paths and its environment, and the same
# from a fresh python3 started by a shell.
VIEW_PROBE = r"""
import json, os, subprocess, sys
links, names = {}, []
for top in sorted(os.listdir("/")):
    if os.path.islink("/" + top):
        links["/" + top] = os.readlink("/" + top)
        continue
    if top in ("proc", "sys", "usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        continue  # the host's /usr (and its merged directories), bound as they are
    for d, dirs, files in os.walk("/" + top):
        for n in dirs + files:
            p = os.path.join(d, n)
            if not p.startswith("/opt/env/"):  # (its 1,400 names would flood stdout)
                names.append(p)
            if os.path.islink(p):
                links[p] = os.readlink(p)
try:
    os.listdir("/root")
    root = "listable"
except OSError as e:
    root = type(e).__name__
shell = subprocess.run(["sh", "-c", "python3 -c 'import json, os, sys; print(json.dumps("
                        "[sys.path, sys.prefix, sys.base_prefix, sys.executable, dict(os.environ)]))'"],
                       capture_output=True, text=True)
print(json.dumps({"ls": sorted(os.listdir("/")), "names": names, "links": links,
                  "mountinfo": open("/proc/self/mountinfo").read(), "root": root,
                  "path": sys.path, "prefix": [sys.prefix, sys.base_prefix, sys.exec_prefix,
                                               sys.executable],
                  "environ": dict(os.environ), "shell": shell.stdout, "shell_err": shell.stderr}))
"""


def _mountinfo_root(path: Path) -> str:
    """What the kernel shows as the root field of a bind mount of ``path``: its path inside
    the file system that holds it, not its full path (the two differ where /tmp is a tmpfs of
    its own, as on most systemd hosts and in the cgroup v2 guest)."""
    real = os.path.realpath(path)
    best = ("", "/")
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        root, point = (re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), f)
                       for f in fields[3:5])  # the kernel escapes blanks as octal
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[0]):  # the last of equal points is on top
            best = (point, root)
    point, root = best
    return os.path.normpath(os.path.join(root, os.path.relpath(real, point)))


def _overlay_available() -> bool:
    with open("/proc/filesystems") as f:
        return any(line.split()[-1] == "overlay" for line in f if line.strip())


async def test_no_host_path_in_the_sandboxs_view(sandbox: PoolInfo) -> None:
    # Issue 17: the environment is mounted at /opt/env, the supervisor's interpreter and
    # virtualenv not at all; /root is absent. Where the kernel has overlayfs, /opt/env is a
    # read-only overlay whose line names no host path either (a bind's root field is its
    # source's path on the host: /var/lib/sandloop/envs/<id>/tree); elsewhere it is that bind.
    r = await attack(sandbox.pool, VIEW_PROBE, lim=limits(time_s=20, stdout_bytes=1 << 20))
    assert r.status is Status.OK, (r.status, r.stderr[-2000:])
    seen = report(r)
    assert seen["shell_err"] == "", seen["shell_err"]
    assert "root" not in seen["ls"] and seen["root"] == "FileNotFoundError"
    assert seen["prefix"] == ["/opt/env/python"] * 3 + ["/opt/env/python/bin/python3"]
    assert all(p.startswith("/opt/env/python/") or p == "/sandbox" for p in seen["path"]), seen
    assert json.loads(seen["shell"])[1] == "/opt/env/python"
    env = sandbox.pool.environment
    assert env is not None
    opt_env = [line for line in seen["mountinfo"].splitlines() if line.split()[4] == "/opt/env"]
    assert len(opt_env) == 1, seen["mountinfo"]
    if _overlay_available():
        fields = opt_env[0].split()
        assert fields[3] == "/" and fields[fields.index("-") + 1] == "overlay", opt_env
        assert str(env.root) not in opt_env[0] and "/var/lib" not in opt_env[0], opt_env
        mounts = seen["mountinfo"].splitlines()
    else:
        assert opt_env[0].split()[3] == _mountinfo_root(env.root), opt_env
        mounts = [line for line in seen["mountinfo"].splitlines() if line not in opt_env]
    view = json.dumps({k: v for k, v in seen.items() if k != "mountinfo"})
    for needle in _host_paths(sandbox):
        assert needle not in view, needle
        assert all(needle not in line for line in mounts), (needle, seen["mountinfo"])
    assert "/root" not in view and all("/root" not in line for line in mounts)


async def test_no_zygote_state_reachable_from_a_python_program(sandbox: PoolInfo) -> None:
    needles = _needles(sandbox)
    stdin = json.dumps([n.encode().hex() for n in needles])
    # Twice per slot: the first run of a slot is served by the Python loop, later ones by
    # jail.c's (two ways out of the zygote's frames); with SANDLOOP_JAIL=python, only Python.
    for _ in range(2 * len(sandbox.pool._slots)):
        r = await attack(sandbox.pool, LAYOUT_PROBE, stdin=stdin, lim=limits(time_s=20))
        assert r.status is Status.OK, (r.status, r.stderr[-2000:])
        seen = report(r)
        assert seen["objects"] > 1000, seen  # the scan did run over the interpreter's heap
        assert seen["hits"] == [], json.dumps(seen["hits"], indent=1)
        assert seen["zygote_modules"] == []  # BOOTSTRAP's modules are gone from sys.modules
        if AT_TOP_LEVEL:  # (see ZYGOTE_PROBE's test)
            assert seen["frames"] == 1, seen["frames"]


# What a program reaches without the collector: its frames (and each one's globals), every module,
# __main__, builtins, sys's hooks and argv, the objects those hold (functions' globals, bound
# methods' selves, partials' arguments) a few levels down. It prints whatever names the zygote:
# its code's neutral file name, its module names, its package, BOOTSTRAP's own names.
ZYGOTE_PROBE = r"""
START = sorted(globals())
import builtins, json, subprocess, sys, types
MARKS = ("sandloop", "zygote", "<string>", "RunProgram", "program_entry", "BOOTSTRAP")
hits, seen = [], set()
def names(s):
    return isinstance(s, str) and any(m in s for m in MARKS)
def scan(obj, path, depth=0):
    if id(obj) in seen or depth > 5 or obj is hits or obj is seen:
        return
    seen.add(id(obj))
    if names(obj):
        hits.append([path, obj[:200]])
    elif isinstance(obj, dict):
        for k, v in list(obj.items()):
            scan(k, path + ":key", depth + 1)
            scan(v, f"{path}[{str(k)[:40]}]", depth + 1)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for i, v in enumerate(list(obj)[:2000]):
            scan(v, f"{path}[{i}]", depth + 1)
    elif isinstance(obj, types.CodeType):
        scan(obj.co_filename, path + ".co_filename", depth + 1)
        scan(obj.co_name, path + ".co_name", depth + 1)
        scan(obj.co_consts, path + ".co_consts", depth + 1)
    elif isinstance(obj, types.FunctionType):
        scan(obj.__code__, path + ".__code__", depth + 1)
        scan(obj.__globals__, path + ".__globals__", depth + 1)
        scan(obj.__closure__, path + ".__closure__", depth + 1)
    elif isinstance(obj, types.CellType):
        scan(obj.cell_contents, path + ".cell_contents", depth + 1)
    elif isinstance(obj, (types.MethodType, types.BuiltinMethodType)):
        scan(getattr(obj, "__self__", None), path + ".__self__", depth + 1)
        scan(getattr(obj, "__func__", None), path + ".__func__", depth + 1)
    elif isinstance(obj, types.ModuleType):
        scan(obj.__name__, path + ".__name__", depth + 1)
        scan(getattr(obj, "__file__", None), path + ".__file__", depth + 1)
    elif isinstance(obj, types.FrameType):
        scan(obj.f_code, path + ".f_code", depth + 1)
        scan(obj.f_globals, path + ".f_globals", depth + 1)
    elif hasattr(obj, "func") and hasattr(obj, "args"):  # functools.partial
        scan(obj.func, path + ".func", depth + 1)
        scan(obj.args, path + ".args", depth + 1)
frames, f = [], sys._getframe()
while f is not None:
    frames.append(f.f_code.co_filename)
    if f is not sys._getframe():
        scan(f, f"frame{len(frames) - 1}")
    f = f.f_back
main = sys.modules["__main__"]
scan({k: m for k, m in sys.modules.items() if m is not main}, "sys.modules")
hooks = {n: getattr(sys, n) for n in ("excepthook", "displayhook", "breakpointhook",
                                      "unraisablehook", "meta_path", "path_hooks",
                                      "path_importer_cache", "argv", "orig_argv", "path")
         if hasattr(sys, n)}
scan(hooks, "sys")
plain = json.loads(subprocess.run([sys.executable, "-I", "-c", "import builtins, json; "
                                   "print(json.dumps(sorted(vars(builtins))))"],
                                  capture_output=True, text=True).stdout)
print(json.dumps({"frames": frames, "hits": hits[:50], "main_is_mine": vars(main) is globals(),
                  "main_extra": sorted(set(START) - set(vars(types.ModuleType("m"))) - {
                      "__builtins__", "__file__", "__cached__", "__annotations__"}),
                  "builtins_extra": sorted(set(vars(builtins)) - set(plain)),
                  "builtins_missing": sorted(set(plain) - set(vars(builtins))),
                  "excepthook_default": sys.excepthook is sys.__excepthook__,
                  "displayhook_default": sys.displayhook is sys.__displayhook__}))
"""


async def test_a_python_program_reaches_nothing_of_the_zygote(sandbox: PoolInfo) -> None:
    # Issue 23, item 7: from its first frame the program walked f_back into the zygote's frames
    # and, through their globals, to every module, function and object of the zygote. Twice per
    # slot: the first run of a slot leaves the Python loop, later ones jail.c's.
    for _ in range(2 * len(sandbox.pool._slots)):
        r = await attack(sandbox.pool, ZYGOTE_PROBE, lim=limits(time_s=20))
        assert r.status is Status.OK, (r.status, r.stderr[-2000:])
        seen = report(r)
        assert seen["frames"][0] == "/sandbox/main.py", seen["frames"]
        if AT_TOP_LEVEL:
            assert len(seen["frames"]) == 1, seen["frames"]
            assert seen["hits"] == [], json.dumps(seen["hits"], indent=1)
        assert seen["main_is_mine"] and seen["main_extra"] == [], seen
        assert seen["builtins_extra"] == [] and seen["builtins_missing"] == [], seen
        assert seen["excepthook_default"] and seen["displayhook_default"], seen


async def test_no_zygote_state_reachable_when_collecting(sandbox: PoolInfo) -> None:
    # A run that collects files: the program is a fork of the trusted pid 1.
    needles = _needles(sandbox)
    stdin = json.dumps([n.encode().hex() for n in needles])
    src = LAYOUT_PROBE + "open('out.txt', 'w').write('x')\n"
    r = await sandbox.pool.run(Program(source=src, stdin=stdin, collect=["out.txt"]),
                               limits(time_s=20))
    assert r.status is Status.OK, (r.status, r.stderr[-2000:])
    assert report(r)["hits"] == []
    assert r.files == {"out.txt": b"x"}


async def test_the_probe_finds_host_paths_it_can_reach(sandbox: PoolInfo) -> None:
    # The probe is not blind: a needle the program itself holds in a global is found.
    stdin = json.dumps([b"/run/sandloop-probe-check".hex()])
    src = "KEEP = '/run/sandloop-probe-check' + ''.join(['/x'])\n" + LAYOUT_PROBE
    seen = report(await attack(sandbox.pool, src, stdin=stdin, lim=limits(time_s=20)))
    assert any(h[1] == "/run/sandloop-probe-check" for h in seen["hits"]), seen
