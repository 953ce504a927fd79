"""Who used what, and what it cost: each finished inference request accounted to its tenant and cost pool.

Runs as a request observer (after the answer went out, off the request path). Per request: the
tenant's bounded label (exporters/tenants.py), the cost pool and price (exporters/cost.py), the
GPU-seconds (exporters/gpu_seconds.py: vLLM's own numbers with the stat-logger plugin, else the
token-based estimate), the prefix cache's savings, and whether an answer cache would have served
it (exporters/repeats.py). The counters are exposed by :meth:`UsageAccounting.collect` (families
built fresh per scrape) and kept in time buckets for showback reports (exporters/usage_ledger.py).
A tenant that loses its name at a window's end has its series removed (its past is in the ledger).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from exporters.catalog import usage as cat
from exporters.catalog.request import INFERENCE_ROUTES
from exporters.cost import CostConfig, Rates, cost_at, cost_pool, price_rates
from exporters.gpu_seconds import ENGINE, TOKEN_ESTIMATE, BatchTimeline, engine_gpu_seconds, estimated_gpu_seconds
from exporters.records import Outcome, RequestRecord
from exporters.repeats import RepeatPrompts
from exporters.tenants import TenantLabels
from exporters.usage_ledger import Usage, UsageLedger

_INFERENCE = frozenset(INFERENCE_ROUTES)
_BOUNDS = cat.TENANT_LATENCY_BUCKETS
_COUNTERS = (  # (spec, Usage field) of the families labelled tenant, model, pool, outcome
    (cat.USAGE_REQUESTS, "requests"), (cat.USAGE_PROMPT_TOKENS, "prompt_tokens"),
    (cat.USAGE_COMPLETION_TOKENS, "completion_tokens"), (cat.USAGE_CACHED_PROMPT_TOKENS, "cached_prompt_tokens"),
    (cat.USAGE_COST, "cost"), (cat.USAGE_PREFIX_CACHE_SAVED_COST, "prefix_cache_saved_cost"),
    (cat.USAGE_REPEAT_REQUESTS, "repeat_requests"),
)


class UsageAccounting(Collector):
    """Accounts finished requests to tenants and pools; a collector of the usage families."""

    def __init__(
        self, cost: CostConfig, max_tenants: int, tenant_window_s: float, timeline: BatchTimeline | None = None,
        ledger: UsageLedger | None = None, clock: Callable[[], float] | None = None,
    ) -> None:
        self._cost = cost
        self.tenants = TenantLabels(max_tenants, tenant_window_s) if clock is None else \
            TenantLabels(max_tenants, tenant_window_s, clock)
        self.timeline = timeline
        self.ledger = ledger if ledger is not None else UsageLedger()
        self.repeats = RepeatPrompts(cost.repeat_ttl_s, cost.repeat_max_entries)
        self._lock = threading.Lock()
        self._rows: dict[tuple[str, str, str, str], Usage] = {}
        self._gpu: dict[tuple[str, str, str, str, str], float] = {}
        self._repeat_tokens: dict[tuple[str, str, str, str], int] = {}
        self._latency: dict[tuple[str, str], list[float]] = {}  # bucket counts (not cumulative), +Inf, sum
        self._rates: dict[tuple[str, str], Rates] = {}
        """Each (model, pool)'s price rates, worked out once (models bounded as the proxy bounds their labels)."""

    def observe(self, record: RequestRecord) -> None:
        """Account one finished request (inference routes only)."""
        if record.route not in _INFERENCE:
            return
        tenant, demoted = self.tenants.label(record.tenant)
        pool = cost_pool(self._cost, record.route, record.request_class, record.prompt_tokens)
        end = record.start_unix + (record.e2e_s or 0.0)
        usage = self._usage(record, pool, end)
        with self._lock:
            if demoted:
                self._forget(demoted)
            key = (tenant, record.model, pool, str(record.outcome))  # the StrEnum's value; str() is cheaper
            row = self._rows.get(key)
            if row is None:
                self._rows[key] = row = Usage()
            row.add(usage)
            basis = TOKEN_ESTIMATE if usage.gpu_seconds_estimated else ENGINE
            gpu_key = (tenant, record.model, pool, key[3], basis)
            self._gpu[gpu_key] = self._gpu.get(gpu_key, 0.0) + usage.gpu_seconds
            if usage.repeat_requests:
                for kind, tokens in (("prompt", usage.prompt_tokens), ("completion", usage.completion_tokens)):
                    token_key = (tenant, record.model, pool, kind)
                    self._repeat_tokens[token_key] = self._repeat_tokens.get(token_key, 0) + tokens
            if record.e2e_s is not None:
                latency = self._latency.setdefault((tenant, record.model), [0.0] * (len(_BOUNDS) + 2))
                latency[bisect.bisect_left(_BOUNDS, record.e2e_s)] += 1
                latency[-1] += record.e2e_s
        self.ledger.add(end, (tenant, record.model, pool), usage)

    def _usage(self, record: RequestRecord, pool: str, end: float) -> Usage:
        prompt, completion = record.prompt_tokens or 0, record.completion_tokens or 0
        engine, cost = record.engine, self._cost
        usage = Usage(requests=1, prompt_tokens=prompt, completion_tokens=completion)
        if engine is not None:
            timeline = self.timeline if self.timeline is not None else BatchTimeline()
            usage.gpu_seconds = engine_gpu_seconds(engine.prefill_s, engine.decode_s, end, timeline)
            usage.cached_prompt_tokens = engine.cached_tokens
            per_prompt_token_s = engine.prefill_s / max(1, engine.prompt_tokens - engine.cached_tokens)
            saved_s = per_prompt_token_s * engine.cached_tokens
        elif prompt or completion:
            usage.gpu_seconds = usage.gpu_seconds_estimated = estimated_gpu_seconds(
                prompt, completion, cost.estimate_prefill_tokens_per_s, cost.estimate_decode_tokens_per_s)
            saved_s = 0.0
        else:
            saved_s = 0.0
        rates = self._rates.get((record.model, pool))
        if rates is None:
            rates = self._rates[(record.model, pool)] = price_rates(cost, record.model, pool)
        usage.cost = cost_at(rates, usage.gpu_seconds, prompt + completion)
        usage.prefix_cache_saved_cost = cost_at(rates, saved_s, usage.cached_prompt_tokens)
        if record.repeat_key is not None and self.repeats.seen(record.repeat_key, end, record.outcome is Outcome.OK):
            usage.repeat_requests = 1
            usage.repeat_saved_tokens = prompt + completion
        return usage

    def _forget(self, tenants: frozenset[str]) -> None:
        self._rows = {key: row for key, row in self._rows.items() if key[0] not in tenants}
        self._gpu = {key: seconds for key, seconds in self._gpu.items() if key[0] not in tenants}
        self._repeat_tokens = {key: n for key, n in self._repeat_tokens.items() if key[0] not in tenants}
        self._latency = {key: values for key, values in self._latency.items() if key[0] not in tenants}

    def collect(self) -> Iterator[Metric]:
        """The usage families, built from a copy of the tables (no I/O)."""
        with self._lock:
            rows = {key: Usage(**{f: getattr(row, f) for f in row.__slots__}) for key, row in self._rows.items()}
            gpu, repeat_tokens = dict(self._gpu), dict(self._repeat_tokens)
            latency = {key: list(values) for key, values in self._latency.items()}
        for spec, field in _COUNTERS:
            family = CounterMetricFamily(spec.name, spec.help, labels=list(spec.labels))
            for key, row in rows.items():
                family.add_metric(list(key), getattr(row, field))
            yield family
        family = CounterMetricFamily(cat.USAGE_GPU_SECONDS.name, cat.USAGE_GPU_SECONDS.help,
                                     labels=list(cat.USAGE_GPU_SECONDS.labels))
        for gpu_key, seconds in gpu.items():
            family.add_metric(list(gpu_key), seconds)
        yield family
        family = CounterMetricFamily(cat.USAGE_REPEAT_SAVED_TOKENS.name, cat.USAGE_REPEAT_SAVED_TOKENS.help,
                                     labels=list(cat.USAGE_REPEAT_SAVED_TOKENS.labels))
        for token_key, tokens in repeat_tokens.items():
            family.add_metric(list(token_key), tokens)
        yield family
        forgotten = CounterMetricFamily(cat.USAGE_REPEAT_FORGOTTEN.name, cat.USAGE_REPEAT_FORGOTTEN.help)
        forgotten.add_metric([], self.repeats.forgotten_early)
        yield forgotten
        histogram = HistogramMetricFamily(cat.TENANT_LATENCY_SECONDS.name, cat.TENANT_LATENCY_SECONDS.help,
                                          labels=list(cat.TENANT_LATENCY_SECONDS.labels))
        for (tenant, model), values in latency.items():
            running, buckets = 0.0, []
            for bound, count in zip((*_BOUNDS, float("inf")), values[:-1], strict=True):
                running += count
                buckets.append((str(bound) if bound != float("inf") else "+Inf", running))
            histogram.add_metric([tenant, model], buckets, values[-1])
        yield histogram
        if self.timeline is not None:
            busy = CounterMetricFamily(cat.ENGINE_BUSY_SECONDS.name, cat.ENGINE_BUSY_SECONDS.help)
            busy.add_metric([], self.timeline.busy_s)
            yield busy
