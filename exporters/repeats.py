"""Repeat prompts: what an answer cache with a TTL would have answered, from salted prompt hashes only.

A request is a repeat when the same prompt (its salted 64-bit hash, :attr:`RequestRecord.repeat_key`;
never the text) got a successful answer within the TTL before it, counted from that answer, as a
cache that stores an answer once and lets it expire would. Memory is bounded by ``max_entries``
hashes (oldest forgotten first); a hash forgotten before its TTL is counted in
:attr:`RepeatPrompts.forgotten_early`, and a repeat it would have matched is missed: that count
bounds the undercount. Two different prompts share a 64-bit hash with probability about
``entries / 2**64`` per request (under 1e-14 at 100,000 entries): a negligible overcount.
"""

from __future__ import annotations

from collections import OrderedDict


class RepeatPrompts:
    """The hashes of prompts answered within the TTL, in the order they were answered."""

    def __init__(self, ttl_s: float, max_entries: int) -> None:
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._answered: OrderedDict[int, float] = OrderedDict()
        self.forgotten_early = 0

    def __len__(self) -> int:
        return len(self._answered)

    def seen(self, key: int, now: float, answered: bool) -> bool:
        """Whether an answer to this prompt is still cached at ``now``; remember it when ``answered`` and not."""
        entries = self._answered
        while entries:
            oldest, at = next(iter(entries.items()))
            if now - at < self._ttl_s:
                break
            del entries[oldest]
        if key in entries:
            return True
        if answered:
            entries[key] = now
            if len(entries) > self._max_entries:
                entries.popitem(last=False)
                self.forgotten_early += 1
        return False
