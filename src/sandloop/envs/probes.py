"""The determinism probe set and the comparison of its repeated outcomes (pure; the runs happen
in the sandbox, driven by ``sandloop env check``).

Each probe prints something a correct program may print and that an environment should pin:
set iteration order and ``hash()`` (PYTHONHASHSEED), the locale, the time zone, what a fresh
``python3`` in a shell run does. Run K times over every slot, any probe with more than one
distinct outcome (status + output) is nondeterministic in this environment.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
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
