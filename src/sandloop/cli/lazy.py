"""Command groups whose modules are imported only when one of their commands runs.

``sandloop --help`` lists every group with its one-line help, and ``sandloop exec`` needs none of
them; importing them all (``env`` alone pulls in the environment specs and pydantic) cost more
than the rest of the start-up together. The root group therefore holds a stand-in per group,
carrying only its name and help text, and swaps in the real group when it is resolved to run.
A test renders the root's help with the stand-ins and with the real groups and requires the two
to be the same, so the help texts below cannot drift from the modules' own.
"""

from __future__ import annotations

import importlib
from typing import Any, ClassVar, NamedTuple

from typer.core import TyperGroup
from typer.main import get_group_from_info
from typer.models import TyperInfo

__all__ = ["LazyGroup", "LazySub"]


class LazySub(NamedTuple):
    """A sub-``Typer`` named ``attr`` in ``module``, registered as a command group."""

    module: str
    attr: str
    help: str


class LazyGroup(TyperGroup):
    """A root group whose ``lazy`` sub-groups are stand-ins until one is resolved to run.

    Subclass it with ``lazy`` set (in the order the groups are listed, after the commands).
    Listing commands for help keeps the stand-ins; anything else that asks for a group by
    name (running it, its own ``--help``, completion) gets the real one.
    """

    lazy: ClassVar[dict[str, LazySub]] = {}

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self._stubs = dict(self.lazy)
        self._listing = False
        for name, sub in self.lazy.items():
            self.commands[name] = TyperGroup(name=name, help=sub.help,
                                             rich_markup_mode=self.rich_markup_mode)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        sub = self._stubs.get(cmd_name)
        if sub is not None and not self._listing:
            self.commands[cmd_name] = self._load(cmd_name, sub)
            del self._stubs[cmd_name]
        return self.commands.get(cmd_name)

    def _load(self, name: str, sub: LazySub) -> TyperGroup:
        """The real group, built as ``Typer.add_typer(app, name=name)`` on the root would."""
        typer_app = getattr(importlib.import_module(sub.module), sub.attr)
        return get_group_from_info(TyperInfo(typer_app, name=name),
                                   pretty_exceptions_short=True,
                                   suggest_commands=self.suggest_commands,
                                   rich_markup_mode=self.rich_markup_mode)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False
