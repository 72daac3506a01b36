"""The seccomp denylist every sandboxed program runs under, compiled once to classic BPF.

A denylist rather than an allowlist: model-written programs use interpreters and compilers whose
syscall sets change between versions, and an allowlist that breaks them turns into false
``runtime_error`` verdicts. What we deny are the syscalls that reach kernel attack surface or
undo the other layers (namespaces, mounts, other processes' memory), following isolate, flatpak
and firejail's default lists (research/isolation.md §6.1 item 5).
"""

from __future__ import annotations

import errno
import functools
import logging
import tempfile
from collections.abc import Iterable

logger = logging.getLogger(__name__)

# Syscalls that fail with EPERM. A name the kernel/libseccomp does not know is skipped.
DENY_EPERM: tuple[str, ...] = (
    # other processes' memory and tracing
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    # kernel attack surface with a history of exploits
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "keyctl", "add_key", "request_key",
    # leaving the mount / namespace jail
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "fsopen", "fsconfig",
    "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr", "open_by_handle_at",
    "name_to_handle_at",
    # the machine itself
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot",
    "swapon", "swapoff", "syslog", "acct", "quotactl", "quotactl_fd", "settimeofday",
    "clock_settime", "clock_adjtime", "adjtimex", "vhangup", "lookup_dcookie",
    # legacy and confusing interfaces
    "personality", "modify_ldt", "uselib", "ustat", "sysfs", "_sysctl", "nfsservctl",
    # NUMA placement can starve other tenants
    "mbind", "migrate_pages", "move_pages", "set_mempolicy",
)

# Syscalls that fail with ENOSYS, as on a kernel built without them (programs that can do
# without, e.g. ``tail -f``, fall back to polling). Watching inodes is a side channel here:
# /usr and the other runtime binds are the host's own inodes, so an inotify (or unprivileged
# fanotify) watch on them reports every file the host and the other tenants open or run.
DENY_ENOSYS: tuple[str, ...] = (
    "inotify_init", "inotify_init1", "inotify_add_watch", "fanotify_init", "fanotify_mark",
)

CLONE_NEWUSER = 0x10000000
AF_VSOCK = 40
TIOCSTI = 0x5412
TIOCLINUX = 0x541C


def _rules(f: object, names: Iterable[str], action: object) -> list[str]:
    import pyseccomp as sc

    skipped = []
    for name in names:
        try:
            f.add_rule(action, name)  # type: ignore[attr-defined]
        except (ValueError, RuntimeError, OSError):
            skipped.append(name)
    _ = sc
    return skipped


@functools.lru_cache(maxsize=1)
def compile_filter() -> bytes:
    """Build the denylist and return it as raw BPF (what ``prctl(PR_SET_SECCOMP)`` loads).

    Non-native architectures (32-bit x86 on x86_64, x32) are killed: a syscall number means
    something else there, which is the classic way around a denylist.
    """
    import pyseccomp as sc

    f = sc.SyscallFilter(defaction=sc.ALLOW)
    # A binary tree of syscall numbers instead of a linear chain: the kernel evaluates the
    # filter once per syscall number when it is loaded (its action cache), so this halves the
    # load cost paid by every run (libseccomp >= 2.5; older versions keep the chain).
    try:
        f.set_attr(sc.Attr.CTL_OPTIMIZE, 2)
    except (ValueError, RuntimeError, OSError) as e:
        logger.debug("libseccomp cannot build a binary tree (%s): a linear filter, dearer to "
                     "load per run", e)
    _rules(f, DENY_EPERM, sc.ERRNO(errno.EPERM))
    # New user namespaces would give the program a fresh set of capabilities to attack with.
    f.add_rule(sc.ERRNO(errno.EPERM), "clone",
               sc.Arg(0, sc.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER))
    # clone3 passes flags in memory, where BPF cannot look; ENOSYS makes libc fall back to clone.
    _rules(f, ("clone3", *DENY_ENOSYS), sc.ERRNO(errno.ENOSYS))
    # vsock reaches the hypervisor host on VMs like this one.
    f.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), "socket", sc.Arg(0, sc.EQ, AF_VSOCK))
    # Pushing characters into a terminal's input queue (TIOCSTI) or the console (TIOCLINUX).
    f.add_rule(sc.ERRNO(errno.EPERM), "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, TIOCSTI))
    f.add_rule(sc.ERRNO(errno.EPERM), "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, TIOCLINUX))
    with tempfile.TemporaryFile() as tmp:
        f.export_bpf(tmp)
        tmp.seek(0)
        return tmp.read()
