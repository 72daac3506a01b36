"""jail.c and sandbox/protocol.py describe one protocol: their constants, record kinds, the
errnos that make a file failure the program's verdict, and the structures the zygote shares
with the C loop must agree, or the C path and the Python path disagree at run time (a run
reported as the wrong kind of failure, a descriptor read from the wrong slot)."""

from __future__ import annotations

import errno
import re
from pathlib import Path

import pytest

from sandloop.sandbox import languages, protocol
from sandloop.sandbox.zygote import cjail, syscalls

JAIL_C = Path(protocol.__file__).with_name("jail.c").read_text()


def _defines(source: str) -> dict[str, str]:
    """Every object-like ``#define NAME value`` (comments stripped)."""
    out = {}
    for m in re.finditer(r"^#define\s+([A-Z_][A-Z0-9_]*)[ \t]+(.+?)\s*(?:/\*.*)?$", source, re.M):
        out[m.group(1)] = m.group(2).strip()
    return out


def _c_value(text: str) -> object:
    if text.startswith('"'):
        return text.strip('"').encode()
    if text.startswith("'"):
        return text.strip("'").encode()
    return int(text, 0)


DEFINES = _defines(JAIL_C)

# jail.c's name -> the protocol's value (bytes for strings and characters).
EXPECTED: dict[str, object] = {
    "SETUP_FAILED_EXIT": protocol.SETUP_FAILED_EXIT,
    "WORK_DIR": protocol.WORK_DIR.encode(),
    "N_RUN_FDS": protocol.N_RUN_FDS,
    "SPEC_MAGIC": protocol.SPEC_MAGIC,
    "RUN_MAGIC": protocol.RUN_MAGIC,
    "RUN_HEAD": protocol.RUN_HEAD_SIZE,
    "SL_MAX_RUNNING": protocol.SL_MAX_RUNNING,
    "SL_MAX_FDS": protocol.SL_MAX_FDS,
    "SL_NET_SNAP": protocol.SL_NET_SNAP,
    "SL_NET_FILES": protocol.SL_NET_FILES,
    "CHILD_RUN": protocol.CHILD_RUN,
    "CTL_READY": protocol.CTL_READY,
    "CTL_FAILED": protocol.CTL_FAILED,
    "REC_STARTED": protocol.Record.STARTED.value,
    "REC_SETUP_FAILED": protocol.Record.SETUP_FAILED.value,
    "REC_FILES_FAILED": protocol.Record.FILES_FAILED.value,
    "REC_EXIT": protocol.Record.EXIT.value,
    "FD_FILES": int(protocol.RunFd.FILES),
    "FD_SPEC": int(protocol.RunFd.SPEC),
    "FD_STATUS": int(protocol.RunFd.STATUS),
}


def test_the_parser_reads_jail_c() -> None:
    # Not vacuous: the defines were found, and a define that differs would be seen.
    assert set(EXPECTED) <= set(DEFINES), sorted(set(EXPECTED) - set(DEFINES))
    drifted = _defines(JAIL_C.replace("#define N_RUN_FDS 7", "#define N_RUN_FDS 8"))
    assert _c_value(drifted["N_RUN_FDS"]) != EXPECTED["N_RUN_FDS"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_jail_c_defines_match_the_protocol(name: str) -> None:
    assert _c_value(DEFINES[name]) == EXPECTED[name], (
        f"jail.c #define {name} {DEFINES[name]} differs from sandbox/protocol.py")


def test_file_errnos_match() -> None:
    body = re.search(r"static int file_errno\(int e\)\s*\{(.*?)\n\}", JAIL_C, re.S)
    assert body is not None
    in_c = set(re.findall(r"case\s+(E[A-Z0-9]+)\s*:", body.group(1)))
    assert len(in_c) > 5
    assert in_c == set(protocol.FILE_ERRNO_NAMES)
    assert {getattr(errno, n) for n in in_c} == protocol.FILE_ERRNOS


def _struct_fields(name: str) -> list[str]:
    """The member names of ``struct name { ... };`` in jail.c, in order."""
    m = re.search(r"struct " + name + r" \{(.*?)\n\};", JAIL_C, re.S)
    assert m is not None, name
    body = re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S)
    fields = []
    for decl in body.split(";"):
        decl = " ".join(decl.split())
        if not decl:
            continue
        # "int a, b[N]" / "const char **x" / "void *a, *b": the type is the leading words.
        parts = decl.split(",")
        first = re.match(r"(?:const\s+)?(?:unsigned\s+|struct\s+)?\w+\s+(.*)", parts[0])
        assert first is not None, decl
        for d in [first.group(1), *parts[1:]]:
            ident = re.match(r"\s*\**\s*(\w+)", d)
            assert ident is not None, decl
            fields.append(ident.group(1))
    return fields


@pytest.mark.parametrize(("c_name", "py_struct"), [("sl_child", cjail.SlChild),
                                                   ("sl_zygote", cjail.SlZygote)])
def test_ctypes_structures_mirror_jail_c(c_name: str, py_struct: type) -> None:
    py_fields = [f[0] for f in py_struct._fields_]  # type: ignore[attr-defined]
    assert _struct_fields(c_name) == py_fields


def test_jail_c_reads_the_network_files_python_reads() -> None:
    # The C loop and the Python loop take turns checking the slot's network namespace against
    # what the other read: the same files, in the same order (see jail.c shared_net).
    m = re.search(r"NET_FILES\[SL_NET_FILES\] = \{(.*?)\};", JAIL_C, re.S)
    assert m is not None
    assert tuple(re.findall(r'"(\w+)"', m.group(1))) == syscalls.NET_FILES
    assert len(syscalls.NET_FILES) == protocol.SL_NET_FILES


def test_languages_use_the_protocol_paths() -> None:
    assert languages.WORK_DIR == protocol.WORK_DIR
    assert languages.TOOLS_DIR == protocol.TOOLS_DIR
    assert languages.SANDBOX_PATH.startswith(protocol.TOOLS_DIR + ":")


def test_killed_for_names_every_reason_the_supervisor_kills_for() -> None:
    # "cancelled" was once missing from the documented set: every kill() reason in slot.py
    # must be one of protocol.KilledFor.
    from typing import get_args

    slot_src = Path(protocol.__file__).with_name("slot.py").read_text()
    reasons = set(re.findall(r"\bkill\(\"(\w+)\"\)", slot_src))
    assert {"wall", "cpu", "output", "cancelled"} <= reasons
    assert reasons <= set(get_args(protocol.KilledFor))


def test_framing_round_trips() -> None:
    msg = protocol.encode_run("abc", 64, 1000, 3)
    assert protocol.decode_msg(msg) == {"op": "run", "work": "abc", "workdir_mb": 64,
                                        "workdir_inodes": 1000, "ncg": 3}
    assert len(protocol.encode_run("", 1, 1, 1)) == protocol.RUN_HEAD_SIZE
    spec: protocol.RunSpec = {"env": {"A": "b"}, "collect": ["x"]}
    assert protocol.unpack_spec(protocol.pack_spec(((1, 2), (3, 4)), spec)) == (
        [(1, 2), (3, 4)], spec)
    assert protocol.unpack_spec(b"nope") is None
