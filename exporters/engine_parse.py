"""Any engine's ``/metrics`` text -> :class:`~exporters.vllm_parse.EngineSnapshot`, so one view serves all.

vLLM's text goes to :mod:`exporters.vllm_parse`. SGLang's (``sglang:``) and llama.cpp's (``llamacpp:``) are read
here into the same snapshot, their generation named after the engine (``sglang``, ``llamacpp``): the derived
engine series, boards and rules then work unchanged, and what an engine does not export stays None (absent),
never a zero (exporters/catalog/engines.py says which). Nothing here raises on bad input.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from exporters.catalog import llamacpp as cl
from exporters.catalog import sglang as cs
from exporters.catalog import vllm as cv
from exporters.catalog.engines import Engine
from exporters.catalog.spec import MetricSpec, MetricType
from exporters.vllm_parse import EngineSeries, EngineSnapshot, parse_exposition, split_families

LLAMACPP_MODEL = "default"
"""The model label of llama.cpp's series, which carry no labels (one model per llama-server)."""


def _sglang_engine(labels: dict[str, str]) -> str:
    """SGLang's data-parallel rank is its engine (the scheduler's gauges are recorded by TP rank 0 only)."""
    return labels.get("dp_rank", "0")


SGLANG_FIELDS: dict[str, str] = {
    cs.NUM_RUNNING_REQS.name: "running", cs.NUM_QUEUE_REQS.name: "waiting", cs.TOKEN_USAGE.name: "kv_usage",
    cs.NUM_RETRACTED_REQUESTS.name: "preemptions", cs.PROMPT_TOKENS.name: "prefix_queries",
    cs.CACHED_TOKENS.name: "prefix_hits", cs.GENERATION_TOKENS.name: "generation_tokens",
}
"""SGLang family -> :class:`EngineSeries` field, summed over the family's samples of one model and engine."""
LLAMACPP_FIELDS: dict[str, str] = {
    cl.REQUESTS_PROCESSING.name: "running", cl.REQUESTS_DEFERRED.name: "waiting",
    cl.PROMPT_SECONDS.name: "prefill_seconds", cl.TOKENS_PREDICTED_SECONDS.name: "decode_seconds",
    cl.TOKENS_PREDICTED.name: "generation_tokens", cl.PROMPT_TOKENS_CACHED.name: "prefix_hits",
    # prompt_tokens_total excludes the cached tokens: queries = computed + cached
    cl.PROMPT_TOKENS.name: "prefix_queries",
}


def _names(specs: tuple[MetricSpec, ...]) -> dict[str, MetricSpec]:
    """Every ``# TYPE`` name a family may carry (counters with and without ``_total``) -> spec."""
    out = {}
    for spec in specs:
        out[spec.name] = spec
        if spec.type is MetricType.COUNTER:
            out[spec.name.removesuffix("_total")] = spec
    return out


def _read(
    text: str, prefix: str, specs: tuple[MetricSpec, ...], fields: dict[str, str], generation: str,
    engine_of: Callable[[dict[str, str]], str], model_of: Callable[[dict[str, str]], str],
) -> EngineSnapshot:
    known = _names(specs)
    blocks, errors = split_families(text)
    values: dict[tuple[str, str], dict[str, Any]] = {}  # EngineSeries' float fields by name
    malformed: list[str] = []
    families = 0
    for name, lines in blocks:
        if not name.startswith(prefix) or name.endswith("_created"):
            continue
        families += 1
        spec = known.get(name)
        fieldname = fields.get(spec.name) if spec is not None else None
        if fieldname is None:
            continue
        try:
            parsed: list[Any] = list(text_string_to_metric_families("\n".join(lines) + "\n"))
        except Exception:  # the parser raises ValueError, IndexError, ...: all mean "malformed"
            errors += 1
            malformed.append(name)
            continue
        for family in parsed:
            for sample in family.samples:
                if sample.name.endswith("_created") or sample.value != sample.value:  # NaN
                    continue
                key = (model_of(sample.labels), engine_of(sample.labels))
                slot = values.setdefault(key, {})
                slot[fieldname] = slot.get(fieldname, 0.0) + float(sample.value)
    if generation == Engine.LLAMACPP:
        for slot in values.values():
            if "prefix_queries" in slot or "prefix_hits" in slot:
                slot["prefix_queries"] = slot.get("prefix_queries", 0.0) + slot.get("prefix_hits", 0.0)
    series = tuple(EngineSeries(model, engine, **fields_) for (model, engine), fields_ in sorted(values.items()))
    return EngineSnapshot(
        generation if families else None, series, parse_errors=errors,
        malformed_families=tuple(malformed), families=families,
    )


def parse_sglang(text: str) -> EngineSnapshot:
    """SGLang's ``/metrics`` (``sglang:`` families) as an engine snapshot of generation ``sglang``."""
    return _read(text, cs.PREFIX, cs.SPECS, SGLANG_FIELDS, Engine.SGLANG, _sglang_engine,
                 lambda labels: labels.get("model_name", ""))


def parse_llamacpp(text: str, model: str = LLAMACPP_MODEL) -> EngineSnapshot:
    """llama-server's ``/metrics`` (``llamacpp:`` families, no labels) as a snapshot of generation ``llamacpp``,
    its one model labelled ``model``."""
    return _read(text, cl.PREFIX, cl.SPECS, LLAMACPP_FIELDS, Engine.LLAMACPP, lambda _labels: "0",
                 lambda _labels: model)


def engine_of_exposition(text: str) -> Engine | None:
    """The engine whose families an exposition holds (the first such family decides), or None."""
    prefixes = ((cs.PREFIX, Engine.SGLANG), (cl.PREFIX, Engine.LLAMACPP), (cv.VLLM_PREFIX, Engine.VLLM),
                *((prefix, Engine.VLLM) for prefix in cv.RAY_PREFIXES))
    for line in text.splitlines():
        name = line.split(None, 3)[2] if line.startswith("# TYPE ") and len(line.split()) > 2 else line
        for prefix, engine in prefixes:
            if name.startswith(prefix):
                return engine
    return None


def parse_engine_exposition(text: str, engine: str | None = None, *, model: str = LLAMACPP_MODEL) -> EngineSnapshot:
    """Parse ``text`` as ``engine``'s exposition (``None`` or ``auto``: the engine its families name; vLLM
    when none); ``model`` labels llama.cpp's series."""
    if not isinstance(text, str):
        return EngineSnapshot(generation=None, parse_errors=1)
    chosen = engine if engine in (Engine.SGLANG, Engine.LLAMACPP, Engine.VLLM) else engine_of_exposition(text)
    if chosen == Engine.SGLANG:
        return parse_sglang(text)
    if chosen == Engine.LLAMACPP:
        return parse_llamacpp(text, model)
    return parse_exposition(text)


OLLAMA_ROOT_TEXT = "Ollama is running"
"""What Ollama's ``GET /`` answers (its liveness text)."""
LLAMACPP_METRICS_OFF = "--metrics"
"""What llama-server's ``/metrics`` refusal (501, metrics off) names: the flag that turns them on."""


def engine_of_answers(
    metrics_status: int | None, metrics_text: str, root_status: int | None, root_text: str,
) -> tuple[Engine | None, str]:
    """The engine an upstream is, from its answers to ``GET /metrics`` and ``GET /`` (None: not known yet),
    with how it was told: ``metrics`` (the families' names) or ``endpoint`` (Ollama's root text, llama-server's
    refusal of /metrics without ``--metrics``)."""
    if metrics_status == 200:
        engine = engine_of_exposition(metrics_text)
        if engine is not None:
            return engine, "metrics"
    if metrics_status == 501 and LLAMACPP_METRICS_OFF in metrics_text:
        return Engine.LLAMACPP, "endpoint"
    if root_status == 200 and root_text.strip() == OLLAMA_ROOT_TEXT:
        return Engine.OLLAMA, "endpoint"
    return None, "none"
