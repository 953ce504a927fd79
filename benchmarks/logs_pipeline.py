"""Log pipeline figures for BENCHMARKS.md: archive size and speed against gzip -6, ingest rate, lookup.

    .venv/bin/python benchmarks/logs_pipeline.py [--records 200000] [--lookup-gb 1.0] [--runs 5]

Writes the "## Log pipeline" section of BENCHMARKS.md (and prints it).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson
from _common import machine, percentile, publish, revision
from logs_generate import events
from prometheus_client import CollectorRegistry

from log_pipeline.archive import ArchiveWriter
from log_pipeline.config import LogConfig
from log_pipeline.ingest import ingest_lines
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


def _no_fsync(_fd: int) -> None:
    return None


def _write_archive(records: list[dict[str, Any]], *, durable: bool = True) -> tuple[float, int, int]:
    """Seconds from the dicts to a published segment, and its sizes; the files are removed.

    ``durable=False`` replaces ``os.fsync`` by a no-op for the run (bytes reach the page cache only).
    """
    directory = tempfile.mkdtemp(prefix="iw-bench-")
    real_fsync = os.fsync
    if not durable:
        os.fsync = _no_fsync
    started = time.perf_counter()
    try:
        writer = ArchiveWriter(LogConfig(dir=directory))
        for record in records:
            writer.append(record)
        writer.close()
        elapsed = time.perf_counter() - started
    finally:
        os.fsync = real_fsync
    data, index = _archive_bytes(directory)
    shutil.rmtree(directory)
    return elapsed, data, index


def _write_gzip(records: list[dict[str, Any]], encode: Any, *, durable: bool = True) -> tuple[float, int]:
    """Seconds from the dicts to a fsynced gzip -6 file of their JSON lines, and its size; the file is removed."""
    directory = tempfile.mkdtemp(prefix="iw-bench-gz-")
    path = os.path.join(directory, "records.jsonl.gz")
    started = time.perf_counter()
    data = gzip.compress(b"".join([encode(r) for r in records]), 6)
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        if durable:
            os.fsync(handle.fileno())
    elapsed = time.perf_counter() - started
    shutil.rmtree(directory)
    return elapsed, len(data)


def _orjson_line(record: dict[str, Any]) -> bytes:
    return orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)


def _stdlib_line(record: dict[str, Any]) -> bytes:
    return (ENCODE(record) + "\n").encode()


def compression(records: list[dict[str, Any]], label: str, runs: int) -> tuple[list[str], list[str]]:
    """Size rows and speed rows comparing the archive with gzip -6 of the same records as JSON lines.

    Each run times, back to back on the same dicts: orjson lines + gzip -6 + write + fsync, then
    the archive writer from the first append to a published segment (frames, dictionary
    training, index, every fsync). Speeds are medians over the runs; the ratio is the median of
    the per-run ratios, so both sides of a ratio share the machine's load of that moment.
    """
    n = len(records)
    raw_bytes = sum(len(_orjson_line(r)) for r in records)
    gz_times, arch_times, ratios, cached_ratios = [], [], [], []
    gz_size = data = index = 0
    for _ in range(runs):
        t_gz, gz_size = _write_gzip(records, _orjson_line)
        t_arch, data, index = _write_archive(records)
        t_gz_cached, _ = _write_gzip(records, _orjson_line, durable=False)
        t_arch_cached, _, _ = _write_archive(records, durable=False)
        gz_times.append(t_gz)
        arch_times.append(t_arch)
        ratios.append(t_gz / t_arch)
        cached_ratios.append(t_gz_cached / t_arch_cached)
    raw = b"".join(_orjson_line(r) for r in records)
    t_gzip_only, _ = _best(lambda: gzip.compress(raw, 6))
    t_stdlib, _ = _best(lambda: _write_gzip(records, _stdlib_line)[0], 1)
    mb = raw_bytes / 1e6
    sizes = [
        f"| {label}: gzip -6 of the JSON lines | {n:,} | {gz_size:,} | {gz_size / n:.1f} | — |",
        f"| {label}: archive, segments only | {n:,} | {data:,} | {data / n:.1f} | **{data / gz_size - 1:+.1%}** |",
        f"| {label}: archive, segments + trace_id index | {n:,} | {data + index:,} | {(data + index) / n:.1f} | "
        f"**{(data + index) / gz_size - 1:+.1%}** |",
    ]
    speeds = [
        f"| {label} | {n:,} | {mb / statistics.median(gz_times):.0f} | {mb / statistics.median(arch_times):.0f} | "
        f"**{statistics.median(ratios):.2f}x** ({min(ratios):.2f}-{max(ratios):.2f}) | "
        f"**{statistics.median(cached_ratios):.2f}x** ({min(cached_ratios):.2f}-{max(cached_ratios):.2f}) | "
        f"{mb / t_gzip_only:.0f} | {mb / t_stdlib:.0f} |",
    ]
    return sizes, speeds


def ingest(lines: list[bytes]) -> list[str]:
    """Offered records per CPU-second through the ingest loop and through the proxy's offer()."""
    rows = []
    for name in ("`logs ingest` loop (`ingest_lines`: decode + sampling + queue)", "sidecar `offer(event)` from dicts"):
        directory = tempfile.mkdtemp(prefix="iw-bench-")
        sink = RecordSink(LogConfig(dir=directory), CollectorRegistry(), on_problem=lambda _m: None)
        sink.start()
        if name.startswith("`logs"):
            cpu0 = time.process_time()
            wall0 = time.perf_counter()
            ingest_lines(lines, sink)
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
    shutil.rmtree(directory)
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
    parser.add_argument("--runs", type=int, default=5, help="timed runs per record set (medians are reported)")
    args = parser.parse_args()
    records = list(events(args.records))
    lines = [(ENCODE(r) + "\n").encode() for r in records]
    sampler = Sampler(0.05)
    kept = [r for r in records if sampler.decide_event(r).keep]
    size_all, speed_all = compression(records, "all records", args.runs)
    size_kept, speed_kept = compression(kept, "kept at 5 %", args.runs)
    ing = ingest(lines)
    look = lookup(args.lookup_gb, records) if args.lookup_gb > 0 else ["- (skipped)"]
    body = "\n".join([
        f"Measured {time.strftime('%Y-%m-%d')} at {revision()} on {machine()} (a machine shared with other "
        "work: ratios are taken within each run).",
        f"Command: `{COMMAND} --records {args.records} --lookup-gb {args.lookup_gb:g} --runs {args.runs}`. "
        "Records come from `benchmarks/logs_generate.py` (our lean schema: one trace_id, one span_id, times in "
        f"0.1 ms, {sum(len(x) for x in lines) / len(lines):.0f} B per record as JSON); archive format 2 with the "
        "defaults: frames of 256 records, zstd-3, per-segment trained dictionary (16 KiB), one Bloom filter "
        "(~10 bits per record) per group of ~6,500 records as the trace_id index.",
        "",
        "### Archive size against gzip -6 (same records)",
        "",
        "| what | records | bytes | B/record | vs gzip -6 |",
        "|---|---:|---:|---:|---:|",
        *size_all,
        *size_kept,
        "",
        "### Compression speed, end to end from the record dicts to fsynced bytes on disk",
        "",
        "MB/s of raw JSON (the records as compact JSON lines). gzip -6 side: orjson lines + `gzip.compress(6)` + "
        "write + fsync. Archive side: `ArchiveWriter.append` of every dict, then `close()`: columns, zstd-3, "
        "dictionary training, Bloom index, segment and index fsyncs, rename, directory fsync. "
        f"{args.runs} runs alternating the two; medians. The no-fsync ratio repeats each run with the bytes left "
        "in the page cache (`os.fsync` a no-op on both sides), which isolates the CPU work from this disk's "
        "fsync time.",
        "",
        "| records | n | gzip -6 MB/s | archive MB/s | archive / gzip -6 (median, range) | same, no fsync | "
        "gzip -6 on bytes in hand | gzip -6 with stdlib json |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *speed_all,
        *speed_kept,
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
    publish("Log pipeline", body, True)


if __name__ == "__main__":
    main()
