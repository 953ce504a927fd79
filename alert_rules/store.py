"""In-memory time-series store: compact per-series arrays, retention per series, bounded size.

Timestamps are integer milliseconds (as in Prometheus); values are float64, the stale marker
included. A series keeps its samples in two ``array`` buffers (16 bytes a sample) and drops
samples older than its retention as new ones arrive.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from alert_rules.promql.ast import Matcher
from alert_rules.promql.values import NAME, Labels, is_stale, labels_of

TRIM_SLACK = 0.125
"""Samples are trimmed once the oldest is this share of the retention past it (amortizes deletes)."""


class Series:
    """One series' samples, oldest first."""

    __slots__ = ("labels", "mapping", "retention_ms", "special", "ts", "vs")

    def __init__(self, labels: Labels, retention_ms: int) -> None:
        self.labels = labels
        self.mapping = dict(labels)
        self.retention_ms = retention_ms
        self.ts = array("q")
        self.vs = array("d")
        self.special = 0  # NaN or stale samples currently held: the range fast path needs none

    def last_time(self) -> int | None:
        """Timestamp of the newest sample."""
        return self.ts[-1] if self.ts else None

    def trim(self, now_ms: int) -> None:
        """Drop samples older than the retention (in bulk, with some slack)."""
        if not self.ts:
            return
        horizon = now_ms - self.retention_ms
        if self.ts[0] >= horizon - int(self.retention_ms * TRIM_SLACK):
            return
        cut = bisect_left(self.ts, horizon)
        if self.special:
            self.special -= sum(1 for v in self.vs[:cut] if math.isnan(v))
        del self.ts[:cut]
        del self.vs[:cut]


@dataclass(frozen=True, slots=True)
class StoreStats:
    """Counts for the store's own metrics and the benchmark."""

    series: int
    samples: int
    dropped_out_of_order: int
    dropped_series_limit: int

    @property
    def bytes_per_sample(self) -> float:
        """Bytes of sample buffers per stored sample (timestamp + value)."""
        return 16.0


class SeriesStore:
    """Series indexed by metric name, queried the way PromQL selectors need."""

    def __init__(self, retention_ms: int = 6 * 3600 * 1000, max_series: int = 200_000) -> None:
        self.retention_ms = retention_ms
        self.max_series = max_series
        self._by_name: dict[str, dict[Labels, Series]] = {}
        self._sorted: dict[str, list[Series]] = {}
        self._count = 0
        self.dropped_out_of_order = 0
        self.dropped_series_limit = 0

    def __len__(self) -> int:
        return self._count

    def append(self, labels: Labels | Mapping[str, str], t_ms: int, value: float,
               retention_ms: int | None = None) -> bool:
        """Add one sample; returns False when it was dropped (out of order, duplicate, series limit)."""
        if not isinstance(labels, tuple):
            labels = labels_of(labels)
        name = labels[0][1] if labels and labels[0][0] == NAME else ""
        family = self._by_name.get(name)
        if family is None:
            family = self._by_name[name] = {}
        series = family.get(labels)
        if series is None:
            if self._count >= self.max_series:
                self.dropped_series_limit += 1
                return False
            series = family[labels] = Series(labels, retention_ms or self.retention_ms)
            self._count += 1
            self._sorted.pop(name, None)
        elif retention_ms is not None:
            series.retention_ms = retention_ms
        ts = series.ts
        if ts and t_ms <= ts[-1]:
            self.dropped_out_of_order += 1
            return False
        ts.append(t_ms)
        series.vs.append(value)
        if math.isnan(value):
            series.special += 1
        series.trim(t_ms)
        return True

    def backfill(self, labels: Labels, ts: array, vs: array, retention_ms: int | None = None) -> None:
        """Install a whole series at once (sorted timestamps in ms, values); replaces any held samples."""
        name = labels[0][1] if labels and labels[0][0] == NAME else ""
        family = self._by_name.setdefault(name, {})
        if labels not in family:
            self._count += 1
            self._sorted.pop(name, None)
        series = family[labels] = Series(labels, retention_ms or self.retention_ms)
        series.ts, series.vs = array("q", ts), array("d", vs)
        series.special = sum(1 for v in series.vs if math.isnan(v))

    def extend(self, samples: Iterable[tuple[Labels, float]], t_ms: int, retention_ms: int | None = None) -> int:
        """Append many samples at one timestamp; returns how many were kept."""
        return sum(1 for labels, value in samples if self.append(labels, t_ms, value, retention_ms))

    def gc(self, now_ms: int) -> int:
        """Trim every series and forget those with no sample left; returns how many were removed."""
        removed = 0
        for name, family in list(self._by_name.items()):
            for labels, series in list(family.items()):
                series.trim(now_ms)
                last = series.last_time()
                if last is None or last < now_ms - series.retention_ms:
                    del family[labels]
                    removed += 1
            if not family:
                del self._by_name[name]
            if removed:
                self._sorted.pop(name, None)
        self._count -= removed
        return removed

    def stats(self) -> StoreStats:
        """Series and sample counts."""
        samples = sum(len(s.ts) for f in self._by_name.values() for s in f.values())
        return StoreStats(self._count, samples, self.dropped_out_of_order, self.dropped_series_limit)

    def series(self, name: str | None, matchers: Sequence[Matcher]) -> list[Series]:
        """Series matching a selector, sorted by label set (Prometheus' order)."""
        if name is not None:
            candidates = self._sorted_family(name)
        else:
            candidates = sorted((s for f in self._by_name.values() for s in f.values()),
                                key=lambda s: s.labels)
        if not matchers:
            return candidates
        out = []
        for series in candidates:
            mapping = series.mapping
            if all(m.matches(mapping.get(m.name, "")) for m in matchers):
                out.append(series)
        return out

    def _sorted_family(self, name: str) -> list[Series]:
        cached = self._sorted.get(name)
        if cached is None:
            family = self._by_name.get(name, {})
            cached = self._sorted[name] = sorted(family.values(), key=lambda s: s.labels)
        return cached

    def instant(self, name: str | None, matchers: Sequence[Matcher], ref_ms: int,
                lookback_ms: int) -> list[tuple[Labels, float]]:
        """The latest sample at or before ``ref_ms`` and no older than the lookback, per series."""
        out = []
        oldest = ref_ms - lookback_ms
        for series in self.series(name, matchers):
            ts = series.ts
            if not ts or ts[0] > ref_ms:
                continue
            i = len(ts) - 1 if ts[-1] <= ref_ms else bisect_right(ts, ref_ms) - 1
            if ts[i] < oldest:
                continue
            value = series.vs[i]
            if math.isnan(value) and is_stale(value):
                continue
            out.append((series.labels, value))
        return out

    def window(self, name: str | None, matchers: Sequence[Matcher], mint_ms: int,
               maxt_ms: int) -> list[tuple[Labels, Sequence[int], Sequence[float]]]:
        """Samples with ``mint <= t <= maxt`` (both ends included, as Prometheus 2.x), stale ones left out."""
        out = []
        for series in self.series(name, matchers):
            ts = series.ts
            if not ts or ts[-1] < mint_ms or ts[0] > maxt_ms:
                continue
            lo = bisect_left(ts, mint_ms)
            hi = len(ts) if ts[-1] <= maxt_ms else bisect_right(ts, maxt_ms)
            if lo >= hi:
                continue
            times, values = ts[lo:hi], series.vs[lo:hi]
            if series.special and any(math.isnan(v) for v in values):
                kept = [(t, v) for t, v in zip(times, values, strict=True) if not is_stale(v)]
                if not kept:
                    continue
                times = array("q", (t for t, _ in kept))
                values = array("d", (v for _, v in kept))
            out.append((series.labels, times, values))
        return out
