"""Build the C helper (src/sandloop/sandbox/jail.c) when sandloop is installed.

Everything else is in pyproject.toml. The helper is a plain shared library that the zygote
loads with ctypes (it uses no Python headers); it is built as an optional extension module so
that setuptools compiles it with the host's C compiler for wheels and editable installs alike
(an editable install puts it next to jail.c). Without a compiler the install still succeeds,
and runs use the same isolation steps in Python (slower; ``sandloop doctor`` says which).
The library records the SHA-256 of the source it was built from: ``sandloop.sandbox.jailbuild``
refuses one that no longer matches jail.c (reinstall to rebuild it). It is named ``jail.so.1``,
not ``_jail.<abi>.so``: it is no Python module, and a name with a module suffix made every
package walk (``pkgutil.walk_packages``) try to import it.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

LIBRARY = "jail.so.1"  # must match sandloop.sandbox.jailbuild.LIBRARY

SOURCE = "src/sandloop/sandbox/jail.c"
digest = hashlib.sha256(Path(__file__).with_name("src").joinpath(
    "sandloop", "sandbox", "jail.c").read_bytes()).hexdigest()



class BuildJail(build_ext):
    """build_ext, with the helper under a name that is not a module's."""

    def get_ext_filename(self, fullname: str) -> str:
        name: str = super().get_ext_filename(fullname)
        if fullname.rpartition(".")[2] == "_jail":
            return os.path.join(os.path.dirname(name), LIBRARY)
        return name


setup(cmdclass={"build_ext": BuildJail}, ext_modules=[Extension(
    "sandloop.sandbox._jail",
    [SOURCE],
    define_macros=[("SL_SOURCE_SHA256", f'"{digest}"')],
    extra_compile_args=["-O2"],
    optional=True,  # no compiler: install anyway, runs use the Python steps
)])
