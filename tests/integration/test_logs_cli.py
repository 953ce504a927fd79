"""`inferwatch logs ...` run as real processes: crash safety under kill -9, sampling, search and errors."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from log_pipeline.records import format_ts
from log_pipeline.sampling import Sampler

REPO = Path(__file__).resolve().parents[2]
FRAME_MS = 100
SLACK_MS = 900  # scheduling on a shared 2-core machine; the bound under test is FRAME_MS


def _cli(*args: str, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "serving.cli", "logs", *args], input=stdin, capture_output=True, text=True,
        cwd=REPO, timeout=timeout, check=False,
    )


def _records(n: int, seed: int = 1, error_every: int = 25) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ok = i % error_every != 0
        out.append({
            "ts": format_ts(1_754_568_000 + i * 0.01), "level": "info" if ok else "error", "event": "request",
            "trace_id": f"{rng.getrandbits(128):032x}", "outcome": "ok" if ok else "upstream_error",
            "http_status": 200 if ok else 502, "e2e_ms": round(rng.random() * 5000, 1), "seq": i,
        })
    return out


def _lines(records: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def _cat(directory: Path, *extra: str) -> list[dict[str, Any]]:
    result = _cli("cat", "--dir", str(directory), *extra)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_kill_9_loses_only_the_open_frame(tmp_path: Path) -> None:
    """After kill -9 of ingest, every record sent more than a frame's time before the kill is found, in order,
    unaltered, and nothing else."""
    process = subprocess.Popen(
        [sys.executable, "-m", "serving.cli", "logs", "ingest", "--dir", str(tmp_path),
         "--logs-success-sample-ratio", "1.0", "--logs-frame-max-ms", str(FRAME_MS),
         "--logs-frame-max-records", "50"],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO,
    )
    assert process.stdin is not None
    records = _records(100_000)
    sent_at: list[float] = []
    try:
        process.stdin.write((json.dumps(records[0]) + "\n").encode())
        process.stdin.flush()
        sent_at.append(time.monotonic())
        deadline = time.monotonic() + 60
        while not any(tmp_path.glob("*.izst.open")) and time.monotonic() < deadline:
            time.sleep(0.02)  # wait until the pipeline has written its first frame
        stop = time.monotonic() + 1.5 + random.random()
        for record in records[1:]:
            if time.monotonic() >= stop:
                break
            process.stdin.write((json.dumps(record) + "\n").encode())
            process.stdin.flush()
            sent_at.append(time.monotonic())
            time.sleep(0.001)
        killed_at = time.monotonic()
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.wait(30)
    found = _cat(tmp_path)
    seqs = [r["seq"] for r in found]
    assert seqs == list(range(len(seqs))), "records must come back in order, without gaps or extras"
    assert found == records[: len(found)]
    must_have = sum(1 for t in sent_at if killed_at - t > (FRAME_MS + SLACK_MS) / 1000)
    assert len(found) >= must_have > 100


def test_sampling_is_the_same_across_processes_and_matches_the_library(tmp_path: Path) -> None:
    """Two ingest processes keep the same records: errors plus the trace ids the Sampler keeps."""
    records = _records(20_000, seed=9)
    kept = []
    for name in ("a", "b"):
        result = _cli("ingest", "--dir", str(tmp_path / name), stdin=_lines(records))
        assert result.returncode == 0, result.stderr
        kept.append([r["seq"] for r in _cat(tmp_path / name)])
    sampler = Sampler(0.05)
    expected = [
        r["seq"] for r in records
        if sampler.decide(r["trace_id"], is_error=r["outcome"] != "ok", slow=False).keep
    ]
    assert kept[0] == kept[1] == expected


def test_search_finds_every_kept_record_of_a_trace(tmp_path: Path) -> None:
    """Three error records of one trace spread over the input are all printed; exit code 0."""
    records = _records(3000)
    trace = records[25]["trace_id"]
    for i in (1000, 2975):
        records[i]["trace_id"] = trace
    ingest = _cli("ingest", "--dir", str(tmp_path), "--logs-frame-max-records", "64", stdin=_lines(records))
    assert ingest.returncode == 0, ingest.stderr
    result = _cli("search", "--dir", str(tmp_path), "--trace-id", trace.upper())
    assert result.returncode == 0, result.stderr
    assert [json.loads(line)["seq"] for line in result.stdout.splitlines()] == [25, 1000, 2975]


def test_search_for_an_unknown_trace_exits_1(tmp_path: Path) -> None:
    """No match prints nothing on stdout, says so on stderr and exits 1."""
    _cli("ingest", "--dir", str(tmp_path), stdin=_lines(_records(100)))
    result = _cli("search", "--dir", str(tmp_path), "--trace-id", "0" * 32)
    assert (result.returncode, result.stdout) == (1, "")
    assert "no record with trace_id" in result.stderr


def test_malformed_lines_are_reported_by_number_and_skipped(tmp_path: Path) -> None:
    """A non-JSON line and a JSON array are named by line number; the good records are archived."""
    good = _records(3, error_every=1)
    stdin = _lines(good[:1]) + "{oops\n" + "[1, 2]\n" + _lines(good[1:])
    result = _cli("ingest", "--dir", str(tmp_path), stdin=stdin)
    assert result.returncode == 0
    assert "line 2: not JSON" in result.stderr
    assert "line 3: not a JSON object" in result.stderr
    assert [r["seq"] for r in _cat(tmp_path)] == [0, 1, 2]


def test_cat_filters_and_stats_summarise(tmp_path: Path) -> None:
    """cat --outcome prints only errors; stats reports the record count and a compression ratio."""
    records = _records(2000)
    _cli("ingest", "--dir", str(tmp_path), "--logs-success-sample-ratio", "1", stdin=_lines(records))
    errors = _cat(tmp_path, "--outcome", "upstream_error", "--since", records[100]["ts"])
    assert [r["seq"] for r in errors] == [r["seq"] for r in records[100:] if r["outcome"] != "ok"]
    stats = _cli("stats", "--dir", str(tmp_path), "--json")
    assert stats.returncode == 0, stats.stderr
    summary = json.loads(stats.stdout)
    assert summary["records"] == 2000
    assert summary["compression_ratio"] > 1


def test_a_corrupt_file_and_a_path_outside_give_clear_errors(tmp_path: Path) -> None:
    """A foreign file in the archive and a segment linking outside it both exit 2 naming the file."""
    archive = tmp_path / "archive"
    archive.mkdir()
    bad = archive / "20250101T000000000000-1-0001-abcdef.izst"
    bad.write_bytes(b"this is not a segment")
    result = _cli("search", "--dir", str(archive), "--trace-id", "0" * 32)
    assert result.returncode == 2
    assert f"{bad}: not an inferwatch archive segment" in result.stderr
    bad.unlink()
    elsewhere = tmp_path / "elsewhere"
    _cli("ingest", "--dir", str(elsewhere), stdin=_lines(_records(10)))
    (segment,) = elsewhere.glob("*.izst")
    (archive / segment.name).symlink_to(segment)
    result = _cli("cat", "--dir", str(archive))
    assert result.returncode == 2
    assert "outside the archive directory" in result.stderr
    missing = _cli("stats", "--dir", str(tmp_path / "missing"))
    assert (missing.returncode, "archive directory does not exist" in missing.stderr) == (2, True)
