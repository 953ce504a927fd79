"""Release-day signals of the sidecar: wrong-model requests, text classes and the upstream's tokenizer fingerprint.

The proxy calls the :func:`request_describer` once per request (the requested model, the client, the prompt's
text class: cheap, no I/O); :meth:`CutoverWatch.observe` runs first among the observers of a finished
request and decides whether it was a wrong-model request, stamps the tokenizer fingerprint on its record and
span, and counts it. The fingerprint is taken in a background task whenever an upstream's readiness changes
to ready: ``/v1/models`` (which also gives the aliases), then ``/tokenize`` of every probe text per model.
Nothing here ever blocks or fails a request: a probe that fails leaves the last fingerprint as it was.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp
import orjson
import structlog
from opentelemetry.trace import Span
from prometheus_client import CollectorRegistry

from exporters.cutover_metrics import CutoverMetrics, TokenizerFingerprints
from exporters.model_match import ModelNames, aliases_from_models, model_names
from exporters.records import RequestRecord
from exporters.text_class import text_class
from exporters.tokenizer_drift import PROBE_TEXTS, fingerprint
from serving.config import ServeConfig
from serving.proxy import RequestDescriber

log = structlog.get_logger(__name__)

MAX_NAME_CHARS = 128
MAX_FINGERPRINTED_MODELS = 16
PROBE_TIMEOUT = aiohttp.ClientTimeout(total=10)


async def tokenize(session: aiohttp.ClientSession, upstream: str, model: str, text: str) -> list[int]:
    """The token ids ``upstream``'s vLLM gives ``text`` for ``model`` (its ``/tokenize``, no special tokens).

    Raises:
        aiohttp.ClientError, TimeoutError: the upstream did not answer.
        ValueError: it answered something else than a list of token ids.
    """
    body = orjson.dumps({"model": model, "prompt": text, "add_special_tokens": False})
    async with session.post(upstream.rstrip("/") + "/tokenize", data=body, timeout=PROBE_TIMEOUT,
                            headers={"Content-Type": "application/json"}) as response:
        payload = await response.json(loads=orjson.loads, content_type=None)
        if response.status != 200:
            raise ValueError(f"{upstream}/tokenize answered {response.status}: {str(payload)[:200]}")
    tokens = payload.get("tokens") if isinstance(payload, dict) else None
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise ValueError(f"{upstream}/tokenize answered no list of token ids")
    return tokens


async def models_payload(session: aiohttp.ClientSession, upstream: str) -> Any:
    """The upstream's ``/v1/models`` answer, decoded.

    Raises:
        aiohttp.ClientError, TimeoutError, ValueError: no JSON answer.
    """
    async with session.get(upstream.rstrip("/") + "/v1/models", timeout=PROBE_TIMEOUT) as response:
        return await response.json(loads=orjson.loads, content_type=None)


def request_describer(config: ServeConfig) -> RequestDescriber:
    """The proxy's call that puts the client, the requested model and the prompt's text class on a record."""
    client_header = config.client_header
    threshold = config.emoji_dense_threshold

    def describe(
        record: RequestRecord, headers: Mapping[str, str], payload: dict[str, Any] | None, texts: Sequence[str],
    ) -> None:
        client = headers.get(client_header) or headers.get("User-Agent")
        if client:
            record.client = client[:MAX_NAME_CHARS]
        if payload is None:
            return
        model = payload.get("model")
        if isinstance(model, str):
            record.requested_model = model[:MAX_NAME_CHARS]
        record.text_class = text_class(texts, threshold)  # the proxy's one walk of the prompt: Outgoing.texts

    return describe


class CutoverWatch:
    """Per-request release-day signals and the tokenizer fingerprints of the upstreams."""

    def __init__(
        self, config: ServeConfig, registry: CollectorRegistry, session: Callable[[], aiohttp.ClientSession],
    ) -> None:
        self._names: ModelNames = model_names(config.model_renames, config.retired_models)
        self._metrics = CutoverMetrics(registry)
        self.fingerprints = TokenizerFingerprints(registry)
        self._session = session
        self._ready: dict[str, bool] = {}
        self._refreshing: dict[str, asyncio.Task[None]] = {}

    def observe(self, record: RequestRecord, span: Span, *, generation: bool) -> None:
        """A finished request: wrong model or not, its tokenizer fingerprint, the counters, the span."""
        record.wrong_model = self._names.wrong_model(record.requested_model, record.response_model)
        if record.requested_model is not None:
            record.tokenizer_fingerprint = self.fingerprints.get(record.upstream, record.requested_model)
        self._metrics.observe(record, generation=generation)
        if span.is_recording():
            attributes: dict[str, str] = {"inferwatch.text_class": record.text_class}
            if record.tokenizer_fingerprint is not None:
                attributes["inferwatch.tokenizer.fingerprint"] = record.tokenizer_fingerprint
            if record.wrong_model is not None:
                attributes["inferwatch.wrong_model"] = record.wrong_model
            if record.client is not None:
                attributes["inferwatch.client"] = record.client
            span.set_attributes(attributes)

    # ---- readiness and the tokenizer fingerprint -----------------------------------------------
    def readiness(self, upstream: str, ready: bool) -> None:
        """Hear a readiness probe's outcome; a change to ready takes the fingerprint again (in the background)."""
        upstream = upstream.rstrip("/")
        changed = self._ready.get(upstream) != ready
        self._ready[upstream] = ready
        if not (changed and ready):
            return
        running = self._refreshing.get(upstream)
        if running is not None:
            running.cancel()
        self._refreshing[upstream] = asyncio.get_running_loop().create_task(self.refresh(upstream))

    async def refresh(self, upstream: str) -> None:
        """Learn the upstream's model aliases and fingerprint its tokenizer for each model; failures are logged."""
        session = self._session()
        try:
            payload = await models_payload(session, upstream)
            aliases = aliases_from_models(payload)
            self._names = self._names.with_aliases({**self._names.aliases, **aliases})
            for model in sorted(aliases)[:MAX_FINGERPRINTED_MODELS]:
                ids = [await tokenize(session, upstream, model, text) for text in PROBE_TEXTS]
                value = fingerprint(ids)
                if self.fingerprints.set(upstream, model, value):
                    log.warning("tokenizer_changed", upstream=upstream, model=model, fingerprint=value)
        except (aiohttp.ClientError, TimeoutError, ValueError) as err:
            log.warning("tokenizer_fingerprint_failed", upstream=upstream, error=repr(err))

    async def close(self) -> None:
        """Stop the probes still running."""
        tasks = list(self._refreshing.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


__all__ = ["CutoverWatch", "models_payload", "request_describer", "tokenize"]
