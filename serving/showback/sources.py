"""Where a showback report's rows come from: a sidecar's ledger, or Prometheus's usage counters.

A sidecar (``GET /admin/usage``) answers from its own ledger: exact counts, for the 5-minute
buckets that start inside the window, as far back as it has run (8 days at most). Prometheus
answers ``sum by (tenant, model_name, pool) (increase(...[window] @ to))`` for each usage family:
any window its retention holds, across sidecars and restarts, extrapolated as ``increase()`` is.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from exporters.catalog import usage as cat
from exporters.catalog.spec import MetricSpec
from exporters.errors import InferwatchError
from exporters.gpu_seconds import TOKEN_ESTIMATE
from exporters.usage_ledger import Key, Usage
from serving.showback.sidecar import USAGE_PATH, rows_from_json

TIMEOUT_S = 30.0
_FIGURES: tuple[tuple[MetricSpec, str], ...] = (
    (cat.USAGE_REQUESTS, "requests"), (cat.USAGE_PROMPT_TOKENS, "prompt_tokens"),
    (cat.USAGE_COMPLETION_TOKENS, "completion_tokens"), (cat.USAGE_CACHED_PROMPT_TOKENS, "cached_prompt_tokens"),
    (cat.USAGE_COST, "cost"), (cat.USAGE_PREFIX_CACHE_SAVED_COST, "prefix_cache_saved_cost"),
    (cat.USAGE_REPEAT_REQUESTS, "repeat_requests"),
)
_INTEGERS = frozenset({"requests", "prompt_tokens", "completion_tokens", "cached_prompt_tokens", "repeat_requests",
                       "repeat_saved_tokens"})


class ShowbackSourceError(InferwatchError, RuntimeError):
    """The sidecar or Prometheus could not be asked, or answered something else than expected."""


def _get_json(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:  # noqa: S310 - the user's own URL
            return json.loads(response.read())
    except urllib.error.HTTPError as err:
        raise ShowbackSourceError(f"{url} answered HTTP {err.code}: {err.read()[:300]!r}") from err
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise ShowbackSourceError(f"{url} could not be read: {getattr(err, 'reason', err)}") from err


def from_sidecar(base: str, start: float, end: float) -> tuple[dict[Key, Usage], str]:
    """The sidecar's ledger rows for ``[start, end)`` and its currency."""
    query = urllib.parse.urlencode({"from": start, "to": end})
    body = _get_json(f"{base.rstrip('/')}/admin{USAGE_PATH}?{query}")
    try:
        return rows_from_json(body["rows"]), str(body["currency"])
    except (KeyError, TypeError, ValueError) as err:
        raise ShowbackSourceError(f"the sidecar at {base} answered no usage rows: {err}") from err


def _query(base: str, expr: str, at: float) -> list[dict[str, Any]]:
    query = urllib.parse.urlencode({"query": expr, "time": at})
    body = _get_json(f"{base.rstrip('/')}/api/v1/query?{query}")
    if body.get("status") != "success":
        raise ShowbackSourceError(f"Prometheus refused {expr!r}: {body.get('error')}")
    return list(body["data"]["result"])


def from_prometheus(base: str, start: float, end: float) -> dict[Key, Usage]:
    """Each usage family's increase over ``[start, end]`` by tenant, model and pool."""
    window = f"{max(1, round(end - start))}s"
    rows: dict[Key, Usage] = {}

    def add(series: dict[str, Any], figure: str) -> None:
        labels = series["metric"]
        key = (labels.get("tenant", ""), labels.get("model_name", ""), labels.get("pool", ""))
        usage = rows.setdefault(key, Usage())
        value = float(series["value"][1])
        setattr(usage, figure, getattr(usage, figure) + (round(value) if figure in _INTEGERS else value))

    def increase(spec: MetricSpec, by: str) -> str:
        return f"sum by ({by}) (increase({spec.series}[{window}]))"

    by = "tenant, model_name, pool"
    for spec, figure in _FIGURES:
        for series in _query(base, increase(spec, by), end):
            add(series, figure)
    for series in _query(base, increase(cat.USAGE_GPU_SECONDS, f"{by}, basis"), end):
        add(series, "gpu_seconds")
        if series["metric"].get("basis") == TOKEN_ESTIMATE:
            add(series, "gpu_seconds_estimated")
    for series in _query(base, increase(cat.USAGE_REPEAT_SAVED_TOKENS, by), end):
        add(series, "repeat_saved_tokens")
    return rows
