"""Keep-or-drop decisions for request records: every error, every slow request, a ratio of the rest.

The ratio part agrees with OpenTelemetry Python's ``TraceIdRatioBased`` sampler: a trace is kept
when the low 64 bits of its 128-bit trace id are below ``round(ratio * 2**64)``. The decision is a
pure function of the trace id, so every process (the sidecar, ``inferwatch logs ingest``, the
tracer) picks the same traces, and a trace kept at a ratio is kept at any larger ratio.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_BOUND = 2**64
_HEX = frozenset("0123456789abcdefABCDEF")

ERROR = "error"
SLOW = "slow"
SAMPLED = "sampled"
DROPPED_SAMPLING = "dropped_sampling"

SPAN_ATTRIBUTE = "inferwatch.log.sampled"
"""Span attribute naming whether the request's log record was kept (True/False)."""


@dataclass(frozen=True, slots=True)
class Decision:
    """Whether a record is kept and why: ``error``, ``slow``, ``sampled`` or ``dropped_sampling``."""

    keep: bool
    reason: str


_KEEP_ERROR = Decision(True, ERROR)
_KEEP_SLOW = Decision(True, SLOW)
_KEEP_SAMPLED = Decision(True, SAMPLED)
_DROP = Decision(False, DROPPED_SAMPLING)


def trace_randomness(trace_id: str) -> int:
    """The 64-bit value a trace id is sampled on: its low 64 bits, or a BLAKE2b hash of a malformed id."""
    if len(trace_id) == 32 and _HEX.issuperset(trace_id):
        return int(trace_id[16:], 16)
    digest = hashlib.blake2b(trace_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class Sampler:
    """Decides once, at the end of a request, whether its record is kept."""

    __slots__ = ("_bound", "ratio")

    def __init__(self, ratio: float) -> None:
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"sampling ratio must be between 0 and 1, got {ratio!r}")
        self.ratio = ratio
        self._bound = round(ratio * _BOUND)

    def decide(self, trace_id: str, *, is_error: bool, slow: bool) -> Decision:
        """Keep every error and slow request, and the trace ids under the ratio's bound."""
        if is_error:
            return _KEEP_ERROR
        if slow:
            return _KEEP_SLOW
        if trace_randomness(trace_id) < self._bound:
            return _KEEP_SAMPLED
        return _DROP

    def decide_event(self, event: Mapping[str, Any], *, slow_after_ms: float = 0.0) -> Decision:
        """Decide for a log event dict (see :func:`classify`)."""
        is_error, slow = classify(event, slow_after_ms=slow_after_ms)
        trace_id = event.get("trace_id")
        return self.decide(trace_id if isinstance(trace_id, str) else "", is_error=is_error, slow=slow)


def classify(event: Mapping[str, Any], *, slow_after_ms: float = 0.0) -> tuple[bool, bool]:
    """``(is_error, slow)`` of an event: any outcome but ``ok`` (or level error) is an error.

    A request is slow when its ``slow`` flag is true, or when ``slow_after_ms`` is positive and its
    ``e2e_ms`` exceeds it. Missing or mistyped fields count as neither.
    """
    return classify_fields(event.get("outcome"), event.get("level"), event.get("slow"), event.get("e2e_ms"),
                           slow_after_ms=slow_after_ms)


def classify_fields(
    outcome: object, level: object, slow_flag: object, e2e_ms: object, *, slow_after_ms: float = 0.0
) -> tuple[bool, bool]:
    """:func:`classify` on an event's ``outcome``, ``level``, ``slow`` and ``e2e_ms`` (None: absent).

    The sink's request path calls this with a finished request's values without building its
    event; ``e2e_ms`` is only read when ``slow_after_ms`` is positive.
    """
    is_error = (outcome is not None and outcome != "ok") or level in ("error", "critical")
    slow = slow_flag is True
    if not slow and slow_after_ms > 0:
        slow = isinstance(e2e_ms, int | float) and not isinstance(e2e_ms, bool) and e2e_ms > slow_after_ms
    return is_error, slow
