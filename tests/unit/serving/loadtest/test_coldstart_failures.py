"""The requests a restart made fail are one set: the report's column, report.json and the exit code agree."""

from __future__ import annotations

from serving.loadtest.capacity import SloTarget
from serving.loadtest.client import RequestResult
from serving.loadtest.coldstart import ColdStart, measure_shock, unexpected_failures
from serving.loadtest.markdown import render
from serving.loadtest.report import ReportContext, build_document
from serving.loadtest.run import default_source
from serving.loadtest.spec import LoadSpec
from serving.loadtest.stats import summarize
from serving.loadtest.steps import RunPlan, RunResult
from serving.loadtest.table import format_run

RESTART_S, READY_S = 10.0, 20.0


def _request(index: int, sent_s: float, e2e_s: float, *, ok: bool) -> RequestResult:
    return RequestResult(index=index, sent_s=sent_s, e2e_s=e2e_s, status=200 if ok else 502,
                         error=None if ok else "502")


def test_a_request_running_when_the_restart_began_counts_with_those_sent_before_ready() -> None:
    """Killed in flight (sent 9.5 s, failed at 10.2 s) and sent while down (12 s) are the restart's two; a
    failure that ended before the restart and one sent after ready are not, and only those two fail the run."""
    results = [
        _request(0, 8.0, 0.5, ok=False),   # failed and over before the restart: not the restart's doing
        _request(1, 9.5, 0.7, ok=False),   # running at the restart, killed by it
        _request(2, 12.0, 0.01, ok=False),  # sent while vLLM was down
        _request(3, 21.0, 0.3, ok=True),
        _request(4, 22.0, 0.2, ok=False),  # after ready: unexpected
    ]
    event = ColdStart(1, RESTART_S, ready_s=READY_S, first_token_s=READY_S + 0.1)
    measure_shock(event, results, 60.0)
    assert event.failed_indexes == (1, 2)
    assert [r.index for r in unexpected_failures(results, [event])] == [0, 4]
    spec = LoadSpec(url="http://127.0.0.1:8000", model="m", duration_s=30.0, concurrency=2)
    run = RunResult(RunPlan((spec,), ("concurrency 2",), default_source(spec)), [summarize(spec, results, 30.0)],
                    cold_starts=[event])
    assert "2 requests failed by it" in format_run(run)
    document = build_document(run, ReportContext(SloTarget(1.0, 0.5)))
    (cold,) = document["cold_starts"]
    assert (cold["failed_requests"], cold["failed_request_indexes"]) == (2, [1, 2])
    assert "| 1 | 10.0 | 10.0 | 10.1 | 2 |" in render(document)
