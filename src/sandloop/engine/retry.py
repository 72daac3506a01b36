"""The engine's retry policy: the one place where infrastructure failures are retried.

Only the engine retries. Below it, the sandbox pool and the verifier *classify* (a broken slot
or a lost backend is a ``sandbox_error`` result; a program's failure is its verdict) and return
at once; above it, surfaces never loop on a ``sandbox_error``. Stacked retries multiplied: the
pool, the engine and the verifier each retrying once made up to 9 attempts of one verifier run.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["RetryPolicy"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a job whose run ended in ``sandbox_error`` (the infrastructure's fault) is retried.

    ``max_attempts`` counts the first run (1 = never retry). Attempt ``n`` (n >= 1 retries done)
    waits ``backoff_s * factor**(n-1)``, capped at ``max_backoff_s``, scaled by a random factor
    in ``[1 - jitter, 1 + jitter]`` so that jobs failed together do not come back together.
    Retries go back to the front of the queue and usually land on another slot (the pool has
    replaced a broken one). Session runs are never retried: their state may be gone.
    """

    max_attempts: int = 3
    backoff_s: float = 0.05
    factor: float = 2.0
    max_backoff_s: float = 2.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.backoff_s < 0 or self.max_backoff_s < 0 or self.factor < 1:
            raise ValueError("backoff_s and max_backoff_s must be >= 0 and factor >= 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"jitter must be within [0, 1], got {self.jitter}")

    def allows(self, attempts_done: int) -> bool:
        """Whether another attempt may follow ``attempts_done`` failed ones."""
        return attempts_done < self.max_attempts

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (1 for the first retry)."""
        base = min(self.max_backoff_s, self.backoff_s * self.factor ** (retry - 1))
        return base * (1 + self.jitter * (2 * random.random() - 1))
