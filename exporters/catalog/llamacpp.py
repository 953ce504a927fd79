"""Families llama.cpp's ``llama-server --metrics`` exposes that the engine view reads.

llama.cpp as vendored in llama-cpp-python 0.3.36 (``tools/server``; shared/reference/engines.md §1): a
hand-written exposition, ``llamacpp:`` prefix, no labels at all, every family at 0 before the first request.
There is no KV-cache gauge: the engine view says KV usage is unknown rather than inventing one.
"""

from __future__ import annotations

from exporters.catalog.spec import MetricSpec, MetricType, Source

PREFIX = "llamacpp:"
G, C = MetricType.GAUGE, MetricType.COUNTER


def _llamacpp(name: str, type_: MetricType, help_: str, unit: str = "") -> MetricSpec:
    return MetricSpec(name, type_, help_, (), unit, None, Source.LLAMACPP)


PROMPT_TOKENS = _llamacpp("llamacpp:prompt_tokens_total", C, "Prompt tokens processed, cached ones excluded.",
                          "tokens")
PROMPT_TOKENS_CACHED = _llamacpp("llamacpp:prompt_tokens_cached_total", C, "Prompt tokens reused from the cache.",
                                 "tokens")
PROMPT_SECONDS = _llamacpp("llamacpp:prompt_seconds_total", C, "Seconds of prompt processing (prefill).", "seconds")
TOKENS_PREDICTED = _llamacpp("llamacpp:tokens_predicted_total", C, "Generated tokens.", "tokens")
TOKENS_PREDICTED_SECONDS = _llamacpp("llamacpp:tokens_predicted_seconds_total", C, "Seconds of generation (decode).",
                                     "seconds")
REQUESTS_PROCESSING = _llamacpp("llamacpp:requests_processing", G, "Busy slots: requests being processed.",
                                "requests")
REQUESTS_DEFERRED = _llamacpp("llamacpp:requests_deferred", G, "Requests deferred for want of a free slot.",
                              "requests")

SPECS: tuple[MetricSpec, ...] = (
    PROMPT_TOKENS, PROMPT_TOKENS_CACHED, PROMPT_SECONDS, TOKENS_PREDICTED, TOKENS_PREDICTED_SECONDS,
    REQUESTS_PROCESSING, REQUESTS_DEFERRED,
)
