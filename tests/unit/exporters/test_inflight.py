"""The live table's view of a stream: its size, and whether vLLM is running it now."""

from __future__ import annotations

import time
from dataclasses import dataclass

from exporters.inflight import GENERATING_WITHIN_NS, InFlightTokens


@dataclass
class Stream:
    content_events: int = 0
    last_content_ns: int | None = None


def test_a_stream_counts_as_generating_only_while_its_tokens_come() -> None:
    """Tokens lately: running. None yet, or none for a while (preempted, blocks freed): not, though its size stays."""
    table, now = InFlightTokens(), time.perf_counter_ns()
    table.track("waiting", "m", 100, Stream())
    table.track("running", "m", 100, Stream(40, now))
    table.track("preempted", "m", 100, Stream(25, now - GENERATING_WITHIN_NS - 1))
    table.track("not a stream", "m", 100)
    assert [(entry.tokens, entry.generating) for entry in table.local_snapshot()] == [
        (100, False), (140, True), (125, False), (100, False)]
