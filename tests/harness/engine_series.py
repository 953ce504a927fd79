"""What the sidecar's /metrics says about its engine series: present or stale, and the scrape health beside them."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from exporters.catalog import engine as ce
from exporters.catalog import gpu as cg
from exporters.catalog import request as cr

ENGINE_SAMPLES = frozenset(n for spec in (*ce.ENGINE_SERIES, cg.GPU_TOKENS_PER_JOULE) for n in spec.sample_names())


@dataclass(frozen=True)
class EngineSeriesReading:
    """One read of the sidecar's /metrics, at ``at`` (monotonic)."""

    at: float
    engine: frozenset[str] = frozenset()
    """The engine-series sample names present (those derived from vLLM's /metrics)."""
    scrape_up: float | None = None
    stale: float | None = None
    consecutive_failures: float | None = None
    ready: float | None = None
    failures: dict[str, float] = field(default_factory=dict)
    """inferwatch_upstream_scrape_failures_total by reason."""


def read_engine_series(base_url: str) -> EngineSeriesReading | None:
    """Read the sidecar at ``base_url``; None when its /metrics did not answer."""
    at = time.monotonic()
    try:
        with urllib.request.urlopen(f"{base_url}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    names, values, failures = set(), {}, {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            names.add(sample.name)
            values[sample.name] = sample.value
            if sample.name == ce.SCRAPE_FAILURES.series:
                failures[sample.labels["reason"]] = sample.value
    return EngineSeriesReading(
        at, frozenset(names & ENGINE_SAMPLES), values.get(ce.SCRAPE_UP.series), values.get(ce.SCRAPE_STALE.series),
        values.get(ce.SCRAPE_CONSECUTIVE_FAILURES.series), values.get(cr.UPSTREAM_READY.series), failures,
    )


def live(reading: EngineSeriesReading | None) -> bool:
    """The engine series are exported and not stale."""
    return reading is not None and bool(reading.engine) and reading.stale == 0


def poll_until(base_url: str, done: Callable[[EngineSeriesReading], bool], deadline_s: float,
               into: list[EngineSeriesReading] | None = None) -> EngineSeriesReading | None:
    """Read every 0.1 s until ``done``; the reading that was, None past the deadline (``into`` keeps every one)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        reading = read_engine_series(base_url)
        if reading is not None:
            if into is not None:
                into.append(reading)
            if done(reading):
                return reading
        time.sleep(0.1)
    return None
