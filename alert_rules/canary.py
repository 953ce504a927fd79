"""The canary's breaker: the canary upstream compared with the primary over the same window.

Requests the sidecar sent to serve.canary_upstream carry ``role="canary"``, the others
``role="primary"`` (serving/upstream_choice.py). Both alerts read only the inference routes over
``rules.breaker_window_s`` and need ``rules.breaker_min_requests`` canary requests in it, like the
model's own breaker, and fire only where the canary does worse than the primary of the same model
on the same window: a failure both share is the model's breaker's, not the canary's.

- degrade (warning, ``action="canary_shift_back"``): the canary's error ratio above
  ``rules.degrade_error_ratio`` (1 %) or its p99 end-to-end latency above ``rules.degrade_p99_s``
  (2 s): shift its traffic back (lower serve.canary_weight).
- rollback (critical, ``action="canary_rollback"``): its error ratio above
  ``rules.rollback_error_ratio`` (3 %): take the canary out (serve.canary_weight = 0).
"""

from __future__ import annotations

from alert_rules.config import RulesConfig
from alert_rules.context import MODEL as MODEL_SCOPE
from alert_rules.context import context
from alert_rules.runbooks import Runbook
from alert_rules.scenario import (
    MODEL,
    Scenario,
    Series,
    above,
    ceil_to,
    counter_values,
    ratio_traffic,
    step_for,
    steps_needed,
)
from alert_rules.slo import SERVED, error_outcomes
from alert_rules.spec import AlertRule, Severity, any_of, duration, number, selector
from exporters.catalog.request import E2E_LATENCY_SECONDS, REQUESTS

DEGRADE = "InferwatchCanaryDegrade"
ROLLBACK = "InferwatchCanaryRollback"
M = "model_name"
CANARY = ("role", "=", "canary")
PRIMARY = ("role", "=", "primary")


def error_ratio(window_s: float, role: tuple[str, str, str]) -> str:
    """The error ratio of one role's inference requests by model over ``window_s``."""
    w = duration(window_s)
    bad = selector(REQUESTS.series, ("outcome", "=~", any_of(error_outcomes())), SERVED, role)
    every = selector(REQUESTS.series, SERVED, role)
    return f"(sum by ({M}) (rate({bad}[{w}])) / sum by ({M}) (rate({every}[{w}])))"


def p99_e2e(window_s: float, role: tuple[str, str, str]) -> str:
    """The p99 end-to-end latency of one role's inference requests by model over ``window_s``."""
    bucket = selector(E2E_LATENCY_SECONDS.bucket, SERVED, role)
    return f"histogram_quantile(0.99, sum by ({M}, le) (rate({bucket}[{duration(window_s)}])))"


def _enough(config: RulesConfig) -> tuple[str, str]:
    if not config.breaker_min_requests:
        return "", ""
    count = f"sum by ({M}) (increase({selector(REQUESTS.series, SERVED, CANARY)}[{duration(config.breaker_window_s)}]))"
    return (f" and ({count} >= {config.breaker_min_requests})",
            f", with at least {config.breaker_min_requests} canary requests in the window")


def _role_series(role: str, per_step_ok: float, per_step_bad: float, steps: int) -> tuple[Series, ...]:
    base = (("model_name", "=", MODEL), ("route", "=", "/v1/completions"), ("length_bucket", "=", "le512"),
            ("lane", "=", "default"), ("role", "=", role))
    return (
        Series(selector(REQUESTS.series, *base, ("outcome", "=", "ok")), counter_values(per_step_ok, steps)),
        Series(selector(REQUESTS.series, *base, ("outcome", "=", "upstream_error")),
               counter_values(per_step_bad, steps)),
    )


def _scenario(ratio_firing: float, config: RulesConfig) -> Scenario:
    """Firing: the canary fails at ``ratio_firing`` while the primary does not fail. Quiet: the primary fails at
    that ratio and the canary does not (the canary's alerts never fire for the primary's failures)."""
    step = step_for(config.breaker_window_s)
    fire_at = step + ceil_to(config.breaker_for_s, step)
    n = steps_needed(fire_at + 2 * step, step)
    firing = (*_role_series("canary", *ratio_traffic(ratio_firing), n), *_role_series("primary", 100000, 0, n))
    quiet = (*_role_series("canary", 100000, 0, n), *_role_series("primary", *ratio_traffic(ratio_firing), n))
    return Scenario(step, firing, quiet, step, {"model_name": MODEL})


def _degrade_scenario(c: RulesConfig, _alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    between = (c.degrade_error_ratio + c.rollback_error_ratio) / 2
    return _scenario(between if c.degrade_error_ratio < c.rollback_error_ratio else above(c.degrade_error_ratio), c)


def _rollback_scenario(c: RulesConfig, _alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    return _scenario(above(c.rollback_error_ratio), c)


def canary_breaker(config: RulesConfig, _edges: tuple[int, ...]) -> list[AlertRule]:
    """The canary's two breaker levels, each only where the canary does worse than the primary."""
    w = duration(config.breaker_window_s)
    canary_errors, primary_errors = error_ratio(config.breaker_window_s, CANARY), error_ratio(
        config.breaker_window_s, PRIMARY)
    canary_p99, primary_p99 = p99_e2e(config.breaker_window_s, CANARY), p99_e2e(config.breaker_window_s, PRIMARY)
    enough, enough_text = _enough(config)
    worse_errors = f"({canary_errors} > {number(config.degrade_error_ratio)} and {canary_errors} > {primary_errors})"
    slower = f"({canary_p99} > {number(config.degrade_p99_s)} and {canary_p99} > {primary_p99})"
    degrade = AlertRule(
        name=DEGRADE,
        expr=f"({worse_errors} or {slower}){enough}",
        for_s=config.breaker_for_s,
        severity=Severity.WARNING,
        labels={"action": "canary_shift_back", "role": "canary"},
        summary="The canary does worse than the primary: shift its traffic back.",
        description=(
            f"The canary of model {{{{ $labels.model_name }}}} has had an error ratio above "
            f"{config.degrade_error_ratio * 100:g} % or a p99 latency above {config.degrade_p99_s:g} s over {w}, "
            f"worse than the primary's on the same window{enough_text}, for {duration(config.breaker_for_s)}."
        ),
        runbook=Runbook(
            "The canary upstream (serve.canary_upstream) fails or is slow where the primary is not, over the "
            "same window: the new version is the likely cause.",
            ("The board's row \"canary against primary\": error ratio, p99 TTFT and e2e of each role.",
             "The canary's failing requests: `inferwatch logs search --since 15m` and keep those with "
             "`role` canary and an error outcome; their trace ids lead to `inferwatch explain`.",
             "What differs between the two upstreams: model, vLLM version, flags (`inferwatch tokenizer diff` "
             "for the tokenizer)."),
            ("Shift traffic back: lower `serve.canary_weight` (clients stay sticky, so the same clients stay "
             "on the canary while it is above 0).",
             "If the error ratio keeps rising, set `serve.canary_weight` to 0 (the rollback level)."),
        ),
        scenario=_degrade_scenario,
        annotations=context(MODEL_SCOPE),
    )
    rollback = AlertRule(
        name=ROLLBACK,
        expr=f"({canary_errors} > {number(config.rollback_error_ratio)} and {canary_errors} > {primary_errors})"
             f"{enough}",
        for_s=config.breaker_for_s,
        severity=Severity.CRITICAL,
        labels={"action": "canary_rollback", "role": "canary"},
        summary="The canary fails too many requests: roll it back.",
        description=(
            f"The canary of model {{{{ $labels.model_name }}}} has had an error ratio above "
            f"{config.rollback_error_ratio * 100:g} % over {w}, worse than the primary's{enough_text}, "
            f"for {duration(config.breaker_for_s)}."
        ),
        runbook=Runbook(
            "The canary upstream fails the rollback share of its requests while the primary does not: its "
            "clients are being failed by the new version.",
            ("The canary's error types in its records (`role` canary): vLLM's error type, the outcome.",
             "The canary's vLLM logs for tracebacks; its readiness (`inferwatch_upstream_ready`)."),
            ("Roll back: set `serve.canary_weight` to 0 and restart the sidecars (every client returns to the "
             "primary), then investigate the canary offline with shadow traffic (`serve.shadow_upstream`).",),
        ),
        scenario=_rollback_scenario,
        annotations=context(MODEL_SCOPE),
    )
    return [degrade, rollback]


__all__ = ["DEGRADE", "ROLLBACK", "canary_breaker", "error_ratio", "p99_e2e"]
