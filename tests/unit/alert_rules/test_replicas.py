"""Several replicas, each its own sidecar and scrape target: the rules aggregate across them by model.

A promtool-format test over the built rules, run here by the embedded evaluator (and by the real
promtool in tests/integration/test_multi_replica.py): two instances of one model, one of them
restarting inside the window, and per-replica alerts that keep ``instance``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from alert_rules.build import outputs
from alert_rules.config import RulesConfig
from alert_rules.promtool_runner import run_file
from alert_rules.slo import error_ratio_name
from tests.unit.alert_rules.rule_test_files import write_rule_test

MODEL = "m"


def _counter(per_minute: int, minutes: int = 11, restart_at: int | None = None) -> str:
    """Counter samples one minute apart; after ``restart_at`` it starts again from one minute's worth."""
    values = []
    for minute in range(minutes):
        if restart_at is None or minute < restart_at:
            values.append(per_minute * minute)
        else:
            values.append(per_minute * (minute - restart_at + 1))
    return " ".join(str(v) for v in values)


def _requests(instance: str, outcome: str, values: str) -> dict[str, str]:
    return {"series": f'inferwatch_requests_total{{instance="{instance}", model_name="{MODEL}", '
                      f'outcome="{outcome}", route="/v1/chat/completions"}}', "values": values}


def _queue_expr(config: RulesConfig) -> str:
    rules = yaml.safe_load(outputs(config)["rules/intervene.yml"])
    alert = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "InferwatchQueueBacklog")
    return str(alert["expr"])


def replica_test_file(root: Path, config: RulesConfig | None = None) -> Path:
    """Write the built rules and a promtool test of their cross-instance aggregation under ``root``.

    Instance a: 45 ok and 15 failed requests a minute. Instance b: 180 ok a minute, no error series at
    all, and a restart at minute 6. Over 5m at 10m the fleet served 4 requests/s, 0.25/s of them failed:
    the recorded availability error ratio is 0.0625 exactly. (Summing the counters across instances
    before rate() would see b's restart as a reset of the whole sum and report 0.05.)
    """
    config = config or RulesConfig()
    waiting = 'inferwatch_engine_requests{{instance="{}", model_name="{}", state="waiting"}}'
    limit = config.queue_waiting
    doc: dict[str, Any] = {
        "rule_files": ["../rules/slo.yml", "../rules/intervene.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "name": "SLO error ratio over two instances, one restarting",
                "interval": "1m",
                "input_series": [
                    _requests("a", "ok", _counter(45)),
                    _requests("a", "upstream_error", _counter(15)),
                    _requests("b", "ok", _counter(180, restart_at=6)),
                ],
                "promql_expr_test": [{
                    "expr": f'{error_ratio_name(300)}{{slo="availability"}}',
                    "eval_time": "10m",
                    "exp_samples": [{"labels": f'{error_ratio_name(300)}{{model_name="{MODEL}", '
                                               f'slo="availability"}}', "value": 0.0625}],
                }],
            },
            {
                "name": "A per-replica queue alert names the replica, never the fleet sum",
                "interval": "1m",
                "input_series": [
                    {"series": waiting.format("a", MODEL), "values": f"{limit * 0.6:g}x10"},
                    {"series": waiting.format("b", MODEL), "values": f"{limit * 0.6:g}x10"},
                    {"series": waiting.format("c", MODEL), "values": f"{limit * 2:g}x10"},
                ],
                "promql_expr_test": [{
                    "expr": _queue_expr(config),
                    "eval_time": "5m",
                    "exp_samples": [{"labels": f'{{instance="c", model_name="{MODEL}"}}', "value": limit * 2}],
                }],
            },
        ],
    }
    return write_rule_test(root, config, "replicas.yml", doc)


def test_embedded_evaluator_aggregates_replicas(tmp_path: Path) -> None:
    """The SLO ratio is summed over instances (a restart is one instance's reset); the queue alert keeps instance."""
    result = run_file(replica_test_file(tmp_path))
    assert result.errors == []
    assert result.failures == []


def test_per_replica_alerts_keep_instance() -> None:
    """Per-engine alerts group by instance (or keep every label); fleet alerts aggregate by model only."""
    rules = yaml.safe_load(outputs(RulesConfig())["rules/intervene.yml"])
    exprs = {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"]}
    for name in ("InferwatchRequestsSwapped", "InferwatchPreemptionStorm", "InferwatchQueueBacklog"):
        assert "sum by (model_name, instance)" in exprs[name], name
    for name in ("InferwatchOOMBurst", "InferwatchLogRecordsDropped"):
        assert "sum by (instance)" in exprs[name], name
    for name in ("InferwatchKVCacheNearlyFull", "InferwatchUpstreamDown", "InferwatchGpuMemoryHigh"):
        assert "sum" not in exprs[name], name
        assert "by (" not in exprs[name], name
    for name in ("InferwatchCircuitBreakerRollback", "InferwatchLatencyAboveSLA", "InferwatchLongContextFailures"):
        assert "instance" not in exprs[name], name
