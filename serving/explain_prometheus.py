"""The engine's state around a request, read from Prometheus (``inferwatch explain --prometheus URL``).

Prometheus holds what the sidecar's own history may not: any moment its retention keeps, across
sidecar restarts, archived requests included. For a request from ``start`` to ``end``, a range
query (``/api/v1/query_range``, one point every :data:`STEP_S`) over ``[start - step, end + step]``
gives each gauge's largest value meanwhile, as Prometheus scraped it (a state shorter than its
scrape interval may not show); vLLM's preemption counter is an ``increase`` over the same window.
The series are the ones the sidecar exports (vLLM's own, passed through, and its NVML readings).
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from alert_rules.spec import selector
from exporters.catalog import gpu as gpu_specs
from exporters.catalog import request as request_specs
from exporters.catalog import vllm as vllm_specs
from exporters.errors import InferwatchError
from exporters.explain import ColdStartSpan, EngineContext

STEP_S = 1.0
TIMEOUT_S = 10.0


class PrometheusContextError(InferwatchError, RuntimeError):
    """Prometheus could not be asked, or refused a query; the message says which and why."""


def _get(base: str, path: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    url = f"{base.rstrip('/')}{path}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:  # noqa: S310 - the user's own URL
            body = json.loads(response.read())
    except urllib.error.HTTPError as err:
        raise PrometheusContextError(f"Prometheus at {base} answered HTTP {err.code} to {params['query']!r}: "
                                     f"{err.read()[:300]!r}") from err
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise PrometheusContextError(f"Prometheus at {base} could not be asked: {getattr(err, 'reason', err)}") from err
    if body.get("status") != "success":
        raise PrometheusContextError(f"Prometheus at {base} refused {params['query']!r}: {body.get('error')}")
    return list(body["data"]["result"])


def _peaks(base: str, expr: str, start: float, end: float) -> dict[str, float]:
    """Each result series' largest value over ``[start, end]``, by its labels' values joined (one series: "")."""
    found = {}
    for series in _get(base, "/api/v1/query_range", {"query": expr, "start": start, "end": end, "step": STEP_S}):
        values = [float(v) for _t, v in series["values"] if not math.isnan(float(v))]
        if values:
            found[",".join(series["metric"].values())] = max(values)
    return found


def _peak(base: str, expr: str, start: float, end: float) -> float | None:
    return max(_peaks(base, expr, start, end).values(), default=None)


def context_from_prometheus(
    base: str, model: str, start_unix: float, end_unix: float, *, max_num_seqs: int | None = None,
    cold_starts: tuple[ColdStartSpan, ...] = (),
) -> EngineContext:
    """The engine around a request of ``model`` from ``start_unix`` to ``end_unix``, from Prometheus at ``base``;
    ``max_num_seqs`` and ``cold_starts`` are carried over (Prometheus has neither).

    Raises:
        PrometheusContextError: Prometheus could not be asked or refused a query.
    """
    start, end = start_unix - STEP_S, end_unix + STEP_S
    same = ("model_name", "=", model)

    def total(spec: Any) -> str:
        return f"sum({selector(spec.series, same)})"

    def busiest(spec: Any) -> str:
        return f"max({spec.series})"

    running = _peak(base, total(vllm_specs.NUM_REQUESTS_RUNNING), start, end)
    waiting = _peak(base, total(vllm_specs.NUM_REQUESTS_WAITING), start, end)
    by_reason = selector(vllm_specs.NUM_REQUESTS_WAITING_BY_REASON.series, same, ("reason", "=", "deferred"))
    deferred = _peak(base, f"sum({by_reason})", start, end)
    window = f"{math.ceil(end - start)}s"
    increase = _get(base, "/api/v1/query", {
        "query": f"sum(increase({selector(vllm_specs.NUM_PREEMPTIONS.series, same)}[{window}]))", "time": end})
    events = _peaks(base, f"max by (reason) ({gpu_specs.GPU_CLOCK_EVENT_ACTIVE.series})", start, end)
    return EngineContext(
        "prometheus", running_max=None if running is None else int(running),
        waiting_max=None if waiting is None else int(waiting),
        waiting_deferred_max=None if deferred is None else int(deferred),
        kv_usage_max=_peak(base, f"max({selector(vllm_specs.KV_CACHE_USAGE_PERC.series, same)})", start, end),
        preemptions_in_window=float(increase[0]["value"][1]) if increase else None, max_num_seqs=max_num_seqs,
        in_flight_max=_peak(base, total(request_specs.REQUESTS_IN_FLIGHT), start, end), cold_starts=cold_starts,
        gpu_utilization_max=_peak(base, busiest(gpu_specs.GPU_UTILIZATION), start, end),
        gpu_memory_used_max_bytes=_peak(base, busiest(gpu_specs.GPU_MEMORY_USED), start, end),
        gpu_temperature_max=_peak(base, busiest(gpu_specs.GPU_TEMPERATURE), start, end),
        gpu_clock_events=tuple(sorted(reason for reason, value in events.items() if reason and value >= 1)),
        note=f"Prometheus at {base}, one point every {STEP_S:g} s: the samples it scraped, not the request's own "
             "moments",
    )
