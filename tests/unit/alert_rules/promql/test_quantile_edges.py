"""histogram_quantile edge cases that Prometheus answers with NaN rather than an error."""

from __future__ import annotations

import math

from alert_rules.promql import functions as fn


def test_zero_quantile_over_an_empty_first_bucket_is_nan() -> None:
    """q=0 with no observation in the first bucket is Go's 0/0: NaN, never a ZeroDivisionError."""
    buckets = [(0.5, 0.0), (1.0, 3.0), (math.inf, 4.0)]
    assert math.isnan(fn.bucket_quantile(0.0, buckets))


def test_zero_quantile_interpolates_inside_a_filled_first_bucket() -> None:
    """q=0 with observations in the first bucket starts at the bucket's lower edge (0)."""
    assert fn.bucket_quantile(0.0, [(0.5, 2.0), (math.inf, 4.0)]) == 0.0
