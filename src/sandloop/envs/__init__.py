"""Runtime environments: specs, content-addressed read-only builds, verification.

The lowest layer above data (DESIGN.md): it imports nothing of the sandbox or above. The sandbox
mounts an :class:`Environment` (environment.py) at /opt/env; docs/environments.md says how.
"""

from sandloop.envs.environment import MOUNT_POINT, Environment, Mount
from sandloop.envs.errors import EnvBuildError, EnvNotFound, SpecError
from sandloop.envs.spec import (
    BUILTIN_ENVIRONMENTS,
    BUILTIN_LANGUAGES,
    Determinism,
    EnvSpec,
    Pin,
    PythonSpec,
    builtin_spec,
    load_spec,
    parse_spec,
)
from sandloop.envs.store import EnvInfo, EnvStore, VerifyReport, default_dir

__all__ = [
    "BUILTIN_ENVIRONMENTS",
    "BUILTIN_LANGUAGES",
    "MOUNT_POINT",
    "Determinism",
    "EnvBuildError",
    "EnvInfo",
    "EnvNotFound",
    "EnvSpec",
    "EnvStore",
    "Environment",
    "Mount",
    "Pin",
    "PythonSpec",
    "SpecError",
    "VerifyReport",
    "builtin_spec",
    "default_dir",
    "load_spec",
    "parse_spec",
]
