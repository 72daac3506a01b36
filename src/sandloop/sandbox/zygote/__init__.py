"""The fork-server (zygote) of one slot, and the isolation steps of every child it spawns.

The zygote runs as its own process under the runtime's Python interpreter, started as root by
the slot supervisor (``slot.py``) as ``python -I -c BOOTSTRAP <socket fd> <this directory>``
with its configuration (``protocol.ZygoteConfig``) on stdin. It imports only the standard
library, holds no secrets, never runs untrusted code, and never reads a request's program,
arguments, stdin or files (they travel in memfds that only the child opens), so no child can
find an earlier run's data in the memory it inherits. Each run is a fresh child cloned into new
pid, mount, net, ipc and uts namespaces, which

  1. is born inside the slot's (limit-free) cgroups, which the zygote joined at start,
     lives in the zygote's minimal read-only root (runtime directories bound read-only, a few
     devices) and has an empty capability bounding set, both inherited from the zygote,
  2. mounts a fresh size- and inode-limited tmpfs at /tmp and a /proc of its own pid namespace,
     brings up loopback and reports ready. A child prepared while the slot is idle waits here,
     still root, so that a run skips clone and namespace setup;
  3. is moved by the zygote into the run's own cgroups (made by the supervisor with the run's
     limits), and then, on its request: mounts /sandbox (a fresh tmpfs, or a session's work
     dir), detaches the zygote's private area, sets rlimits, switches to the slot's
     unprivileged uid/gid, sets no_new_privs, loads the seccomp filter, writes the files, and
     becomes the program (exec, or Python in this already-warm interpreter). When files must be
     collected after the run, it instead forks the program and stays as a trusted pid 1 that
     reports its status and files.

One module per concern (as nsjail keeps one file per subsystem):

  ``../protocol.py``  what the supervisor, the zygote and jail.c share (constants, record
                      kinds, messages, descriptor order, framing)
  ``syscalls.py``     libc through ctypes: mount, prctl, clone, seccomp, loopback
  ``program.py``      the locked-down child's last steps: leave the zygote's frames, run the
                      program, or stay as the collecting pid 1
  ``child.py``        the child's isolation steps in Python (steps 2 and 3)
  ``cjail.py``        the same steps and the steady-state loop in C (jail.c), through ctypes
  ``server.py``       the zygote: setup, prepared children, the serving loop, ``main``

Steps 2 and 3 up to the files run in C (jail.c) when sandloop was installed with a C compiler
(``jailbuild``), else in Python (``child.py``): the same steps.

This ``__init__`` is the supervisor's side only (``BOOTSTRAP``, ``PACKAGE_DIR``); the zygote never
runs it.
"""

from __future__ import annotations

import os

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

# The zygote's modules, in dependency order, as BOOTSTRAP loads them: (module name under the
# root package, file relative to this directory).
MODULES = (
    ("protocol", "../protocol.py"),
    ("zygote", None),  # the package itself: an empty module, never this __init__
    ("zygote.syscalls", "syscalls.py"),
    ("zygote.program", "program.py"),
    ("zygote.child", "child.py"),
    ("zygote.cjail", "cjail.py"),
    ("zygote.server", "server.py"),
)
ROOT = "sandloop_zygote"  # stands for sandloop.sandbox in the zygote's sys.modules

# How the supervisor starts a zygote: ``python -I -c BOOTSTRAP <socket fd> <PACKAGE_DIR>``. Not
# as a script: a script's syntax tree stays alive while its top-level code runs, and main()
# never returns, so every child would inherit ~2 MiB of it, copying its page tables at fork and
# unmapping them at exit. Imported as modules (from their cached bytecode when there is one),
# nothing of the compilation stays. The modules are registered under ROOT without a file, a
# spec or a loader, and their code objects are renamed "<sandloop zygote>": a program that
# finds one (a frame, a function, a module) must not learn where sandloop lives on the host.
# Relative imports between them resolve through sys.modules (each has its __package__).
# In a child, server.main() returns once the zygote's frames are gone (program.RunProgram), and
# program_entry returns once the program is set to run: then this code ends too, and the
# interpreter starts the program from C, under no frame at all (program._RUNNER). The command
# compiles its text first: the syntax tree of a -c command lives until the command ends, which
# every child now reaches, and freeing it there cost each run ~30 copy-on-write faults. For the
# same reason each module keeps its own top-level code (``_bootstrap_code``): the last one,
# freed as this code returns in a child, cost ~45.
#
# Re-executed on an environment's interpreter (ZygoteConfig.exec), the zygote's files are not
# in its root: argv[2] is then "fd:N:M:S" (server.reexec): memfds holding N the configuration
# ({"config": ..., "tag": the first stage's cache tag}), M the modules' code, compiled (under
# the same neutral name) and marshalled by the first stage, S their sources ({name: source}).
# The code is loaded as from .pyc files when the cache tags match, else compiled here from the
# sources: compiling (and parsing the sources' JSON) leaves a more fragmented heap, which cost
# every run ~65 more copy-on-write faults. That interpreter runs without -I, so that it reads PYTHONHASHSEED (-s: no user
# site); the current directory it puts first on sys.path (-c) is removed, as -I would have.
_BOOTSTRAP_SOURCE = (
    "def _zygote():\n"
    "    import sys\n"
    "    from importlib.machinery import SourceFileLoader\n"
    "    from types import CodeType, ModuleType\n"
    "    def neutral(code):\n"
    "        consts = tuple(neutral(c) if isinstance(c, CodeType) else c\n"
    "                       for c in code.co_consts)\n"
    "        return code.replace(co_filename='<sandloop zygote>', co_consts=consts)\n"
    "    codes = None\n"
    "    if sys.argv[2].startswith('fd:'):\n"
    "        import json, marshal, os\n"
    "        fd, code_fd, src_fd = (int(x) for x in sys.argv[2][3:].split(':'))\n"
    "        tag = json.loads(os.pread(fd, os.fstat(fd).st_size, 0))['tag']\n"
    "        if tag == sys.implementation.cache_tag:\n"
    "            codes = marshal.loads(os.pread(code_fd, os.fstat(code_fd).st_size, 0))\n"
    "        else:\n"
    "            src = json.loads(os.pread(src_fd, os.fstat(src_fd).st_size, 0))\n"
    "            codes = {n: compile(s, '<sandloop zygote>', 'exec', dont_inherit=True)\n"
    "                     for n, s in src.items()}\n"
    "            del src\n"
    "        os.close(code_fd)\n"
    "        os.close(src_fd)\n"
    "        if sys.path[:1] == ['']:\n"
    "            del sys.path[0]\n"
    f"    root = {ROOT!r}\n"
    "    sys.modules[root] = ModuleType(root)\n"
    "    sys.modules[root].__package__ = root\n"
    f"    sys.modules[root].zygote_modules = (root, *(root + '.' + n for n, _ in {MODULES!r}))\n"
    f"    for name, rel in {MODULES!r}:\n"
    "        full = root + '.' + name\n"
    "        module = sys.modules[full] = ModuleType(full)\n"
    "        module.__package__ = full if rel is None else full.rpartition('.')[0]\n"
    "        if rel is None:\n"
    "            continue\n"
    "        if codes is None:\n"
    "            loader = SourceFileLoader(full, sys.argv[2] + '/' + rel)\n"
    "            code = neutral(loader.get_code(full))\n"
    "        else:\n"
    "            code = codes[name]\n"
    "        exec(code, module.__dict__)\n"
    "        module._bootstrap_code = code\n"
    "    del codes\n"
    "    server = sys.modules[root + '.zygote.server']\n"
    "    run = server.main()\n"
    "    return None if run is None else (sys.modules[root + '.zygote.program'].program_entry, run)\n"
    "_zygote = _zygote()\n"
    "if _zygote is not None:\n"
    "    _zygote[0](_zygote[1])\n"
)
BOOTSTRAP = f"exec(compile({_BOOTSTRAP_SOURCE!r}, '<string>', 'exec'))"

