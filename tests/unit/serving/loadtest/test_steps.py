"""A whole load test against the fake upstream: steps, the mix, capacity, the timeline and cold starts."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from serving.loadtest.capacity import SloTarget, capacity, judge
from serving.loadtest.coldstart import Probe
from serving.loadtest.errors import LoadTestError
from serving.loadtest.prepare import LoadOptions, prepare
from serving.loadtest.spec import LoadSpec
from serving.loadtest.steps import ColdStartPlan, run_steps
from serving.loadtest.timeline import read_exposition
from tests.fakes.openai_upstream import FakeOpenAI

Servers = Callable[..., Awaitable[TestServer]]
DATA = Path(__file__).resolve().parents[3] / "data"


async def _url(aiohttp_server: Servers, fake: FakeOpenAI) -> str:
    server = await aiohttp_server(fake.app())
    return str(server.make_url("")).rstrip("/")


def _base(url: str, **changes: object) -> LoadSpec:
    values: dict[str, object] = {"url": url, "model": "m", "max_tokens": 4, "ignore_eos": True}
    values.update(changes)
    return LoadSpec(**values)  # type: ignore[arg-type]


class TestMixRun:
    """The mix is sent in its proportions at the calibrated lengths."""

    async def test_proportions_lengths_and_token_sums(self, aiohttp_server: Servers) -> None:
        """300 requests at 7:2:1 with seed 5: each request at the length docs/loadtest.md's seeded draw gives
        its index (211, 61 and 28 in all), every prompt at its calibrated length, the token totals equal to
        the upstream's own usage sums."""
        fake = FakeOpenAI(count_prompt_words=True, model_name="m", max_model_len=4096)
        url = await _url(aiohttp_server, fake)
        options = LoadOptions(base=_base(url, requests=300, concurrency=8, seed=5), mix="20:7,80:2,300:1")
        plan, calibration = await prepare(options, say=lambda _: None)
        assert calibration is not None
        run = await run_steps(plan)
        results = run.results
        assert len(results) == 300
        assert all(r.ok for r in results)
        drawn = {i: random.Random(5 * 1_000_003 + i).choices(("20", "80", "300"), (7.0, 2.0, 1.0))[0]
                 for i in range(300)}
        assert {r.index: r.bucket for r in results} == drawn
        assert Counter(r.bucket for r in results) == {"20": 211, "80": 61, "300": 28}
        assert all(r.prompt_tokens == r.asked_prompt_tokens == int(r.bucket) for r in results)
        assert sum(r.prompt_tokens or 0 for r in results) == fake.usage_prompt_tokens
        assert sum(r.completion_tokens or 0 for r in results) == fake.usage_completion_tokens == 300 * 4
        assert len({r.index for r in results}) == 300


class TestCapacity:
    """Latency that grows with load in a known way gives a known capacity."""

    async def test_capacity_picks_the_highest_step_within_the_slo(self, aiohttp_server: Servers) -> None:
        """With 0.1 s per request in flight, steps at concurrency 1 and 2 answer in 0.1-0.2 s and meet a
        0.5 s SLO; at concurrency 8 most requests take 0.8 s and miss it: capacity is the second step."""
        fake = FakeOpenAI(latency_per_in_flight_s=0.1, model_name="m")
        url = await _url(aiohttp_server, fake)
        options = LoadOptions(base=_base(url, requests=16), concurrency=(1, 2, 8))
        plan, _ = await prepare(options, say=lambda _: None)
        run = await run_steps(plan)
        target = SloTarget(0.5, 0.9)
        verdicts = [judge(label, step.results, step.requests_per_s, target)
                    for label, step in zip(plan.labels, run.steps, strict=True)]
        assert [v.meets_slo for v in verdicts] == [True, True, False]
        best = capacity(verdicts)
        assert best is not None
        assert best.step == "concurrency 2"
        assert best.rpm == pytest.approx(run.steps[1].requests_per_s * 60)


class TestTimeline:
    """The engine values during a run come from the exporters' parsing."""

    def test_a_vllm_exposition_is_read_through_the_exporters(self) -> None:
        """The captured vLLM 0.32 text gives its own gauge values (read here from the text's sample lines)."""
        text = (DATA / "vllm_v1_engine_0.32.prom").read_text()
        reading = read_exposition(text)
        values = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                  if line.startswith(("vllm:num_requests_waiting{", "vllm:num_requests_running{",
                                      "vllm:kv_cache_usage_perc{"))}
        assert reading.source == "vllm"
        assert reading.waiting == values["vllm:num_requests_waiting"]
        assert reading.running == values["vllm:num_requests_running"]
        assert reading.kv_usage == values["vllm:kv_cache_usage_perc"]
        assert reading.gpu_power_w == {}

    def test_a_sidecar_exposition_gives_engine_and_gpu_values(self) -> None:
        """The sidecar's normalized families, GPU power and temperature included."""
        text = "\n".join([
            '# TYPE inferwatch_engine_requests gauge',
            'inferwatch_engine_requests{model_name="m",state="running"} 3',
            'inferwatch_engine_requests{model_name="m",state="waiting"} 5',
            '# TYPE inferwatch_kv_cache_usage_ratio gauge',
            'inferwatch_kv_cache_usage_ratio{model_name="m"} 0.25',
            '# TYPE inferwatch_engine_preemptions_total counter',
            'inferwatch_engine_preemptions_total{model_name="m"} 7',
            '# TYPE inferwatch_gpu_power_usage_watts gauge',
            'inferwatch_gpu_power_usage_watts{gpu="0",uuid="GPU-a"} 301.5',
            '# TYPE inferwatch_gpu_temperature_celsius gauge',
            'inferwatch_gpu_temperature_celsius{gpu="0",uuid="GPU-a"} 64',
        ]) + "\n"
        reading = read_exposition(text)
        assert (reading.source, reading.running, reading.waiting, reading.kv_usage, reading.preemptions) == (
            "sidecar", 3, 5, 0.25, 7)
        assert reading.gpu_power_w == {"0": 301.5}
        assert reading.gpu_temperature_c == {"0": 64}

    def test_text_that_is_no_exposition_reads_as_none(self) -> None:
        """Anything else gives source none and no values."""
        assert read_exposition("hello {").source == "none"

    async def test_the_run_scrapes_the_metrics_url(self, aiohttp_server: Servers) -> None:
        """A run with a metrics URL records samples from it, times after the start of the run."""
        fake = FakeOpenAI(model_name="m", token_delay_s=0.02,
                          metrics_text=(DATA / "vllm_v1_engine_0.32.prom").read_text())
        url = await _url(aiohttp_server, fake)
        options = LoadOptions(base=_base(url, duration_s=0.5, concurrency=2), metrics_url=url + "/metrics",
                              scrape_interval_s=0.1)
        plan, _ = await prepare(options, say=lambda _: None)
        run = await run_steps(plan)
        assert run.timeline is not None
        assert run.timeline.source == "vllm"
        assert len(run.timeline.samples) >= 2
        times = [s.t_s for s in run.timeline.samples]
        assert times == sorted(times)
        assert times[0] < 0.1


class TestColdStarts:
    """Restarts during a run are measured from the restart to ready to the first token."""

    async def test_a_restart_that_makes_the_upstream_unhealthy(self, aiohttp_server: Servers) -> None:
        """The restart makes /health answer 503 for a while: ready comes after it, then a first token."""
        fake = FakeOpenAI(model_name="m", token_delay_s=0.01)
        url = await _url(aiohttp_server, fake)
        done: list[int] = []

        async def restart() -> None:
            fake.unhealthy_for = fake.health_checks + 3
            done.append(fake.health_checks)

        probe = Probe(url + "/health", url + "/v1/completions", "m", poll_s=0.02)
        options = LoadOptions(base=_base(url, duration_s=0.6, concurrency=2))
        plan, _ = await prepare(options, say=lambda _: None)
        plan = replace(plan, cold_starts=ColdStartPlan(1, restart, probe, 0.3))
        run = await run_steps(plan)
        (event,) = run.cold_starts
        assert event.error == ""
        assert done
        assert event.down_s is not None
        assert event.ready_s is not None
        assert event.first_token_s is not None
        assert event.restart_s <= event.down_s < event.ready_s < event.first_token_s
        assert event.restart_s == pytest.approx(0.3, abs=0.2)
        assert event.requests_before > 0

    async def test_the_timeline_shows_the_upstream_back_when_the_load_ended_first(
        self, aiohttp_server: Servers
    ) -> None:
        """The load ends while the upstream is still restarting: the run still takes a scrape after ready."""
        fake = FakeOpenAI(model_name="m", token_delay_s=0.01,
                          metrics_text=(DATA / "vllm_v1_engine_0.32.prom").read_text())
        url = await _url(aiohttp_server, fake)

        async def restart() -> None:
            fake.unhealthy_for = fake.health_checks + 40  # about 0.8 s at 0.02 s a poll, past the load's end

        probe = Probe(url + "/health", url + "/v1/completions", "m", poll_s=0.02)
        options = LoadOptions(base=_base(url, duration_s=0.3, concurrency=1), metrics_url=url + "/metrics",
                              scrape_interval_s=0.5)
        plan, _ = await prepare(options, say=lambda _: None)
        run = await run_steps(replace(plan, cold_starts=ColdStartPlan(1, restart, probe, at_s=(0.1,))))
        (event,) = run.cold_starts
        assert event.ready_s is not None
        assert event.ready_s > 0.3
        assert run.timeline is not None
        assert any(sample.t_s > event.ready_s and sample.reading.running is not None
                   for sample in run.timeline.samples), run.timeline.samples

    async def test_a_failing_restart_is_reported(self, aiohttp_server: Servers) -> None:
        """A restart that fails leaves the reason and no ready time."""
        url = await _url(aiohttp_server, FakeOpenAI(model_name="m"))

        async def restart() -> None:
            raise LoadTestError("restart-cmd", "the restart command exited with status 3")

        probe = Probe(url + "/health", url + "/v1/completions", "m", poll_s=0.02)
        options = LoadOptions(base=_base(url, duration_s=0.3, concurrency=1))
        plan, _ = await prepare(options, say=lambda _: None)
        (event,) = (await run_steps(replace(plan, cold_starts=ColdStartPlan(1, restart, probe)))).cold_starts
        assert "status 3" in event.error
        assert event.ready_s is None
