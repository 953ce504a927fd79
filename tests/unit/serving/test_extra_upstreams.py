"""``/metrics/upstream?name=...``: the extra upstreams' engines, one target at a time (serving/extra_upstreams.py),
in the built app against in-process fake upstreams serving captured real expositions."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from exporters.catalog import engine as ce
from serving.app import build_app, build_secondary_app
from serving.config import defaults, replace
from tests.fakes.openai_upstream import FakeOpenAI
from tests.harness.exposition import sample_sum

DATA = Path(__file__).resolve().parents[2] / "data"
MAIN_TEXT = (DATA / "vllm_v1_engine_0.32.prom").read_text()  # model tiny-llm
LONG_TEXT = (DATA / "vllm_v1_0.11.prom").read_text()  # model qwen-7b, two engines
CANARY_TEXT = (DATA / "sglang_0.5.23.prom").read_text()  # another engine than the main one
PATH = "/metrics/upstream"


def _own_sample(text: str, name: str, **labels: str) -> float:
    """An engine's own counter, summed over its engines (the truth the sidecar's series must equal)."""
    return sample_sum(text, name, **labels)


async def _fake(aiohttp_server: Callable[..., Awaitable[Any]], text: str, unhealthy_for: int = 0) -> tuple[str,
                                                                                                             FakeOpenAI]:
    fake = FakeOpenAI(metrics_text=text, unhealthy_for=unhealthy_for)
    return f"http://127.0.0.1:{(await aiohttp_server(fake.app())).port}", fake


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def _settings(main: str, tmp_path: Path, *, scrape: dict[str, Any] | None = None, **serve: Any) -> Any:
    settings = replace(defaults(), "serve", upstream=main, readiness_interval_s=0.1, **serve)
    settings = replace(replace(settings, "gpu", enabled=False), "logs", dir=str(tmp_path))
    return replace(settings, "scrape", **{"interval_s": 0.1, **(scrape or {})})


async def _text(client: Any, path: str, accept: str = "") -> tuple[int, str, str]:
    response = await client.get(path, headers={"Accept": accept} if accept else {})
    return response.status, response.headers["Content-Type"], await response.text()


async def _until(client: Any, path: str, predicate: Callable[[str], bool], timeout_s: float = 5.0) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        _status, _type, text = await _text(client, path)
        if predicate(text) or time.monotonic() > deadline:
            return text
        await asyncio.sleep(0.05)


async def test_each_extra_upstream_is_served_under_its_name_and_main_metrics_stay_the_mains(
    aiohttp_client: Any, aiohttp_server: Any, tmp_path: Path,
) -> None:
    """The long lane's and the canary's engine series (each read as its own engine: vLLM 0.11 and SGLang) are
    served under their names with the main engine's families and labels, their values the upstreams' own
    counters; /metrics holds the main upstream's alone."""
    main, _ = await _fake(aiohttp_server, MAIN_TEXT)
    long, _ = await _fake(aiohttp_server, LONG_TEXT)
    canary, _ = await _fake(aiohttp_server, CANARY_TEXT)
    client = await aiohttp_client(build_app(_settings(
        main, tmp_path, long_prompt_upstream=long, canary_upstream=canary, canary_weight=0.5)))
    tokens = ce.ENGINE_GENERATION_TOKENS.series
    status, content_type, long_text = await _text(client, f"{PATH}?name=long")
    assert (status, content_type) == (200, "text/plain; version=0.0.4; charset=utf-8")
    assert sample_sum(long_text, tokens, model_name="qwen-7b") == _own_sample(
        LONG_TEXT, "vllm:generation_tokens_total", model_name="qwen-7b") == 8000.0
    assert sample_sum(long_text, ce.SCRAPE_UP.series, upstream=long) == 1.0
    assert sample_sum(long_text, ce.SCRAPE_STALE.series, upstream=long) == 0.0
    assert sample_sum(long_text, tokens, model_name="tiny-llm") == 0.0  # not the main engine's
    _, _, canary_text = await _text(client, f"{PATH}?name=canary")
    assert sample_sum(canary_text, ce.ENGINE_INFO.series, generation="sglang") == 1.0
    assert sample_sum(canary_text, tokens) == _own_sample(CANARY_TEXT, "sglang:generation_tokens_total") == 96.0
    _, _, main_text = await _text(client, "/metrics")
    assert sample_sum(main_text, tokens, model_name="tiny-llm") == _own_sample(
        MAIN_TEXT, "vllm:generation_tokens_total", model_name="tiny-llm")
    assert {s.labels["upstream"] for f in text_string_to_metric_families(main_text) for s in f.samples
            if s.name in ce.SCRAPE_UP.sample_names()} == {main}
    assert sample_sum(main_text, tokens, model_name="qwen-7b") == 0.0


async def test_openmetrics_is_served_when_the_scraper_asks_for_it(
    aiohttp_client: Any, aiohttp_server: Any, tmp_path: Path,
) -> None:
    """The same content negotiation as /metrics: OpenMetrics (ending in # EOF) for a scraper that accepts it."""
    main, _ = await _fake(aiohttp_server, MAIN_TEXT)
    long, _ = await _fake(aiohttp_server, LONG_TEXT)
    client = await aiohttp_client(build_app(_settings(main, tmp_path, long_prompt_upstream=long)))
    status, content_type, text = await _text(client, f"{PATH}?name=long",
                                             "application/openmetrics-text; version=1.0.0")
    assert status == 200
    assert content_type.startswith("application/openmetrics-text")
    assert text.endswith("# EOF\n")
    assert f"# TYPE {ce.KV_USAGE.series} gauge\n" in text
    assert f"# TYPE {ce.SCRAPE_PARSE_ERRORS.name} counter\n" in text  # OpenMetrics: a counter without _total


async def test_an_unknown_or_unconfigured_name_is_404_listing_the_names(
    aiohttp_client: Any, aiohttp_server: Any, tmp_path: Path,
) -> None:
    """A name not configured (canary without a canary), an unknown one and none at all: 404 in the sidecar's JSON
    error shape, naming the upstreams there are; with none configured, the list is empty and says why."""
    main, _ = await _fake(aiohttp_server, MAIN_TEXT)
    long, _ = await _fake(aiohttp_server, LONG_TEXT)
    client = await aiohttp_client(build_app(_settings(main, tmp_path, long_prompt_upstream=long,
                                                      shadow_upstream=long, shadow_ratio=0.5)))
    for query in ("?name=canary", "?name=nonsense", ""):
        response = await client.get(PATH + query)
        body = orjson.loads(await response.read())
        assert response.status == 404, query
        assert response.headers["Content-Type"].startswith("application/json")
        assert body["error"]["upstreams"] == ["long", "shadow"]
        assert "this sidecar scrapes: long, shadow" in body["error"]["message"]
    _, _, shadow = await _text(client, f"{PATH}?name=shadow")  # one URL under two names: one scrape, both served
    assert sample_sum(shadow, ce.ENGINE_GENERATION_TOKENS.series) == 8000.0
    bare = await aiohttp_client(build_app(_settings(main, tmp_path / "bare")))
    response = await bare.get(f"{PATH}?name=long")
    body = orjson.loads(await response.read())
    assert (response.status, body["error"]["upstreams"]) == (404, [])
    assert "no serve.long_prompt_upstream" in body["error"]["message"]


async def test_an_extra_upstream_that_is_not_ready_or_down_goes_stale(
    aiohttp_client: Any, aiohttp_server: Any, tmp_path: Path,
) -> None:
    """A long lane whose /health answers 503 (its /metrics answering) exports scrape up 1, stale 1 and no engine
    series, and they come back once it is ready; a canary on a closed port: up 0, stale 1, no engine series."""
    main, _ = await _fake(aiohttp_server, MAIN_TEXT)
    long, fake = await _fake(aiohttp_server, LONG_TEXT, unhealthy_for=10**9)
    closed = _closed_port_url()
    client = await aiohttp_client(build_app(_settings(main, tmp_path, long_prompt_upstream=long,
                                                      canary_upstream=closed, canary_weight=0.5)))
    tokens = ce.ENGINE_GENERATION_TOKENS.series
    _, _, text = await _text(client, f"{PATH}?name=long")
    assert (sample_sum(text, ce.SCRAPE_UP.series), sample_sum(text, ce.SCRAPE_STALE.series)) == (1.0, 1.0)
    assert tokens not in text
    _, _, down = await _text(client, f"{PATH}?name=canary")
    assert (sample_sum(down, ce.SCRAPE_UP.series, upstream=closed),
            sample_sum(down, ce.SCRAPE_STALE.series, upstream=closed)) == (0.0, 1.0)
    assert sample_sum(down, ce.SCRAPE_FAILURES.series, upstream=closed, reason="connect") >= 1
    assert tokens not in down
    assert ce.KV_USAGE.series not in down
    fake.unhealthy_for = 0
    back = await _until(client, f"{PATH}?name=long", lambda t: sample_sum(t, ce.SCRAPE_STALE.series) == 0.0)
    assert sample_sum(back, tokens) == 8000.0


async def test_nothing_is_scraped_while_scraping_is_off(
    aiohttp_client: Any, aiohttp_server: Any, tmp_path: Path,
) -> None:
    """scrape.enabled false: no extra upstream is scraped either, and the 404 says why."""
    main, _ = await _fake(aiohttp_server, MAIN_TEXT)
    long, fake = await _fake(aiohttp_server, LONG_TEXT)
    client = await aiohttp_client(build_app(_settings(main, tmp_path, scrape={"enabled": False},
                                                      long_prompt_upstream=long)))
    response = await client.get(f"{PATH}?name=long")
    assert response.status == 404
    assert "scrape.enabled is false" in orjson.loads(await response.read())["error"]["message"]
    assert fake.health_checks >= 1  # the lane is still probed for readiness: only its /metrics is left alone


async def test_a_secondary_worker_answers_from_the_primary(aiohttp_client: Any, tmp_path: Path) -> None:
    """With ``serve --workers N`` a secondary process asks the primary (which scrapes) for /metrics/upstream, with
    the query."""
    asked: list[str] = []

    async def primary_answer(request: web.Request) -> web.Response:
        asked.append(request.path_qs)
        return web.Response(text="the primary's exposition")

    primary = web.Application()
    primary.router.add_get(PATH, primary_answer)
    runner = web.AppRunner(primary)
    await runner.setup()
    socket_path = str(tmp_path / "primary.sock")
    await web.UnixSite(runner, socket_path).start()
    try:
        settings = _settings("http://127.0.0.1:9", tmp_path, long_prompt_upstream="http://127.0.0.1:9")
        client = await aiohttp_client(build_secondary_app(settings, socket_path, 1, os.getppid()))
        response = await client.get(f"{PATH}?name=long")
        assert (response.status, await response.text()) == (200, "the primary's exposition")
        assert asked == [f"{PATH}?name=long"]
    finally:
        await runner.cleanup()


async def test_the_rule_engine_evaluates_each_extra_upstream_apart_and_sees_it_end(aiohttp_server: Any) -> None:
    """The embedded store ingests the long lane's families labelled upstream_name and instance: a rule on KV usage
    fires for it apart from the main engine (which has no series here), and once the lane loses readiness its
    series end and the alert with them."""
    from alert_rules.engine_config import EngineConfig
    from serving.extra_upstreams import ExtraUpstreams
    from serving.rule_engine import RuleRunner

    long, _ = await _fake(aiohttp_server, LONG_TEXT)
    lost = {"now": False}
    async with aiohttp.ClientSession() as session:
        extras = ExtraUpstreams({"long": long}, defaults().scrape, lambda: session, lambda _url: lost["now"])
        await extras.scrapes[long].scrape_once()
        rules = {"groups": [{"name": "kv", "interval": "1s", "rules": [
            {"alert": "KvUsed", "expr": f"{ce.KV_USAGE.series} >= 0"}]}]}
        runner = RuleRunner(EngineConfig(), rules, interval_s=1.0, extra_sources=extras.store_sources())
        t0 = 1_700_000_000_000
        runner.step(t0)
        firing = {(a["upstream_name"], a["instance"], a["model_name"]) for a in runner.firing.get("KvUsed", ())}
        lost["now"] = True
        runner.step(t0 + 1_000)
    assert firing == {("long", "long", "qwen-7b")}
    assert not runner.firing.get("KvUsed")
    assert runner.store.instant(ce.KV_USAGE.series, [], t0 + 1_000, 300_000) == []
