"""Replay JSON lines into a sink: the loop behind `inferwatch logs ingest` (and its benchmark)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from log_pipeline.sink import RecordSink


@dataclass(slots=True)
class IngestResult:
    """What an ingest saw: lines read, malformed lines, and sampling decisions by reason."""

    lines: int = 0
    malformed: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


def _decode(raw: bytes) -> Any:
    """orjson first (fast); the stdlib for what only it accepts (NaN, Infinity, integers past 64 bits)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def ingest_lines(
    lines: Iterable[bytes],
    sink: RecordSink,
    *,
    on_malformed: Callable[[int, str], None] | None = None,
    on_progress: Callable[[int], None] | None = None,
    progress_every: int = 100_000,
) -> IngestResult:
    """Sample and queue every JSON-object line (waiting for room); report malformed lines by number."""
    result = IngestResult()
    reasons = result.reasons
    for number, raw in enumerate(lines, start=1):
        result.lines = number
        try:
            event = _decode(raw)
        except ValueError as err:
            event = err
        if not isinstance(event, dict):
            if raw.strip():
                result.malformed += 1
                if on_malformed is not None:
                    why = f"not JSON ({event})" if isinstance(event, ValueError) else "not a JSON object"
                    on_malformed(number, why)
            continue
        reason = sink.put(event).reason
        reasons[reason] = reasons.get(reason, 0) + 1
        if on_progress is not None and number % progress_every == 0:
            on_progress(number)
    return result
