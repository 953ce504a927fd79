"""Live token counts of the requests in flight, written by the proxy, read by the KV-fragmentation signal."""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class InFlight:
    """One request's current size in tokens (prompt plus generated so far)."""

    model: str
    tokens: int


class InFlightTokens:
    """A small thread-safe table ``request key -> InFlight``; the proxy updates, collectors read copies."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._table: dict[str, InFlight] = {}

    def update(self, key: str, model: str, tokens: int) -> None:
        """Set the token count of a request (called on start and on every usage chunk)."""
        with self._lock:
            self._table[key] = InFlight(model, tokens)

    def remove(self, key: str) -> None:
        """Forget a finished request."""
        with self._lock:
            self._table.pop(key, None)

    def snapshot(self) -> list[InFlight]:
        """A copy of the current entries."""
        with self._lock:
            return list(self._table.values())
