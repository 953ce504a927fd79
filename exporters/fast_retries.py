"""Fast retries: a client sending the same request again within a moment of the last one ending.

A request is a fast retry when the same client (its ``client`` and ``tenant``) sent the same body
(:attr:`RequestRecord.body_key`, a salted hash; never the body) to the same route, and the previous such request
ended less than ``window_s`` before this one started (the same prompt with other options, such as another
``max_tokens``, is another request). Clients should back off at least 500 ms, doubling
(the launch checklist's rule): a retry sooner adds load to an engine that is already failing. Memory is
bounded by ``max_entries`` (client, route, body) keys, the oldest forgotten first.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from exporters.catalog.request import FAST_RETRIES
from exporters.records import RequestRecord


class FastRetries:
    """The end time of each client's latest request per prompt, and whether a new one came too soon."""

    def __init__(self, window_s: float, max_entries: int = 65536) -> None:
        self._window_s = window_s
        self._max_entries = max_entries
        self._ended: OrderedDict[tuple[str, str, str, int], float] = OrderedDict()

    def is_fast_retry(self, record: RequestRecord) -> bool:
        """Note a finished request; True when it started within the window after the same client's same request
        ended. Requests without a body hash or a start time are never retries."""
        if record.body_key is None or not record.start_unix:
            return False
        key = (record.client or "", record.tenant, record.route, record.body_key)
        previous = self._ended.pop(key, None)
        self._ended[key] = record.start_unix + (record.e2e_s or 0.0)
        if len(self._ended) > self._max_entries:
            self._ended.popitem(last=False)
        return previous is not None and record.start_unix - previous < self._window_s


class FastRetryCounter:
    """``inferwatch_fast_retries_total`` by model, fed each finished request (an observer of the proxy)."""

    def __init__(self, registry: CollectorRegistry, window_s: float) -> None:
        self._retries = FastRetries(window_s)
        self._count = Counter(FAST_RETRIES.name, FAST_RETRIES.help, FAST_RETRIES.labels, registry=registry)
        self._series: dict[str, Any] = {}
        """Each model's child of the counter, once its series exists (bounded as the proxy bounds model labels):
        a dict lookup per request instead of prometheus_client's locked ``labels()``."""

    def observe(self, record: RequestRecord) -> None:
        """Count the request when it is a fast retry. A model's series is created at 0 by its first request, so that
        Prometheus has a 0 before the first retry: a series that first appears at 1 has no increase to rate()."""
        series = self._series.get(record.model)
        if series is None:
            series = self._series[record.model] = self._count.labels(record.model)
        if self._retries.is_fast_retry(record):
            series.inc()


__all__ = ["FastRetries", "FastRetryCounter"]
