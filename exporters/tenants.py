"""Bounded tenant labels: at most ``max_named`` tenants by name, chosen by traffic, stable over a window.

Within a window a tenant keeps the label it got: its own name while it is one of the named tenants
(a tenant not seen before is named while fewer than ``max_named`` are), else ``other``. At the end
of each window the named set becomes the ``max_named`` tenants with the most requests in it (ties
by name), so a tenant that grows is named from the next window on, and one that went quiet gives
its place up. Traffic is counted with the Space-Saving algorithm over ``4 * max_named`` counters,
so memory stays bounded however many distinct tenants call: a count is over by at most the
window's requests divided by the counters, and every tenant with more than that share is kept.
``unknown`` (no tenant) is a label of its own, outside the cap.
"""

from __future__ import annotations

import time
from collections.abc import Callable

OTHER = "other"
UNKNOWN = "unknown"
RESERVED = frozenset({OTHER, UNKNOWN})
COUNTERS_PER_NAME = 4


class TenantLabels:
    """Maps tenant names to bounded label values."""

    def __init__(self, max_named: int, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_named = max_named
        self._window_s = window_s
        self._clock = clock
        self._window_end = clock() + window_s
        self._named: set[str] = set()
        self._counts: dict[str, int] = {}
        self._capacity = COUNTERS_PER_NAME * max_named

    @property
    def named(self) -> frozenset[str]:
        """The tenants labelled by name in this window."""
        return frozenset(self._named)

    def label(self, tenant: str) -> tuple[str, frozenset[str]]:
        """Count one request of ``tenant``; its label and the tenants that just lost their name (window end)."""
        demoted: frozenset[str] = frozenset()
        if self._clock() >= self._window_end:
            demoted = self._next_window()
        if tenant in RESERVED:
            return tenant, demoted
        self._count(tenant)
        if tenant in self._named:
            return tenant, demoted
        if len(self._named) < self.max_named:
            self._named.add(tenant)
            return tenant, demoted
        return OTHER, demoted

    def _count(self, tenant: str) -> None:
        counts = self._counts
        if tenant in counts or len(counts) < self._capacity:
            counts[tenant] = counts.get(tenant, 0) + 1
            return
        smallest = min(counts, key=counts.__getitem__)  # Space-Saving: the new one inherits the smallest count
        counts[tenant] = counts.pop(smallest) + 1

    def _next_window(self) -> frozenset[str]:
        now = self._clock()
        while self._window_end <= now:
            self._window_end += self._window_s
        top = sorted(self._counts.items(), key=lambda item: (-item[1], item[0]))[: self.max_named]
        named = {name for name, _ in top}
        demoted = frozenset(self._named - named)
        self._named, self._counts = named, {}
        return demoted
