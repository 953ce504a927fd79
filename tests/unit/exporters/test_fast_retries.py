"""Fast retries: the same client's same request again within the window after the previous one ended."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from exporters.fast_retries import FastRetries, FastRetryCounter
from exporters.records import RequestRecord


def _record(start: float, *, client: str = "c", key: int | None = 7, e2e: float = 0.2,
            route: str = "/v1/completions") -> RequestRecord:
    return RequestRecord("t" * 32, "s" * 16, route, client=client, body_key=key, start_unix=start, e2e_s=e2e)


@pytest.mark.parametrize(("gap_s", "fast"), [(0.1, True), (0.49, True), (0.5, False), (2.0, False)],
                         ids=["100 ms after", "490 ms after", "exactly 500 ms after", "2 s after"])
def test_a_repeat_within_the_window_after_the_end_is_fast(gap_s: float, fast: bool) -> None:
    """The gap runs from the previous request's end (start + e2e) to the repeat's start; 500 ms is not fast."""
    retries = FastRetries(0.5)
    assert not retries.is_fast_retry(_record(100.0, e2e=1.0))
    assert retries.is_fast_retry(_record(101.0 + gap_s)) is fast


def test_other_clients_prompts_and_routes_are_no_retries() -> None:
    """Another client with the same body, the same client with another, or the same body to another route, is a
    request of its own."""
    retries = FastRetries(0.5)
    retries.is_fast_retry(_record(100.0, route="/tokenize"))
    assert not retries.is_fast_retry(_record(100.3))
    assert not retries.is_fast_retry(_record(100.3, client="other"))
    assert not retries.is_fast_retry(_record(100.3, key=8))
    assert not retries.is_fast_retry(_record(100.3, key=None))


def test_memory_is_bounded_oldest_first() -> None:
    """Past max_entries the oldest (client, prompt) is forgotten: its repeat is no longer seen."""
    retries = FastRetries(0.5, max_entries=2)
    for key in (1, 2, 3):
        retries.is_fast_retry(_record(100.0, key=key))
    assert not retries.is_fast_retry(_record(100.3, key=1))
    assert retries.is_fast_retry(_record(100.3, key=3))


def test_a_models_series_is_at_zero_from_its_first_request() -> None:
    """The counter's series of a model exists at 0 once the model's first request ended, so the first fast retry
    is an increase Prometheus can rate (a series first scraped at 1 shows none); the repeat then counts 1."""
    registry = CollectorRegistry()
    counter = FastRetryCounter(registry, 0.5)
    first = _record(100.0)
    first.model = "m"
    counter.observe(first)
    assert registry.get_sample_value("inferwatch_fast_retries_total", {"model_name": "m"}) == 0.0
    repeat = _record(100.3)
    repeat.model = "m"
    counter.observe(repeat)
    assert registry.get_sample_value("inferwatch_fast_retries_total", {"model_name": "m"}) == 1.0
