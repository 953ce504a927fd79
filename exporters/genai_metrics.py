"""OpenTelemetry's GenAI model-server histograms, observed once per request (``serve.genai_metrics``).

Label values follow the conventions' attributes: the operation from the route, provider ``vllm``,
the requested model as the proxy bounded it (a name vLLM does not serve is ``other``), the model
vLLM answered with, the upstream's address and port, and on failures ``error_type``: the span's
``error.type`` (the proxy's low-cardinality error kind, set for the outcomes that count against the
SLO, as on the span; past :data:`MAX_ERROR_TYPES` distinct kinds, the conventions' ``_OTHER``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram

from exporters.catalog import genai as cat
from exporters.catalog.engines import AUTO
from exporters.catalog.spec import MetricSpec
from exporters.records import Outcome, RequestRecord

DEFAULT_PROVIDER = "vllm"
"""``gen_ai.provider.name`` while ``serve.engine = auto`` has not recognized the engine: vLLM, the default."""


def provider_name(engine: str) -> str:
    """``gen_ai.provider.name`` for ``serve.engine``: the engine, or :data:`DEFAULT_PROVIDER` for ``auto``."""
    return DEFAULT_PROVIDER if engine == AUTO else engine
OPERATIONS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "text_completion",
    "/v1/embeddings": "embeddings",
    "/v1/responses": "chat",
}
"""gen_ai.operation.name of each OpenAI route the sidecar proxies (other routes are not GenAI operations)."""
MAX_ERROR_TYPES = 32
OTHER_ERROR = "_OTHER"


def operation_name(route: str) -> str | None:
    """The conventions' operation name of a route; None for routes that are no GenAI operation."""
    return OPERATIONS.get(route)


def _histogram(spec: MetricSpec, registry: CollectorRegistry) -> Histogram:
    return Histogram(spec.name, spec.help, spec.labels, registry=registry, buckets=spec.buckets or ())


class GenAiServerMetrics:
    """The three ``gen_ai.server.*`` histograms on a registry, for the upstream at ``address:port``."""

    def __init__(self, registry: CollectorRegistry, address: str, port: int, provider: str = DEFAULT_PROVIDER) -> None:
        self.duration = _histogram(cat.SERVER_REQUEST_DURATION, registry)
        self.ttft = _histogram(cat.SERVER_TIME_TO_FIRST_TOKEN, registry)
        self.tpot = _histogram(cat.SERVER_TIME_PER_OUTPUT_TOKEN, registry)
        self._server = (address, str(port))
        self.provider = provider
        """``gen_ai.provider.name``: the engine behind the sidecar once known (serving/engine_detect.py)."""
        self._error_types: set[str] = set()

    def _error_type(self, record: RequestRecord) -> str:
        kind = record.error_type or record.outcome.value
        if kind not in self._error_types:
            if len(self._error_types) >= MAX_ERROR_TYPES:
                return OTHER_ERROR
            self._error_types.add(kind)
        return kind

    def observe(self, record: RequestRecord) -> None:
        """Record one finished request of a GenAI route."""
        operation = operation_name(record.route)
        if operation is None or record.e2e_s is None:
            return
        known = record.model not in ("other", "unknown")
        labels = (operation, self.provider, record.model, (record.response_model or "") if known else "", *self._server)
        error = self._error_type(record) if record.outcome.is_error else ""
        self.duration.labels(*labels, error).observe(record.e2e_s)
        if record.outcome is not Outcome.OK or not record.stream or record.ttft_s is None:
            return
        self.ttft.labels(*labels).observe(record.ttft_s)
        tokens = record.completion_tokens
        if tokens is not None and tokens > 1:
            self.tpot.labels(*labels).observe(max(record.e2e_s - record.ttft_s, 0.0) / (tokens - 1))
