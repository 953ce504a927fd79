"""`inferwatch shadow report`: the shadowed requests of a real sidecar on loopback, from its ring and from its
archive, summed up and judged; and the summary's arithmetic on requests counted by hand."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporters.shadow_report import Thresholds, percentile, report, summarize
from serving.cli import main
from tests.fakes.faulty_upstream import FaultyUpstream, ThreadedServer
from tests.fakes.openai_upstream import FakeOpenAI
from tests.unit.serving.inprocess import record_of, send, start_sidecar


def _event(result: str, e2e: float = 100.0, shadow_e2e: float = 100.0, *, outcome: str = "ok",
           shadow_outcome: str = "ok") -> dict[str, Any]:
    return {"shadow_result": result, "outcome": outcome, "shadow_outcome": shadow_outcome, "e2e_ms": e2e,
            "shadow_e2e_ms": shadow_e2e, "ttft_ms": e2e / 2, "shadow_ttft_ms": shadow_e2e / 2}


def test_the_summary_counts_what_both_sides_answered() -> None:
    """3 matches and 1 mismatch of 4 compared, a streamed one not compared, a dropped one left out of the
    ratios; the shadow twice as slow on every request; one shadow error in five answered."""
    events = [_event("match", 100, 200), _event("match", 200, 400), _event("match", 300, 600),
              _event("mismatch", 400, 800), _event("not_compared", 500, 1000, shadow_outcome="upstream_error"),
              {"shadow_result": "dropped_slow", "outcome": "ok"}, {"outcome": "ok"}]
    summary = summarize(events)
    assert summary.shadowed == 6
    assert summary.results == {"match": 3, "mismatch": 1, "not_compared": 1, "dropped_slow": 1}
    assert summary.match_rate == 0.75
    assert summary.e2e_p50_ratio == summary.e2e_p99_ratio == summary.ttft_p99_ratio == 2.0
    assert summary.primary_error_ratio == 0.0
    assert summary.shadow_error_ratio == summary.error_delta == 0.2
    body = report(summary, Thresholds(min_requests=4))
    assert body["verdict"] == "no-go"
    assert body["reasons"] == ["match rate 0.75 is below 0.95", "p50 e2e latency ratio 2 is above 1.1",
                               "p99 e2e latency ratio 2 is above 1.25", "error ratio delta 0.2 is above 0.01"]
    assert report(summary, Thresholds(0.75, 2.0, 2.0, 0.2, 4))["verdict"] == "go"


def test_percentiles_are_nearest_rank() -> None:
    """p50 of 1..4 is 2, p99 of 1..100 is 99, p99 of one value is that value."""
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.0
    assert percentile([float(v) for v in range(1, 101)], 0.99) == 99.0
    assert percentile([7.0], 0.99) == 7.0


@pytest.fixture(name="upstreams")
def _upstreams() -> Iterator[tuple[ThreadedServer, ThreadedServer]]:
    with ThreadedServer(FakeOpenAI().app) as primary, ThreadedServer(FaultyUpstream().app) as shadow:
        yield primary, shadow


_LATENCY_ANY = ("--max-p50-ratio", "100", "--max-p99-ratio", "100")


def _report(*argv: str) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["shadow", "report", *argv, "--json"])
    return code, json.loads(out.getvalue())


async def test_the_report_reads_the_sidecar_and_the_archive_alike(
    upstreams: tuple[ThreadedServer, ThreadedServer], tmp_path: Path,
) -> None:
    """Eight requests the shadow answers like the primary and two it fails (500): from the sidecar's ring and
    from the archive (at a 0 success sample ratio: shadowed records are kept anyway) the same report, no-go
    on the error delta by default (exit 1), go with looser thresholds (exit 0). The two fakes' latencies are
    noise, so the latency ratios' thresholds are set out of reach (the first test checks those verdicts)."""
    primary, shadow = upstreams
    sidecar, runner = await start_sidecar(primary.url, tmp_path / "logs", shadow_upstream=shadow.url,
                                          shadow_ratio=1.0, success_sample_ratio=0.0)
    try:
        answers = [await send(sidecar, None, stream=False) for _ in range(8)]
        answers += [await send(sidecar, "error_500_json", stream=False) for _ in range(2)]
        assert [a.status for a in answers] == [200] * 10  # the primary ignores the fault header
        for answer in answers:
            assert await record_of(sidecar.logs, answer.headers["x-trace-id"]) is not None
        ring = await asyncio.to_thread(_report, "--sidecar", sidecar.url, "--since", "5m", *_LATENCY_ANY)
    finally:
        await sidecar.session.close()
        await runner.cleanup()
    archive = _report("--dir", str(tmp_path / "logs"), "--since", "5m", *_LATENCY_ANY)
    for code, body in (ring, archive):
        assert code == 1
        assert body["results"] == {"match": 8, "not_compared": 2}
        assert (body["compared"], body["match_rate"], body["error_delta"]) == (8, 1.0, 0.2)
        assert body["reasons"] == ["8 compared requests, fewer than --min-requests 100",
                                   "error ratio delta 0.2 is above 0.01"]
    code, body = _report("--dir", str(tmp_path / "logs"), "--min-requests", "8", "--max-error-delta", "0.2",
                         *_LATENCY_ANY)
    assert (code, body["verdict"]) == (0, "go")
