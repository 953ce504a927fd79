"""GPU-seconds per request, from vLLM's own numbers or, without them, a token-based estimate.

With the stat-logger plugin a request's GPU-seconds are its prefill time plus its decode time
shared with the batch it ran in: each moment of its decode counts ``1 / running``, where
``running`` is the scheduler's running count after the latest step (the plugin sends it on every
change). The same step states give the engine's busy time: the time during which at least one
request ran. Without the plugin the figure is an estimate, named as such (``basis="token_estimate"``):
prompt tokens over a prefill rate plus completion tokens over a decode rate (``[cost]``).
"""

from __future__ import annotations

import bisect

ENGINE = "engine"
TOKEN_ESTIMATE = "token_estimate"  # noqa: S105 - a label value, not a secret
STEPS_KEPT = 20_000
"""Step states kept: at the plugin's pace (a change, or every 0.1 s) well over the longest request."""


class BatchTimeline:
    """The scheduler's running count over time (step arrivals, Unix seconds) and the busy time it adds up to."""

    def __init__(self, kept: int = STEPS_KEPT) -> None:
        self._kept = kept
        self._times: list[float] = []
        self._running: list[int] = []
        self.busy_s = 0.0
        """Seconds with at least one request running, since the first step."""

    def add(self, at: float, running: int) -> None:
        """Note a step state that arrived at ``at`` (steps arrive in time order)."""
        if self._times and self._running[-1] > 0:
            self.busy_s += max(0.0, at - self._times[-1])
        self._times.append(at)
        self._running.append(running)
        if len(self._times) > 2 * self._kept:  # trimmed in halves: appends stay O(1) on average
            del self._times[: self._kept], self._running[: self._kept]

    def shared_seconds(self, start: float, end: float) -> float:
        """``∫ 1 / max(1, running) dt`` over ``[start, end]``: one request's share of the batch over that time."""
        if end <= start:
            return 0.0
        times, running = self._times, self._running
        if not times:
            return end - start
        total, at = 0.0, start
        if start < times[0]:  # before the first step kept: no batch known, the whole time counts
            at = min(end, times[0])
            total = at - start
        first = max(0, bisect.bisect_right(times, at) - 1)
        for index in range(first, len(times)):
            upto = times[index + 1] if index + 1 < len(times) else end
            upto = min(upto, end)
            if upto > at:
                total += (upto - at) / max(1, running[index])
                at = upto
            if at >= end:
                break
        if at < end:
            total += end - at
        return total


def engine_gpu_seconds(prefill_s: float, decode_s: float, end_unix: float, timeline: BatchTimeline) -> float:
    """A request's GPU-seconds from vLLM's numbers: its prefill plus its decode shared with its batch."""
    return prefill_s + timeline.shared_seconds(end_unix - decode_s, end_unix)


def estimated_gpu_seconds(prompt_tokens: int, completion_tokens: int, prefill_tokens_per_s: float,
                          decode_tokens_per_s: float) -> float:
    """The token-based estimate used without the plugin."""
    return prompt_tokens / prefill_tokens_per_s + completion_tokens / decode_tokens_per_s
