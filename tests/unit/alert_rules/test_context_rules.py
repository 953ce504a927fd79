"""The context annotation, expanded exactly, in a promtool-format test over the built rules.

Run here by the embedded evaluator and by the real promtool (tests/integration/test_rules_promtool.py), so
both must produce the very string written below. The numbers come from the input series (independent
truth): sidecar ``a`` serves model m and is backed up; sidecar ``b`` serves m too but is healthy apart
from its own errors, preemptions and a throttled GPU; host ``c`` serves another model. A per-replica alert
(queue backlog on ``a``) shows ``a``'s numbers only; a fleet alert (rollback of m) shows m over ``a`` and
``b``, and the GPUs of those two hosts, never ``c``'s.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from alert_rules.build import outputs
from alert_rules.config import RulesConfig
from alert_rules.context import context_template
from alert_rules.promtool_runner import run_file
from exporters.catalog.engine import ENGINE_PREEMPTIONS, ENGINE_REQUESTS, ENGINE_WAITING_BY_REASON, KV_USAGE
from exporters.catalog.gpu import GPU_CLOCK_EVENT_ACTIVE, GPU_MEMORY_TOTAL, GPU_MEMORY_USED
from exporters.catalog.request import REQUESTS
from tests.unit.alert_rules.rule_test_files import write_rule_test

QUEUE_CONTEXT = ("KV cache 87.5%; preemptions 0.5/s; waiting by reason: capacity=45 deferred=15; "
                 "most errors: length bucket 2k-8k at 0.2/s; GPU memory used 75%; "
                 "GPU throttle: hw_slowdown sw_power_cap")
"""Sidecar a: KV 0.875; 30 preemptions a minute; 45 + 15 waiting; timeouts 12 a minute in 2k-8k beat upstream
errors 6 a minute in le512; GPU 0 60 of 80 GB (GPU 1: 20 of 80); sw_power_cap on GPU 0, hw_slowdown on GPU 1."""
ROLLBACK_CONTEXT = ("KV cache 87.5%; preemptions 10.5/s; waiting by reason: capacity=46 deferred=15; "
                    "most errors: length bucket gt32k at 1/s; GPU memory used 98.75%; "
                    "GPU throttle: hw_slowdown hw_thermal sw_power_cap")
"""Model m over a and b: the fuller KV cache (a's 0.875), 0.5 + 10 preemptions a second, 45 + 1 capacity waits,
b's 60 errors a minute in gt32k, b's GPU at 79 of 80 GB, throttle reasons of both hosts; host c (99.9 %,
gpu_idle) serves no m and stays out."""


INFERENCE = {"model_name": "m", "route": "/v1/completions"}
"""Model m's requests on an inference route (the breaker reads only those)."""


def _series(name: str, values: str, **labels: str) -> dict[str, str]:
    body = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{body}}}", "values": values}


def _inputs() -> list[dict[str, str]]:
    waiting, by_reason = ENGINE_REQUESTS.series, ENGINE_WAITING_BY_REASON.series
    used, total, clock = GPU_MEMORY_USED.series, GPU_MEMORY_TOTAL.series, GPU_CLOCK_EVENT_ACTIVE.series
    out = [
        _series(waiting, "60x20", instance="a", model_name="m", state="waiting"),
        _series(by_reason, "45x20", instance="a", model_name="m", reason="capacity"),
        _series(by_reason, "15x20", instance="a", model_name="m", reason="deferred"),
        _series(KV_USAGE.series, "0.875x20", instance="a", model_name="m"),
        _series(ENGINE_PREEMPTIONS.series, "0+30x20", instance="a", model_name="m"),
        _series(REQUESTS.series, "0+300x20", instance="a", length_bucket="le512", outcome="ok", **INFERENCE),
        _series(REQUESTS.series, "0+6x20", instance="a", length_bucket="le512", outcome="upstream_error", **INFERENCE),
        _series(REQUESTS.series, "0+12x20", instance="a", length_bucket="2k-8k", outcome="timeout", **INFERENCE),
        _series(waiting, "1x20", instance="b", model_name="m", state="waiting"),
        _series(by_reason, "1x20", instance="b", model_name="m", reason="capacity"),
        _series(KV_USAGE.series, "0.1x20", instance="b", model_name="m"),
        _series(ENGINE_PREEMPTIONS.series, "0+600x20", instance="b", model_name="m"),
        _series(REQUESTS.series, "0+300x20", instance="b", length_bucket="le512", outcome="ok", **INFERENCE),
        _series(REQUESTS.series, "0+60x20", instance="b", length_bucket="gt32k", outcome="upstream_error", **INFERENCE),
        _series(KV_USAGE.series, "0.2x20", instance="c", model_name="other"),
    ]
    for instance, gpu, used_bytes, reasons in (
        ("a", "0", 60e9, {"sw_power_cap": 1, "hw_thermal": 0}), ("a", "1", 20e9, {"hw_slowdown": 1}),
        ("b", "0", 79e9, {"hw_thermal": 1, "gpu_idle": 0}), ("c", "0", 79.92e9, {"gpu_idle": 1}),
    ):
        ids = {"instance": instance, "gpu": gpu, "uuid": f"GPU-{instance}{gpu}"}
        out.append(_series(used, f"{used_bytes:.0f}x20", **ids))
        out.append(_series(total, "80000000000x20", **ids))
        out.extend(_series(clock, f"{v}x20", **ids, reason=r) for r, v in reasons.items())
    return out


def _alert(rules: dict[str, Any], name: str, labels: dict[str, str], context: str) -> dict[str, Any]:
    rule = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == name)
    annotations = {}
    for key, template in rule["annotations"].items():
        text = re.sub(r"\{\{ \$labels\.([a-z_]+) \}\}", lambda m: labels.get(m.group(1), ""), template)
        annotations[key] = context if key == "context" else text
        assert "{{" not in annotations[key], (name, key)
    return {"exp_labels": {**labels, **rule["labels"]}, "exp_annotations": annotations}


def context_test_file(root: Path, config: RulesConfig | None = None) -> Path:
    """Write the built rules and the promtool test of two alerts' expanded context."""
    config = config or RulesConfig()
    rules = yaml.safe_load(outputs(config)["rules/intervene.yml"])
    doc: dict[str, Any] = {
        "rule_files": ["../rules/slo.yml", "../rules/intervene.yml"],
        "evaluation_interval": "1m",
        "tests": [{
            "name": "The context annotation shows what else was true, scoped by the alert's labels",
            "interval": "1m",
            "input_series": _inputs(),
            "alert_rule_test": [
                {"eval_time": "10m", "alertname": "InferwatchQueueBacklog",
                 "exp_alerts": [_alert(rules, "InferwatchQueueBacklog", {"instance": "a", "model_name": "m"},
                                       QUEUE_CONTEXT)]},
                {"eval_time": "10m", "alertname": "InferwatchCircuitBreakerRollback",
                 "exp_alerts": [_alert(rules, "InferwatchCircuitBreakerRollback", {"model_name": "m"},
                                       ROLLBACK_CONTEXT)]},
            ],
        }],
    }
    return write_rule_test(root, config, "context.yml", doc)


def test_embedded_evaluator_expands_the_context_exactly(tmp_path: Path) -> None:
    """The embedded engine expands both alerts' context to the strings computed from the inputs."""
    result = run_file(context_test_file(tmp_path))
    assert result.errors == []
    assert result.failures == []


def test_context_names_what_is_missing() -> None:
    """With none of the series, every part says no data (or no errors / no throttling), never an error."""
    from alert_rules.promql.template import TemplateData, expand

    text = expand(context_template(("model_name", "instance")),
                  TemplateData({"model_name": "m"}, 1.0, {}, query=lambda _q: []))
    assert text == ("KV cache: no data; preemptions: no data; waiting by reason: no data; most errors: none in 5m; "
                    "GPU memory used: no data; GPU throttle: no data")


def test_every_intervene_now_alert_but_log_drops_carries_context() -> None:
    """Critical and warning alerts of the intervene group have a context annotation (log drops are about the
    sidecar's own log pipeline, advice is never a page); SLO burn alerts do not."""
    rules = yaml.safe_load(outputs(RulesConfig())["rules/intervene.yml"])
    without = sorted(r["alert"] for g in rules["groups"] for r in g["rules"]
                     if "alert" in r and "context" not in r["annotations"])
    assert without == ["InferwatchBatchSizeAdvice", "InferwatchLogRecordsDropped"]
