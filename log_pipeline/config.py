"""Configuration section owned by the log pipeline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exporters.configuring import non_negative, optional_http_url, positive, ratio, setting


def _level(value: Any) -> str | None:
    """Validator: a zstd compression level the writer supports."""
    return None if 1 <= value <= 19 else "must be between 1 and 19"


def _frame_records(value: Any) -> str | None:
    """Validator: a frame holds between 1 and 65535 records."""
    return None if 1 <= value <= 65535 else "must be between 1 and 65535"


def _segment_bytes(value: Any) -> str | None:
    """Validator: segments stay below 4 GiB so that frame offsets fit 32 bits."""
    return None if 64 * 1024 <= value < 4 * 1024**3 else "must be between 65536 and 4294967295"


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Section ``[logs]``: per-request records, sampling and the zstd archive."""

    dir: str = setting("", "Archive directory for request records; empty = do not archive.")
    success_sample_ratio: float = setting(
        0.05, "Share of successful, fast requests whose record is kept (errors and slow ones always are).",
        check=ratio,
    )
    slow_request_s: float = setting(
        0.0, "A record whose e2e_ms exceeds this many seconds counts as slow and is always kept; "
        "0 = rely on the record's own `slow` flag (set from the route's SLA).", check=non_negative,
    )
    queue_size: int = setting(
        10000, "Records waiting for the writer thread; when full, new records are dropped and counted.",
        check=positive,
    )
    frame_max_records: int = setting(
        256, "A zstd frame is closed after this many records (a kill loses at most one open frame).",
        check=_frame_records,
    )
    frame_max_ms: float = setting(
        1000.0, "A zstd frame is closed at most this many milliseconds after its first record.",
        check=positive,
    )
    segment_max_bytes: int = setting(
        64 * 1024 * 1024, "A segment file is published and a new one started past this many bytes.",
        check=_segment_bytes,
    )
    segment_max_age_s: float = setting(
        3600.0, "A segment file is published and a new one started after this many seconds.", check=positive
    )
    retention_bytes: int = setting(
        10 * 1024**3, "Oldest segments are deleted while the archive is larger than this; 0 = no limit.",
        check=non_negative,
    )
    retention_age_s: float = setting(
        14 * 86400.0, "Segments whose newest record is older than this many seconds are deleted; 0 = keep.",
        check=non_negative,
    )
    compression_level: int = setting(3, "zstd level of the archive frames (1 fastest, 19 smallest).",
                                     check=_level)
    use_dictionary: bool = setting(
        True, "Train a zstd dictionary from each segment's first records and use it for its later frames.",
    )
    dictionary_bytes: int = setting(
        16384, "Target size of a segment's trained dictionary, in bytes.", check=positive
    )
    dictionary_sample_records: int = setting(
        1024, "Records written to a segment before its dictionary is trained from them "
        "(earlier frames go without).", check=positive,
    )
    capture_prompt_hash: bool = setting(
        False, "Add a SHA-256 of the prompt and its length in characters to each record (never the text).",
    )
    otlp_endpoint: str = setting(
        "", "OTLP/HTTP logs endpoint that also receives the kept records, with their trace and span ids, e.g. "
        "http://127.0.0.1:4318/v1/logs (Loki 3, an OpenTelemetry Collector); empty = off. Headers, TLS and "
        "compression follow the OTEL_EXPORTER_OTLP_LOGS_* environment variables.", check=optional_http_url,
    )
    otlp_queue_size: int = setting(
        4096, "Records waiting for the OTLP logs backend; when full (backend slow or down) new ones are dropped "
        "and counted.", check=positive,
    )
    otlp_batch_records: int = setting(512, "Most records sent to the OTLP logs backend in one request.",
                                      check=positive)
    otlp_flush_ms: float = setting(
        1000.0, "A batch is sent at most this many milliseconds after its first record.", check=positive
    )
    otlp_timeout_s: float = setting(
        5.0, "Seconds one OTLP logs request may take, retries included, before its batch is dropped.",
        check=positive,
    )
