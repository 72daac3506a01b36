"""Every exception sandloop raises on purpose sits in the tree of ``sandloop.errors``."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import sandloop
from sandloop.errors import InputError, SandloopError

# Exceptions that never reach a caller: control flow inside the sandboxed harness (which runs
# in the sandbox, away from sandloop's package) and inside the zygote's and server's own loops.
INTERNAL = {
    "sandloop.reward.sandbox_harness.CandidateError",
    "sandloop.reward.sandbox_harness.WorkerLost",
    "sandloop.reward.sandbox_harness.TestTimeout",
    "sandloop.sandbox.zygote.syscalls.SetupError",
    "sandloop.sandbox.zygote.server.SpareGone",
    "sandloop.sandbox.zygote.child.FilesError",
    "sandloop.sandbox.zygote.program.RunProgram",
    "sandloop.server.auth.Refused",
    "sandloop.server.errors.ClientGone",
}


OPTIONAL = {"torch", "transformers", "trl", "tokenizers", "datasets", "ray", "pyarrow"}


def _exception_classes() -> list[type[BaseException]]:
    found = []
    for mod in pkgutil.walk_packages(sandloop.__path__, "sandloop."):
        if mod.name.endswith("__main__"):
            continue
        try:
            module = importlib.import_module(mod.name)
        except ModuleNotFoundError as e:
            # Modules of an optional extra (sandloop[train], [ray]) need its packages.
            if (e.name or "").split(".")[0] in OPTIONAL:
                continue
            raise
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if (issubclass(obj, BaseException) and obj.__module__ == module.__name__
                    and not obj.__name__.startswith("_")):  # private: never leaves its module
                found.append(obj)
    return found


def test_every_public_exception_derives_from_sandloop_error() -> None:
    classes = _exception_classes()
    assert len(classes) > 20  # the walk found the package's exceptions
    stray = [f"{c.__module__}.{c.__qualname__}" for c in classes
             if not issubclass(c, SandloopError)
             and f"{c.__module__}.{c.__qualname__}" not in INTERNAL]
    assert stray == [], f"add these to sandloop.errors' tree: {stray}"


def test_input_errors_are_value_errors() -> None:
    # Callers that caught ValueError for bad input before the tree existed still do.
    from sandloop.engine import ResourceTooLarge
    from sandloop.tasks.loaders import TaskFormatError

    assert issubclass(InputError, ValueError)
    assert issubclass(TaskFormatError, InputError) and issubclass(ResourceTooLarge, InputError)
