"""ctypes bindings of jail.c: the C fast path of a child's isolation steps and of the zygote's
steady-state loop (see docs/sandbox.md, "The C helper, the Python steps, and why").

The structures mirror jail.c's ``struct sl_child`` and ``struct sl_zygote`` field by field.
"""

from __future__ import annotations

import ctypes
import os
from typing import TYPE_CHECKING, Any

from ..protocol import N_RUN_FDS, PRIVATE, SL_MAX_FDS, SL_MAX_RUNNING, SL_NET_FILES, SL_NET_SNAP

if TYPE_CHECKING:
    from .server import SpareKey, Zygote

class SlChild(ctypes.Structure):
    """``struct sl_child`` of jail.c."""

    _fields_ = [
        ("ctl_fd", ctypes.c_int), ("parent_fd", ctypes.c_int), ("work_opts", ctypes.c_char_p),
        ("tmp_opts", ctypes.c_char_p), ("tmp_binds", ctypes.POINTER(ctypes.c_char_p)),
        ("n_tmp_binds", ctypes.c_int), ("private_dir", ctypes.c_char_p),
        ("uid", ctypes.c_uint), ("gid", ctypes.c_uint),
        ("bpf", ctypes.c_char_p), ("bpf_len", ctypes.c_uint), ("detach_early", ctypes.c_int),
        ("net_fd", ctypes.c_int), ("zygote_net_fd", ctypes.c_int),
    ]



class SlZygote(ctypes.Structure):
    """jail.c's ``struct sl_zygote``: the zygote loop's state while the C loop runs it."""

    _fields_ = [
        ("sock", ctypes.c_int),
        ("spare_pid", ctypes.c_int), ("spare_ctl", ctypes.c_int),
        ("spare_pidfd", ctypes.c_int), ("spare_mntns", ctypes.c_int),
        ("spare_ready", ctypes.c_int),
        ("n_running", ctypes.c_int),
        ("run_pid", ctypes.c_int * SL_MAX_RUNNING), ("run_status", ctypes.c_int * SL_MAX_RUNNING),
        ("run_pidfd", ctypes.c_int * SL_MAX_RUNNING),
        ("clone_flags", ctypes.c_ulong),
        ("child", ctypes.c_void_p), ("proc_dir", ctypes.c_char_p),
        ("before_fork", ctypes.c_void_p), ("after_fork_parent", ctypes.c_void_p),
        ("after_fork_child", ctypes.c_void_p),
        ("key", ctypes.c_char * 128), ("spare_key", ctypes.c_char * 128),
        ("child_fds", ctypes.c_int * N_RUN_FDS),
        ("fast_runs", ctypes.c_ulong),
        ("zygote_net", ctypes.c_int), ("run_net", ctypes.c_int),
        ("net_files", ctypes.c_int * SL_NET_FILES), ("net_snap_len", ctypes.c_int),
        ("net_snap", ctypes.c_char * SL_NET_SNAP),
        ("n_fds", ctypes.c_int), ("fds", ctypes.c_int * SL_MAX_FDS),
        ("msg_len", ctypes.c_int), ("msg", ctypes.c_char * (1 << 16)),
    ]


class Jail:
    """The C fast path (jail.c) of prepare_child + drop_privileges + write_files, and of the
    zygote's steady-state loop."""

    def __init__(self, path: str) -> None:
        # PyDLL keeps the GIL across the call, as clone_fork needs.
        self.lib = ctypes.PyDLL(path, use_errno=True)
        self.lib._name = "sandloop-jail"  # not the host path
        self.lib.sl_spawn.restype = ctypes.c_long
        self.lib.sl_spawn.argtypes = [ctypes.c_ulong, ctypes.POINTER(SlChild),
                                      ctypes.POINTER(ctypes.c_int)]
        self.lib.sl_serve.restype = ctypes.c_int
        self.lib.sl_serve.argtypes = [ctypes.POINTER(SlZygote)]
        self.state = SlZygote()
        self.state.proc_dir = f"{PRIVATE}/proc".encode()
        api = ctypes.pythonapi
        for field, fn in (("before_fork", api.PyOS_BeforeFork),
                          ("after_fork_parent", api.PyOS_AfterFork_Parent),
                          ("after_fork_child", api.PyOS_AfterFork_Child)):
            setattr(self.state, field, ctypes.cast(fn, ctypes.c_void_p).value)
        # One prepared struct per tmpfs options (SpareKey); the objects it points into stay
        # referenced here for as long as it does.
        self._structs: dict[SpareKey, tuple[SlChild, Any, list[bytes]]] = {}

    def _struct(self, z: Zygote, key: SpareKey) -> SlChild:
        """The child's configuration for these tmpfs sizes, as of now (see prepare_child for
        detach_early)."""
        if key not in self._structs:
            opts = key
            binds = [x.encode() for pair in z.tmp_binds for x in pair]
            arr = (ctypes.c_char_p * max(1, len(binds)))(*binds)
            c = SlChild(
                work_opts=f"{opts},mode=0755,uid={z.uid},gid={z.gid}".encode(),
                tmp_opts=f"{opts},mode=1777".encode(), tmp_binds=arr,
                n_tmp_binds=len(binds) // 2, private_dir=PRIVATE.encode(), uid=z.uid,
                gid=z.gid, bpf=z.bpf or None, bpf_len=len(z.bpf),
            )
            if len(self._structs) > 64:  # only the sizes of requests' work dirs vary
                self._structs.clear()
            self._structs[key] = (c, arr, binds)
        c = self._structs[key][0]
        c.detach_early = int(not z.work_opts)
        return c

    def spawn(self, z: Zygote, key: SpareKey, flags: int, ctl: int, parent: int,
              net: int) -> int:
        """Clone a child that isolates itself in C (joining the network namespace ``net``, or,
        if -1, bringing up the fresh one ``flags`` give it). Returns the pid in the zygote; in
        the child, returns 0 once the request has arrived and the child is locked down (see
        jail.c)."""
        c = self._struct(z, key)
        c.ctl_fd, c.parent_fd = ctl, parent
        c.net_fd, c.zygote_net_fd = net, z.zygote_net
        ctypes.pythonapi.PyOS_BeforeFork()
        pid = int(self.lib.sl_spawn(ctypes.c_ulong(flags), ctypes.byref(c), self.state.child_fds))
        if pid == 0:
            ctypes.pythonapi.PyOS_AfterFork_Child()
            return 0
        ctypes.pythonapi.PyOS_AfterFork_Parent()
        if pid < 0:
            raise OSError(-pid, f"clone: {os.strerror(-pid)}")
        return pid

