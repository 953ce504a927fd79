"""Tests of exporters.engine_parse: SGLang's and llama.cpp's /metrics read into the engine view, and detection.

The SGLang text was produced by SGLang 0.5.23's own collectors (tests/harness/sglang_exposition.py): the numbers
checked here are the ones fed to them, not re-derived by our code. One llama.cpp text is written from its
server's source (tests/data/llamacpp_source_0.3.36.prom says which values came from a real server), the other
captured from a real llama-server (make release-check-llamacpp) and checked against prometheus_client's reading.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporters import derive
from exporters.catalog import engine as ce
from exporters.catalog import llamacpp as cl
from exporters.catalog import sglang as cs
from exporters.catalog.engines import Engine
from exporters.collectors import EngineCollector, EngineState, register_collectors
from exporters.engine_parse import engine_of_answers, engine_of_exposition, parse_engine_exposition
from tests.harness import sglang_exposition as fed

DATA = Path(__file__).resolve().parents[2] / "data"
SGLANG = (DATA / "sglang_0.5.23.prom").read_text()
LLAMACPP = (DATA / "llamacpp_source_0.3.36.prom").read_text()
LLAMACPP_REAL = (DATA / "llamacpp_real_0.3.36.prom").read_text()


def _exported(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    snapshot = parse_engine_exposition(text)
    registry = CollectorRegistry()
    register_collectors(registry, EngineCollector(lambda: EngineState("u", snapshot, up=True)))
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(generate_latest(registry).decode()) for s in fam.samples}


def test_sglang_numbers_are_the_ones_its_collectors_were_fed() -> None:
    """Running, queued, token usage, retractions, prompt/cached/generated tokens: what SGLang's collectors got."""
    view = derive.model_views(parse_engine_exposition(SGLANG))[0]
    prompt = sum(r[0] for r in fed.REQUESTS)
    cached = sum(r[2] for r in fed.REQUESTS)
    assert (view.model, view.running, view.waiting) == ("tiny-llm", fed.SCHEDULER["num_running_reqs"],
                                                       fed.SCHEDULER["num_queue_reqs"])
    assert view.kv_usage == fed.SCHEDULER["token_usage"]
    assert view.preemptions == fed.RETRACTED[0]
    assert view.prefix_hit_ratio == pytest.approx(cached / prompt)
    assert view.generation_tokens == sum(r[1] for r in fed.REQUESTS)


def test_sglang_lands_in_the_engine_series_with_its_engine_named() -> None:
    """The engine series carry SGLang's numbers; the info series names the engine in its generation label."""
    got = _exported(SGLANG)
    model = ("model_name", "tiny-llm")
    assert got[(ce.ENGINE_REQUESTS.name, (model, ("state", "running")))] == 3.0
    assert got[(ce.KV_USAGE.name, (model,))] == 0.625
    assert got[(ce.ENGINE_PREEMPTIONS.series, (model,))] == 2.0
    info = [labels for name, labels in got if name == ce.ENGINE_INFO.name]
    assert dict(info[0])["generation"] == "sglang"


def test_sglang_has_no_block_count_and_no_phase_time_so_those_series_are_absent() -> None:
    """What SGLang does not export stays absent, never 0."""
    names = {name for name, _ in _exported(SGLANG)}
    assert ce.KV_BLOCKS_TOTAL.name not in names
    assert ce.ENGINE_PREFILL_SECONDS.series not in names


def test_a_malformed_sglang_family_is_skipped_and_counted_the_rest_still_parses() -> None:
    """As for vLLM's generations: one broken family costs that family, not the scrape."""
    broken = SGLANG.replace('sglang:num_queue_reqs{engine_type="unified"', 'sglang:num_queue_reqs{engine_type="unif')
    snapshot = parse_engine_exposition(broken)
    assert snapshot.parse_errors >= 1
    assert "sglang:num_queue_reqs" in snapshot.malformed_families
    view = derive.model_views(snapshot)[0]
    assert view.waiting is None
    assert view.running == 3.0


def test_llamacpp_prefill_and_decode_time_come_from_its_counters_and_kv_usage_is_unknown() -> None:
    """Busy slots, deferred requests, prompt and generation seconds; no KV gauge: KV usage absent, and said so."""
    snapshot = parse_engine_exposition(LLAMACPP)
    view = derive.model_views(snapshot)[0]
    assert (snapshot.generation, view.running, view.waiting) == ("llamacpp", 1.0, 2.0)
    assert (view.prefill_seconds, view.decode_seconds, view.generation_tokens) == (0.0125, 0.0418, 34.0)
    assert view.prefix_hit_ratio == pytest.approx(28 / (27 + 28))  # prompt_tokens_total excludes the cached
    assert view.kv_usage is None
    assert "KV-cache usage" in derive.normalized(snapshot)["missing"]
    assert (ce.KV_USAGE.name, (("model_name", "default"),)) not in _exported(LLAMACPP)


@pytest.mark.parametrize(("text", "engine"), [
    pytest.param(SGLANG, Engine.SGLANG, id="sglang families name SGLang"),
    pytest.param(LLAMACPP, Engine.LLAMACPP, id="llamacpp families name llama.cpp"),
    pytest.param((DATA / "vllm_v1_engine_0.32.prom").read_text(), Engine.VLLM, id="vllm families name vLLM"),
    pytest.param((DATA / "ray_vllm_0.33.prom").read_text(), Engine.VLLM, id="Ray's vLLM families name vLLM"),
    pytest.param("# nothing\n", None, id="no engine family names none"),
])
def test_the_engine_is_told_by_the_families(text: str, engine: Engine | None) -> None:
    """auto recognizes the engine from the first of its families."""
    assert engine_of_exposition(text) == engine


def test_ollama_and_a_llamacpp_without_metrics_are_told_by_their_endpoints() -> None:
    """Ollama has no /metrics but says so at its root; llama-server without --metrics names the flag (501)."""
    assert engine_of_answers(404, "404 page not found", 200, "Ollama is running") == (Engine.OLLAMA, "endpoint")
    refusal = ('{"error":{"code":501,"message":"This server does not support metrics endpoint. Start it with '
               '`--metrics`","type":"not_supported_error"}}')
    assert engine_of_answers(501, refusal, 404, "{}") == (Engine.LLAMACPP, "endpoint")
    assert engine_of_answers(None, "", None, "") == (None, "none")


@pytest.mark.parametrize(("text", "specs"), [
    pytest.param(SGLANG, "sglang", id="every SGLang family the catalog reads is in SGLang's own exposition"),
    pytest.param(LLAMACPP, "llamacpp", id="every llama.cpp family the catalog reads is in its server's text"),
    pytest.param(LLAMACPP_REAL, "llamacpp", id="every llama.cpp family the catalog reads is in a real server's"),
])
def test_the_catalog_names_only_families_the_engine_writes(text: str, specs: str) -> None:
    """A family renamed or dropped by the engine would read as absent forever: the catalog must match its text."""
    module = {"sglang": cs, "llamacpp": cl}[specs]
    written = {family.name for family in text_string_to_metric_families(text)}
    assert {spec.name.removesuffix("_total") for spec in module.SPECS} <= written


def test_a_real_llamacpp_exposition_reads_as_its_own_counters_say() -> None:
    """The capture of a real llama-server (make release-check-llamacpp): the view holds its counters as
    prometheus_client reads them, and no KV usage."""
    raw = {s.name: s.value for f in text_string_to_metric_families(LLAMACPP_REAL) for s in f.samples}
    snapshot = parse_engine_exposition(LLAMACPP_REAL)
    view = derive.model_views(snapshot)[0]
    assert snapshot.parse_errors == 0
    assert (view.prefill_seconds, view.decode_seconds) == (raw[cl.PROMPT_SECONDS.name],
                                                           raw[cl.TOKENS_PREDICTED_SECONDS.name])
    assert view.generation_tokens == raw[cl.TOKENS_PREDICTED.name]
    assert (view.running, view.waiting) == (raw[cl.REQUESTS_PROCESSING.name], raw[cl.REQUESTS_DEFERRED.name])
    assert view.kv_usage is None
