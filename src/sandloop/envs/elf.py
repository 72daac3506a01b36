"""Relocating copied binaries: rewrite host paths inside ELF files, in place.

An interpreter built by pyenv (or any ``./configure --prefix=...`` build) finds ``libpython``
through a RUNPATH naming its install prefix (``/root/.pyenv/versions/3.11.7/lib``) and keeps that
prefix as a compiled-in fallback. A copy in an environment tree must neither depend on nor show
that host path: inside the sandbox the path does not exist, and its name says where the host
keeps things. RUNPATH entries become ``$ORIGIN``-relative (so the tree also works where it lies
on the host, for build checks).

Other strings naming the prefix are left alone: the linker merges string tails, so
``PY_VERSION`` ("3.11.7") can be the last bytes of "/root/.pyenv/versions/3.11.7", and
overwriting the prefix (as conda does, with NUL padding) emptied ``sys.version`` here. The
compiled-in prefix is only a fallback the interpreter does not use when its landmarks (lib/
python3.X/os.py next to the binary) exist, which a built tree guarantees; it stays readable as
bytes of libpython. The build's check then imports every extension module of the copy.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path

from sandloop.envs.errors import EnvBuildError

_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_STRTAB, _DT_RPATH, _DT_RUNPATH = 0, 5, 15, 29


def is_elf(path: Path) -> bool:
    """Whether ``path`` is a regular file starting with the ELF magic."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def _runpath_slots(data: bytes) -> list[tuple[int, int]]:
    """(file offset, length) of each DT_RPATH / DT_RUNPATH string of a 64-bit little-endian
    ELF file; [] for any other kind (nothing to relocate there)."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return []
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads: list[tuple[int, int, int]] = []
    dynamic: tuple[int, int] | None = None
    for i in range(phnum):
        p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from(
            "<IIQQQQ", data, phoff + i * phentsize)
        if p_type == _PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == _PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return []
    strtab_vaddr: int | None = None
    paths: list[int] = []
    off, size = dynamic
    for pos in range(off, off + size, 16):
        tag, val = struct.unpack_from("<qQ", data, pos)
        if tag == _DT_NULL:
            break
        if tag == _DT_STRTAB:
            strtab_vaddr = val
        elif tag in (_DT_RPATH, _DT_RUNPATH):
            paths.append(val)
    if strtab_vaddr is None or not paths:
        return []
    strtab = next((strtab_vaddr - v + o for v, o, s in loads if v <= strtab_vaddr < v + s), None)
    if strtab is None:
        raise EnvBuildError("an ELF file's string table lies outside its loaded segments; "
                            "cannot relocate it")
    out = []
    for p in paths:
        start = strtab + p
        end = data.index(b"\0", start)
        out.append((start, end - start))
    return out


def relocate_elf(path: Path, map_dir: Callable[[str], Path | None]) -> bool:
    """Rewrite the RUNPATH/RPATH of ``path`` in place; True when it changed.

    ``map_dir`` maps a RUNPATH entry naming a host directory to where that directory's copy lies
    in the tree (None: leave the entry). Raises EnvBuildError when a rewritten string would not
    fit in the old one's bytes.
    """
    data = bytearray(path.read_bytes())
    before = bytes(data)
    for start, length in _runpath_slots(before):
        entries = before[start:start + length].decode("utf-8", "surrogateescape").split(":")
        new_entries = []
        for e in entries:
            target = map_dir(e)
            if target is None:
                new_entries.append(e)
            else:
                rel = os.path.relpath(target, path.parent)
                new_entries.append("$ORIGIN" if rel == "." else f"$ORIGIN/{rel}")
        new = ":".join(new_entries).encode("utf-8", "surrogateescape")
        if len(new) > length:
            raise EnvBuildError(f"{path.name}: its RUNPATH {entries} cannot be rewritten to "
                                f"{new_entries} in place (longer)")
        data[start:start + length] = new + b"\0" * (length - len(new))
    if bytes(data) == before:
        return False
    mode = path.stat().st_mode
    os.chmod(path, mode | 0o200)
    path.write_bytes(bytes(data))
    os.chmod(path, mode)
    return True
