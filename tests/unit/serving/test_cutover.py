"""Release-day signals through the proxy and a fake upstream: retired names, text classes, the client, NFC."""

from __future__ import annotations

import unicodedata
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from serving import config as cfg
from serving.app import build_app
from serving.unicode_nfc import normalize_prompt_text
from tests.fakes.openai_upstream import FakeOpenAI

Clients = Callable[..., Awaitable[TestClient]]
EMOJI_16 = "\U0001f600\U0001f603\U0001f604\U0001f601\U0001f606\U0001f605\U0001f923\U0001f602" * 2


@pytest.fixture(name="setup")
async def _setup(
    aiohttp_server: Callable[..., Awaitable[TestServer]], aiohttp_client: Clients
) -> tuple[TestClient, CollectorRegistry]:
    upstream = await aiohttp_server(FakeOpenAI(model_name="m").app())
    settings = cfg.replace(cfg.defaults(), "serve", upstream=str(upstream.make_url("")).rstrip("/"),
                           retired_models=["m-old"], client_header="x-client-id")
    registry = CollectorRegistry()
    client = await aiohttp_client(build_app(settings, registry))
    return client, registry


async def _complete(client: TestClient, model: str, prompt: str, **headers: str) -> int:
    response = await client.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 2},
                                 headers=headers)
    await response.read()
    return response.status


async def test_a_retired_name_is_a_wrong_model_request(setup: Any) -> None:
    """Asking for a retired model counts once under its own name; asking for the served one does not."""
    client, registry = setup
    await _complete(client, "m", "hello")
    await _complete(client, "m-old", "hello", **{"x-client-id": "billing-batch"})
    assert registry.get_sample_value(
        "inferwatch_wrong_model_requests_total", {"model_name": "m-old", "reason": "retired_model"}) == 1
    assert registry.get_sample_value(
        "inferwatch_wrong_model_requests_total", {"model_name": "m", "reason": "other_model"}) is None


async def test_text_classes_are_counted_with_their_outcome(setup: Any) -> None:
    """Sixteen emoji make an emoji_dense request, Japanese a cjk one, English a plain one."""
    client, registry = setup
    for prompt in (EMOJI_16, "\u6771\u4eac\u306f\u65e5\u672c\u306e\u9996\u90fd", "plain words"):
        assert await _complete(client, "m", prompt) == 200
    for text_class in ("emoji_dense", "cjk", "plain"):
        assert registry.get_sample_value("inferwatch_text_class_requests_total", {
            "model_name": "m", "text_class": text_class, "outcome": "ok"}) == 1


def test_nfc_normalization_leaves_emoji_alone() -> None:
    """Emoji are already NFC: normalize_prompt_text changes nothing, so it could not have saved the crash."""
    payload = {"prompt": EMOJI_16 + "\U0001f468\u200d\U0001f469\u200d\U0001f467\U0001f44d\U0001f3fd"}
    assert unicodedata.is_normalized("NFC", payload["prompt"])
    assert not normalize_prompt_text(payload)


async def test_every_wrong_model_request_keeps_its_record_with_the_client(
    aiohttp_server: Callable[..., Awaitable[TestServer]], aiohttp_client: Clients, tmp_path: Any,
) -> None:
    """With no success sampled, the wrong-model request's record is still archived, naming its client."""
    from log_pipeline.query import Archive

    upstream = await aiohttp_server(FakeOpenAI(model_name="m").app())
    settings = cfg.replace(cfg.defaults(), "serve", upstream=str(upstream.make_url("")).rstrip("/"),
                           retired_models=["m-old"])
    settings = cfg.replace(settings, "logs", dir=str(tmp_path), success_sample_ratio=0.0, frame_max_ms=1.0)
    app = build_app(settings, CollectorRegistry())
    client = await aiohttp_client(app)
    ok = await client.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1})
    stale = await client.post("/v1/completions", json={"model": "m-old", "prompt": "x", "max_tokens": 1},
                              headers={"User-Agent": "old-sdk/0.9"})
    traces = ok.headers["x-trace-id"], stale.headers["x-trace-id"]
    await client.close()  # the sink flushes at shutdown
    kept = {r["trace_id"]: r for r in Archive(tmp_path).records()}
    assert traces[0] not in kept
    assert (kept[traces[1]]["wrong_model"], kept[traces[1]]["client"]) == ("retired_model", "old-sdk/0.9")
