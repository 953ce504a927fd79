"""The ingest loop: decoding, malformed-line reports and sampling counts."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from log_pipeline.config import LogConfig
from log_pipeline.ingest import ingest_lines
from log_pipeline.sink import RecordSink


def test_lines_are_counted_reported_and_decoded_like_the_stdlib(tmp_path: Path) -> None:
    """Errors are kept, malformed lines reported by number, and NaN (stdlib-only JSON) still decodes."""
    sink = RecordSink(LogConfig(dir=str(tmp_path), success_sample_ratio=0.0), CollectorRegistry())
    sink.start()
    lines = [
        b'{"trace_id": "a", "outcome": "upstream_error", "level": "error"}\n',
        b"{not json\n",
        b"[1, 2]\n",
        b"\n",
        b'{"trace_id": "b", "outcome": "ok", "level": "info", "e2e_ms": NaN}\n',
    ]
    reports: list[tuple[int, str]] = []
    result = ingest_lines(lines, sink, on_malformed=lambda n, why: reports.append((n, why)))
    sink.close(10)
    assert result.lines == 5
    assert result.malformed == 2
    assert [n for n, _ in reports] == [2, 3]
    assert reports[0][1].startswith("not JSON")
    assert reports[1][1] == "not a JSON object"
    assert result.reasons == {"error": 1, "dropped_sampling": 1}
