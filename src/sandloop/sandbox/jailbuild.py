"""Build the C fast path of a child's isolation steps (``jail.c``) once per source version.

The zygote (run as root) loads the library, so it is only ever taken from a directory that
belongs to the current user and that nobody else can write; otherwise it is built afresh in a
private temporary directory. Without a C compiler, or with ``SANDLOOP_JAIL=python``, the
zygote performs the same steps in Python (slower: about 2 ms more CPU per run).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

SOURCE = Path(__file__).with_name("jail.c")


@dataclass(frozen=True)
class JailBuild:
    path: str | None  # the shared library, or None: the Python steps are used
    detail: str  # what was used, or why not
    private_dir: str | None = None  # a one-off build directory, to remove when the pool closes

    def discard(self) -> None:
        if self.private_dir is not None:
            shutil.rmtree(self.private_dir, ignore_errors=True)


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sandloop"


def _private(path: Path, *, is_dir: bool) -> bool:
    """Owned by us and writable by nobody else (a planted library would run as root)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    kind = stat.S_ISDIR(st.st_mode) if is_dir else stat.S_ISREG(st.st_mode)
    return kind and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def build_jail() -> JailBuild:
    """Compile (or reuse) the helper library; never raises."""
    if os.environ.get("SANDLOOP_JAIL", "").lower() == "python":
        return JailBuild(None, "Python steps (SANDLOOP_JAIL=python)")
    try:
        source = SOURCE.read_bytes()
    except OSError as e:
        return JailBuild(None, f"Python steps (cannot read {SOURCE}: {e})")
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return JailBuild(None, "Python steps (no C compiler; install gcc for ~3.5 ms less CPU per run)")
    name = f"jail-{hashlib.sha256(source).hexdigest()[:16]}.so"
    cache = _cache_dir()
    with contextlib.suppress(OSError):
        cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    private_dir: str | None = None
    if _private(cache, is_dir=True):
        target = cache / name
        if _private(target, is_dir=False):
            return _loadable(JailBuild(str(target), f"C helper {target}"))
        where = cache
    else:
        where = Path(tempfile.mkdtemp(prefix="sandloop-jail-"))
        private_dir = str(where)
        target = where / name
    fd, tmp = tempfile.mkstemp(dir=where, suffix=".so.tmp")
    os.close(fd)
    try:
        proc = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", tmp, str(SOURCE)],
                              capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            return JailBuild(None, f"Python steps ({cc} failed: {proc.stderr.strip()[-300:]})")
        os.chmod(tmp, 0o700)
        os.replace(tmp, target)  # atomic: concurrent pools never load a half-written file
    except (OSError, subprocess.SubprocessError) as e:
        return JailBuild(None, f"Python steps (cannot build the C helper: {e})")
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return _loadable(JailBuild(str(target), f"C helper {target}", private_dir))


def _loadable(build: JailBuild) -> JailBuild:
    """The build if the library loads here (e.g. not on a noexec mount), else the Python steps:
    the zygote loads it the same way, and a zygote that cannot would fail the whole slot."""
    assert build.path is not None
    try:
        lib = ctypes.CDLL(build.path)
        lib.sl_spawn, lib.sl_serve  # noqa: B018 - resolving the symbols is the check
    except (OSError, AttributeError) as e:
        build.discard()
        return JailBuild(None, f"Python steps (the C helper does not load: {e})")
    return build
