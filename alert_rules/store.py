"""In-memory time-series store: compact per-series arrays, retention per series, bounded size.

Timestamps are integer milliseconds (as in Prometheus); values are float64, the stale marker
included. A series keeps its samples in two ``array`` buffers (16 bytes a sample) and drops
samples older than its retention as new ones arrive. It also notes its counter resets as they
arrive (rare: a few bytes per reset), so rate() and increase() read a window's first and last
sample and its resets by bisection instead of copying and scanning it. Every write bumps a
per-name change counter, which lets the evaluator reuse a result while its inputs are unchanged.
"""

from __future__ import annotations

import math
import operator
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress, islice

from alert_rules.promql.ast import Matcher
from alert_rules.promql.values import NAME, Labels, drop_name, get, is_stale, labels_of

TRIM_SLACK = 0.125
"""Samples are trimmed once the oldest is this share of the retention past it (amortizes deletes)."""


class Series:
    """One series' samples, oldest first, with the counter resets they hold.

    ``reset_ts`` / ``reset_prev`` list, oldest first, the samples lower than the sample stored
    just before them (their time, and that previous value). They are kept as samples arrive, so
    rate() and increase() need no scan of the window; they describe the window exactly while the
    series holds no NaN (``special == 0``), which is when they are used.
    """

    __slots__ = ("labels", "mapping", "reset_prev", "reset_ts", "retention_ms", "special", "ts", "unnamed",
                 "vs")

    def __init__(self, labels: Labels, retention_ms: int) -> None:
        self.labels = labels
        self.unnamed = drop_name(labels)
        self.mapping = dict(labels)
        self.retention_ms = retention_ms
        self.ts = array("q")
        self.vs = array("d")
        self.special = 0  # NaN or stale samples currently held: the fast paths need none
        self.reset_ts: array[int] | None = None
        self.reset_prev: array[float] | None = None

    def last_time(self) -> int | None:
        """Timestamp of the newest sample."""
        return self.ts[-1] if self.ts else None

    def note_reset(self, t_ms: int) -> None:
        """Record that the sample about to be appended at ``t_ms`` is lower than the last one."""
        if self.reset_ts is None or self.reset_prev is None:
            self.reset_ts, self.reset_prev = array("q"), array("d")
        self.reset_ts.append(t_ms)
        self.reset_prev.append(self.vs[-1])

    def load(self, ts: array[int], vs: array[float]) -> None:
        """Replace every sample (sorted timestamps) and find the resets among them."""
        self.ts, self.vs = array("q", ts), array("d", vs)
        self.special = sum(1 for v in self.vs if math.isnan(v))
        drops = list(compress(range(1, len(self.vs)), map(operator.gt, self.vs, islice(self.vs, 1, None))))
        if drops:
            self.reset_ts = array("q", (self.ts[i] for i in drops))
            self.reset_prev = array("d", (self.vs[i - 1] for i in drops))
        else:
            self.reset_ts = self.reset_prev = None

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
        if self.reset_ts is not None:
            # a reset at the new first sample lost the sample it was lower than
            gone = bisect_right(self.reset_ts, self.ts[0]) if self.ts else len(self.reset_ts)
            if gone == len(self.reset_ts):
                self.reset_ts = self.reset_prev = None
            elif gone and self.reset_prev is not None:
                del self.reset_ts[:gone]
                del self.reset_prev[:gone]

    def bounds(self, mint_ms: int, maxt_ms: int) -> tuple[int, int]:
        """Index range ``[lo, hi)`` of the samples with ``mint <= t <= maxt``."""
        ts = self.ts
        n = len(ts)
        last = ts[-1]
        if mint_ms > last:
            return n, n
        hi = n if last <= maxt_ms else bisect_right(ts, maxt_ms)
        first = ts[0]
        if mint_ms <= first:
            return 0, hi
        # samples are near-regular: guess the index from the mean spacing, then check it
        i = n - 1 - (last - mint_ms) * (n - 1) // (last - first)
        if 0 < i < n and ts[i] >= mint_ms > ts[i - 1]:
            return i, hi
        if 0 <= i < n - 1 and ts[i + 1] >= mint_ms > ts[i]:
            return i + 1, hi
        return bisect_left(ts, mint_ms, 0, hi), hi

    def increase(self, lo: int, hi: int) -> float:
        """Last minus first value of ``[lo, hi)`` plus the value before each reset in it (no NaN held)."""
        vs = self.vs
        result = vs[hi - 1] - vs[lo]
        resets = self.reset_ts
        if resets is not None:
            ts = self.ts
            start = bisect_right(resets, ts[lo])
            stop = bisect_right(resets, ts[hi - 1], start)
            prev = self.reset_prev
            for k in range(start, stop):
                result += prev[k]  # type: ignore[index]
        return result


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
        self._selected: dict[str, dict[tuple[Matcher, ...], list[Series]]] = {}
        self._changes: dict[str, int] = {}  # per metric name, bumped by every write
        self._all_changes = 0
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
        name = _name_of(labels)
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
            self._forget_selection(name)
        elif retention_ms is not None:
            series.retention_ms = retention_ms
        ts = series.ts
        if ts:
            if t_ms <= ts[-1]:
                self.dropped_out_of_order += 1
                return False
            if value < series.vs[-1]:
                series.note_reset(t_ms)
        ts.append(t_ms)
        series.vs.append(value)
        if value != value:  # noqa: PLR0124 (NaN, the stale marker included; cheaper than math.isnan here)
            series.special += 1
        retention = series.retention_ms
        if ts[0] < t_ms - retention - int(retention * TRIM_SLACK):  # Series.trim's own test, inlined
            series.trim(t_ms)
        self._changes[name] = self._changes.get(name, 0) + 1
        self._all_changes += 1
        return True

    def _changed(self, name: str) -> None:
        self._changes[name] = self._changes.get(name, 0) + 1
        self._all_changes += 1

    def generation(self, names: frozenset[str] | None) -> int:
        """A number that changes whenever a series of one of these metric names (None: any) changes."""
        if names is None:
            return self._all_changes
        changes = self._changes
        return sum(changes.get(name, 0) for name in names)

    def backfill(self, labels: Labels, ts: array[int], vs: array[float], retention_ms: int | None = None) -> None:
        """Install a whole series at once (sorted timestamps in ms, values); replaces any held samples."""
        name = _name_of(labels)
        family = self._by_name.setdefault(name, {})
        if labels not in family:
            self._count += 1
        self._forget_selection(name)
        series = family[labels] = Series(labels, retention_ms or self.retention_ms)
        series.load(ts, vs)
        self._changed(name)

    def extend(self, samples: Iterable[tuple[Labels, float]], t_ms: int, retention_ms: int | None = None) -> int:
        """Append many samples at one timestamp; returns how many were kept."""
        return sum(1 for labels, value in samples if self.append(labels, t_ms, value, retention_ms))

    def gc(self, now_ms: int) -> int:
        """Trim every series and forget those with no sample left; returns how many were removed."""
        removed = 0
        for name, family in list(self._by_name.items()):
            self._changed(name)  # samples may have been trimmed
            for labels, series in list(family.items()):
                series.trim(now_ms)
                last = series.last_time()
                if last is None or last < now_ms - series.retention_ms:
                    del family[labels]
                    removed += 1
            if not family:
                del self._by_name[name]
            if removed:
                self._forget_selection(name)
        self._count -= removed
        return removed

    def stats(self) -> StoreStats:
        """Series and sample counts."""
        samples = sum(len(s.ts) for f in self._by_name.values() for s in f.values())
        return StoreStats(self._count, samples, self.dropped_out_of_order, self.dropped_series_limit)

    def series(self, name: str | None, matchers: Sequence[Matcher]) -> list[Series]:
        """Series matching a selector, sorted by label set (Prometheus' order); do not modify the list."""
        if name is None:
            candidates = sorted((s for f in self._by_name.values() for s in f.values()), key=lambda s: s.labels)
            return _matching(candidates, matchers)
        if not matchers:
            return self._sorted_family(name)
        key = tuple(matchers)
        cache = self._selected.setdefault(name, {})
        found = cache.get(key)
        if found is None:
            if len(cache) >= SELECTIONS_PER_NAME:
                cache.clear()
            found = cache[key] = _matching(self._sorted_family(name), matchers)
        return found

    def _forget_selection(self, name: str) -> None:
        self._sorted.pop(name, None)
        self._selected.pop(name, None)

    def _sorted_family(self, name: str) -> list[Series]:
        cached = self._sorted.get(name)
        if cached is None:
            family = self._by_name.get(name, {})
            cached = self._sorted[name] = sorted(family.values(), key=lambda s: s.labels)
        return cached

    def instant(self, name: str | None, matchers: Sequence[Matcher], ref_ms: int,
                lookback_ms: int) -> list[tuple[Labels, float]]:
        """The latest sample at or before ``ref_ms`` and no older than the lookback, per series."""
        return [(series.labels, series.vs[i]) for series, i in self._latest(name, matchers, ref_ms, lookback_ms)]

    def instant_times(self, name: str | None, matchers: Sequence[Matcher], ref_ms: int,
                      lookback_ms: int) -> list[tuple[Labels, int]]:
        """The time of the sample :meth:`instant` picks, per series (what PromQL's ``timestamp()`` reads)."""
        return [(series.labels, series.ts[i]) for series, i in self._latest(name, matchers, ref_ms, lookback_ms)]

    def _latest(self, name: str | None, matchers: Sequence[Matcher], ref_ms: int,
                lookback_ms: int) -> list[tuple[Series, int]]:
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
            out.append((series, i))
        return out

    def increases(self, name: str | None, matchers: Sequence[Matcher], mint_ms: int, maxt_ms: int,
                  counter: bool) -> list[tuple[Labels, int, int, int, float, float]]:
        """Per series with two samples or more in ``[mint, maxt]`` (stale ones left out): the inputs of
        rate(), increase() and delta().

        Each row is (labels without ``__name__``, sample count, first time, last time, first value,
        last minus first value), the last with every counter reset added back when ``counter``,
        in the order Prometheus adds them.
        """
        out: list[tuple[Labels, int, int, int, float, float]] = []
        append = out.append
        for series in self.series(name, matchers):
            ts = series.ts
            n = len(ts)
            if n < 2:
                continue
            first, last = ts[0], ts[-1]
            if last < mint_ms or first > maxt_ms:
                continue
            if series.special:
                row = _slow_increase(series, mint_ms, maxt_ms, counter)
                if row is not None:
                    append(row)
                continue
            # Series.bounds() inlined: this loop runs once per series and rule
            hi = n if last <= maxt_ms else bisect_right(ts, maxt_ms)
            if mint_ms <= first:
                lo = 0
            else:
                lo = n - 1 - (last - mint_ms) * (n - 1) // (last - first)
                if not (0 < lo < hi and ts[lo] >= mint_ms > ts[lo - 1]):
                    lo = bisect_left(ts, mint_ms, 0, hi)
            if hi - lo < 2:
                continue
            vs = series.vs
            resets = counter and series.reset_ts is not None
            result = series.increase(lo, hi) if resets else vs[hi - 1] - vs[lo]
            append((series.unnamed, hi - lo, ts[lo], ts[hi - 1], vs[lo], result))
        return out

    def window(self, name: str | None, matchers: Sequence[Matcher], mint_ms: int,
               maxt_ms: int) -> list[tuple[Labels, Sequence[int], Sequence[float]]]:
        """Samples with ``mint <= t <= maxt`` (both ends included, as Prometheus 2.x), stale ones left out."""
        out: list[tuple[Labels, Sequence[int], Sequence[float]]] = []
        for series in self.series(name, matchers):
            ts = series.ts
            if not ts or ts[-1] < mint_ms or ts[0] > maxt_ms:
                continue
            lo, hi = series.bounds(mint_ms, maxt_ms)
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


SELECTIONS_PER_NAME = 256
"""Matcher sets remembered per metric name (the rule set needs a handful; ad-hoc queries add more)."""


def _name_of(labels: Labels) -> str:
    """The metric name of a label set, '' when it has none."""
    return labels[0][1] if labels and labels[0][0] == NAME else get(labels, NAME)


def _matching(candidates: list[Series], matchers: Sequence[Matcher]) -> list[Series]:
    if not matchers:
        return candidates
    return [s for s in candidates if all(m.matches(s.mapping.get(m.name, "")) for m in matchers)]


def _slow_increase(series: Series, mint_ms: int, maxt_ms: int,
                   counter: bool) -> tuple[Labels, int, int, int, float, float] | None:
    """:meth:`SeriesStore.increases` for a series holding NaN: stale markers dropped, then a scan."""
    lo, hi = series.bounds(mint_ms, maxt_ms)
    kept = [(t, v) for t, v in zip(series.ts[lo:hi], series.vs[lo:hi], strict=True) if not is_stale(v)]
    if len(kept) < 2:
        return None
    first = kept[0][1]
    result = kept[-1][1] - first
    if counter:
        prev = first
        for _, v in kept:
            if v < prev:
                result += prev
            prev = v
    return series.unnamed, len(kept), kept[0][0], kept[-1][0], first, result
