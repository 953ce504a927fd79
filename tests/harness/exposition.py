"""Reading numbers out of a Prometheus text exposition (vLLM's or the sidecar's /metrics) in tests."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def sample_sum(text: str, sample: str, **labels: str) -> float:
    """The sum of every sample named ``sample`` whose labels include ``labels`` (0 when there is none)."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total
