"""Tests of inferwatch explain's parts for engines that put their own numbers in their answers (Ollama,
llama.cpp): the parts add up, the model load is its own part and a cold start, and an archived record gives
the same parts as the ring's."""

from __future__ import annotations

import pytest

from exporters.explain import explain, facts_from_log_event, facts_from_record
from exporters.records import AnswerPhases, RequestRecord
from log_pipeline.records import event_from_record

OLLAMA = AnswerPhases("ollama", prefill_s=0.020, decode_s=0.100, load_s=0.300, total_s=0.430, prompt_tokens=11,
                      generated_tokens=8)
LLAMACPP = AnswerPhases("llamacpp", prefill_s=0.0022, decode_s=0.0041, prompt_tokens=10, cached_tokens=3,
                        generated_tokens=8)


def _record(phases: AnswerPhases, e2e_s: float) -> RequestRecord:
    return RequestRecord(trace_id="ab" * 16, span_id="cd" * 8, route="/api/generate", model="m", stream=True,
                         http_status=200, e2e_s=e2e_s, ttft_s=0.33, upstream_sent_s=0.001, start_unix=1.7e9,
                         prompt_tokens=11, completion_tokens=8, inter_token_s=[0.01] * 7, answer_phases=phases)


def _parts(explanation: dict) -> dict[str, float]:  # type: ignore[type-arg]
    return {p["name"]: p["ms"] for p in explanation["phases"]}


def test_ollamas_load_is_its_own_part_and_the_parts_add_up_to_the_e2e() -> None:
    """model_load, prefill and decode are Ollama's durations; no engine_queue part, which Ollama does not measure."""
    parts = _parts(explain(facts_from_record(_record(OLLAMA, 0.5))))
    assert (parts["model_load"], parts["prefill"], parts["decode"]) == (300.0, 20.0, 100.0)
    assert "engine_queue" not in parts
    assert sum(parts.values()) == pytest.approx(500.0, abs=0.3)
    assert parts["upstream_front_end"] == pytest.approx(500.0 - 1.0 - 420.0, abs=0.2)


def test_a_long_model_load_is_a_cold_start() -> None:
    """300 ms of a 500 ms request spent loading the model ranks first, as cold_start."""
    causes = explain(facts_from_record(_record(OLLAMA, 0.5)))["causes"]
    assert causes[0]["cause"] == "cold_start"
    assert causes[0]["evidence"]["load_ms"] == 300.0


def test_llamacpp_timings_give_prefill_decode_and_cached_tokens() -> None:
    """llama.cpp's timings split the engine's part; its cached tokens are the explanation's."""
    explanation = explain(facts_from_record(_record(LLAMACPP, 0.05)))
    parts = _parts(explanation)
    assert (parts["prefill"], parts["decode"]) == (2.2, 4.1)
    assert "model_load" not in parts
    assert explanation["cached_tokens"] == 3
    assert explanation["engine_numbers"] is True


@pytest.mark.parametrize("phases", [pytest.param(OLLAMA, id="ollama"), pytest.param(LLAMACPP, id="llama.cpp")])
def test_an_archived_record_keeps_the_engines_parts(phases: AnswerPhases) -> None:
    """The log record's engine fields give the archive's explanation the same engine parts as the ring's."""
    record = _record(phases, 0.5)
    event = event_from_record(record, sla_s=None)
    assert event["engine_source"] == phases.engine
    archived = _parts(explain(facts_from_log_event(event, record.start_unix), source="archive"))
    ring = _parts(explain(facts_from_record(record)))
    for part in ("model_load", "prefill", "decode"):
        assert archived.get(part) == ring.get(part)
