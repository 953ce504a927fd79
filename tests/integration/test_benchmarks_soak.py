"""The soak benchmark: how it judges an answer, its request plan, and a 200-request run."""

from __future__ import annotations

import orjson
import pytest

from benchmarks import soak
from serving.tracing import TRACE_HEADER
from tests.fakes.faulty_upstream import FAULTS

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SSE = {TRACE_HEADER: TRACE, "Content-Type": "text/event-stream; charset=utf-8"}
JSON = {TRACE_HEADER: TRACE, "Content-Type": "application/json"}
CHUNK = b'data: {"choices": [{"index": 0, "text": " w0"}]}\n\n'


def _error(trace_id: str | None, kind: str | None = "upstream_error") -> bytes:
    fields = {"message": "m", **({"type": kind} if kind else {}), **({"trace_id": trace_id} if trace_id else {})}
    return orjson.dumps({"error": fields})


@pytest.mark.parametrize(("status", "headers", "body", "problem"), [
    (200, JSON, b'{"choices": []}', None),
    (502, JSON, _error(TRACE), None),
    (200, SSE, CHUNK + b"data: [DONE]\n\n", None),
    (200, SSE, CHUNK + b"data: " + _error(TRACE) + b"\n\n", None),
    (200, {"Content-Type": "application/json"}, b"{}", "no x-trace-id header"),
    (502, JSON, _error(None), "a JSON error without the trace id"),
    (500, JSON, _error(TRACE, kind=None), "a JSON error without error.type"),
    (500, JSON, b"<html>502</html>", "the body is not JSON"),
    (200, SSE, CHUNK, "the stream ends neither in [DONE] nor in an error event with the trace id"),
    (200, SSE, CHUNK + b"data: " + _error("other") + b"\n\n", "the stream ends neither"),
    (200, SSE, CHUNK + b'data: {"id": "x", "choi', "SSE body: the stream does not end at an event boundary"),
    (200, SSE, CHUNK + b"data: {not json\n\ndata: [DONE]\n\n", "SSE body:"),
    (200, SSE, b"data: [DONE]\n\n" + CHUNK + b"data: [DONE]\n\n", "events after [DONE]"),
])
def test_answers_are_judged_well_formed_or_not(status: int, headers: dict[str, str], body: bytes,
                                               problem: str | None) -> None:
    """JSON (errors with error.type and the trace id) and SSE ending in [DONE] or a traced error event pass."""
    found = soak.answer_problem(status, headers, body)
    if problem is None:
        assert found is None
    else:
        assert found is not None
        assert found.startswith(problem)


def test_the_plan_is_seeded_and_draws_only_known_faults() -> None:
    """The same plan every time; about the asked share of faults, each a fault of FAULTS for its mode."""
    specs = soak.plan(5000, 0.1)
    assert specs == soak.plan(5000, 0.1)
    faulty = [spec for spec in specs if spec.fault]
    assert 400 < len(faulty) < 600
    pools = (*soak.FAST_FAULTS.values(), *soak.TIMEOUT_FAULTS.values())
    assert all(set(pool) <= set(FAULTS) for pool in pools)
    assert all(spec.fault in soak.FAST_FAULTS[spec.stream] + soak.TIMEOUT_FAULTS[spec.stream] for spec in faulty)
    assert {spec.chat for spec in specs} == {spec.stream for spec in specs} == {True, False}


@pytest.mark.slow
def test_a_short_soak_answers_every_request_and_archives_every_record() -> None:
    """200 requests through a real sidecar process: all well-formed, nothing left behind, every record archived."""
    result = soak.soak(200, 8, 0.1, max_seconds=60, warmup_evaluations=0)
    tally, records = result.tally, result.records
    assert tally.answered == 200
    assert not tally.malformed
    assert not tally.unanswered
    assert not tally.clean_failed
    assert records.offered == records.archived == 200
    assert records.missing_trace_ids == 0
    assert result.exit_code == 0
    assert result.snapshots[-1].tasks <= result.snapshots[-2].tasks
