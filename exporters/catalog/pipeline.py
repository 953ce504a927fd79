"""The log pipeline's own families: sampling decisions, the writer queue and the zstd archive."""

from __future__ import annotations

from exporters.catalog.spec import MetricSpec, MetricType

LOG_RECORDS_SEEN = MetricSpec(
    "inferwatch_log_records_seen", MetricType.COUNTER,
    "Request records offered to the log pipeline. Always equals kept + dropped.",
)
LOG_RECORDS_KEPT = MetricSpec(
    "inferwatch_log_records_kept", MetricType.COUNTER,
    "Request records queued for the archive, by why they were kept (error, slow, sampled).",
    ("reason",),
)
LOG_RECORDS_DROPPED = MetricSpec(
    "inferwatch_log_records_dropped", MetricType.COUNTER,
    "Request records not queued for the archive, by reason: sampling (a fast success outside the "
    "sample), queue_full (the writer fell behind: alert on this), closed (the sink was shut down), "
    "no_archive (no archive directory configured).",
    ("reason",),
)
LOG_RECORDS_LOST = MetricSpec(
    "inferwatch_log_records_lost", MetricType.COUNTER,
    "Queued request records that never reached the archive because writing failed (disk full, "
    "permissions) or the writer did not finish in time at shutdown.",
    ("reason",),
)
LOG_QUEUE_RECORDS = MetricSpec(
    "inferwatch_log_queue_records", MetricType.GAUGE,
    "Request records waiting in the writer queue.",
)
LOG_QUEUE_CAPACITY = MetricSpec(
    "inferwatch_log_queue_capacity_records", MetricType.GAUGE,
    "Size of the writer queue; new records are dropped when the queue holds this many.",
)
LOG_ARCHIVE_WRITTEN_BYTES = MetricSpec(
    "inferwatch_log_archive_written_bytes", MetricType.COUNTER,
    "Bytes appended to archive segments (frame headers, compressed records, dictionaries).",
    unit="bytes",
)
LOG_RAW_BYTES = MetricSpec(
    "inferwatch_log_raw_bytes", MetricType.COUNTER,
    "Size of the archived records as compact JSON lines, before compression.",
    unit="bytes",
)
LOG_ARCHIVED_RECORDS = MetricSpec(
    "inferwatch_log_archived_records", MetricType.COUNTER,
    "Request records written to the archive in closed frames.",
)
LOG_FRAMES = MetricSpec(
    "inferwatch_log_frames", MetricType.COUNTER,
    "zstd frames of records written to the archive.",
)
LOG_SEGMENTS = MetricSpec(
    "inferwatch_log_segments_published", MetricType.COUNTER,
    "Archive segments finished, indexed and published.",
)
LOG_SEGMENTS_DELETED = MetricSpec(
    "inferwatch_log_segments_deleted", MetricType.COUNTER,
    "Archive segments deleted by retention, by reason (size, age).",
    ("reason",),
)
LOG_OTLP_RECORDS_EXPORTED = MetricSpec(
    "inferwatch_log_otlp_records_exported", MetricType.COUNTER,
    "Request records the OTLP logs backend accepted (logs.otlp_endpoint): the same records the archive keeps.",
)
LOG_OTLP_RECORDS_DROPPED = MetricSpec(
    "inferwatch_log_otlp_records_dropped", MetricType.COUNTER,
    "Kept request records that never reached the OTLP logs backend, by reason: queue_full (the backend is "
    "slow or down and the bounded queue is full), export_failed (the backend refused a batch or could not be "
    "reached before the export timeout), shutdown (still queued when the sidecar stopped).",
    ("reason",),
)
LOG_OTLP_QUEUE_RECORDS = MetricSpec(
    "inferwatch_log_otlp_queue_records", MetricType.GAUGE,
    "Request records waiting to be sent to the OTLP logs backend.",
)

SPECS: tuple[MetricSpec, ...] = (
    LOG_RECORDS_SEEN, LOG_RECORDS_KEPT, LOG_RECORDS_DROPPED, LOG_RECORDS_LOST, LOG_QUEUE_RECORDS,
    LOG_QUEUE_CAPACITY, LOG_ARCHIVE_WRITTEN_BYTES, LOG_RAW_BYTES, LOG_ARCHIVED_RECORDS, LOG_FRAMES,
    LOG_SEGMENTS, LOG_SEGMENTS_DELETED, LOG_OTLP_RECORDS_EXPORTED, LOG_OTLP_RECORDS_DROPPED, LOG_OTLP_QUEUE_RECORDS,
)
