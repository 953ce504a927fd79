"""Alerts that read a series some engine does not feed say which engines they cannot fire in front of, in an
annotation and in their runbook entry (never an alert that can never fire without saying why)."""

from __future__ import annotations

from alert_rules.annotate import ENGINES_ANNOTATION, annotate_alert
from alert_rules.config import RulesConfig
from alert_rules.runbooks import Runbook, entry
from alert_rules.spec import AlertRule, Severity
from exporters.catalog import engine as ce
from exporters.catalog import request as cr

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
