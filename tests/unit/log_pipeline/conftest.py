"""Shared helpers for the log pipeline tests: record factories and a hand-driven clock."""

from __future__ import annotations

import random
from typing import Any

import pytest

from log_pipeline.records import format_ts


class Clock:
    """A monotonic clock the test advances by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_records(n: int, seed: int = 1, start: float = 1_754_568_000.0) -> list[dict[str, Any]]:
    """``n`` realistic-looking request events with a ``seq`` field."""
    rng = random.Random(seed)
    records = []
    for i in range(n):
        ok = rng.random() > 0.1
        record: dict[str, Any] = {
            "ts": format_ts(start + i * 0.013), "level": "info" if ok else "error", "event": "request",
            "trace_id": f"{rng.getrandbits(128):032x}", "span_id": f"{rng.getrandbits(64):016x}",
            "model": rng.choice(["llama", "qwen"]), "route": "/v1/chat/completions",
            "outcome": "ok" if ok else "timeout", "http_status": 200 if ok else 504,
            "prompt_tokens": rng.randint(1, 4000), "e2e_ms": round(rng.random() * 9000, 1), "seq": i,
        }
        if not ok:
            record["error_type"] = "ReadTimeout"
            record["error_message"] = "upstream stalled — ünïcode"
        records.append(record)
    return records


@pytest.fixture(name="clock")
def _clock() -> Clock:
    return Clock()
