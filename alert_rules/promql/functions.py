"""Numeric kernels with Prometheus 2.42's exact arithmetic: rates, regressions, quantiles, sums."""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Sequence
from itertools import islice

from alert_rules.promql.values import Labels

NAN = math.nan
INF = math.inf


def kahan_inc(inc: float, total: float, comp: float) -> tuple[float, float]:
    """One step of Neumaier-compensated summation, as Prometheus' kahanSumInc."""
    t = total + inc
    if abs(total) >= abs(inc):
        comp += (total - t) + inc
    else:
        comp += (inc - t) + total
    return t, comp


def duration_seconds(ms: int) -> float:
    """Go's ``time.Duration.Seconds()`` for a duration given in milliseconds."""
    sec, rem = divmod(ms, 1000)
    return float(sec) + float(rem * 1_000_000) / 1e9


def extrapolated_rate(
    ts: Sequence[int], vs: Sequence[float], range_start: int, range_end: int, range_ms: int,
    is_counter: bool, is_rate: bool,
) -> float | None:
    """rate/increase/delta over one series' window; None with fewer than two samples."""
    n = len(vs)
    if n < 2:
        return None
    first = vs[0]
    result = vs[-1] - first
    if is_counter and any(map(operator.gt, vs, islice(vs, 1, None))):  # C-speed scan for a reset
        prev = first
        for v in vs[1:]:
            if v < prev:
                result += prev
            prev = v
    ((_, value),) = extrapolate_rows([((), n, ts[0], ts[-1], first, result)], range_start, range_end, range_ms,
                                     is_counter, is_rate)
    return value


def extrapolate_rows(
    rows: Iterable[tuple[Labels, int, int, int, float, float]], range_start: int, range_end: int,
    range_ms: int, is_counter: bool, is_rate: bool,
) -> list[tuple[Labels, float]]:
    """Prometheus' extrapolation of each window's raw increase to the whole range.

    A row is (labels, samples (two or more), first time, last time, first value, last - first
    value with resets added back), as :meth:`alert_rules.store.SeriesStore.increases` gives them.
    """
    seconds = duration_seconds(range_ms)
    out = []
    for labels, n, first_t, last_t, first, result in rows:
        to_start = (first_t - range_start) / 1000
        to_end = (range_end - last_t) / 1000
        sampled = (last_t - first_t) / 1000
        average = sampled / (n - 1)
        if is_counter and result > 0 and first >= 0:
            to_start = min(to_start, sampled * (first / result))
        threshold = average * 1.1
        interval = sampled
        interval += to_start if to_start < threshold else average / 2
        interval += to_end if to_end < threshold else average / 2
        factor = interval / sampled
        if is_rate:
            factor /= seconds
        out.append((labels, result * factor))
    return out


def instant_rate(ts: Sequence[int], vs: Sequence[float], is_rate: bool) -> float | None:
    """irate/idelta from the last two samples."""
    if len(vs) < 2:
        return None
    last, previous = vs[-1], vs[-2]
    result = last - previous if not (is_rate and last < previous) else last
    interval = ts[-1] - ts[-2]
    if interval == 0:
        return None
    if is_rate:
        result /= interval / 1000
    return result


def linear_regression(ts: Sequence[int], vs: Sequence[float], intercept_ms: int) -> tuple[float, float]:
    """Least-squares slope and intercept, with Kahan sums like Prometheus."""
    n = 0.0
    sx = cx = sy = cy = sxy = cxy = sx2 = cx2 = 0.0
    init = vs[0]
    constant = True
    for i, (t, v) in enumerate(zip(ts, vs, strict=True)):
        if constant and i > 0 and v != init:
            constant = False
        n += 1.0
        x = (t - intercept_ms) / 1e3
        # kahan_inc() four times, written out: this loop runs once per sample of the window
        s = sx + x
        cx += (sx - s) + x if abs(sx) >= abs(x) else (x - s) + sx
        sx = s
        s = sy + v
        cy += (sy - s) + v if abs(sy) >= abs(v) else (v - s) + sy
        sy = s
        xv = x * v
        s = sxy + xv
        cxy += (sxy - s) + xv if abs(sxy) >= abs(xv) else (xv - s) + sxy
        sxy = s
        xx = x * x
        s = sx2 + xx
        cx2 += (sx2 - s) + xx if abs(sx2) >= abs(xx) else (xx - s) + sx2
        sx2 = s
    if constant:
        if math.isinf(init):
            return NAN, NAN
        return 0.0, init
    sx += cx
    sy += cy
    sxy += cxy
    sx2 += cx2
    cov = sxy - sx * sy / n
    var = sx2 - sx * sx / n
    slope = cov / var
    intercept = sy / n - slope * sx / n
    return slope, intercept


def sum_over_time(vs: Sequence[float]) -> float:
    """Compensated sum of a window."""
    total = comp = 0.0
    for v in vs:
        total, comp = kahan_inc(v, total, comp)
    if math.isinf(total):
        return total
    return total + comp


def avg_over_time(vs: Sequence[float]) -> float:
    """Compensated incremental mean of a window."""
    mean = comp = 0.0
    count = 0.0
    isinf = math.isinf
    for v in vs:
        count += 1
        if isinf(mean):
            if isinf(v) and (mean > 0) == (v > 0):
                continue
            if not isinf(v) and not math.isnan(v):
                continue
        inc = v / count - mean / count
        s = mean + inc  # kahan_inc() written out
        comp += (mean - s) + inc if abs(mean) >= abs(inc) else (inc - s) + mean
        mean = s
    if math.isinf(mean):
        return mean
    return mean + comp


def max_over_time(vs: Sequence[float]) -> float:
    """Largest value; NaN only when every value is NaN."""
    best = vs[0]
    for v in vs:
        if v > best or math.isnan(best):
            best = v
    return best


def min_over_time(vs: Sequence[float]) -> float:
    """Smallest value; NaN only when every value is NaN."""
    best = vs[0]
    for v in vs:
        if v < best or math.isnan(best):
            best = v
    return best


def quantile(q: float, values: Sequence[float]) -> float:
    """Prometheus' quantile: linear interpolation between the closest ranks."""
    if not values:
        return NAN
    if q < 0:
        return -INF
    if q > 1:
        return INF
    ordered = sorted(values, key=_nan_first)
    n = float(len(ordered))
    rank = q * (n - 1)
    lower = max(0.0, math.floor(rank))
    upper = min(n - 1, lower + 1)
    weight = rank - math.floor(rank)
    return ordered[int(lower)] * (1 - weight) + ordered[int(upper)] * weight


def _nan_first(v: float) -> tuple[int, float]:
    return (0, 0.0) if math.isnan(v) else (1, v)


def changes(vs: Sequence[float]) -> float:
    """How often the value changed within the window."""
    count = 0
    prev = vs[0]
    for v in vs[1:]:
        if v != prev and not (math.isnan(v) and math.isnan(prev)):
            count += 1
        prev = v
    return float(count)


def resets(vs: Sequence[float]) -> float:
    """How often the value decreased within the window."""
    count = 0
    prev = vs[0]
    for v in vs[1:]:
        if v < prev:
            count += 1
        prev = v
    return float(count)


def bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """histogram_quantile over classic buckets given as (upper bound, cumulative count)."""
    if math.isnan(q):
        return NAN
    if q < 0:
        return -INF
    if q > 1:
        return INF
    buckets = sorted(buckets, key=lambda b: b[0])
    if not math.isinf(buckets[-1][0]) or buckets[-1][0] < 0:
        return NAN
    merged: list[list[float]] = []
    for bound, count in buckets:
        if merged and merged[-1][0] == bound:
            merged[-1][1] += count
        else:
            merged.append([bound, count])
    top = merged[0][1]  # Prometheus 2.42 starts from the first bucket's count (NaN there disables the fix-up)
    for b in merged[1:]:
        if b[1] > top:
            top = b[1]
        elif b[1] < top:
            b[1] = top
    if len(merged) < 2:
        return NAN
    observations = merged[-1][1]
    if observations == 0:
        return NAN
    rank = q * observations
    # Go's sort.Search (a binary search) for the first bucket holding the rank: with NaN counts the
    # buckets are not ordered, and a linear scan could stop elsewhere
    index, hi = 0, len(merged) - 1
    while index < hi:
        mid = (index + hi) // 2
        if merged[mid][1] >= rank:
            hi = mid
        else:
            index = mid + 1
    if index == len(merged) - 1:
        return merged[-2][0]
    if index == 0 and merged[0][0] <= 0:
        return merged[0][0]
    start = 0.0
    end, count = merged[index]
    if index > 0:
        start = merged[index - 1][0]
        count -= merged[index - 1][1]
        rank -= merged[index - 1][1]
    if count == 0:
        return NAN  # Go's 0/0 in Prometheus' bucketQuantile (q = 0 over an empty first bucket)
    return start + (end - start) * (rank / count)


def stdvar_over_time(vs: Sequence[float]) -> float:
    """Population variance of a window, with Kahan-compensated running mean and sum of squares."""
    count = mean = c_mean = aux = c_aux = 0.0
    for v in vs:
        count += 1
        delta = v - (mean + c_mean)
        mean, c_mean = kahan_inc(delta / count, mean, c_mean)
        aux, c_aux = kahan_inc(delta * (v - (mean + c_mean)), aux, c_aux)
    return (aux + c_aux) / count

