"""Reading a program's work dir from the (root) supervisor without following its symlinks.

Threat: the program plants ``out.txt -> /etc/shadow`` (or a symlinked parent directory) and
waits for the privileged supervisor to read "its" output. Every path component is opened
relative to the previous one with O_NOFOLLOW, and only regular files are read, with a byte cap;
FIFOs and devices are refused before they can block or misbehave.
"""

from __future__ import annotations

import contextlib
import os
import stat
import struct

from sandloop.sandbox.models import check_relative_path


class UnsafePath(OSError):
    """A collected path is a symlink, not a regular file, or leaves the work dir."""


def read_regular(root: str, relpath: str, max_bytes: int) -> bytes:
    """Read ``root/relpath`` if every component is a real directory and the leaf a regular file."""
    check_relative_path(relpath)
    parts = relpath.split("/")
    flags_dir = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(root, flags_dir)
    try:
        for part in parts[:-1]:
            try:
                nfd = os.open(part, flags_dir, dir_fd=fd)
            except OSError as e:
                raise UnsafePath(f"{relpath}: component {part!r} is not a plain directory") from e
            os.close(fd)
            fd = nfd
        try:
            leaf = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                           dir_fd=fd)
        except OSError as e:
            raise UnsafePath(f"{relpath}: {e.strerror}") from e
    finally:
        os.close(fd)
    try:
        st = os.fstat(leaf)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(f"{relpath}: not a regular file")
        chunks = []
        left = max_bytes
        while left > 0:
            b = os.read(leaf, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        return b"".join(chunks)
    finally:
        os.close(leaf)


def pack_files(files: dict[str, bytes], executable: frozenset[str] = frozenset()) -> bytes:
    """Serialise files for the child to create (see ``zygote._write_files``)."""
    out = bytearray()
    for name, data in files.items():
        check_relative_path(name)
        raw = name.encode()
        mode = 0o755 if name in executable else 0o644
        out += struct.pack("<IQH", len(raw), len(data), mode)
        out += raw
        out += data
    return bytes(out)


def sealed_memfd(name: str, data: bytes) -> int:
    """A read-only in-memory file: used for stdin and for the request's files."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.lseek(fd, 0, os.SEEK_SET)
        import fcntl

        seals = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise
    return fd
