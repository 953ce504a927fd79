"""Reading numbers out of a Prometheus text exposition (vLLM's or the sidecar's /metrics) in tests."""

from __future__ import annotations

import functools

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


@functools.lru_cache(maxsize=16)
def _samples(text: str) -> tuple[Sample, ...]:
    """Every sample of ``text``, parsed once: tests read many numbers out of one text (the showback test some
    1200, from the /metrics of 200 tenants: 16 s when each read parsed the whole text again)."""
    return tuple(s for family in text_string_to_metric_families(text) for s in family.samples)


def sample_sum(text: str, sample: str, **labels: str) -> float:
    """The sum of every sample named ``sample`` whose labels include ``labels`` (0 when there is none)."""
    total = 0.0
    for s in _samples(text):
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
            total += s.value
    return total
