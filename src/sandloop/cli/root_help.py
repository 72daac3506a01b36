"""``sandloop --help`` without typer: the same text, drawn from a table of the root's options
and commands.

typer (with the pydantic adapters it loads) and its help renderer cost this machine more than
the 100 ms the whole ``--help`` may take. The root's help is a fixed list, so this module draws
it with rich the way typer's ``rich_utils`` does (same console, theme, highlighters, panels and
tables), from the table below. A test renders it beside typer's at several widths, in colour and
without, and requires the same bytes: a command or option added to ``cli/commands.py`` without
its line here fails that test. Only the exact line ``sandloop --help`` comes here; everything
else goes to typer.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["COMMANDS", "OPTIONS", "print_root_help"]

USAGE = "Usage: sandloop [OPTIONS] COMMAND [ARGS]..."
HELP = ("sandloop: isolated, fast execution and trustworthy rewards for RL post-training. "
        "Exit codes: 0 ok, 1 the work found failures, 2 bad input, 3 infrastructure failed.")
# (long name, short name, help) of the root's options, all flags, in typer's order.
OPTIONS = (
    ("--version", "", "Print the version and exit."),
    ("--quiet", "-q", "No progress or notes on stderr (errors still)."),
    ("--verbose", "-v", "More detail: tracebacks of internal errors."),
    ("--help", "", "Show this message and exit."),
)
# (name, first paragraph of its help) of every command and group, in the listing's order.
COMMANDS = (
    ("doctor", "Report which isolation features work on this host and what `exec` will use."),
    ("exec", "Run one program in the sandbox. Exit 0: it succeeded; 1: it failed; 3: "
             "sandbox_error."),
    ("exec-batch", "Run many programs in parallel; print one ExecResult JSON per line, in "
                   "input order."),
    ("score", "Score model completions against a task set (pass@k, verdicts, JSONL out, "
              "resumable)."),
    ("demo", "Score the bundled HumanEval demo completions (references, wrong and cheating "
             "ones)."),
    ("serve", "The HTTP service: native API, SandboxFusion /run_code, OpenRLHF /get_reward, "
              "/metrics."),
    ("add-key", "Create an API key for `sandloop serve`; prints the token once (only its hash "
                "is stored)."),
    ("train", "Run GRPO with sandloop rewards: execute → reward → update, with curriculum and "
              "monitor."),
    ("monitor", "Reward monitoring: per-step statistics, reward-hack/drift/diversity/infra "
                "alerts, audits, HTML report."),
    ("episodes", "Multi-turn episodes: list and replay recorded ones."),
    ("cluster", "The Ray cluster sandloop runs on (docs/cluster.md)."),
    ("tasks", "Task governance: inspect, validate, curate, grade, split and diff task sets."),
    ("env", "Runtime environments: build specs into content-addressed read-only trees, list, "
            "show, remove, verify; check determinism across slots."),
)


def _console(highlighter: Any) -> Any:
    """typer's help console (``rich_utils._get_rich_console``), from the same variables."""
    from rich.console import Console
    from rich.theme import Theme

    force: bool | None = (True if os.getenv("GITHUB_ACTIONS") or os.getenv("FORCE_COLOR")
                          or os.getenv("PY_COLORS") else None)
    if os.getenv("_TYPER_FORCE_DISABLE_TERMINAL"):
        force = False
    width = os.getenv("TERMINAL_WIDTH")
    return Console(
        theme=Theme({"option": "bold cyan", "switch": "bold green",
                     "negative_option": "bold magenta", "negative_switch": "bold red",
                     "types": "bold yellow", "types_sep": "dim", "usage": "yellow"}),
        highlighter=highlighter, color_system="auto", force_terminal=force,
        width=int(width) if width else None)


def print_root_help() -> None:
    """Print the root's help on stdout, as typer's rich help would."""
    from rich.align import Align
    from rich.columns import Columns
    from rich.console import Group
    from rich.highlighter import RegexHighlighter
    from rich.padding import Padding
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    class OptionHighlighter(RegexHighlighter):
        highlights = [  # noqa: RUF012 (rich's own attribute)
            r"(^|\W)(?P<switch>\-\w+)(?![a-zA-Z0-9])",
            r"(^|\W)(?P<option>\-\-[\w\-]+)(?![a-zA-Z0-9])",
            r"(?P<types>\<[^\>]+\>)",
            r"(?P<usage>Usage: )",
        ]

    class NegativeOptionHighlighter(RegexHighlighter):
        highlights = [  # noqa: RUF012
            r"(^|\W)(?P<negative_switch>\-\w+)(?![a-zA-Z0-9])",
            r"(^|\W)(?P<negative_option>\-\-[\w\-]+)(?![a-zA-Z0-9])",
        ]

    class TypesHighlighter(RegexHighlighter):
        highlights = [  # noqa: RUF012
            r"^(?P<types_sep>(\[|<))",
            r"(?P<types_sep>\|)",
            r"(?P<types_sep>(\]|>))(\.\.\.)?$",
        ]

    highlighter = OptionHighlighter()
    negative, types = NegativeOptionHighlighter(), TypesHighlighter()
    console = _console(highlighter)

    console.print(Padding(highlighter(USAGE), 1), style="bold")
    # typer's _get_help_text is a rich group (of one text: the help's first paragraph).
    console.print(Padding(Align(Group(highlighter(Text.from_markup(HELP, style=""))),
                                pad=False), (0, 1, 1, 1)))

    options = Table(highlight=True, show_header=False, expand=True, box=None, show_lines=False,
                    leading=0, border_style=None, row_styles=None, pad_edge=False,
                    padding=(0, 1))
    for long, short, text in OPTIONS:
        options.add_row(highlighter(long), highlighter(short), negative(""), negative(""),
                        types(Text("<bool>", style="bold yellow", overflow="fold")),
                        Columns([highlighter(Text.from_markup(text, style=""))]))
    console.print(Panel(options, border_style="dim", title="Options", title_align="left"))

    commands = Table(highlight=False, show_header=False, expand=True, box=None,
                     show_lines=False, leading=0, border_style=None, row_styles=None,
                     pad_edge=False, padding=(0, 1))
    commands.add_column(style="bold cyan", no_wrap=True, width=max(len(n) for n, _ in COMMANDS))
    commands.add_column("Description", justify="left", no_wrap=False, ratio=10)
    for name, text in COMMANDS:
        commands.add_row(Text(name), highlighter(Text.from_markup(text, style="")))
    console.print(Panel(commands, border_style="dim", title="Commands", title_align="left"))
    # click then echoes the (empty) text its formatter collected: one more line.
    print()
