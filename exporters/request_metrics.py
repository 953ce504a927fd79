"""The sidecar's per-request instruments, built from the catalog on a given registry."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from exporters.batch_histogram import BatchHistogram
from exporters.catalog import engines as engines_cat
from exporters.catalog import request as cat
from exporters.catalog.spec import MetricSpec
from exporters.records import AnswerPhases, RequestRecord, length_bucket_labels


def _histogram(spec: MetricSpec, registry: CollectorRegistry) -> BatchHistogram:
    return BatchHistogram(spec, registry)  # lighter per observation than prometheus_client's Histogram


def _counter(spec: MetricSpec, registry: CollectorRegistry) -> Counter:
    return Counter(spec.name, spec.help, spec.labels, registry=registry)


class _Series:
    """The children of one (model, route, outcome, length bucket, lane, role), each made on its first use.

    A family's child is looked up once per label set and then read as a plain attribute (what
    ``cached_property`` leaves in the instance), so a request costs one lookup for all of them, and
    no series appears before a request was observed into it.
    """

    def __init__(
        self, metrics: RequestMetrics, model: str, route: str, outcome: str, bucket: str, lane: str, role: str,
    ) -> None:
        self._metrics, self._model, self._route, self._bucket = metrics, model, route, bucket
        self._outcome = str(outcome)  # the label value (an Outcome member is a StrEnum)
        self._upstream = (lane, role)  # which upstream served it (serving/upstream_choice.py)

    @cached_property
    def requests(self) -> Any:
        return self._metrics.requests.labels(self._model, self._route, self._outcome, self._bucket, *self._upstream)

    @cached_property
    def accept(self) -> Any:
        return self._metrics.accept.labels(self._model, self._route, self._bucket, *self._upstream)

    @cached_property
    def ttft(self) -> Any:
        return self._metrics.ttft.labels(self._model, self._route, self._bucket, *self._upstream)

    @cached_property
    def itl(self) -> Any:
        return self._metrics.itl.labels(self._model, self._route, self._bucket, *self._upstream)

    @cached_property
    def e2e(self) -> Any:
        return self._metrics.e2e.labels(self._model, self._route, self._outcome, self._bucket, *self._upstream)

    @cached_property
    def prompt_tokens(self) -> Any:
        return self._metrics.prompt_tokens.labels(self._model, self._route)

    @cached_property
    def prompt_tokens_hist(self) -> Any:
        return self._metrics.prompt_tokens_hist.labels(self._model, self._route)

    @cached_property
    def completion_tokens(self) -> Any:
        return self._metrics.completion_tokens.labels(self._model, self._route)

    @cached_property
    def completion_tokens_hist(self) -> Any:
        return self._metrics.completion_tokens_hist.labels(self._model, self._route)


class RequestMetrics:
    """Counters and histograms observed once per request, at its end; latencies carry a trace_id exemplar."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = _counter(cat.REQUESTS, registry)
        self.accept = _histogram(cat.UPSTREAM_ACCEPT_SECONDS, registry)
        self.ttft = _histogram(cat.TIME_TO_FIRST_TOKEN_SECONDS, registry)
        self.itl = _histogram(cat.INTER_TOKEN_LATENCY_SECONDS, registry)  # one merge per request, not per gap
        self.e2e = _histogram(cat.E2E_LATENCY_SECONDS, registry)
        self.prompt_tokens = _counter(cat.PROMPT_TOKENS, registry)
        self.completion_tokens = _counter(cat.COMPLETION_TOKENS, registry)
        self.prompt_tokens_hist = _histogram(cat.REQUEST_PROMPT_TOKENS, registry)
        self.completion_tokens_hist = _histogram(cat.REQUEST_COMPLETION_TOKENS, registry)
        self.finish_reasons = _counter(cat.FINISH_REASONS, registry)
        self.prefill_share = _histogram(cat.PREFILL_SHARE_RATIO, registry)
        self.upstream_ready = Gauge(
            cat.UPSTREAM_READY.name, cat.UPSTREAM_READY.help, cat.UPSTREAM_READY.labels, registry=registry
        )
        self.normalized = _counter(cat.REQUESTS_NORMALIZED, registry)
        self.engine_queue = _histogram(cat.ENGINE_QUEUE_SECONDS, registry)
        self.engine_prefill = _histogram(cat.ENGINE_PREFILL_SECONDS, registry)
        self.engine_decode = _histogram(cat.ENGINE_DECODE_SECONDS, registry)
        self.engine_preemptions = _histogram(cat.ENGINE_PREEMPTIONS_PER_REQUEST, registry)
        self.engine_cached_ratio = _histogram(cat.ENGINE_CACHED_PROMPT_RATIO, registry)
        self.engine_load = _histogram(engines_cat.REQUEST_ENGINE_LOAD_SECONDS, registry)
        self._children: dict[tuple[Any, ...], Any] = {}
        """Children by (family, labels...): bounded by the label caps the proxy enforces."""
        self._series: dict[tuple[str, str, str, str, str, str], _Series] = {}
        """The request families' children by (model, route, outcome, length bucket, lane, role), bounded the same
        way (lane and role take two values each)."""

    def precreate(self, model: str, route: str, edges: tuple[int, ...], lane: str = "default",
                  role: str = "primary") -> None:
        """Create the zero-valued request counters of a model and route, so rates exist before any error."""
        for bucket in (*length_bucket_labels(edges), "unknown"):
            for outcome in ("ok", "client_error", "upstream_error", "timeout", "cancelled", "overloaded"):
                self.requests.labels(model, route, outcome, bucket, lane, role)

    def _child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, remembered: a dict lookup per request instead of a locked lookup."""
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def observe(self, record: RequestRecord) -> None:
        """Record one finished request."""
        exemplar = {"trace_id": record.trace_id}
        model, route, bucket, outcome = record.model, record.route, record.length_bucket, record.outcome
        key = (model, route, outcome, bucket, record.lane, record.role)  # a StrEnum member is its value as a key
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = _Series(self, *key)
        series.requests.inc()
        if record.accept_s is not None:
            series.accept.observe(record.accept_s)
        if record.ttft_s is not None:
            series.ttft.observe(record.ttft_s, exemplar)
        if record.inter_token_s:
            series.itl.observe_many(record.inter_token_s, exemplar)
        if record.e2e_s is not None:
            series.e2e.observe(record.e2e_s, exemplar)
            if record.stream and record.ttft_s is not None and record.e2e_s > 0:
                self._child(self.prefill_share, model).observe(min(record.ttft_s / record.e2e_s, 1.0))
        if record.prompt_tokens is not None:
            series.prompt_tokens.inc(record.prompt_tokens)
            series.prompt_tokens_hist.observe(record.prompt_tokens)
        if record.completion_tokens is not None:
            series.completion_tokens.inc(record.completion_tokens)
            series.completion_tokens_hist.observe(record.completion_tokens)
        if record.finish_reason:
            self._child(self.finish_reasons, model, record.finish_reason).inc()
        child = self._child
        engine = record.engine
        if engine is not None:  # vLLM's own numbers, joined from the stat-logger plugin
            label = str(outcome)
            child(self.engine_queue, model, bucket, label).observe(engine.queued_s)
            child(self.engine_prefill, model, bucket, label).observe(engine.prefill_s)
            child(self.engine_decode, model, bucket, label).observe(engine.decode_s)
            child(self.engine_preemptions, model, bucket, label).observe(engine.preemptions)
            if engine.prompt_tokens > 0:
                child(self.engine_cached_ratio, model, bucket, label).observe(
                    engine.cached_tokens / engine.prompt_tokens
                )
        elif record.answer_phases is not None:  # Ollama's or llama.cpp's, from its answer
            self._observe_answer_phases(record.answer_phases, model, bucket, str(outcome))

    def _observe_answer_phases(self, phases: AnswerPhases, model: str, bucket: str, outcome: str) -> None:
        """The per-request engine histograms from an answer's own numbers (the families vLLM's plugin feeds,
        plus the model load)."""
        child = self._child
        child(self.engine_prefill, model, bucket, outcome).observe(phases.prefill_s)
        child(self.engine_decode, model, bucket, outcome).observe(phases.decode_s)
        if phases.load_s is not None:
            child(self.engine_load, model, bucket, outcome).observe(phases.load_s)
        if phases.cached_tokens is not None and phases.prompt_tokens:
            child(self.engine_cached_ratio, model, bucket, outcome).observe(phases.cached_tokens / phases.prompt_tokens)
