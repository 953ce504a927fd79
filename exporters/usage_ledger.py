"""Usage by tenant, model and cost pool in time buckets, so a sidecar can answer for any past window.

The sidecar keeps :data:`RETENTION_S` (8 days, a weekly report plus a day) in buckets of
:data:`BUCKET_S` (5 minutes); only buckets and rows with traffic are held. A window's figures are
the buckets that start inside it, so its edges are exact to a bucket.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

BUCKET_S = 300
RETENTION_S = 8 * 86_400


@dataclass(slots=True)
class Usage:
    """What a tenant used of a model in a cost pool (one row of a showback report)."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0
    gpu_seconds: float = 0.0
    gpu_seconds_estimated: float = 0.0
    """The part of gpu_seconds that is the token-based estimate (requests without the plugin's numbers)."""
    cost: float = 0.0
    prefix_cache_saved_cost: float = 0.0
    repeat_requests: int = 0
    repeat_saved_tokens: int = 0

    def add(self, other: Usage) -> None:
        """Add ``other``'s figures to these: every field, written out (twice per request, so no loop over
        ``dataclasses.fields``; tests/unit/exporters/test_usage.py checks that no field is left out)."""
        self.requests += other.requests
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.cached_prompt_tokens += other.cached_prompt_tokens
        self.gpu_seconds += other.gpu_seconds
        self.gpu_seconds_estimated += other.gpu_seconds_estimated
        self.cost += other.cost
        self.prefix_cache_saved_cost += other.prefix_cache_saved_cost
        self.repeat_requests += other.repeat_requests
        self.repeat_saved_tokens += other.repeat_saved_tokens


Key = tuple[str, str, str]
"""(tenant label, model, cost pool)."""


class UsageLedger:
    """Usage rows per time bucket, bounded by the retention."""

    def __init__(self, bucket_s: int = BUCKET_S, retention_s: int = RETENTION_S) -> None:
        self.bucket_s = bucket_s
        self._retention_s = retention_s
        self._buckets: dict[int, dict[Key, Usage]] = {}
        self._lock = threading.Lock()

    def add(self, at_unix: float, key: Key, usage: Usage) -> None:
        """Account ``usage`` to ``key`` in the bucket of ``at_unix``."""
        start = int(at_unix // self.bucket_s) * self.bucket_s
        with self._lock:
            bucket = self._buckets.get(start)
            if bucket is None:
                bucket = self._buckets[start] = {}
                for old in [b for b in self._buckets if b < start - self._retention_s]:
                    del self._buckets[old]
            row = bucket.get(key)
            if row is None:
                bucket[key] = row = Usage()
            row.add(usage)

    def window(self, from_unix: float, to_unix: float) -> dict[Key, Usage]:
        """The rows of the buckets that start in ``[from_unix, to_unix)``, summed."""
        rows: dict[Key, Usage] = {}
        with self._lock:
            for start, bucket in self._buckets.items():
                if not from_unix <= start < to_unix:
                    continue
                for key, usage in bucket.items():
                    row = rows.get(key)
                    if row is None:
                        rows[key] = row = Usage()
                    row.add(usage)
        return rows
