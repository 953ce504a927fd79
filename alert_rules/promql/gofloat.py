"""Go's ``strconv.FormatFloat(v, fmt, -1, 64)``: the shortest digits that read back to the same float.

One formatter for every place a float becomes text the way Prometheus writes it: ``count_values``
label values (``'f'``), template ``%v`` and ``printf "%g"`` (``'g'``), promtool's failure messages
(``'E'``). Python's ``repr`` finds the same shortest digits as Go; only the layout differs.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Literal

GoFormat = Literal["f", "g", "e", "E"]


def format_float(value: float, fmt: GoFormat) -> str:
    """``strconv.FormatFloat(value, fmt, -1, 64)``; NaN and infinities as Go writes them (``+Inf``)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    if value == 0:
        return sign + ("0" if fmt in "fg" else f"0{fmt}+00")
    _, digit_tuple, exponent = Decimal(repr(abs(value))).as_tuple()
    assert isinstance(exponent, int)
    digits = "".join(map(str, digit_tuple)).rstrip("0") or "0"
    point = len(digit_tuple) + exponent  # where the decimal point sits in ``digits``
    exp = point - 1
    if fmt == "g":
        fmt = "e" if exp < -4 or exp >= 6 else "f"  # Go: shortest 'g' decides with precision 6
    if fmt in "eE":
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{mantissa}{fmt}{'-' if exp < 0 else '+'}{abs(exp):02d}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return f"{sign}{digits}{'0' * (point - len(digits))}"
    return f"{sign}{digits[:point]}.{digits[point:]}"
