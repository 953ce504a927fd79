"""Structured per-request records, sampling and crash-safe zstd archives searchable by trace_id."""
