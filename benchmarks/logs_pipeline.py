"""Log pipeline figures for BENCHMARKS.md: archive size and speed against gzip -6, ingest rate, lookup.

    .venv/bin/python benchmarks/logs_pipeline.py [--records 200000] [--lookup-gb 1.0]

Writes the "## Log pipeline" section of BENCHMARKS.md (and prints it).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import zstandard
from _common import machine, percentile, revision, write_section
from logs_generate import events
from prometheus_client import CollectorRegistry

from log_pipeline.archive import ArchiveWriter
from log_pipeline.config import LogConfig
from log_pipeline.frames import encode_records
from log_pipeline.query import Archive
from log_pipeline.sampling import Sampler
from log_pipeline.sink import RecordSink

ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
COMMAND = "python benchmarks/logs_pipeline.py"


def _best(fn: Any, repeats: int = 3) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(repeats):
        started = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - started)
    return best, result


def _archive_bytes(directory: str) -> tuple[int, int]:
    data = index = 0
    for name in os.listdir(directory):
        size = os.path.getsize(os.path.join(directory, name))
        if name.endswith(".izsx"):
            index += size
        else:
            data += size
    return data, index


def _write_archive(records: list[dict[str, Any]], **config: Any) -> tuple[int, int]:
    directory = tempfile.mkdtemp(prefix="iw-bench-")
    writer = ArchiveWriter(LogConfig(dir=directory, **config))
    for record in records:
        writer.append(record)
    writer.close()
    return _archive_bytes(directory)


def compression(records: list[dict[str, Any]], label: str) -> list[str]:
    """Rows comparing the archive with gzip -6 of the same records as JSON lines."""
    raw = b"".join((ENCODE(r) + "\n").encode() for r in records)
    n = len(records)
    t_gzip, gz = _best(lambda: gzip.compress(raw, 6))
    t_gzip_e2e, _ = _best(lambda: gzip.compress(b"".join((ENCODE(r) + "\n").encode() for r in records), 6))
    t_arch, (data, index) = _best(lambda: _write_archive(records))
    payloads = [encode_records(records[i:i + 256]).payload for i in range(0, n, 256)]
    compressor = zstandard.ZstdCompressor(level=3, write_checksum=False)
    t_zstd, _ = _best(lambda: [compressor.compress(p) for p in payloads])
    mb = len(raw) / 1e6
    return [
        f"| {label}: gzip -6 of the JSON lines | {n:,} | {len(gz):,} | {len(gz) / n:.1f} | — | "
        f"{mb / t_gzip:.0f} (bytes in hand), {mb / t_gzip_e2e:.0f} (incl. JSON encoding) |",
        f"| {label}: archive, segments only | {n:,} | {data:,} | {data / n:.1f} | "
        f"**{data / len(gz) - 1:+.1%}** | {mb / t_arch:.0f} end to end (transpose + zstd-3 + dictionary + write); "
        f"zstd alone on the columnar payloads {sum(map(len, payloads)) / 1e6 / t_zstd:.0f} |",
        f"| {label}: archive, segments + trace_id index | {n:,} | {data + index:,} | {(data + index) / n:.1f} | "
        f"**{(data + index) / len(gz) - 1:+.1%}** | |",
    ]


def ingest(lines: list[bytes]) -> list[str]:
    """Offered records per CPU-second through the ingest loop and through the proxy's offer()."""
    rows = []
    for name in ("`logs ingest` loop (json.loads + sampling + queue)", "sidecar `offer(event)` from dicts"):
        directory = tempfile.mkdtemp(prefix="iw-bench-")
        sink = RecordSink(LogConfig(dir=directory), CollectorRegistry(), on_problem=lambda _m: None)
        sink.start()
        if name.startswith("`logs"):
            cpu0 = time.process_time()
            wall0 = time.perf_counter()
            for raw in lines:
                event = json.loads(raw)
                if isinstance(event, dict):
                    sink.put(event)
        else:
            dicts = [json.loads(raw) for raw in lines]
            cpu0 = time.process_time()
            wall0 = time.perf_counter()
            for event in dicts:
                sink.offer(event)
        sink.close(120)
        cpu = time.process_time() - cpu0
        wall = time.perf_counter() - wall0
        kept = sink.writer.stats.records if sink.writer else 0
        rows.append(f"| {name} | {len(lines):,} | {kept:,} | {len(lines) / cpu:,.0f} | {len(lines) / wall:,.0f} |")
    return rows


def lookup(target_gb: float, base: list[dict[str, Any]]) -> list[str]:
    """Build an archive of ``target_gb`` of raw JSON (every record kept) and time trace_id lookups."""
    directory = tempfile.mkdtemp(prefix="iw-bench-lookup-")
    writer = ArchiveWriter(LogConfig(dir=directory, retention_bytes=0))
    rng = random.Random(5)
    raw_bytes = 0
    probes: list[str] = []
    started = time.perf_counter()
    while raw_bytes < target_gb * 1e9:
        for template in base:
            record = dict(template, trace_id=f"{rng.getrandbits(128):032x}")
            writer.append(record)
            if rng.random() < 1e-4:
                probes.append(record["trace_id"])
        raw_bytes = writer.stats.json_bytes
    writer.close()
    build = time.perf_counter() - started
    data, index = _archive_bytes(directory)
    segments = len([n for n in os.listdir(directory) if n.endswith(".izst")])
    probes = rng.sample(probes, min(100, len(probes)))
    times = []
    for trace_id in probes:
        t0 = time.perf_counter()
        found = list(Archive(directory).find(trace_id))
        times.append((time.perf_counter() - t0) * 1000)
        assert len(found) == 1, trace_id
    misses = []
    for _ in range(20):
        t0 = time.perf_counter()
        assert not list(Archive(directory).find(f"{rng.getrandbits(128):032x}"))
        misses.append((time.perf_counter() - t0) * 1000)
    cli = []
    for trace_id in probes[:5]:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "serving.cli", "logs", "search", "--dir", directory,
                        "--trace-id", trace_id], check=True, capture_output=True)
        cli.append((time.perf_counter() - t0) * 1000)
    return [
        f"- Archive: {writer.stats.records:,} records, {raw_bytes / 1e9:.2f} GB of raw JSON, {segments} segments, "
        f"{data / 1e6:.0f} MB of segments + {index / 1e6:.1f} MB of indexes (built in {build:.0f} s).",
        f"- `Archive.find` of a present trace_id (100 random, fresh `Archive` each): p50 "
        f"**{percentile(times, 0.5):.1f} ms**, p99 {percentile(times, 0.99):.1f} ms, max {max(times):.1f} ms.",
        f"- Absent trace_id: p50 {percentile(misses, 0.5):.1f} ms.",
        f"- Whole `inferwatch logs search` process (Python start and imports included): p50 "
        f"{percentile(cli, 0.5):.0f} ms.",
    ]


def main() -> None:
    """Run every measurement and write the section."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--lookup-gb", type=float, default=1.0)
    args = parser.parse_args()
    records = list(events(args.records))
    lines = [(ENCODE(r) + "\n").encode() for r in records]
    sampler = Sampler(0.05)
    kept = [r for r in records if sampler.decide_event(r).keep]
    comp = compression(records, "all records") + compression(kept, "kept at 5 %")
    ing = ingest(lines)
    look = lookup(args.lookup_gb, records) if args.lookup_gb > 0 else ["- (skipped)"]
    body = "\n".join([
        f"Measured {time.strftime('%Y-%m-%d')} at {revision()} on {machine()} (shared, noisy: speeds ±20 %).",
        f"Command: `{COMMAND} --records {args.records} --lookup-gb {args.lookup_gb}`. Records come from "
        "`benchmarks/logs_generate.py` (our lean schema: one trace_id, one span_id, times in 0.1 ms, "
        f"{sum(len(x) for x in lines) / len(lines):.0f} B per record as JSON); frames of 256 records, zstd-3, "
        "per-segment trained dictionary (the defaults).",
        "",
        "### Archive size and compression speed against gzip -6 (same records)",
        "",
        "| what | records | bytes | B/record | vs gzip -6 | MB/s of raw JSON |",
        "|---|---:|---:|---:|---:|---|",
        *comp,
        "",
        "### Ingest (5 % sampling; offered records per CPU-second, writer thread included)",
        "",
        "| path | offered | archived | per CPU-second | per wall-second |",
        "|---|---:|---:|---:|---:|",
        *ing,
        "",
        f"### trace_id lookup in an archive of {args.lookup_gb:g} GB of raw JSON",
        "",
        *look,
    ])
    print(body)
    write_section("Log pipeline", body)


if __name__ == "__main__":
    main()
