"""`inferwatch logs ingest|search|cat|stats`: replay records into an archive and read it back."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry

from log_pipeline.errors import ArchiveError
from log_pipeline.ingest import ingest_lines
from log_pipeline.query import Archive, Filter
from log_pipeline.sink import RecordSink
from serving.config import add_config_flags, settings_from_args

PROGRESS_EVERY = 100_000
MAX_REPORTED_LINES = 100
_HEX32 = re.compile(r"[0-9a-fA-F]{32}")
_DUMPS = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode

INGEST_HELP = """Read request records as JSON lines on standard input, apply the pipeline's sampling
(every error, every slow request, success_sample_ratio of the rest, keyed on trace_id) and write
the kept ones to the archive in DIR. Each line is one JSON object, archived as given: an error
has an outcome other than "ok" or level "error"; a slow one has "slow": true or e2e_ms over
--logs-slow-request-s; trace_id is 32 hex digits; ts an ISO 8601 time (UTC unless it has an
offset), as the sidecar writes it: 2026-08-07T12:34:56.789Z. A malformed line is reported with
its line number and skipped. Progress goes to stderr every 100,000 lines; a summary at the end."""
SEARCH_HELP = """Print every archived record of one trace as JSON lines (exit 1 when there is none,
2 when the id is not 32 hex digits).
Finished segments are looked up through their trace_id index; open ones are scanned."""
CAT_HELP = """Print archived records as JSON lines, oldest segment first, optionally filtered
(exit 1 when none matches).
Times (--since, --until) are ISO 8601 (UTC unless an offset is given), Unix seconds, or an
age such as 15m, 2h, 7d (that long before now)."""
STATS_HELP = """Summarise an archive: segments, frames, records, bytes on disk and the compression
ratio against the same records as compact JSON lines."""


def _warn(message: str) -> None:
    print(f"inferwatch: warning: {message}", file=sys.stderr)


def parse_time(text: str, *, now: float | None = None) -> int:
    """Epoch milliseconds of an ISO 8601 time, Unix seconds, or an age like ``15m`` before ``now``.

    An age is a Prometheus duration (``15m``, ``2h``, ``1h30m``), read by the one duration parser.
    """
    from alert_rules.engine import RuleFileError, parse_duration_ms

    text = text.strip()
    try:
        return round(float(text) * 1000)
    except ValueError:
        pass
    try:
        age_ms = parse_duration_ms(text, "age")
    except RuleFileError:
        pass
    else:
        return round((time.time() if now is None else now) * 1000) - age_ms
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError as err:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a time: use ISO 8601 (2026-08-07T12:00:00Z), Unix seconds or an age (15m, 2h, 7d)"
        ) from err
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return round(parsed.timestamp() * 1000)


def _choices(text: str) -> frozenset[str]:
    values = frozenset(v.strip() for v in text.split(",") if v.strip())
    if not values:
        raise argparse.ArgumentTypeError("give at least one value (comma-separated)")
    return values


def _print_records(records: Iterable[dict[str, Any]]) -> int:
    count = 0
    out = sys.stdout
    for record in records:
        out.write(_DUMPS(record) + "\n")
        count += 1
    out.flush()
    return count


def _archive(directory: str) -> Archive:
    return Archive(directory, on_problem=_warn)


def _ingest(args: argparse.Namespace) -> int:
    config = settings_from_args(args, {"dir": "logs.dir"}).logs
    sink = RecordSink(config, CollectorRegistry(), on_problem=_warn)
    sink.start()
    started = time.monotonic()
    reported = 0

    def malformed_line(number: int, why: str) -> None:
        nonlocal reported
        reported += 1
        if reported <= MAX_REPORTED_LINES:
            _warn(f"line {number}: {why}; skipped")

    def progress(number: int) -> None:
        rate = number / max(time.monotonic() - started, 1e-9)
        print(f"inferwatch: {number} lines read ({rate:,.0f}/s)", file=sys.stderr)

    try:
        result = ingest_lines(iter(sys.stdin.buffer.readline, b""), sink, on_malformed=malformed_line,
                              on_progress=progress, progress_every=PROGRESS_EVERY)
    finally:
        finished = sink.close(timeout_s=600.0)
    reasons, malformed, line_no = result.reasons, result.malformed, result.lines
    if malformed > MAX_REPORTED_LINES:
        _warn(f"{malformed - MAX_REPORTED_LINES} more malformed lines not shown")
    kept = {k: v for k, v in reasons.items() if k != "dropped_sampling"}
    stats = sink.writer.stats if sink.writer else None
    summary = (
        f"inferwatch: {line_no} lines: {sum(kept.values())} kept "
        f"({', '.join(f'{k} {v}' for k, v in sorted(kept.items())) or 'none'}), "
        f"{reasons.get('dropped_sampling', 0)} dropped by sampling, {malformed} malformed"
    )
    if stats is not None:
        summary += (
            f"; wrote {stats.records} records in {stats.frames} frames, {stats.bytes_written} bytes, "
            f"{stats.segments_published} segments published"
        )
    print(summary, file=sys.stderr)
    return 0 if finished else 1


def trace_id(text: str) -> str:
    """A trace id as the sidecar writes it: 32 hex digits, lower-cased (a malformed one is bad usage)."""
    value = text.strip()
    if not _HEX32.fullmatch(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a trace id: give its 32 hex digits, as in x-trace-id")
    return value.lower()


def _search(args: argparse.Namespace) -> int:
    found = _print_records(_archive(args.dir).find(args.trace_id))
    if not found:
        print(f"inferwatch: no record with trace_id {args.trace_id} in {args.dir}", file=sys.stderr)
        return 1
    return 0


def _cat(args: argparse.Namespace) -> int:
    where = Filter(args.since, args.until, args.level, args.outcome)
    if not _print_records(_archive(args.dir).records(where)):
        print(f"inferwatch: no record in {args.dir} matches", file=sys.stderr)
        return 1
    return 0


def _stats(args: argparse.Namespace) -> int:
    stats = _archive(args.dir).stats()
    stored = stats.segment_bytes + stats.index_bytes
    if args.json:
        print(json.dumps({
            "segments": stats.segments, "open_segments": stats.open_segments, "frames": stats.frames,
            "records": stats.records, "segment_bytes": stats.segment_bytes, "index_bytes": stats.index_bytes,
            "bytes": stored, "raw_json_bytes": stats.json_bytes, "compression_ratio": round(stats.ratio, 3),
        }))
        return 0
    data_ratio = stats.json_bytes / stats.segment_bytes if stats.segment_bytes else 0.0
    print(f"records:           {stats.records}")
    print(f"segments:          {stats.segments} finished, {stats.open_segments} open")
    print(f"frames:            {stats.frames}")
    print(f"bytes:             {stored} ({stats.segment_bytes} segments + {stats.index_bytes} indexes)")
    print(f"raw JSON bytes:    {stats.json_bytes}")
    print(f"compression ratio: {stats.ratio:.2f}x with indexes, {data_ratio:.2f}x segments only")
    return 0


def _guarded(func: Any) -> Any:
    """Run a subcommand; an unusable archive (missing, outside, not ours) is a usage error, exit 2."""

    def run(args: argparse.Namespace) -> int:
        try:
            return int(func(args))
        except ArchiveError as err:
            print(f"inferwatch: {err}", file=sys.stderr)
            return 2
        except BrokenPipeError:
            sys.stdout = open("/dev/null", "w")  # noqa: SIM115 - the reader went away (| head)
            return 0

    return run


def _add_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", required=True, metavar="DIR", help="Archive directory.")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `logs` command group."""
    parser = subparsers.add_parser(
        "logs", help="Request records: replay into an archive, search by trace_id, print, summarise.",
        description="Per-request records kept by the sidecar (every error, every slow request, a "
        "sample of the rest) in crash-safe zstd archives indexed by trace_id.",
    )
    commands = parser.add_subparsers(dest="logs_command", metavar="SUBCOMMAND", required=True)
    raw = argparse.RawDescriptionHelpFormatter

    ingest = commands.add_parser("ingest", help="Sample JSON lines from stdin into an archive.",
                                 description=INGEST_HELP, formatter_class=raw)
    _add_dir(ingest)
    add_config_flags(ingest)
    ingest.set_defaults(func=_guarded(_ingest))

    search = commands.add_parser("search", help="Print every record of one trace_id.",
                                 description=SEARCH_HELP, formatter_class=raw)
    _add_dir(search)
    search.add_argument("--trace-id", required=True, metavar="ID", type=trace_id,
                        help="The trace id (32 hex digits, as in the x-trace-id header).")
    search.set_defaults(func=_guarded(_search))

    cat = commands.add_parser("cat", help="Print archived records, optionally filtered.",
                              description=CAT_HELP, formatter_class=raw)
    _add_dir(cat)
    cat.add_argument("--since", type=parse_time, metavar="T", help="Only records at or after T.")
    cat.add_argument("--until", type=parse_time, metavar="T", help="Only records at or before T.")
    cat.add_argument("--level", type=_choices, metavar="L",
                     help="Only these levels, comma-separated (info, warning, error).")
    cat.add_argument("--outcome", type=_choices, metavar="O",
                     help="Only these outcomes, comma-separated (ok, client_error, upstream_error, "
                     "timeout, cancelled, overloaded).")
    cat.set_defaults(func=_guarded(_cat))

    stats = commands.add_parser("stats", help="Records, segments, bytes and compression ratio.",
                                description=STATS_HELP, formatter_class=raw)
    _add_dir(stats)
    stats.add_argument("--json", action="store_true", help="Print one JSON object instead of text.")
    stats.set_defaults(func=_guarded(_stats))
