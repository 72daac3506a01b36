"""Build the C helper (src/sandloop/sandbox/jail.c) when sandloop is installed.

Everything else is in pyproject.toml. The helper is a plain shared library that the zygote
loads with ctypes (it uses no Python headers); it is built as an optional extension module so
that setuptools compiles it with the host's C compiler for wheels and editable installs alike
(an editable install puts it next to jail.c). Without a compiler the install still succeeds,
and runs use the same isolation steps in Python (slower; ``sandloop doctor`` says which).
The library records the SHA-256 of the source it was built from: ``sandloop.sandbox.jailbuild``
refuses one that no longer matches jail.c (reinstall to rebuild it).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from setuptools import Extension, setup

SOURCE = "src/sandloop/sandbox/jail.c"
digest = hashlib.sha256(Path(__file__).with_name("src").joinpath(
    "sandloop", "sandbox", "jail.c").read_bytes()).hexdigest()

setup(ext_modules=[Extension(
    "sandloop.sandbox._jail",
    [SOURCE],
    define_macros=[("SL_SOURCE_SHA256", f'"{digest}"')],
    extra_compile_args=["-O2"],
    optional=True,  # no compiler: install anyway, runs use the Python steps
)])
