"""Configuration section owned by the log pipeline."""

from __future__ import annotations

from dataclasses import dataclass

from exporters.configuring import ratio, setting


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Section ``[logs]``: per-request records, sampling and the zstd archive."""

    dir: str = setting("", "Archive directory for request records; empty = do not archive.")
    success_sample_ratio: float = setting(
        0.05, "Share of successful, fast requests whose record is kept (errors and slow ones always are).",
        check=ratio,
    )
