"""Find the C fast path of a child's isolation steps (``jail.c``), built when sandloop was
installed (``setup.py``: an optional extension, next to ``jail.c``), and decide whether the
zygote may load it.

The zygote (run as root) loads the library, so it is only taken from a directory and a file
that belong to root or the current user and that nobody else can write, and only if it was
built from this very ``jail.c`` (it records the source's SHA-256: a library left by an older
install would speak an older protocol). Otherwise, without a compiler at install time, or with
``SANDLOOP_JAIL=python``, the zygote performs the same steps in Python (slower: about 2 ms
more CPU per run). Nothing is compiled at run time.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

PACKAGE_DIR = Path(__file__).parent
LIBRARY = "jail.so.1"  # what setup.py builds (not a module's name: see there)
REBUILD = ("reinstall sandloop with a C compiler present to build it "
           "(`pip install -e .` in a checkout, `make deps`)")


@dataclass(frozen=True)
class JailBuild:
    path: str | None  # the shared library, or None: the Python steps are used
    detail: str  # what was used, or why not


def _trusted(path: Path, *, is_dir: bool) -> str | None:
    """Why ``path`` may not be loaded as root, or None: it is of the right kind, owned by root
    or by us, and writable by nobody else (a library someone else could plant or rewrite
    would run as root in every zygote)."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return f"cannot stat {path}: {e.strerror}"
    if not (stat.S_ISDIR(st.st_mode) if is_dir else stat.S_ISREG(st.st_mode)):
        return f"{path} is not a {'directory' if is_dir else 'regular file'}"
    if st.st_uid not in (0, os.geteuid()):
        return f"{path} belongs to uid {st.st_uid}"
    if st.st_mode & 0o022:
        return f"{path} is writable by others (mode {st.st_mode & 0o7777:o})"
    return None


def _library(directory: Path) -> Path | None:
    """The library setup.py built in ``directory``, if there is one (any CPython can load it:
    it uses no Python headers)."""
    candidate = directory / LIBRARY
    return candidate if os.path.lexists(candidate) else None


def find_jail(directory: Path = PACKAGE_DIR) -> JailBuild:
    """The installed helper library if the zygote can use it, else why not; never raises."""
    if os.environ.get("SANDLOOP_JAIL", "").lower() == "python":
        return JailBuild(None, "Python steps (SANDLOOP_JAIL=python)")
    library = _library(directory)
    if library is None:
        return JailBuild(None, "Python steps (no C helper was built when sandloop was installed, "
                               f"probably for want of a C compiler; {REBUILD}: ~2 ms less CPU "
                               "per run)")
    refused = _trusted(directory, is_dir=True) or _trusted(library, is_dir=False)
    if refused is not None:
        return JailBuild(None, f"Python steps (the C helper is not trusted: {refused})")
    try:
        source = hashlib.sha256((directory / "jail.c").read_bytes()).hexdigest()
    except OSError as e:
        return JailBuild(None, f"Python steps (cannot read jail.c: {e})")
    try:
        lib = ctypes.CDLL(str(library))
        lib.sl_source_sha256.restype = ctypes.c_char_p
        built_from = lib.sl_source_sha256() or b""
        lib.sl_spawn, lib.sl_serve  # noqa: B018 - resolving the symbols is the check
    except (OSError, AttributeError, ValueError) as e:
        # E.g. on a noexec mount: a zygote that tried to load it would fail the whole slot.
        logger.debug("the C helper %s does not load: %s", library, e)
        return JailBuild(None, f"Python steps (the C helper does not load: {e})")
    if built_from.decode() != source:
        return JailBuild(None, f"Python steps (the C helper {library} was built from another "
                               f"version of jail.c; {REBUILD})")
    return JailBuild(str(library), f"C helper {library} (built at install)")

