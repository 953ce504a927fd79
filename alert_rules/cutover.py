"""Release-day alerts: wrong-model requests, a tokenizer that changed under the same name, a failing text class.

Each alert is one definition: its rule, its runbook and its promtool scenario, built from ``RulesConfig``.
They live in their own group and rule file (``cutover``): they watch a cut-over, not the engine's health.
"""

from __future__ import annotations

from alert_rules.config import RulesConfig
from alert_rules.runbooks import ROLLBACK, Runbook
from alert_rules.scenario import MODEL, UPSTREAM, Scenario, Series, counter_values, step_for, steps_needed
from alert_rules.slo import SERVED, error_outcomes
from alert_rules.spec import AlertRule, RuleGroup, Severity, any_of, duration, number, selector
from exporters.catalog.cutover import (
    EMOJI_DENSE,
    OTHER_MODEL,
    PLAIN,
    TEXT_CLASS_REQUESTS,
    UPSTREAM_TOKENIZER,
    UPSTREAM_TOKENIZER_CHANGES,
    WRONG_MODEL_REQUESTS,
)
from exporters.catalog.request import REQUESTS

FIND_CLIENTS = (
    "Who sends them: the request records' `client` (serve.client_header, else the User-Agent), `requested_model` "
    "and `wrong_model` keys, every one kept: `inferwatch logs cat --dir DIR --since 1h | jq -r "
    "'select(.wrong_model) | .client' | sort | uniq -c`, or your log backend."
)


def _pct(ratio: float) -> str:
    return f"{ratio * 100:g} %"


def _wrong_model_scenario(c: RulesConfig, _alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    step = step_for(c.wrong_model_window_s)
    n = steps_needed(c.wrong_model_for_s + c.wrong_model_window_s, step)
    wrong = selector(WRONG_MODEL_REQUESTS.series, ("model_name", "=", MODEL), ("reason", "=", OTHER_MODEL))
    requests = selector(REQUESTS.series, ("model_name", "=", MODEL), ("route", "=", "/v1/completions"),
                        ("outcome", "=", "ok"), ("length_bucket", "=", "le512"))
    per_step = max(1000, c.wrong_model_min_requests)
    firing = (Series(requests, counter_values(per_step, n)),
              Series(wrong, counter_values(per_step * min(1.0, c.wrong_model_ratio * 4), n)))
    quiet = (Series(requests, counter_values(per_step, n)),
             Series(wrong, counter_values(per_step * c.wrong_model_ratio / 4, n)))
    return Scenario(step, firing, quiet, step)


def wrong_model(config: RulesConfig) -> AlertRule:
    """Too many requests answered by another model than they asked for, or asking for a retired one."""
    w = duration(config.wrong_model_window_s)
    served = selector(REQUESTS.series, SERVED)
    ratio = f"sum(rate({WRONG_MODEL_REQUESTS.series}[{w}])) / sum(rate({served}[{w}]))"
    evidence = ""
    if config.wrong_model_min_requests:
        evidence = f" and sum(increase({served}[{w}])) >= {number(config.wrong_model_min_requests)}"
    return AlertRule(
        name="InferwatchWrongModelAnswers",
        expr=f"{ratio} > {number(config.wrong_model_ratio)}{evidence}",
        for_s=config.wrong_model_for_s,
        severity=Severity.WARNING,
        summary="Requests are answered by another model than they asked for, or ask for a retired one.",
        description=(
            f"More than {_pct(config.wrong_model_ratio)} of inference requests over {w} were wrong-model requests "
            f"(inferwatch_wrong_model_requests_total, by requested model and reason) for "
            f"{duration(config.wrong_model_for_s)}."
        ),
        runbook=Runbook(
            "After a cut-over, clients with stale caches or configs keep asking for the old model name "
            "(reason retired_model, with serve.retired_models set), or a stale gateway route sends requests to "
            "another model than they name (reason other_model: the answer's `model` is neither the requested "
            "name, nor an alias the upstream lists in /v1/models with the same root, nor a serve.model_renames "
            "target). Those users get answers from a model they did not ask for, or errors.",
            ("`sum by (model_name, reason) (rate(inferwatch_wrong_model_requests_total[10m]))`: which names, "
             "which reason.", FIND_CLIENTS,
             "The upstream's /v1/models and the gateway's routes: is a name missing, or routed to another model?"),
            ("Tell the owners of the stale clients to switch to the new name, or flush the caches that hold the "
             "old one.",
             "Serve the old name as an alias during the transition (vLLM: `--served-model-name new old`), or map "
             "it at the gateway and add it to serve.model_renames.",
             "Fix the gateway route that sends a name to the wrong model.", ROLLBACK),
        ),
        scenario=_wrong_model_scenario,
    )


def _tokenizer_scenario(c: RulesConfig, _alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    step = step_for(c.tokenizer_change_window_s)
    n = steps_needed(c.tokenizer_change_window_s, step)
    changes = selector(UPSTREAM_TOKENIZER_CHANGES.series, ("upstream", "=", UPSTREAM), ("model_name", "=", MODEL))
    info = selector(UPSTREAM_TOKENIZER.series, ("upstream", "=", UPSTREAM), ("model_name", "=", MODEL),
                    ("fingerprint", "=", "0123456789abcdef"))
    firing = (Series(changes, f"0 1+0x{n}"), Series(info, f"1+0x{n}"))
    quiet = (Series(changes, f"0+0x{n}"), Series(info, f"1+0x{n}"))
    return Scenario(step, firing, quiet, step, {"upstream": UPSTREAM, "model_name": MODEL})


def tokenizer_changed(config: RulesConfig) -> AlertRule:
    """An upstream's tokenizer fingerprint changed under the same model name, or upstreams disagree on it."""
    w = duration(config.tokenizer_change_window_s)
    changed = f"sum by (upstream, model_name) (increase({UPSTREAM_TOKENIZER_CHANGES.series}[{w}])) > 0"
    disagree = f"count by (model_name) (count by (model_name, fingerprint) ({UPSTREAM_TOKENIZER.series})) > 1"
    return AlertRule(
        name="InferwatchTokenizerChanged",
        expr=f"{changed} or {disagree}",
        severity=Severity.WARNING,
        summary="The tokenizer behind a model name changed.",
        description=(
            "The tokenizer fingerprint of model {{ $labels.model_name }} changed on upstream "
            "{{ $labels.upstream }} within the last " + w + ", or upstreams serving the name disagree on it "
            "(no upstream label): clients that count, cache or build prompts with the old tokenizer are now wrong."
        ),
        runbook=Runbook(
            "The sidecar fingerprints each upstream's tokenizer (a hash of its /tokenize over a fixed probe set) "
            "whenever the upstream becomes ready. A different fingerprint under the same model name means a new "
            "model or vLLM version brought another tokenizer: token counts, prompt budgets, cached prompts and "
            "clients that tokenize locally may no longer match, and text the old one handled may break.",
            ("`inferwatch_upstream_tokenizer_info` by upstream and model: which upstreams, which fingerprints.",
             "How far apart the two are: `inferwatch tokenizer diff --a OLD_URL --b NEW_URL --model NAME` "
             "(diff-score per text, the worst texts; exit 1 above --max-score).",
             "Failures by text class (emoji_dense, cjk) since the change."),
            ("If the change was not intended, roll back the model or vLLM version.",
             "If it was, serve the new tokenizer under a new model name so clients move knowingly, and update the "
             "clients that tokenize locally.", ROLLBACK),
        ),
        scenario=_tokenizer_scenario,
    )


def _text_class_scenario(c: RulesConfig, _alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    step = step_for(c.text_class_window_s)
    n = steps_needed(c.text_class_for_s + c.text_class_window_s, step)

    def series(text_class: str, ok: float, bad: float) -> tuple[Series, ...]:
        base = (("model_name", "=", MODEL), ("text_class", "=", text_class))
        return (Series(selector(TEXT_CLASS_REQUESTS.series, *base, ("outcome", "=", "ok")), counter_values(ok, n)),
                Series(selector(TEXT_CLASS_REQUESTS.series, *base, ("outcome", "=", "upstream_error")),
                       counter_values(bad, n)))

    per_step = max(100, c.text_class_min_requests)
    plain_bad = per_step * c.text_class_error_ratio  # the rest fails as often as the threshold allows ...
    dense_bad = min(per_step, plain_bad * c.text_class_factor * 2)  # ... the class twice the factor more
    firing = series(PLAIN, per_step * 10 - plain_bad * 10, plain_bad * 10) + series(
        EMOJI_DENSE, per_step - dense_bad, dense_bad)
    # quiet: the class fails above the threshold, but no more often than the rest
    quiet = series(PLAIN, per_step * 10 - dense_bad * 10, dense_bad * 10) + series(
        EMOJI_DENSE, per_step - dense_bad, dense_bad)
    return Scenario(step, firing, quiet, step, {"model_name": MODEL, "text_class": EMOJI_DENSE})


def text_class_failures(config: RulesConfig) -> AlertRule:
    """One text class of a model fails far more often than the model's other classes."""
    w = duration(config.text_class_window_s)
    every = TEXT_CLASS_REQUESTS.series
    bad = selector(every, ("outcome", "=~", any_of(error_outcomes())))
    by_class, by_model = "sum by (model_name, text_class)", "sum by (model_name)"
    bad_c, all_c = f"{by_class} (rate({bad}[{w}]))", f"{by_class} (rate({every}[{w}]))"
    bad_m, all_m = f"{by_model} (rate({bad}[{w}]))", f"{by_model} (rate({every}[{w}]))"
    ratio = f"({bad_c} / {all_c})"
    rest = (f"(({bad_m} - on (model_name) group_right {bad_c}) / "
            f"({all_m} - on (model_name) group_right {all_c}))")
    factor = number(config.text_class_factor)
    expr = f"{ratio} > {number(config.text_class_error_ratio)} and {ratio} > {factor} * {rest}"
    if config.text_class_min_requests:
        expr += f" and {by_class} (increase({every}[{w}])) >= {number(config.text_class_min_requests)}"
    return AlertRule(
        name="InferwatchTextClassFailures",
        expr=expr,
        for_s=config.text_class_for_s,
        severity=Severity.WARNING,
        summary="One kind of text fails far more often than the rest.",
        description=(
            f"Requests of text class {{{{ $labels.text_class }}}} to model {{{{ $labels.model_name }}}} failed "
            f"more than {_pct(config.text_class_error_ratio)} of the time over {w}, and more than "
            f"{number(config.text_class_factor)}x as often as the model's other text classes, for "
            f"{duration(config.text_class_for_s)}."
        ),
        runbook=Runbook(
            "Prompts of one text class (emoji_dense: more emoji than serve.emoji_dense_threshold; cjk: mostly "
            "Chinese, Japanese or Korean) fail far more often than the model's other prompts: a tokenizer or "
            "model bug on that text (a launch once lost every prompt with more than 15 emoji). The overall error "
            "ratio hides it when the class is a small share of the traffic.",
            ("Failure ratio by text class on the SLO board, and the failing requests' `error_type` and "
             "`error_message` in the request records (their `text_class` key).",
             "Did the tokenizer change (InferwatchTokenizerChanged, `inferwatch tokenizer diff`)?",
             "Reproduce with one such prompt against the upstream directly, and read vLLM's log."),
            ("Roll back the model or vLLM version that brought the failures.",
             "Until it is fixed, route that text to a replica with the old version, or reject it at the gateway "
             "with a clear error. NFC normalisation (serve.normalize_unicode) does not change emoji and will not "
             "help.", ROLLBACK),
        ),
        scenario=_text_class_scenario,
    )


def rule_groups(config: RulesConfig) -> tuple[RuleGroup, ...]:
    """The release-day group, in its own rule file."""
    alerts = (wrong_model(config), tokenizer_changed(config), text_class_failures(config))
    return (RuleGroup("inferwatch-cutover", alerts, config.evaluation_interval_s, file="cutover"),)


__all__ = ["rule_groups", "text_class_failures", "tokenizer_changed", "wrong_model"]
