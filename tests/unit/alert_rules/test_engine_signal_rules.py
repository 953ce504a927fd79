"""The wedged-engine page and vLLM's admission rejections in the SLO, beyond each alert's own scenario.

A promtool-format test over the built rules, run here by the embedded evaluator (and by the real promtool
in tests/integration/test_engine_signal_rules_promtool.py): the wedged expression stays quiet for each
reason the issue names (KV cache full, /health failing, nothing waiting, tokens moving), and the
availability error ratio counts a vLLM rejection once whether it came through the sidecar or not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from alert_rules.build import outputs
from alert_rules.config import RulesConfig
from alert_rules.promtool_runner import run_file
from alert_rules.slo import error_ratio_name
from exporters.catalog.engine import ENGINE_ADMISSION_REJECTIONS, ENGINE_GENERATION_TOKENS, ENGINE_REQUESTS, KV_USAGE
from exporters.catalog.request import REQUESTS, UPSTREAM_READY
from tests.unit.alert_rules.rule_test_files import write_rule_test


def _series(name: str, values: str, **labels: str) -> dict[str, str]:
    body = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{body}}}", "values": values}


def _expr(config: RulesConfig, alert: str) -> str:
    rules = yaml.safe_load(outputs(config)["rules/intervene.yml"])
    return str(next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == alert)["expr"])


def _engine(instance: str, *, waiting: float = 4, tokens: str = "500x10", kv: float | None = 0.3,
            ready: float = 1) -> list[dict[str, str]]:
    """One sidecar (instance) of model m: waiting requests, generated tokens, KV usage and /health."""
    out = [
        _series(ENGINE_REQUESTS.series, f"{waiting:g}x10", instance=instance, model_name="m", state="waiting"),
        _series(ENGINE_GENERATION_TOKENS.series, tokens, instance=instance, model_name="m"),
        _series(UPSTREAM_READY.series, f"{ready:g}x10", instance=instance, upstream="http://127.0.0.1:8000"),
    ]
    if kv is not None:
        out.append(_series(KV_USAGE.series, f"{kv:g}x10", instance=instance, model_name="m"))
    return out


def _requests(model: str, outcome: str, per_minute: int) -> dict[str, str]:
    return _series(REQUESTS.series, f"0+{per_minute}x10", instance="a", model_name=model, outcome=outcome,
                   route="/v1/completions")


def _rejections(model: str, per_minute: int) -> dict[str, str]:
    return _series(ENGINE_ADMISSION_REJECTIONS.series, f"0+{per_minute}x10", instance="a", model_name=model,
                   reason="max_num_queued_reqs")


def signals_test_file(root: Path, config: RulesConfig | None = None) -> Path:
    """Write the built rules and the promtool test of the wedged expression and the SLO's rejections."""
    config = config or RulesConfig()
    ratio = f'{error_ratio_name(300)}{{slo="availability"}}'
    doc: dict[str, Any] = {
        "rule_files": ["../rules/slo.yml", "../rules/intervene.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "name": "Wedged: only where requests wait, no token comes, KV has room and /health says 200",
                "interval": "1m",
                "input_series": [
                    *_engine("wedged"),
                    *_engine("kv-unknown", kv=None),
                    *_engine("kv-full", kv=0.97),
                    *_engine("health-failing", ready=0),
                    *_engine("idle", waiting=0),
                    *_engine("generating", tokens="500+40x10"),
                ],
                "promql_expr_test": [{
                    "expr": _expr(config, "InferwatchEngineWedged"),
                    "eval_time": "3m",
                    "exp_samples": [
                        {"labels": '{instance="kv-unknown", model_name="m"}', "value": 4},
                        {"labels": '{instance="wedged", model_name="m"}', "value": 4},
                    ],
                }],
            },
            {
                # Per second: ok 3, the sidecar's overloaded answers 1, vLLM's rejections 1 (the same requests)
                # -> 1 / 4; counted twice it would be 2 / 5.
                "name": "vLLM's rejections count once against availability",
                "interval": "1m",
                "input_series": [
                    _requests("through", "ok", 180), _requests("through", "overloaded", 60),
                    _rejections("through", 60),
                    _requests("bypass", "ok", 180), _rejections("bypass", 60),
                    _requests("mixed", "ok", 120), _requests("mixed", "overloaded", 60), _rejections("mixed", 120),
                    _requests("old", "ok", 180), _requests("old", "upstream_error", 60),
                ],
                "promql_expr_test": [{
                    "expr": ratio,
                    "eval_time": "10m",
                    "exp_samples": [
                        {"labels": f'{error_ratio_name(300)}{{model_name="{m}", slo="availability"}}', "value": v}
                        for m, v in (("bypass", 0.25), ("mixed", 0.5), ("old", 0.25), ("through", 0.25))
                    ],
                }],
            },
        ],
    }
    return write_rule_test(root, config, "engine_signals.yml", doc)


def test_embedded_evaluator_passes_the_engine_signal_cases(tmp_path: Path) -> None:
    """The wedged expression and the rejection-aware error ratio give the expected samples in our evaluator."""
    result = run_file(signals_test_file(tmp_path))
    assert result.errors == []
    assert result.failures == []


def test_wedged_engine_pages_and_offload_traffic_tickets() -> None:
    """The wedged engine is critical (a page); sustained offload traffic is a warning that counts both ways."""
    rules = yaml.safe_load(outputs(RulesConfig())["rules/intervene.yml"])
    alerts = {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert alerts["InferwatchEngineWedged"]["labels"]["severity"] == "critical"
    assert alerts["InferwatchEngineWedged"]["for"] == "1m"
    assert "[2m]" in alerts["InferwatchEngineWedged"]["expr"]
    offload = alerts["InferwatchKVOffloadTraffic"]
    assert offload["labels"]["severity"] == "warning"
    assert 'direction="' not in offload["expr"]


def test_stall_and_offload_limits_follow_the_config() -> None:
    """wedged_stall_s, kv_cache_ratio and kv_offload_bytes_per_s move into the expressions."""
    config = RulesConfig(wedged_stall_s=300, kv_cache_ratio=0.9, kv_offload_bytes_per_s=2e9)
    assert "[5m]" in _expr(config, "InferwatchEngineWedged")
    assert "> 0.9)" in _expr(config, "InferwatchEngineWedged")
    assert _expr(config, "InferwatchKVOffloadTraffic").endswith("> 2000000000")


def test_runbooks_header_names_where_each_runbook_lives() -> None:
    """docs/runbooks.md says its text comes from each alert's definition, not from runbooks.py alone."""
    text = outputs(RulesConfig())["docs/runbooks.md"]
    head = text.split("\n- [", 1)[0]
    assert "`alert_rules/intervene.py`" in head
    assert "`alert_rules/slo.py`" in head
    assert "from `alert_rules/runbooks.py`" not in head
    assert "## InferwatchEngineWedged" in text
    assert "vLLM issue 53130" in text
