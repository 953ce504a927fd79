"""Live token counts of the requests in flight, written by the proxy, read by the KV-fragmentation signal."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class InFlight:
    """One request's current size in tokens (prompt plus generated so far)."""

    model: str
    tokens: int


class InFlightTokens:
    """A table ``request key -> [model, tokens]``; the proxy updates it on every usage chunk.

    It sits on the streaming hot path, so updates are a dict lookup and an item store, with no
    lock: each operation is a single atomic step under the GIL, and readers take a copy.
    """

    def __init__(self) -> None:
        self._table: dict[str, list[object]] = {}

    def update(self, key: str, model: str, tokens: int) -> None:
        """Set the token count of a request (called on start and on every usage chunk)."""
        entry = self._table.get(key)
        if entry is None:
            self._table[key] = [model, tokens]
        else:
            entry[1] = tokens

    def remove(self, key: str) -> None:
        """Forget a finished request."""
        self._table.pop(key, None)

    def snapshot(self) -> list[InFlight]:
        """A copy of the current entries."""
        return [InFlight(str(model), int(tokens)) for model, tokens in list(self._table.values())]  # type: ignore[call-overload]
