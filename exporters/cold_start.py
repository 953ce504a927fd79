"""Cold starts of the upstream, measured by the sidecar from its readiness probes and its requests.

A cold start runs from readiness lost (or, when the sidecar starts beside an upstream that is not
ready yet, from the first probe that found it so) to the first successful token after readiness
returned. Feed :meth:`ColdStartTracker.probe` with every readiness probe result and
:meth:`ColdStartTracker.first_token` with every successful first token (the first content chunk
of a successful stream, or a successful non-streamed answer). A token that arrives while the
probes still say "not ready" proves readiness and ends the cold start too. The tracker keeps
the histogram's counts and the last few cold starts as immutable snapshots, replaced whole, so
``collect()`` and the ``/readyz`` details read them without a lock.
"""

from __future__ import annotations

import bisect
import enum
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import HistogramMetricFamily, Metric

from exporters.buckets import le_label
from exporters.catalog.process import UPSTREAM_COLD_START

RECENT_KEPT = 5


class Phase(enum.Enum):
    """Where the upstream is in its readiness cycle, as far as the sidecar has seen."""

    UNSEEN = "unseen"
    READY = "ready"
    DOWN = "down"
    AWAITING_TOKEN = "awaiting_token"  # noqa: S105 - a phase name, not a secret


@dataclass(frozen=True, slots=True)
class ColdStart:
    """One finished cold start: why it began, when (Unix seconds) and how long each part took."""

    cause: str
    """``readiness_lost`` or ``not_ready_at_start``."""
    began_unix: float
    ready_after_s: float
    first_token_after_s: float

    def to_json(self) -> dict[str, Any]:
        """JSON-ready (for ``/readyz``)."""
        return {"cause": self.cause, "began_unix": self.began_unix, "ready_after_s": round(self.ready_after_s, 3),
                "first_token_after_s": round(self.first_token_after_s, 3)}


@dataclass(frozen=True, slots=True)
class _Counts:
    buckets: tuple[int, ...]
    total: float = 0.0

    @property
    def count(self) -> int:
        return sum(self.buckets)


class ColdStartTracker:
    """Turns readiness probes and first tokens into cold starts; ``clock`` is monotonic, ``wall`` Unix time."""

    def __init__(
        self, *, clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
        keep: int = RECENT_KEPT,
    ) -> None:
        self._clock, self._wall, self._keep = clock, wall, keep
        self.phase = Phase.UNSEEN
        self._cause = ""
        self._began = self._began_unix = self._ready_at = 0.0
        self.recent: tuple[ColdStart, ...] = ()
        """The last ``keep`` cold starts, oldest first."""
        self._bounds = tuple(b for b in UPSTREAM_COLD_START.buckets or ())
        self._counts = _Counts((0,) * (len(self._bounds) + 1))

    def probe(self, ready: bool) -> None:
        """Take one readiness probe result."""
        if not ready:
            if self.phase in (Phase.UNSEEN, Phase.READY):
                self._cause = "not_ready_at_start" if self.phase is Phase.UNSEEN else "readiness_lost"
                self._began, self._began_unix = self._clock(), self._wall()
            self.phase = Phase.DOWN  # lost again while awaiting the token: the same cold start goes on
        elif self.phase is Phase.UNSEEN:
            self.phase = Phase.READY  # already up when first seen: no cold start to measure
        elif self.phase is Phase.DOWN:
            self._ready_at = self._clock()
            self.phase = Phase.AWAITING_TOKEN

    def first_token(self, at: float | None = None) -> ColdStart | None:
        """Take one successful first token, which arrived at ``at`` (``clock`` time; default now).

        Returns the cold start it ends, if any. A token from before the cold start began (a
        request that started earlier and finished later) ends nothing.
        """
        if self.phase is Phase.UNSEEN:
            self.phase = Phase.READY
        if self.phase not in (Phase.DOWN, Phase.AWAITING_TOKEN):
            return None
        now = self._clock() if at is None else at
        if now < self._began:
            return None
        # ready no later than the token: it may have come before the probe that saw readiness return
        ready_at = min(self._ready_at, now) if self.phase is Phase.AWAITING_TOKEN else now
        event = ColdStart(self._cause, self._began_unix, ready_at - self._began, now - self._began)
        self.phase = Phase.READY
        self.recent = (*self.recent, event)[-self._keep:]
        slot = bisect.bisect_left(self._bounds, event.first_token_after_s)
        buckets = list(self._counts.buckets)
        buckets[slot] += 1
        self._counts = _Counts(tuple(buckets), self._counts.total + event.first_token_after_s)
        return event

    def in_progress(self) -> dict[str, Any] | None:
        """The cold start going on now (for ``/readyz``), None when the upstream is serving."""
        if self.phase not in (Phase.DOWN, Phase.AWAITING_TOKEN):
            return None
        return {"cause": self._cause, "began_unix": self._began_unix, "phase": self.phase.value,
                "for_s": round(self._clock() - self._began, 3)}

    def details(self) -> dict[str, Any]:
        """What ``/readyz`` shows: the cold start in progress and the last few finished ones."""
        return {"cold_start_in_progress": self.in_progress(), "recent_cold_starts": [c.to_json() for c in self.recent]}

    def collect(self) -> Iterator[Metric]:
        """The cold-start histogram (a prometheus_client collector)."""
        counts = self._counts
        family = HistogramMetricFamily(UPSTREAM_COLD_START.name, UPSTREAM_COLD_START.help)
        cumulative, running = [], 0
        for bound, count in zip((*(le_label(b) for b in self._bounds), "+Inf"), counts.buckets, strict=True):
            running += count
            cumulative.append((bound, float(running)))
        family.add_metric([], cumulative, counts.total)
        yield family
