"""The determinism probe set and the comparison of its repeated outcomes (pure; the runs happen
in the sandbox, driven by ``sandloop env check``).

Each probe prints something a correct program may print and that an environment should pin:
set iteration order and ``hash()`` (PYTHONHASHSEED), the locale, the time zone, what a fresh
``python3`` in a shell run does. Run K times over every slot, any probe with more than one
distinct outcome (status + output) is nondeterministic in this environment.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Probe:
    """One program of the probe set."""

    name: str
    language: str
    source: str
    pins: str  # what it checks, for the report


PROBES: tuple[Probe, ...] = (
    Probe("set_order", "python",
          'print({"apple", "banana", "cherry", "date", "elderberry", "fig", "grape", "kiwi"})\n',
          "iteration order of a set of strings (PYTHONHASHSEED of the slot's interpreter)"),
    Probe("str_hash", "python", 'print(hash("abc"), hash(b"abc"), hash(("a", 1)))\n',
          "hash() of str/bytes/tuple (PYTHONHASHSEED of the slot's interpreter)"),
    Probe("locale", "python",
          "import locale, sys\n"
          "print(locale.setlocale(locale.LC_ALL, ''), locale.getpreferredencoding(False),\n"
          "      sys.getfilesystemencoding(), sys.stdout.encoding)\n",
          "locale and encodings (LANG/LC_ALL)"),
    Probe("timezone", "python",
          "import time\nprint(time.tzname, time.timezone, time.strftime('%Z %z', "
          "time.localtime(0)))\n",
          "time zone (TZ)"),
    Probe("environ", "python",
          "import os, sys\nprint(sorted(os.environ.items()), sys.flags.hash_randomization)\n",
          "the environment variables a program sees"),
    Probe("shell_python", "bash",
          "python3 -c 'print({\"apple\", \"banana\", \"cherry\", \"date\", \"fig\"})'\n"
          "date -d @0 '+%Z %z'\n",
          "a fresh python3 started from a shell run (PYTHONHASHSEED in the run's environment), "
          "and date's time zone"),
)


@dataclass(frozen=True)
class ProbeReport:
    """The distinct outcomes of one probe: ``variants`` maps (status, output) to a count."""

    probe: Probe
    variants: tuple[tuple[str, str, int], ...]

    @property
    def deterministic(self) -> bool:
        return len(self.variants) == 1


def compare(probe: Probe, outcomes: Iterable[tuple[str, str]]) -> ProbeReport:
    """Group a probe's outcomes, (status, output) each; most frequent first."""
    counts = Counter(outcomes)
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return ProbeReport(probe, tuple((s, out, n) for (s, out), n in ordered))


# Runs one probe in the sandbox and returns its (status, output); injected so that this layer,
# below the sandbox, drives runs without importing it (``env check`` gives a pool's, ``tasks
# validate`` the engine's).
ProbeRunner = Callable[[Probe], Awaitable[tuple[str, str]]]


async def check_determinism(run: ProbeRunner, *, repeat: int, width: int,
                            probes: Sequence[Probe] = PROBES,
                            concurrent: bool = False) -> list[ProbeReport]:
    """Run every probe ``repeat`` rounds of ``width`` runs each and compare the outcomes.

    ``width`` is the number of slots. Sequential runs (the default) visit every slot of a pool
    that hands slots out in FIFO order once per round; ``concurrent`` runs a round's ``width``
    runs at once, faster, and spread over the slots of an otherwise idle pool, but not
    guaranteed to touch each one (a quick run can free its slot for the next)."""
    if repeat < 1 or width < 1:
        raise ValueError("repeat and width must be >= 1")
    outcomes: list[list[tuple[str, str]]] = [[] for _ in probes]
    for _ in range(repeat):
        for i, probe in enumerate(probes):
            if concurrent:
                outcomes[i].extend(await asyncio.gather(*(run(probe) for _ in range(width))))
            else:
                for _slot in range(width):
                    outcomes[i].append(await run(probe))
    return [compare(p, o) for p, o in zip(probes, outcomes, strict=True)]
