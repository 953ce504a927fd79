"""PromQL's date functions with Go's calendar arithmetic, to the wrap-around of its 64-bit integers.

Prometheus turns a value into ``time.Unix(int64(v), 0).UTC()``: the float is truncated (NaN and values
out of range become the smallest int64, as Go's conversion does on amd64), and the calendar fields
come from Go's ``absDate``. Both are ported here, so that even such inputs give Prometheus' answers.
"""

from __future__ import annotations

import math
from collections.abc import Callable

_U64 = 1 << 64
_SECONDS_PER_DAY = 86_400
_DAYS_PER_400_YEARS = 365 * 400 + 97
_DAYS_PER_100_YEARS = 365 * 100 + 24
_DAYS_PER_4_YEARS = 365 * 4 + 1
_ABSOLUTE_ZERO_YEAR = -292277022399
_UNIX_TO_ABSOLUTE = 9223372028715321600  # Go's unixToInternal + internalToAbsolute
_DAYS_BEFORE = (0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334, 365)
_INT64_MIN = -(1 << 63)


def go_int64(value: float) -> int:
    """Go's ``int64(v)`` on amd64: truncation; NaN and out-of-range values give the smallest int64."""
    if math.isnan(value) or not -9.223372036854775808e18 <= value < 9.223372036854775808e18:
        return _INT64_MIN
    return int(value)


def go_seconds(t_ms: int) -> int:
    """Go's ``t / 1000`` for milliseconds (integer division truncating towards zero)."""
    return -(-t_ms // 1000) if t_ms < 0 else t_ms // 1000


def _abs(unix_seconds: int) -> int:
    return (unix_seconds + _UNIX_TO_ABSOLUTE) % _U64


def _is_leap(year: int) -> bool:
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def _abs_date(abs_seconds: int) -> tuple[int, int, int, int]:
    """Go's absDate: (year, month 1-12, day of month, day of year 0-based)."""
    d = abs_seconds // _SECONDS_PER_DAY
    n = d // _DAYS_PER_400_YEARS
    y = 400 * n
    d -= _DAYS_PER_400_YEARS * n
    n = d // _DAYS_PER_100_YEARS
    n -= n >> 2
    y += 100 * n
    d -= _DAYS_PER_100_YEARS * n
    n = d // _DAYS_PER_4_YEARS
    y += 4 * n
    d -= _DAYS_PER_4_YEARS * n
    n = d // 365
    n -= n >> 2
    y += n
    d -= 365 * n
    year = (y % _U64) + _ABSOLUTE_ZERO_YEAR
    yday = d
    day = yday
    if _is_leap(year):
        if day > 31 + 29 - 1:
            day -= 1
        elif day == 31 + 29 - 1:
            return year, 2, 29, yday
    month = day // 31
    end = _DAYS_BEFORE[month + 1]
    if day >= end:
        month += 1
        begin = end
    else:
        begin = _DAYS_BEFORE[month]
    return year, month + 1, day - begin + 1, yday


def _days_in(month: int, year: int) -> int:
    if month == 2 and _is_leap(year):
        return 29
    return _DAYS_BEFORE[month] - _DAYS_BEFORE[month - 1]


def _field(name: str) -> Callable[[int], float]:
    def of(unix_seconds: int) -> float:
        a = _abs(unix_seconds)
        if name == "hour":
            return float((a % _SECONDS_PER_DAY) // 3600)
        if name == "minute":
            return float((a % 3600) // 60)
        if name == "day_of_week":  # Go: (abs + Monday * secondsPerDay) % secondsPerWeek / secondsPerDay
            return float(((a + _SECONDS_PER_DAY) % (7 * _SECONDS_PER_DAY)) // _SECONDS_PER_DAY)
        year, month, day, yday = _abs_date(a)
        if name == "year":
            return float(year)
        if name == "month":
            return float(month)
        if name == "day_of_month":
            return float(day)
        if name == "day_of_year":
            return float(yday + 1)
        return float(_days_in(month, year))  # days_in_month

    return of


DATE_FIELDS: dict[str, Callable[[int], float]] = {
    name: _field(name)
    for name in ("day_of_month", "day_of_week", "day_of_year", "days_in_month", "hour", "minute", "month", "year")
}
"""Function name -> the field of ``time.Unix(seconds, 0).UTC()`` it returns."""
