"""Which cause an explanation names, from a request's facts and the engine's state around it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from exporters.explain import (
    CAUSES,
    ColdStartSpan,
    EngineContext,
    EnginePhases,
    RequestFacts,
    explain,
    facts_from_json,
    facts_from_log_event,
    facts_from_record,
)
from exporters.records import Outcome, RequestRecord
from log_pipeline.records import event_from_record

START = 1_700_000_000.0


def _facts(e2e_ms: float = 1000.0, **changes: Any) -> RequestFacts:
    values: dict[str, Any] = {
        "trace_id": "ab" * 16, "model": "m", "route": "/v1/completions", "stream": True, "outcome": "ok",
        "http_status": 200, "start_unix": START, "e2e_ms": e2e_ms, "ttft_ms": 100.0, "sent_ms": 1.0,
        "largest_gap_ms": 12.0, "median_gap_ms": 10.0, "mean_gap_ms": 10.0, "prompt_tokens": 100,
        "engine": EnginePhases(queue_ms=1.0, prefill_ms=20.0, decode_ms=900.0, preemptions=0, cached_tokens=0),
    }
    return RequestFacts(**(values | changes))


def _causes(facts: RequestFacts, context: EngineContext | None = None) -> list[str]:
    return [c["cause"] for c in explain(facts, context or EngineContext("plugin_steps", running_max=1))["causes"]]


def test_a_long_queue_with_full_kv_is_kv_capacity_and_with_free_kv_a_full_batch() -> None:
    """The same queue time names queue_kv_capacity at KV usage 0.95 and queue_full_batch at 0.3."""
    facts = _facts(engine=EnginePhases(600.0, 20.0, 300.0, 0, 0))
    assert _causes(facts, EngineContext("plugin_steps", running_max=8, kv_usage_max=0.95))[0] == "queue_kv_capacity"
    assert _causes(facts, EngineContext("plugin_steps", running_max=8, kv_usage_max=0.3,
                                        max_num_seqs=8))[0] == "queue_full_batch"


def test_a_short_queue_is_no_cause() -> None:
    """A queue under its floor (50 ms) is no cause even when it is a large share of a short request."""
    assert _causes(_facts(e2e_ms=60.0, engine=EnginePhases(30.0, 5.0, 20.0, 0, 0))) == ["none"]


def test_long_prefill_needs_a_prompt_mostly_outside_the_prefix_cache() -> None:
    """A long prefill is long_prefill with no cache hit, and no cause when most of the prompt was cached."""
    uncached = _facts(prompt_tokens=4000, engine=EnginePhases(1.0, 500.0, 400.0, 0, 0))
    cached = _facts(prompt_tokens=4000, engine=EnginePhases(1.0, 500.0, 400.0, 0, 3968))
    assert _causes(uncached) == ["long_prefill"]
    assert _causes(cached) == ["none"]


def test_stall_is_a_gap_far_above_the_requests_own() -> None:
    """A 1.5 s gap among 10 ms gaps is a stall; a 1.5 s gap among 1 s gaps is not."""
    assert "stall" in _causes(_facts(e2e_ms=3000.0, largest_gap_ms=1500.0, median_gap_ms=10.0))
    assert "stall" not in _causes(_facts(e2e_ms=3000.0, largest_gap_ms=1500.0, median_gap_ms=1000.0))


def test_a_gap_the_client_made_is_no_stall() -> None:
    """A 1.5 s gap while the stream waited 1.2 s on the client is no stall; with 0.2 s of waiting, a 1.3 s one."""
    assert "stall" not in _causes(_facts(e2e_ms=3000.0, largest_gap_ms=1500.0, median_gap_ms=10.0,
                                         client_wait_ms=1200.0))
    stall = next(c for c in explain(_facts(e2e_ms=3000.0, largest_gap_ms=1500.0, median_gap_ms=10.0,
                                           client_wait_ms=200.0))["causes"] if c["cause"] == "stall")
    assert stall["ms"] == 1300.0


def test_decode_contention_needs_a_busy_batch() -> None:
    """A decode holding most of the e2e is decode_contention with 8 running (2 of max_num_seqs 4), no cause alone."""
    assert _causes(_facts(), EngineContext("plugin_steps", running_max=8)) == ["decode_contention"]
    assert _causes(_facts(), EngineContext("plugin_steps", running_max=1)) == ["none"]
    assert _causes(_facts(), EngineContext("plugin_steps", running_max=8, max_num_seqs=256)) == ["decode_contention"]
    assert _causes(_facts(), EngineContext("plugin_steps", running_max=2, max_num_seqs=4)) == ["decode_contention"]


def test_a_request_sent_during_warm_up_is_cold_start_and_one_cut_by_a_restart_is_upstream_restart() -> None:
    """A cold start that began before the request is cold_start; one that began while it ran, upstream_restart;
    both rank before time-share causes."""
    warming = ColdStartSpan("readiness_lost", START - 5, START + 0.5)
    before = EngineContext("none", running_max=8, cold_starts=(warming,))
    during = EngineContext("none", cold_starts=(ColdStartSpan("readiness_lost", START + 0.5, None),))
    assert _causes(_facts(), before)[0] == "cold_start"
    assert _causes(_facts(outcome="upstream_error", http_status=502), during)[:2] == ["upstream_error",
                                                                                      "upstream_restart"]
    assert _causes(_facts(), EngineContext("none", cold_starts=(ColdStartSpan("x", START - 60, START - 50),))) \
        == ["none"]


def test_parts_add_up_when_a_slow_client_held_the_stream() -> None:
    """The client's wait after vLLM finished is client_slow_read, and the parts still add up to the e2e."""
    facts = _facts(e2e_ms=2000.0, client_wait_ms=900.0)
    explanation = explain(facts)
    phases = {p["name"]: p["ms"] for p in explanation["phases"]}
    assert phases["client_slow_read"] == pytest.approx(900.0)
    assert sum(phases.values()) == pytest.approx(2000.0)
    assert explanation["causes"][0]["cause"] == "client_slow_read"


def test_without_the_plugin_the_time_to_first_token_is_one_unsplit_part() -> None:
    """No engine numbers: vllm_until_first_token, split false, then generation; they add up to the e2e."""
    phases = explain(_facts(engine=None))["phases"]
    assert [p["name"] for p in phases] == ["sidecar", "connect", "vllm_until_first_token", "generation",
                                           "client_slow_read"]
    assert [p["split"] for p in phases][2] is False
    assert sum(p["ms"] for p in phases) == pytest.approx(1000.0)


def test_a_client_wait_while_vllm_still_generated_is_not_counted_twice() -> None:
    """A client that held the stream 500 ms, all but 78 ms of it while vLLM still decoded: client_slow_read is
    the 78 ms after vLLM finished, and the parts add up to the e2e."""
    explanation = explain(_facts(client_wait_ms=500.0))  # 1000 ms: 1 sent, 921 in the engine, 78 after
    phases = {p["name"]: p["ms"] for p in explanation["phases"]}
    assert phases["client_slow_read"] == pytest.approx(78.0)
    assert phases["vllm_front_end"] == 0.0
    assert sum(phases.values()) == pytest.approx(1000.0)


def test_the_readme_documents_the_vocabulary_and_every_cause_named_is_in_it() -> None:
    """Each cause of CAUSES is named in the README's "Explain a request", and the causes the tests above
    produce are all in CAUSES."""
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    section = readme[readme.index("## Explain a request"):readme.index("## When things go wrong")]
    assert [cause for cause in CAUSES if f"`{cause}`" not in section] == []
    produced = {"queue_kv_capacity", "queue_full_batch", "long_prefill", "stall", "decode_contention", "cold_start",
                "upstream_restart", "upstream_error", "client_slow_read", "none", "preempted", "sidecar"}
    assert produced <= set(CAUSES)
    sidecar_slow = _facts(e2e_ms=1000.0, sent_ms=400.0, engine=EnginePhases(1.0, 20.0, 500.0, 0, 0))
    assert _causes(sidecar_slow)[0] == "sidecar"


def test_a_gpu_slowed_by_heat_or_power_is_gpu_throttled_an_idle_one_not() -> None:
    """hw_thermal while the request ran names gpu_throttled with the engine's time; gpu_idle or application clocks
    do not; the facts in the explanation read back as the same facts."""
    hot = EngineContext("plugin_steps", running_max=1, gpu_clock_events=("hw_thermal",), gpu_temperature_max=91.0)
    explanation = explain(_facts(), hot)
    throttled = next(c for c in explanation["causes"] if c["cause"] == "gpu_throttled")
    assert throttled["ms"] == 920.0
    assert throttled["evidence"]["reasons"] == ["hw_thermal"]
    idle = EngineContext("plugin_steps", running_max=1, gpu_clock_events=("applications_clocks", "gpu_idle"))
    assert "gpu_throttled" not in _causes(_facts(), idle)
    assert facts_from_json(json.loads(json.dumps(explanation["facts"]))) == _facts()


def test_an_archived_record_is_split_as_the_ring_splits_the_same_request() -> None:
    """A stream that went out after 30 ms (5 ms connecting) and waited 900 ms on its client: explained from its log
    record, the phases, causes and largest gap equal the ring's explanation of the record itself; a request the
    sidecar refused likewise."""
    record = RequestRecord(
        trace_id="ab" * 16, span_id="00f067aa0ba902b7", route="/v1/completions", model="m", stream=True,
        http_status=200, length_bucket="le512", prompt_tokens=100, completion_tokens=4, accept_s=0.04,
        upstream_sent_s=0.03, connect_s=0.005, ttft_s=0.1, e2e_s=2.2, inter_token_s=[0.01, 0.5, 0.02],
        start_unix=START, client_wait_s=0.9)
    refused = RequestRecord(trace_id="cd" * 16, span_id="00f067aa0ba902b7", route="/v1/completions",
                            http_status=413, outcome=Outcome.CLIENT_ERROR, e2e_s=0.002, start_unix=START,
                            error_type="request_too_large", error_message="too large", refused=True)
    for one in (record, refused):
        event = json.loads(json.dumps(event_from_record(one, sla_s=None)))
        from_ring = explain(facts_from_record(one))
        from_archive = explain(facts_from_log_event(event, one.start_unix), source="archive")
        assert from_archive["phases"] == from_ring["phases"]
        assert [c["cause"] for c in from_archive["causes"]] == [c["cause"] for c in from_ring["causes"]]
        assert from_archive["largest_gap_ms"] == from_ring["largest_gap_ms"]
    assert {p["name"] for p in explain(facts_from_record(record))["phases"]} >= {"sidecar", "connect",
                                                                                  "client_slow_read"}


def test_a_request_cut_just_before_the_probe_saw_vllm_gone_is_upstream_restart() -> None:
    """A request that failed 0.3 s before a probe found vLLM down, within the probe interval before it, names
    upstream_restart; one that succeeded then, or failed before the interval, does not."""
    began = START + 3.0
    context = EngineContext("plugin_steps", running_max=1, cold_starts=(
        ColdStartSpan("readiness_lost", began, None, began - 1.0),))
    cut = _facts(e2e_ms=2700.0, outcome="upstream_error", http_status=502)
    assert "upstream_restart" in _causes(cut, context)
    assert "upstream_restart" not in _causes(_facts(e2e_ms=2700.0), context)
    assert "upstream_restart" not in _causes(_facts(e2e_ms=1500.0, outcome="upstream_error", http_status=502),
                                             context)


def _preempted(explanation: dict[str, Any]) -> dict[str, Any]:
    return dict(next(c for c in explanation["causes"] if c["cause"] == "preempted")["evidence"])


def test_the_recomputed_tokens_are_the_prompt_and_the_output_before_each_of_its_largest_stalls() -> None:
    """A stream of 7 one-token chunks preempted twice, its two largest gaps after chunks 2 and 5: vLLM prefilled
    again at most the prompt and 2 tokens, then the prompt and 5; preempted once, the largest only; the figure
    survives the facts' JSON (what --prometheus explains again from)."""
    record = RequestRecord(
        trace_id="ab" * 16, span_id="00f067aa0ba902b7", route="/v1/completions", model="m", stream=True,
        http_status=200, prompt_tokens=100, completion_tokens=7, upstream_sent_s=0.001, ttft_s=0.1, e2e_s=2.5,
        inter_token_s=[0.01, 0.9, 0.01, 0.01, 1.2, 0.01], start_unix=START)
    twice = dataclasses.replace(facts_from_record(record), engine=EnginePhases(1.0, 20.0, 2300.0, 2, 0))
    evidence = _preempted(explain(twice))
    assert evidence["recomputed_tokens_at_most"] == 2 * 100 + 5 + 2
    assert evidence["recomputed_tokens_basis"] == "stalls"
    assert evidence["tokens_before_stalls"] == [5, 2]
    assert evidence["stalls_ms"] == [1200.0, 900.0]
    again = explain(facts_from_json(json.loads(json.dumps(explain(twice)["facts"]))))
    assert _preempted(again)["recomputed_tokens_at_most"] == 207
    once = dataclasses.replace(twice, engine=EnginePhases(1.0, 20.0, 2300.0, 1, 0))
    assert _preempted(explain(once))["recomputed_tokens_at_most"] == 105
    assert "at most 105 tokens" in explain(once)["reason"]


def test_chunks_that_merged_tokens_raise_the_bound_and_without_a_timeline_it_is_the_whole_output() -> None:
    """12 tokens in 10 chunks, a stall after chunk 4: up to 2 of the merged tokens may have come before it, so at
    most 6 tokens then; a request that was not streamed (or an archived one, or one with more preemptions than the
    gaps kept) recomputed at most its prompt and all but its last token, per preemption; without usage, unknown."""
    merged = _facts(completion_tokens=12, content_chunks=10, stalls=((800.0, 4), (11.0, 2)),
                    engine=EnginePhases(1.0, 20.0, 900.0, 1, 0))
    assert _preempted(explain(merged))["tokens_before_stalls"] == [6]
    assert _preempted(explain(merged))["recomputed_tokens_at_most"] == 106
    whole = _facts(stream=False, completion_tokens=12, largest_gap_ms=None, median_gap_ms=None,
                   engine=EnginePhases(1.0, 20.0, 900.0, 2, 0))
    assert _preempted(explain(whole))["recomputed_tokens_at_most"] == 2 * (100 + 11)
    assert _preempted(explain(whole))["recomputed_tokens_basis"] == "output_length"
    too_many = dataclasses.replace(merged, engine=EnginePhases(1.0, 20.0, 900.0, 3, 0))
    assert _preempted(explain(too_many))["recomputed_tokens_basis"] == "output_length"
    unknown = _preempted(explain(dataclasses.replace(whole, completion_tokens=None)))
    assert unknown["recomputed_tokens_at_most"] is None
    assert "at most" not in explain(dataclasses.replace(whole, completion_tokens=None))["reason"]
