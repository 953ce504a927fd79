"""Alerts that read a series some engine does not feed say which engines they cannot fire in front of, in an
annotation and in their runbook entry (never an alert that can never fire without saying why)."""

from __future__ import annotations

from pathlib import Path

from alert_rules.annotate import ENGINES_ANNOTATION, annotate_alert, engines_unable
from alert_rules.config import RulesConfig
from alert_rules.promql import parse_expr
from alert_rules.promtool_runner import run_file
from alert_rules.render import alerts
from alert_rules.runbooks import Runbook, entry
from alert_rules.spec import AlertRule, Severity
from exporters.catalog import engine as ce
from exporters.catalog import request as cr
from exporters.catalog.engines import Engine
from tests.unit.alert_rules.rule_test_files import write_rule_test

BOOK = Runbook("It means something.", ("Check one thing.",), ("Do one thing.",))


def _alert(expr: str) -> AlertRule:
    return AlertRule("InferwatchTestAlert", expr, Severity.WARNING, "Something happened.", "Something happened.",
                     BOOK, scenario=lambda _config: None)  # type: ignore[arg-type, return-value]


def test_an_alert_on_kv_usage_names_the_engines_without_a_kv_gauge() -> None:
    """KV usage comes from vLLM and SGLang only: llama.cpp and Ollama are named, with why."""
    alert = annotate_alert(RulesConfig(), _alert(f"max({ce.KV_USAGE.name}) > 0.95"))
    note = alert.annotations[ENGINES_ANNOTATION]
    assert "llama.cpp (llama-server exports no KV-cache gauge)" in note
    assert "Ollama (Ollama has no /metrics)" in note
    assert "SGLang" not in note
    assert f"**Engines.** {note}" in entry(RulesConfig(), alert)


def test_an_alert_on_preemptions_names_llamacpp_and_ollama_but_not_sglang() -> None:
    """SGLang's retractions feed the preemption counter; llama.cpp and Ollama have none."""
    note = annotate_alert(RulesConfig(), _alert(f"increase({ce.ENGINE_PREEMPTIONS.series}[5m]) > 0")).annotations[
        ENGINES_ANNOTATION]
    assert "llama.cpp" in note
    assert "Ollama" in note
    assert "SGLang" not in note


def test_an_alert_on_the_sidecars_own_request_counters_fires_everywhere() -> None:
    """The sidecar measures requests in front of every engine: no annotation, no runbook line."""
    alert = annotate_alert(RulesConfig(), _alert(f"sum(rate({cr.REQUESTS.series}[5m])) > 1"))
    assert ENGINES_ANNOTATION not in alert.annotations
    assert "**Engines.**" not in entry(RulesConfig(), alert)


def test_what_only_an_unless_or_one_side_of_an_or_reads_does_not_silence_an_alert() -> None:
    """``unless`` on KV usage, ``or`` with a constant and ``absent()`` leave an alert able to fire where those
    series are missing; ``or`` of two reads that both miss on an engine cannot fire there."""
    kv, waiting, tokens = ce.KV_USAGE.name, ce.ENGINE_REQUESTS.name, ce.ENGINE_GENERATION_TOKENS.series
    assert set(engines_unable(parse_expr(f"{waiting} > 0 unless {kv} > 0.95"))) == {Engine.OLLAMA}
    assert engines_unable(parse_expr(f"{kv} > 0.9 or vector(0)")) == {}
    assert engines_unable(parse_expr(f"absent({kv})")) == {}
    assert set(engines_unable(parse_expr(f"{waiting} > 0 and {kv} > 0.9"))) == {Engine.OLLAMA, Engine.LLAMACPP}
    assert set(engines_unable(parse_expr(f"{kv} > 0.9 or rate({tokens}[1m]) > 0"))) == {Engine.OLLAMA}


def test_the_wedged_engine_alert_can_fire_in_front_of_llamacpp() -> None:
    """It reads KV usage only to stay quiet when the cache is full: llama.cpp, which has none, is not named."""
    wedged = next(a for a in alerts(RulesConfig()) if a.name == "InferwatchEngineWedged")
    note = wedged.annotations[ENGINES_ANNOTATION]
    assert "Ollama" in note
    assert "llama.cpp" not in note


def test_in_front_of_ollama_no_engine_alert_fires_for_want_of_engine_series(tmp_path: Path) -> None:
    """With only the sidecar's own series (Ollama: no /metrics), the engine alerts stay quiet instead of paging on
    an absent series."""
    series = [
        {"series": f'{cr.REQUESTS.series}{{instance="a", model_name="m", outcome="ok", route="/api/generate"}}',
         "values": "0+60x120"},
        {"series": f'{cr.UPSTREAM_READY.series}{{instance="a", upstream="http://127.0.0.1:11434"}}', "values": "1x120"},
    ]
    quiet = ("InferwatchQueueBacklog", "InferwatchUpstreamDown", "InferwatchKVCacheNearlyFull",
             "InferwatchPreemptionStorm", "InferwatchEngineWedged", "InferwatchRequestsSwapped")
    doc = {"rule_files": ["../rules/slo.yml", "../rules/intervene.yml"], "evaluation_interval": "1m", "tests": [{
        "name": "Ollama: no engine series, no engine alert", "interval": "1m", "input_series": series,
        "alert_rule_test": [{"eval_time": "60m", "alertname": name, "exp_alerts": []} for name in quiet],
    }]}
    result = run_file(write_rule_test(tmp_path, RulesConfig(), "ollama_quiet.yml", doc))
    assert result.errors == []
    assert result.failures == []
