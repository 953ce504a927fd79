"""How long a closed-loop worker waits after a failed request: exponential backoff with jitter.

After the k-th failure in a row (k = 0 for the first) the base wait is ``initial_s * 2**k``, capped
at ``max_s``; the wait is drawn uniformly between the base and ``1 + JITTER`` times it (never below
the base, so never below ``initial_s``), and never shorter than the answer's ``Retry-After``. A
success starts the sequence again. This is what the README asks of every client.
"""

from __future__ import annotations

import random

JITTER = 0.5
INITIAL_MS = 500.0
"""The first wait (``--retry-initial-ms``): the README asks clients to start at 500 ms or more."""
MAX_MS = 5000.0
"""Where the doubling stops (``--retry-max-ms``)."""


class Backoff:
    """The waits of one worker; seeded, so a run's pauses can be replayed."""

    def __init__(self, initial_s: float, max_s: float, rng: random.Random) -> None:
        self.initial_s = initial_s
        self.max_s = max_s
        self._rng = rng
        self.failures_in_a_row = 0

    def base_s(self, failures_before: int) -> float:
        """The base wait after ``failures_before + 1`` failures in a row."""
        return min(self.max_s, self.initial_s * 2.0 ** min(failures_before, 64))

    def pause_after(self, ok: bool, retry_after_s: float | None = None) -> float:
        """Seconds to wait before the worker's next request: none after a success (the next failure waits
        ``initial_s`` again), else the next wait of the sequence, at least ``retry_after_s``."""
        if ok:
            self.failures_in_a_row = 0
            return 0.0
        base = self.base_s(self.failures_in_a_row)
        self.failures_in_a_row += 1
        return max(base * (1.0 + JITTER * self._rng.random()), retry_after_s or 0.0)
