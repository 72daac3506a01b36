"""Building an environment's tree from a spec: copy, relocate, install, compile, check, seal.

Everything comes from this host and the registries it reaches: the interpreter and its standard
library are copied from the host's installation (no site-packages), packages come from pip's
configured index (exact pins, ``--no-deps``: the spec is the lock), node_modules from ``npm ci``.
The tree is laid out as it appears in the sandbox under /opt/env, relocated so that no file names
the host path it came from, made read-only, and hashed (manifest.py).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandloop.envs import manifest
from sandloop.envs.elf import is_elf, relocate_elf
from sandloop.envs.environment import MOUNT_POINT, NODE_DIR, PYTHON_DIR
from sandloop.envs.errors import EnvBuildError
from sandloop.envs.spec import EnvSpec

Log = Callable[[str], None]

SANDBOX_PREFIX = f"{MOUNT_POINT}/{PYTHON_DIR}"
# Parts of the standard library a sandboxed program has no use for: its test suite (123 MiB
# here), GUI toolkits, the installer of pip (packages come only from a spec), and the static
# library and Makefile of config-3.X-*/ (for building extensions; 44 MiB).
_STDLIB_SKIP = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test",
                          "idlelib", "tkinter", "turtledemo", "ensurepip", "__pycache__"})
# A clean environment for running the tree's own interpreter during the build.
_CLEAN_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}

_PROBE = r"""
import json, os, sys, sysconfig
v = sysconfig.get_config_var
ver = v("VERSION")
exe = os.path.join(sys.base_prefix, "bin", "python" + ver)
if not os.path.isfile(exe):
    exe = os.path.realpath(sys.executable)
print(json.dumps({
    "version": ".".join(map(str, sys.version_info[:3])),
    "implementation": sys.implementation.name,
    "short": ver,
    "base_prefix": sys.base_prefix,
    "executable": os.path.realpath(exe),
    "stdlib": sysconfig.get_paths(vars={"installed_base": sys.base_prefix,
                                        "base": sys.base_prefix})["stdlib"],
    "shared": bool(v("Py_ENABLE_SHARED")),
    "libdir": v("LIBDIR") or "",
    "soname": v("INSTSONAME") or "",
    "ldlibrary": v("LDLIBRARY") or "",
    "platlibdir": sys.platlibdir,
    "multiarch": v("MULTIARCH") or "",
}))
"""


@dataclass
class BuildResult:
    """What a build produced, before it enters the store."""

    tree: Path
    resolved: dict[str, Any]
    manifest_text: str
    timings: dict[str, float] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)


def default_interpreter() -> str:
    """The interpreter a spec without ``python.interpreter`` copies: ``$SANDLOOP_PYTHON``, else
    the one running sandloop (its base installation: a virtualenv's packages never come)."""
    return os.environ.get("SANDLOOP_PYTHON") or sys.executable


def probe_interpreter(exe: str) -> dict[str, Any]:
    """Where a host interpreter keeps its binary, library and standard library."""
    try:
        out = subprocess.run([exe, "-I", "-c", _PROBE], capture_output=True, text=True,
                             check=True, timeout=60, env=_CLEAN_ENV).stdout
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        raise EnvBuildError(f"cannot run the interpreter {exe!r} ({e}); set python.interpreter "
                            "in the spec, or $SANDLOOP_PYTHON, to a working CPython") from None
    info: dict[str, Any] = json.loads(out)
    if info["implementation"] != "cpython":
        raise EnvBuildError(f"{exe}: {info['implementation']} is not CPython; environments "
                            "copy a CPython installation")
    return info


def _ignore_stdlib(directory: str, names: list[str]) -> set[str]:
    skip = {n for n in names if n in _STDLIB_SKIP}
    if os.path.basename(directory).startswith("python3"):  # the stdlib's top level
        skip |= {n for n in names if n.startswith("config-")}
    return skip


def copy_python(info: dict[str, Any], dest: Path) -> None:
    """Lay out ``dest`` (= /opt/env/python) as a prefix CPython recognises from its binary's
    location: bin/python3.X, lib/libpython3.X.so.1.0, lib/python3.X/ (no site-packages)."""
    short = info["short"]
    (dest / "bin").mkdir(parents=True)
    lib = dest / "lib"
    lib.mkdir()
    exe_name = f"python{short}"
    shutil.copy2(info["executable"], dest / "bin" / exe_name)
    for alias in ("python3", "python"):
        (dest / "bin" / alias).symlink_to(exe_name)
    if info["shared"] and info["soname"]:
        src = Path(info["libdir"]) / info["soname"]
        if not src.exists() and info["multiarch"]:
            src = Path(info["libdir"]) / info["multiarch"] / info["soname"]
        if not src.exists():
            raise EnvBuildError(f"{info['executable']} links {info['soname']}, which is not in "
                                f"{info['libdir']}; point python.interpreter at a complete "
                                "installation")
        shutil.copy2(os.path.realpath(src), lib / info["soname"])
        if info["ldlibrary"] and info["ldlibrary"] != info["soname"]:
            (lib / info["ldlibrary"]).symlink_to(info["soname"])
    stdlib = Path(info["stdlib"])
    target = lib / f"python{short}"
    shutil.copytree(stdlib, target, symlinks=True, ignore=_ignore_stdlib)
    (target / "site-packages").mkdir()
    # A copied lib-dynload may live outside the stdlib (Debian: /usr/lib/python3.X/lib-dynload
    # is inside; python.org and pyenv builds too). Refuse the layouts we did not handle.
    if not (target / "lib-dynload").is_dir():
        raise EnvBuildError(f"{stdlib} has no lib-dynload/; this interpreter's layout is not "
                            "supported, use a python.org-style build (pyenv, ./configure)")


def relocate(tree: Path, prefix_dir: Path, old_prefixes: tuple[str, ...],
             new_prefix: str) -> int:
    """Rewrite every file under ``prefix_dir`` that names an old prefix (the host installation,
    the build directory) so that it names ``new_prefix``; returns how many changed."""
    olds = tuple(sorted({p for p in old_prefixes if p and p != "/"}, key=len, reverse=True))

    def map_dir(entry: str) -> Path | None:
        for old in olds:
            if entry == old or entry.startswith(old + "/"):
                return prefix_dir / entry[len(old):].lstrip("/")
        return None

    changed = 0
    needles = [o.encode() for o in olds]
    for dirpath, _dirs, files in os.walk(prefix_dir):
        for name in files:
            p = Path(dirpath) / name
            if p.is_symlink() or not p.is_file():
                continue
            if is_elf(p):
                changed += relocate_elf(p, map_dir)
                continue
            data = p.read_bytes()
            if not any(n in data for n in needles) or b"\0" in data:
                continue
            for n in needles:
                data = data.replace(n, new_prefix.encode())
            mode = p.stat().st_mode
            os.chmod(p, mode | 0o200)
            p.write_bytes(data)
            os.chmod(p, mode)
            changed += 1
    # Symlinks pointing at an old prefix (absolute) would name a host path inside the sandbox.
    for dirpath, dirs, files in os.walk(prefix_dir):
        for name in dirs + files:
            p = Path(dirpath) / name
            if p.is_symlink():
                target = os.readlink(p)
                mapped = map_dir(target)
                if mapped is not None:
                    p.unlink()
                    p.symlink_to(os.path.relpath(mapped, p.parent))
                    changed += 1
    return changed


def _run(argv: list[str], what: str, log: Log, *, cwd: Path | None = None,
         env: dict[str, str] | None = None, timeout: float = 3600) -> str:
    log(f"$ {' '.join(argv)}")
    try:
        r = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=env,
                           timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise EnvBuildError(f"{what} failed: {e}") from None
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip()[-2000:]
        raise EnvBuildError(f"{what} failed (exit {r.returncode}):\n{tail}")
    return r.stdout


def install_packages(spec: EnvSpec, py_exe: Path, work: Path, log: Log) -> None:
    """pip install the spec's pins into the tree's site-packages, through the host's pip
    driving the tree's interpreter (``pip --python``), then ``pip check``: a pin whose own
    dependencies are not pinned fails the build, naming them."""
    assert spec.python is not None
    reqs = work / "requirements.lock"
    reqs.write_text("".join(p.requirement() + "\n" for p in spec.python.packages))
    pip = [sys.executable, "-m", "pip", "--python", str(py_exe), "--disable-pip-version-check",
           "--no-input"]
    env = {**os.environ, "PIP_NO_COMPILE": "1", "PIP_ROOT_USER_ACTION": "ignore"}
    for var in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        env.pop(var, None)
    _run([*pip, "install", "--no-deps", "--no-compile", "--no-warn-script-location",
          "--progress-bar", "off", "-r", str(reqs)], "pip install", log, env=env)
    try:
        _run([*pip, "check"], "pip check", log, env=env)
    except EnvBuildError as e:
        raise EnvBuildError(f"{e}\nthe spec pins packages whose dependencies are not pinned: "
                            "add each missing one as name==version to python.packages") from None


def installed_packages(site: Path) -> list[str]:
    """name==version of every distribution in ``site`` (from its .dist-info directories)."""
    out = []
    for d in sorted(site.glob("*.dist-info")):
        meta = d / "METADATA"
        if not meta.is_file():
            continue
        name = version = ""
        for line in meta.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("Name:"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("Version:"):
                version = line.split(":", 1)[1].strip()
            elif not line:
                break
        out.append(f"{re.sub(r'[-_.]+', '-', name).lower()}=={version}")
    return sorted(out)


def compile_bytecode(py_exe: Path, prefix_dir: Path, log: Log) -> None:
    """Byte-compile the whole prefix once, into the read-only tree: a program never compiles
    the standard library again, tracebacks name /opt/env/... (``-p``), and pycs are checked
    by hash-free ``unchecked-hash`` so that their bytes do not depend on file times."""
    argv = [str(py_exe), "-I", "-m", "compileall", "-q", "-f", "-j", "0",
            "--invalidation-mode", "unchecked-hash", "-s", str(prefix_dir), "-p", SANDBOX_PREFIX,
            str(prefix_dir / "lib")]
    log(f"$ {' '.join(argv)}")
    r = subprocess.run(argv, capture_output=True, text=True, env=_CLEAN_ENV, timeout=3600)
    if r.returncode != 0:
        # A package may ship files that are not valid Python 3 (templates, py2 leftovers);
        # they stay uncompiled, as pip itself would leave them.
        log(f"compileall: some files did not compile:\n{r.stdout.strip()[-1000:]}")


_IMPORT_ALL = r"""
import importlib, json, sys
bad = {}
for m in sys.argv[1:]:
    try:
        importlib.import_module(m)
    except Exception as e:
        bad[m] = f"{type(e).__name__}: {e}"
print(json.dumps({"version": sys.version, "failed": bad}))
"""


def _try_imports(exe: str, modules: list[str]) -> dict[str, Any]:
    r = subprocess.run([exe, "-I", "-c", _IMPORT_ALL, *modules], capture_output=True,
                       text=True, env=_CLEAN_ENV, timeout=300)
    if r.returncode != 0:
        raise EnvBuildError(f"the interpreter {exe} does not start: {r.stderr.strip()[-1000:]}")
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def check_imports(py_exe: Path, host_exe: str, preload: tuple[str, ...], log: Log) -> None:
    """Run the tree's interpreter isolated (-I, clean environment): it must report the host
    interpreter's version, import ``preload``, and import every extension module of its
    standard library that the host interpreter imports (a relocation that broke a library
    shows here, not in a program's run)."""
    dyn = sorted({p.name.split(".")[0] for p in py_exe.parent.parent.glob(
        "lib/python3*/lib-dynload/*.so")})
    log(f"checking the copy: {len(dyn)} extension modules, preload {list(preload)}")
    mine = _try_imports(str(py_exe), [*dyn, *preload])
    host = _try_imports(host_exe, dyn)
    if mine["version"] != host["version"]:
        raise EnvBuildError(f"the copied interpreter reports {mine['version']!r}, the host "
                            f"{host['version']!r}: the copy is broken")
    broken = {m: e for m, e in mine["failed"].items() if m not in host["failed"]}
    if broken:
        detail = "; ".join(f"{m}: {e}" for m, e in sorted(broken.items())[:8])
        raise EnvBuildError(f"the environment's interpreter cannot import {detail}; pin the "
                            "missing packages or fix the preload list")


def install_node(spec: EnvSpec, dest: Path, work: Path, log: Log) -> None:
    """node_modules from the spec's lockfile, by ``npm ci`` (exact, lockfile-only; install
    scripts are not run: they would execute package code on the host at build time)."""
    assert spec.node is not None
    npm = shutil.which("npm")
    if npm is None:
        raise EnvBuildError("[node] needs npm on the host (Debian: apt-get install npm)")
    dest.mkdir(parents=True)
    (dest / "package.json").write_text(spec.node.package_json, encoding="utf-8")
    (dest / "package-lock.json").write_text(spec.node.lockfile, encoding="utf-8")
    env = {**os.environ, "npm_config_cache": str(work / "npm-cache"),
           "npm_config_update_notifier": "false"}
    _run([npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--omit=dev"],
         "npm ci", log, cwd=dest, env=env)


def resolve_system(packages: tuple[str, ...], strict: bool) -> dict[str, str]:
    """Installed versions of host distribution packages (dpkg). ``strict``: a missing one is
    an error; otherwise it is recorded as absent (built-in environments)."""
    if not packages:
        return {}
    dpkg = shutil.which("dpkg-query")
    if dpkg is None:
        if strict:
            raise EnvBuildError("[system] packages need a Debian-family host (dpkg-query); "
                                "remove [system] on this host")
        return {p: "unknown" for p in packages}
    out: dict[str, str] = {}
    for p in packages:
        r = subprocess.run([dpkg, "-W", "-f", "${Version} ${db:Status-Status}", p],
                           capture_output=True, text=True, timeout=60)
        parts = r.stdout.split()
        if r.returncode == 0 and len(parts) == 2 and parts[1] == "installed":
            out[p] = parts[0]
        elif strict:
            raise EnvBuildError(f"system package {p!r} is not installed on this host; "
                                f"apt-get install {p}")
        else:
            out[p] = "absent"
    return out


# Where the sandbox finds a language's binaries (sandbox/languages.py HOST_PATH): not the
# caller's PATH, which may name a rustup shim in a home directory the sandbox never sees.
TOOL_PATH = "/usr/local/bin:/usr/bin:/bin"


def tool_stats(tools: tuple[str, ...]) -> dict[str, list[int]]:
    """The real file behind each of ``tools`` on :data:`TOOL_PATH`, with its size and mtime
    (what ``EnvStore.ensure`` compares to notice a host upgrade). Missing tools are left out."""
    out: dict[str, list[int]] = {}
    for t in tools:
        found = shutil.which(t, path=TOOL_PATH)
        if found is None:
            continue
        real = os.path.realpath(found)
        st = os.stat(real)
        out[real] = [st.st_size, st.st_mtime_ns]
    return out


def tool_packages(paths: list[str]) -> dict[str, str]:
    """The distribution package owning each binary, with its installed version (dpkg):
    ``{"/usr/lib/jvm/.../javac": "openjdk-17-jdk-headless 17.0.x"}``. A binary no package
    owns (built by hand) is recorded as such; not a Debian host: nothing."""
    dpkg = shutil.which("dpkg-query")
    if dpkg is None:
        return {}
    out: dict[str, str] = {}
    for real in paths:
        # dpkg knows merged-/usr files by their old name too (/bin/bash), so try both.
        pkg = ""
        for cand in (real, real.removeprefix("/usr")):
            r = subprocess.run([dpkg, "-S", cand], capture_output=True, text=True, timeout=60)
            if r.returncode == 0 and ":" in r.stdout:
                pkg = r.stdout.split(":", 1)[0].split(",")[0].strip()
                break
        if not pkg:
            out[real] = "(no package)"
            continue
        v = subprocess.run([dpkg, "-W", "-f", "${Version}", pkg], capture_output=True,
                           text=True, timeout=60)
        out[real] = f"{pkg} {v.stdout.strip()}" if v.returncode == 0 else pkg
    return out


def host_os() -> str:
    """``ID VERSION_ID`` from /etc/os-release (part of a resolved spec)."""
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        return platform.system().lower()
    kv = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    return f"{kv.get('ID', '').strip(chr(34))} {kv.get('VERSION_ID', '').strip(chr(34))}".strip()


def seal(tree: Path) -> None:
    """Make the tree read-only (and readable by the sandbox's unprivileged uids)."""
    for dirpath, dirs, files in os.walk(tree):
        for name in files:
            p = Path(dirpath) / name
            if p.is_symlink():
                continue
            mode = p.stat().st_mode & 0o7777 & ~0o7000  # no setuid/setgid/sticky in a runtime
            mode |= 0o444 | (0o111 if mode & 0o100 else 0)
            os.chmod(p, mode & ~0o222)
        for name in dirs:
            p = Path(dirpath) / name
            if not p.is_symlink():
                os.chmod(p, 0o555)
    os.chmod(tree, 0o555)


def build_tree(spec: EnvSpec, work: Path, log: Log, *, builtin: bool = False,
               tools: tuple[str, ...] = ()) -> BuildResult:
    """Build ``spec`` into ``work/tree`` and return it with its resolved spec and manifest.
    ``work`` is a fresh directory the caller owns (and removes on failure). ``tools``: the
    host binaries a toolchain built-in runs (recorded with their packages, and watched)."""
    tree = work / "tree"
    tree.mkdir(mode=0o755)
    timings: dict[str, float] = {}
    resolved: dict[str, Any] = {
        "format": 1,
        # The name and description are labels, not content: the same content under two names
        # is the same environment (one id).
        "spec": spec.model_dump(mode="json", exclude={"name", "description"}),
        "machine": platform.machine(),
        "os": host_os(),
    }
    source: dict[str, Any] = {}
    t0 = time.monotonic()
    if spec.python is not None:
        exe = spec.python.interpreter or default_interpreter()
        info = probe_interpreter(exe)
        if spec.python.version and spec.python.version != info["short"]:
            raise EnvBuildError(f"the spec asks for Python {spec.python.version}, but {exe} is "
                                f"{info['version']}; set python.interpreter (or "
                                "$SANDLOOP_PYTHON) to a matching host interpreter")
        prefix_dir = tree / PYTHON_DIR
        copy_python(info, prefix_dir)
        st = os.stat(info["executable"])
        source = {"interpreter": info["executable"], "size": st.st_size,
                  "mtime_ns": st.st_mtime_ns}
        olds = (info["base_prefix"], os.path.realpath(info["base_prefix"]))
        relocate(tree, prefix_dir, olds, SANDBOX_PREFIX)
        timings["copy_python_s"] = time.monotonic() - t0
        py_exe = prefix_dir / "bin" / f"python{info['short']}"
        if spec.python.packages:
            t = time.monotonic()
            install_packages(spec, py_exe, work, log)
            # Console scripts' shebangs and RECORDs name the build directory.
            relocate(tree, prefix_dir, (str(prefix_dir),), SANDBOX_PREFIX)
            timings["pip_install_s"] = time.monotonic() - t
        t = time.monotonic()
        compile_bytecode(py_exe, prefix_dir, log)
        timings["compile_s"] = time.monotonic() - t
        t = time.monotonic()
        check_imports(py_exe, info["executable"], spec.python.preload, log)
        timings["check_s"] = time.monotonic() - t
        site = prefix_dir / "lib" / f"python{info['short']}" / "site-packages"
        resolved["python"] = {"version": info["version"],
                              "installed": installed_packages(site)}
    if spec.node is not None:
        t = time.monotonic()
        install_node(spec, tree / NODE_DIR, work, log)
        timings["npm_ci_s"] = time.monotonic() - t
    for rel, content in sorted(spec.files.items()):
        p = tree / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content, encoding="utf-8")
        os.chmod(p, 0o644)
    resolved["system"] = resolve_system(spec.system.packages, strict=not builtin)
    if tools:
        stats = tool_stats(tools)
        resolved["toolchain"] = tool_packages(sorted(stats))
        source["tools"] = stats
    t = time.monotonic()
    seal(tree)
    text = manifest.render(manifest.scan(tree))
    timings["hash_s"] = time.monotonic() - t
    timings["total_s"] = time.monotonic() - t0
    return BuildResult(tree, resolved, text, timings, source)
