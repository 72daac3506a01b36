"""Moving bytes into a sandbox without the supervisor touching the sandbox's file system.

Files and stdin go in as sealed memfds that the child reads after it has dropped privileges and
pivoted into its jail, and files come back the same way (collected by the run's trusted pid 1,
inside the jail). The root supervisor therefore never opens a path a program could have planted
a symlink at (``out.txt -> /etc/shadow``).
"""

from __future__ import annotations

import contextlib
import os
import struct

from sandloop.sandbox.models import check_relative_path


def pack_files(files: dict[str, bytes], executable: frozenset[str] = frozenset(),
               tmp_files: dict[str, bytes] | None = None) -> bytes:
    """Serialise files for the child to create (see ``zygote.child.write_files``): ``files`` under
    the work dir, ``tmp_files`` under the run's private /tmp (a workspace run's own program)."""
    out = bytearray()
    entries = [(check_relative_path(n), d) for n, d in files.items()]
    entries += [("/tmp/" + check_relative_path(n), d) for n, d in (tmp_files or {}).items()]
    for name, data in entries:
        raw = name.encode()
        mode = 0o755 if name.removeprefix("/tmp/") in executable else 0o644
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
