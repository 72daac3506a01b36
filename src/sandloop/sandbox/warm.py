"""Warm modules: trusted, standard-library-only Python modules that every zygote of a pool
compiles and loads once, so that a program finds them ready in ``sys.modules`` instead of
loading them itself in every run.

The one user today is the verifier's in-sandbox harness (``reward.sandbox_harness`` and its value
codec): loading its ~1,200 lines from marshalled code cost each Python verification run ~1.8 ms
of CPU and ~230 page faults (docs/rewards.md has the A/B). The
layer that owns such a module registers it (``register``) when it is imported; pools started
afterwards load what is registered (``SandboxPool(warm_modules=...)`` overrides it). A program
must not trust that a module is there, or that it is the version it expects: each loaded
module carries ``__warm_hash__`` (``source_hash`` of its source), and a program that finds
another hash, or none, loads its own copy (the verifier's stub does).

The modules run their top level in the zygote, as root, before it locks itself down, so only
sandloop's own code is registered here, never anything a request or a task supplies. They hold
no secrets: every program of the pool can read them, as it could read the same source in the
run's files.
"""

from __future__ import annotations

import functools
import hashlib
import keyword
import marshal
import sys
from collections.abc import Mapping

__all__ = ["WarmModules", "register", "registered", "source_hash", "zygote_entries"]

WarmModules = Mapping[str, str]  # module name -> source

_REGISTERED: dict[str, str] = {}


def source_hash(source: str) -> str:
    """What a warm module's ``__warm_hash__`` is set to: a hash of its source."""
    return hashlib.sha256(source.encode("utf-8")).hexdigest()[:16]


def register(name: str, source: str) -> None:
    """Load module ``name`` from ``source`` in the zygotes of pools started from now on.
    ``name`` must be a plain identifier that no standard module uses (it goes straight into
    ``sys.modules``)."""
    if not name.isidentifier() or keyword.iskeyword(name):
        raise ValueError(f"a warm module's name must be a plain identifier, not {name!r}")
    _entry(name, source)  # compiles it: a module that cannot is refused here, not at pool start
    _REGISTERED[name] = source


def registered() -> dict[str, str]:
    """A copy of what is registered (what a pool loads by default)."""
    return dict(_REGISTERED)


def zygote_entries(modules: WarmModules) -> tuple[tuple[str, str, str, str, str], ...]:
    """``protocol.ZygoteConfig``'s ``warm``: each module with its hash and its code compiled
    here, which a zygote on an interpreter of the same cache tag loads instead of compiling."""
    return tuple(_entry(name, source) for name, source in modules.items())


@functools.lru_cache(maxsize=64)
def _entry(name: str, source: str) -> tuple[str, str, str, str, str]:
    code = compile(source, name + ".py", "exec", dont_inherit=True)
    return (name, source, source_hash(source), sys.implementation.cache_tag or "",
            marshal.dumps(code).hex())
