"""Every upstream fault, streamed and not, through a real sidecar on loopback.

For each fault the client gets a well-formed answer within the configured timeouts (a JSON
error with ``error.type`` and ``trace_id``, or after the stream started a final SSE error event
and a clean end of the chunked body), the outcome is counted, the span has an error status,
the request's log record is archived with the ``error.type`` the client read (so are the span's
``error.type`` and the GenAI histogram's ``error_type`` label), the next normal request succeeds,
and no upstream connection, asyncio task or file descriptor is left behind.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from opentelemetry.trace import StatusCode
from prometheus_client import CollectorRegistry

from tests.fakes.faulty_upstream import FaultyUpstream, ThreadedServer, unaccepting_listener
from tests.unit.serving.inprocess import (
    ANSWER_WITHIN_S,
    CONNECT_TIMEOUT_S,
    Answer,
    Sidecar,
    open_fds,
    record_of,
    requests_counted,
    send,
    sse_events,
    start_sidecar,
    upstream_connections_in_use,
    wait_for,
)


@pytest.fixture(name="upstream", scope="module")
def _upstream() -> Iterator[ThreadedServer]:
    fake = FaultyUpstream()
    with ThreadedServer(fake.app) as server:
        yield server


@pytest.fixture(name="sidecar")
async def _sidecar(upstream: ThreadedServer, tmp_path: Path) -> AsyncIterator[Sidecar]:
    sidecar, runner = await start_sidecar(upstream.url, tmp_path / "logs", genai_metrics=True)
    try:
        yield sidecar
    finally:
        await sidecar.session.close()
        await runner.cleanup()



# fault, streamed?, HTTP status the client sees, outcome counted, error.type named to the client
BEFORE_STATUS = [
    ("reset_before_status", False, 502, "upstream_error", "upstream_disconnected"),
    ("reset_before_status", True, 502, "upstream_error", "upstream_disconnected"),
    ("silent_before_status", False, 504, "timeout", "upstream_timeout"),
    ("silent_before_status", True, 504, "timeout", "upstream_timeout"),
    ("reset_mid_body", False, 502, "upstream_error", "upstream_disconnected"),
    ("drip_body", False, 504, "timeout", "request_timeout"),
    ("error_500_json", False, 500, "upstream_error", "InternalServerError"),
    ("error_500_json", True, 500, "upstream_error", "InternalServerError"),
    ("error_500_html", False, 500, "upstream_error", "upstream_error"),
    ("error_500_html", True, 500, "upstream_error", "upstream_error"),
    ("error_503_retry_after", False, 503, "overloaded", "ServiceUnavailableError"),
    ("error_503_retry_after", True, 503, "overloaded", "ServiceUnavailableError"),
    ("error_429_retry_after", False, 429, "overloaded", "ServiceUnavailableError"),
    ("error_500_oom", False, 500, "upstream_error", "InternalServerError"),
    ("error_502_odd_type", False, 502, "upstream_error", "upstream_error"),
    ("error_500_oom", True, 500, "upstream_error", "InternalServerError"),
]
MID_STREAM = [
    ("reset_mid_stream", "upstream_error", "upstream_stream_broken"),
    ("silent_mid_stream", "timeout", "upstream_stalled"),
    ("drip", "timeout", "request_timeout"),
    ("bad_json_event", "upstream_error", "upstream_malformed_event"),
    ("truncated_event", "upstream_error", "upstream_stream_truncated"),
    ("no_done", "upstream_error", "upstream_stream_truncated"),
    ("oversized_event", "upstream_error", "upstream_event_too_large"),
    ("mid_stream_error_event", "upstream_error", "InternalServerError"),
    ("mid_stream_oom_event", "upstream_error", "InternalServerError"),
]


def genai_errors(registry: CollectorRegistry) -> dict[str, float]:
    """gen_ai_server_request_duration_seconds' count by its error_type label, failures only."""
    counts: dict[str, float] = {}
    for family in registry.collect():
        for s in family.samples:
            if s.name == "gen_ai_server_request_duration_seconds_count" and s.labels["error_type"]:
                counts[s.labels["error_type"]] = counts.get(s.labels["error_type"], 0) + s.value
    return counts


async def check_aftermath(sidecar: Sidecar, answer: Answer, outcome: str, kind: str,
                          baseline: tuple[int, int]) -> None:
    """Counted, span in error, record archived, one error.type everywhere, next request fine, nothing left behind."""
    trace_id = answer.headers["x-trace-id"]
    assert await wait_for(lambda: requests_counted(sidecar.registry, outcome) == 1), \
        f"outcome {outcome} not counted once"
    (span,) = [s for s in sidecar.spans.get_finished_spans() if format(s.context.trace_id, "032x") == trace_id]
    assert span.status.status_code is StatusCode.ERROR
    record = await record_of(sidecar.logs, trace_id)
    assert record is not None, "the failed request's log record was not archived"
    assert record["outcome"] == outcome
    # the client's error.type, everywhere: record, span attribute and status, GenAI metric label
    assert (record["error_type"], span.attributes["error.type"], span.status.description) == (kind, kind, kind)
    assert genai_errors(sidecar.registry) == {kind: 1}
    good = await send(sidecar, None, stream=True)
    assert good.status == 200
    assert sse_events(good.body)[-1] == "[DONE]"
    assert await wait_for(lambda: upstream_connections_in_use(sidecar.app) == 0)
    tasks, fds = baseline
    assert await wait_for(lambda: len(asyncio.all_tasks()) <= tasks), f"tasks left: {asyncio.all_tasks()}"
    assert await wait_for(lambda: open_fds() <= fds), f"file descriptors left: {open_fds()} > {fds}"


async def warm_baseline(sidecar: Sidecar) -> tuple[int, int]:
    """Tasks and fds once the connection pools hold what a normal request leaves (one each way)."""
    for _ in range(2):
        assert (await send(sidecar, None, stream=True)).status == 200
    await record_of(sidecar.logs, (await send(sidecar, None, stream=False)).headers["x-trace-id"])
    return len(asyncio.all_tasks()), open_fds()


@pytest.mark.parametrize(("fault", "stream", "status", "outcome", "kind"), BEFORE_STATUS,
                         ids=[f"{f}-{'stream' if s else 'plain'}" for f, s, *_ in BEFORE_STATUS])
async def test_fault_before_the_status_line_gets_a_json_error(
    sidecar: Sidecar, fault: str, stream: bool, status: int, outcome: str, kind: str
) -> None:
    """The upstream fails before the client got anything: a JSON error naming the trace id."""
    baseline = await warm_baseline(sidecar)
    answer = await send(sidecar, fault, stream=stream)
    assert answer.seconds < ANSWER_WITHIN_S
    assert answer.status == status
    assert answer.headers["Content-Type"].startswith("application/json")
    error = json.loads(answer.body)["error"]
    assert error["type"] == kind
    assert error["trace_id"] == answer.headers["x-trace-id"]
    assert answer.headers["Cache-Control"] == "no-store"
    if "retry_after" in fault:
        assert answer.headers["Retry-After"] == "7"
    if fault == "error_500_html":
        assert "502 Bad Gateway" in error["message"]
        assert "<" not in error["message"]
    await check_aftermath(sidecar, answer, outcome, kind, baseline)


@pytest.mark.parametrize(("fault", "outcome", "kind"), MID_STREAM, ids=[f for f, *_ in MID_STREAM])
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_fault_mid_stream_ends_with_an_error_event(
    sidecar: Sidecar, fault: str, outcome: str, kind: str, chat: bool
) -> None:
    """After the stream started: the chunks so far, then a final error event and a clean end."""
    baseline = await warm_baseline(sidecar)
    answer = await send(sidecar, fault, stream=True, chat=chat)
    assert answer.seconds < ANSWER_WITHIN_S
    assert answer.status == 200
    events = sse_events(answer.body)
    if events[-1] == "[DONE]":  # the upstream's own error event, then its [DONE]
        events.pop()
    *content, last = events
    assert len(content) >= 3 if fault == "drip" else len(content) == 3
    assert all("choices" in event for event in content)
    assert last["error"]["type"] == kind
    assert last["error"]["trace_id"] == answer.headers["x-trace-id"]
    await check_aftermath(sidecar, answer, outcome, kind, baseline)


async def test_a_client_error_keeps_the_upstreams_type_in_the_record_only(sidecar: Sidecar) -> None:
    """A 4xx: the record names vLLM's type as the client read it; the span and GenAI label carry no error (OTel)."""
    answer = await send(sidecar, "echo_prompt_400", stream=False)
    assert answer.status == 400
    kind = json.loads(answer.body)["error"]["type"]
    assert kind == "BadRequestError"
    trace_id = answer.headers["x-trace-id"]
    record = await record_of(sidecar.logs, trace_id)
    assert record is not None
    assert (record["outcome"], record["error_type"]) == ("client_error", kind)
    (span,) = [s for s in sidecar.spans.get_finished_spans() if format(s.context.trace_id, "032x") == trace_id]
    assert span.status.status_code is StatusCode.UNSET
    assert "error.type" not in span.attributes
    assert genai_errors(sidecar.registry) == {}


def oom_events(registry: CollectorRegistry) -> float:
    return sum(s.value for f in registry.collect() for s in f.samples
               if s.name == "inferwatch_upstream_process_oom_events_total")


@pytest.mark.parametrize(("fault", "stream"), [("error_500_oom", False), ("mid_stream_oom_event", True)],
                         ids=["oom-body", "oom-event"])
async def test_out_of_memory_answers_are_counted_for_the_oom_rule(sidecar: Sidecar, fault: str, stream: bool) -> None:
    """vLLM's CUDA OOM message, as an error body or a stream's error event, counts one OOM event."""
    before = oom_events(sidecar.registry)
    await send(sidecar, fault, stream=stream)
    assert await wait_for(lambda: oom_events(sidecar.registry) == before + 1)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_connection_refused_is_a_502(tmp_path: Path, upstream: ThreadedServer, stream: bool) -> None:
    """Nothing listens upstream: 502 upstream_unreachable, counted, and the sidecar keeps serving."""
    sidecar, runner = await start_sidecar("http://127.0.0.1:9", tmp_path / "logs")
    try:
        answer = await send(sidecar, None, stream=stream)
        assert answer.status == 502
        error = json.loads(answer.body)["error"]
        assert (error["type"], error["trace_id"]) == ("upstream_unreachable", answer.headers["x-trace-id"])
        assert requests_counted(sidecar.registry, "upstream_error") == 1
        assert await record_of(sidecar.logs, answer.headers["x-trace-id"]) is not None
    finally:
        await sidecar.session.close()
        await runner.cleanup()


async def test_connect_timeout_is_a_504(tmp_path: Path) -> None:
    """An upstream that never accepts the TCP connection: 504 within serve.connect_timeout_s."""
    with unaccepting_listener() as url:
        sidecar, runner = await start_sidecar(url, tmp_path / "logs")
        try:
            answer = await send(sidecar, None, stream=False)
            assert answer.status == 504
            assert json.loads(answer.body)["error"]["type"] == "upstream_connect_timeout"
            assert answer.seconds < CONNECT_TIMEOUT_S + 1.0
            assert requests_counted(sidecar.registry, "timeout") == 1
        finally:
            await sidecar.session.close()
            await runner.cleanup()
