"""What the checklist reads from the sidecar's /metrics: samples by name and labels, absent when not served."""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

Samples = list[tuple[dict[str, str], float]]


async def read_samples(session: aiohttp.ClientSession, metrics_url: str, *names: str) -> dict[str, Samples] | None:
    """``sample name -> [(labels, value)]`` for ``names`` in one scrape; None when the URL serves no metrics."""
    try:
        async with session.get(metrics_url, timeout=aiohttp.ClientTimeout(total=10)) as reply:
            if reply.status != 200:
                return None
            text = await reply.text()
    except (aiohttp.ClientError, TimeoutError, OSError):
        return None
    wanted = set(names)
    found: dict[str, Samples] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in wanted:
                    found.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    except ValueError:
        return None
    return found


def total(samples: Samples | None, **labels: str) -> float:
    """The sum of the samples whose labels include ``labels`` (0 when none)."""
    return sum(v for have, v in samples or [] if all(have.get(k) == x for k, x in labels.items()))


__all__ = ["Samples", "read_samples", "total"]
