"""promtool test inputs of an alert, and the helpers its definition builds them with.

Every alert carries a scenario builder (``AlertRule.scenario``): from the same config values as
the rule, it returns inputs that make the expression true from ``active_at_s`` on, and inputs that
keep it false, so a changed threshold moves the test inputs with it. ``testgen`` turns a scenario
into a promtool file. Input samples and evaluations share one step per alert. The values (Series,
Case, Scenario, ScenarioBuilder) are part of the rule's value and live in :mod:`alert_rules.spec`.
"""

from __future__ import annotations

import math

from alert_rules.spec import Case, Scenario, ScenarioBuilder, Series, number, selector
from exporters.catalog.request import REQUESTS

MODEL = "test-model"
"""The model_name of every scenario's series."""
UPSTREAM = "http://127.0.0.1:8000"
"""The upstream label of every scenario's scrape series."""


def counter_values(per_step: float, steps: int, start: float = 0) -> str:
    """A counter growing by ``per_step`` for ``steps`` steps, in expanding notation."""
    return f"{number(start)}+{number(per_step)}x{steps}"


def gauge_values(value: float, steps: int) -> str:
    """A gauge holding ``value`` for ``steps`` steps, in expanding notation."""
    return f"{number(value)}x{steps}"


def step_for(window_s: float, cap: int = 60) -> int:
    """An input step that leaves at least two samples in a window."""
    return max(1, min(cap, int(window_s) // 2))


def first_eval_after(t: float, step: int) -> int:
    """The first evaluation strictly after ``t``."""
    return int(math.floor(t / step) + 1) * step


def ceil_to(t: float, step: int) -> int:
    """``t`` rounded up to a whole number of steps."""
    return math.ceil(t / step) * step


def above(threshold: float) -> float:
    """A value clearly above a ratio threshold, below 1 when the threshold is."""
    return min(threshold * 2, (threshold + 1) / 2) if threshold < 1 else threshold * 2 + 1


def steps_needed(scenario_end_s: float, step: int) -> int:
    """How many samples cover a scenario that ends at ``scenario_end_s``, with room after it."""
    return int(scenario_end_s // step) + 3


def request_series(model: str, per_step_ok: float, per_step_bad: float, steps: int,
                   length_bucket: str = "le512") -> tuple[Series, ...]:
    """Request counters of one model: successes and upstream errors per step."""
    base = (("model_name", "=", model), ("route", "=", "/v1/completions"), ("length_bucket", "=", length_bucket))
    return (
        Series(selector(REQUESTS.series, *base, ("outcome", "=", "ok")), counter_values(per_step_ok, steps)),
        Series(selector(REQUESTS.series, *base, ("outcome", "=", "upstream_error")),
               counter_values(per_step_bad, steps)),
    )


def ratio_traffic(ratio: float, total: int = 100000) -> tuple[float, float]:
    """(good, bad) requests per step with an error ratio of ``ratio``."""
    bad = round(total * ratio)
    return total - bad, bad


def le_series(spec_bucket: str, model: str, per_step: dict[str, float], steps: int) -> tuple[Series, ...]:
    """Histogram bucket counters of one model: ``le`` value -> increase per step."""
    return tuple(
        Series(selector(spec_bucket, ("model_name", "=", model), ("le", "=", le)), counter_values(v, steps))
        for le, v in per_step.items()
    )


__all__ = [
    "MODEL", "UPSTREAM", "Case", "Scenario", "ScenarioBuilder", "Series", "above", "ceil_to", "counter_values",
    "first_eval_after", "gauge_values", "le_series", "ratio_traffic", "request_series", "step_for", "steps_needed",
]
