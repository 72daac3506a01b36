"""Every exception sandloop raises on purpose sits in the tree of ``sandloop.errors``."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import sandloop
from sandloop.errors import InputError, SandloopError

# Exceptions that never reach a caller: control flow inside the sandboxed harness (which runs
# in the sandbox, away from sandloop's package) and inside the zygote's and server's own loops.
INTERNAL = {
    "sandloop.reward.sandbox_harness.CandidateError",
    "sandloop.reward.sandbox_harness.WorkerLost",
    "sandloop.reward.sandbox_harness.TestTimeout",
    "sandloop.sandbox.slot.CowUnavailable",
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


def _drawn_under() -> dict[str, set[str]]:
    """Each class name in the module docstring's drawing -> the top-level branches (the names
    after "├──"/"└──" at the first depth) it is drawn under."""
    import sandloop.errors

    doc = sandloop.errors.__doc__ or ""
    tree = doc[doc.index("    SandloopError\n"):doc.index("The HTTP status")]
    out: dict[str, set[str]] = {}
    branch = "SandloopError"
    for line in tree.splitlines():
        top = re.match(r"    [├└]── (\w+)", line)
        if top:
            branch = top.group(1)
        for name in re.findall(r"\b([A-Z][A-Za-z]+)\b", line):
            out.setdefault(name, set()).add(branch)
    return out


def test_the_drawn_tree_names_every_class_under_its_base() -> None:
    import sandloop.errors as errors

    drawn = _drawn_under()
    bases = {getattr(errors, n) for n in errors.__all__} - {SandloopError}
    missing, misplaced = [], []
    for cls in _exception_classes():
        if not issubclass(cls, SandloopError) or cls in bases or cls is SandloopError:
            continue
        if cls.__name__ not in drawn:
            missing.append(f"{cls.__module__}.{cls.__name__}")
            continue
        under = {b for b in bases if issubclass(cls, b)}
        # Drawn under its layer's base, or under InputError when that is its only base.
        if not any(getattr(errors, b, None) in under for b in drawn[cls.__name__]):
            misplaced.append(f"{cls.__name__}: drawn under {sorted(drawn[cls.__name__])}, "
                             f"derives from {sorted(b.__name__ for b in under)}")
    assert missing == [], f"draw these in sandloop.errors' docstring: {missing}"
    assert misplaced == [], misplaced
