"""The kill drill's findings: restarts counted by the sidecar, recovery, and how they are told."""

from __future__ import annotations

import asyncio
import subprocess
import time
from typing import Any

import psutil
from aiohttp import web

from serving.commands.drill import format_drill
from serving.loadtest.client import RequestResult
from serving.loadtest.coldstart import ColdStart
from serving.loadtest.drill import DrillResult, DrillSpec, kill_drill
from tests.fakes.openai_upstream import FakeOpenAI


def _result(**changes: object) -> DrillResult:
    result = DrillResult(42, "VLLM::EngineCore")
    result.recovery = ColdStart(1, 4.0, command_done_s=30.0, down_s=4.1, ready_s=31.0, first_token_s=31.2)
    result.results = [RequestResult(index=0, status=200), RequestResult(index=1, error="stream_error")]
    for key, value in changes.items():
        setattr(result, key, value)
    return result


def test_restarts_counted_are_the_increase_per_reason() -> None:
    """A reason missing before counts from zero; without the sidecar's numbers there is no count."""
    result = _result(restarts_before={"readiness": 2.0}, restarts_after={"readiness": 3.0, "pid_change": 1.0})
    assert result.restarts_counted == {"pid_change": 1.0, "readiness": 1.0}
    assert _result().restarts_counted is None


def test_recovered_needs_ready_and_a_token() -> None:
    """Ready without a first token, or an error, is not a recovery."""
    assert _result().recovered
    assert not _result(recovery=ColdStart(1, 4.0, ready_s=31.0)).recovered
    assert not _result(recovery=ColdStart(1, 4.0, ready_s=31.0, first_token_s=32.0, error="boom")).recovered


def test_the_findings_as_lines() -> None:
    """Times after the kill, failures, the sidecar's count and the alerts seen."""
    text = format_drill(_result(restarts_before={"readiness": 0.0}, restarts_after={"readiness": 1.0},
                                alerts={"InferwatchUpstreamDown": "firing"}))
    assert "ready       27.0 s after the kill" in text
    assert "first token 27.2 s after the kill" in text
    assert "2 sent, 1 failed" in text
    assert "readiness +1" in text
    assert "InferwatchUpstreamDown (firing)" in text
    assert text.endswith("verdict     recovered")


async def test_the_drills_workers_back_off_while_the_engine_is_down(aiohttp_server: Any) -> None:
    """While the restarted upstream answers 503 for 2.5 s, one worker sends at most 4 requests there (waits of
    0.5, 1 and 2 s), not one every few milliseconds; each after a failure is numbered as a retry."""
    fake = FakeOpenAI(model_name="m")
    state = {"down": False}
    during: list[float] = []

    async def generate(request: web.Request) -> web.StreamResponse:
        if state["down"]:
            during.append(time.monotonic())
            return web.json_response({"error": {"message": "restarting"}}, status=503)
        return await fake.generate(request)

    async def health(_request: web.Request) -> web.Response:
        return web.Response(status=503 if state["down"] else 200)

    app = web.Application()
    app.router.add_post("/v1/completions", generate)
    app.router.add_get("/health", health)
    server = await aiohttp_server(app)

    async def restart() -> None:
        state["down"] = True
        await asyncio.sleep(2.5)
        state["down"] = False

    victim = subprocess.Popen(["sleep", "60"])
    try:
        spec = DrillSpec(f"http://127.0.0.1:{server.port}", "m", restart, concurrency=1, max_tokens=2,
                         before_s=0.2, after_s=0.2, timeout_s=10.0)
        result = await kill_drill(spec, psutil.Process(victim.pid), say=lambda _: None)
    finally:
        victim.kill()
        victim.wait()
    assert result.recovered, result.to_dict()
    assert 1 <= len(during) <= 4, len(during)
    failed = [r for r in result.results if not r.ok]
    assert len(failed) == len(during)
    assert [r.retry for r in failed] == list(range(len(failed)))  # the first failure, then its retries
