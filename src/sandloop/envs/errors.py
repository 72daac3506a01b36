"""What can go wrong with environments, each saying what to do next."""

from __future__ import annotations

from sandloop.errors import EnvError, InputError


class SpecError(EnvError, InputError):
    """An environment spec is malformed (a field, a pin, a file): the message names the fix."""


class EnvBuildError(EnvError, RuntimeError):
    """A build step failed (copying the interpreter, pip, npm, a check import)."""


class EnvNotFound(EnvError, InputError, LookupError):
    """No built environment has that name or id (prefix)."""
