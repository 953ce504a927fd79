"""The extra upstreams' engines (long lane, canary, shadow), scraped and served one target at a time.

Prometheus's multi-target exporter pattern: ``GET /metrics/upstream?name=NAME`` answers the engine and
scrape-health families of the extra upstream called NAME (``long``: serve.long_prompt_upstream, ``canary``:
serve.canary_upstream, ``shadow``: serve.shadow_upstream; those that are in use), the same families and labels
as the main upstream's on ``/metrics``, so every board and rule reads them unchanged; the scrape job names the
upstream with a label from ``__param_name`` (dashboards/compose/prometheus.yml, deploy/kubernetes/podmonitor.yaml).
An unknown name, or one not configured, gets 404 listing the names there are. Content negotiation is
``/metrics``'s (Prometheus text, OpenMetrics on request); like ``/metrics`` it needs no credential.

Each extra upstream is scraped by its own :class:`~serving.upstream_scrape.UpstreamScrape` every
``scrape.interval_s`` with the same timeout, size limit and stale rule as the main one: its engine series
leave its exposition after ``scrape.stale_after_failures`` failed scrapes in a row, and while its last
readiness probe (serving/upstream_choice.py's, every ``serve.readiness_interval_s``) failed. Its engine is
told by its own families (vLLM, SGLang or llama.cpp), whatever ``serve.engine`` says of the main upstream;
an Ollama upstream has no /metrics, so its scrape fails (``http_status``). Two names on one URL share one scrape.
Nothing of this touches the request path. With ``scrape.enabled`` false, nothing is scraped and every name is
unknown. The embedded rule engine's store ingests each name's families too (:meth:`ExtraUpstreams.store_sources`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from functools import partial

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from exporters.config import ScrapeConfig
from serving.background import PeriodicJobs
from serving.endpoints import error_response, metrics_handler
from serving.upstream_choice import UpstreamChoice
from serving.upstream_scrape import UpstreamScrape

EXTRA_METRICS_PATH = "/metrics/upstream"
UPSTREAM_NAME_LABEL = "upstream_name"
"""The label naming the extra upstream, added by the scrape job (from ``__param_name``) and by the rule engine."""


def extra_targets(choice: UpstreamChoice) -> dict[str, str]:
    """Name -> URL of each extra upstream in use (the long lane, the canary, the shadow)."""
    found = {"long": choice.long.url if choice.long else "", "canary": choice.canary.url if choice.canary else "",
             "shadow": choice.shadow.upstream if choice.shadow else ""}
    return {name: url for name, url in found.items() if url}


class ExtraUpstreams:
    """One scrape and one registry per extra upstream, and the ``/metrics/upstream`` handler that serves them."""

    def __init__(
        self, targets: Mapping[str, str], config: ScrapeConfig, session: Callable[[], aiohttp.ClientSession],
        readiness_lost: Callable[[str], bool],
    ) -> None:
        """``targets``: name -> URL; ``readiness_lost(url)``: whether that upstream's last readiness probe failed."""
        self.config = config
        self.scrapes: dict[str, UpstreamScrape] = {}
        """One per distinct URL."""
        self._registries: dict[str, CollectorRegistry] = {}
        by_url: dict[str, CollectorRegistry] = {}
        for name, url in (targets.items() if config.enabled else ()):
            if url not in by_url:
                scrape = self.scrapes[url] = UpstreamScrape(
                    url, config, session_getter=session, readiness_lost=partial(readiness_lost, url))
                registry = by_url[url] = CollectorRegistry()
                registry.register(scrape.collector())
            self._registries[name] = by_url[url]
        self._serve = {name: metrics_handler(registry) for name, registry in self._registries.items()}

    def store_sources(self) -> dict[str, tuple[CollectorRegistry, dict[str, str]]]:
        """For the embedded rule engine's store: each name's registry with the labels its samples get there
        (``upstream_name`` and an ``instance`` of their own, as the shipped scrape jobs label them: the rules
        aggregate the engine series by model_name and instance)."""
        return {f"upstream:{name}": (registry, {UPSTREAM_NAME_LABEL: name, "instance": name})
                for name, registry in self._registries.items()}

    @property
    def names(self) -> tuple[str, ...]:
        """The names ``/metrics/upstream`` answers."""
        return tuple(self._registries)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """The named extra upstream's families, or 404 listing the names there are."""
        name = request.query.get("name", "")
        serve = self._serve.get(name)
        if serve is not None:
            return await serve(request)
        if self.names:
            have = f"this sidecar scrapes: {', '.join(self.names)}"
        elif not self.config.enabled:
            have = "this sidecar scrapes none (scrape.enabled is false)"
        else:
            have = "this sidecar has none (no serve.long_prompt_upstream, canary_upstream or shadow_upstream in use)"
        return error_response(request, 404, f"no extra upstream named {name!r}; {have}",
                              fields={"upstreams": list(self.names)})

    def ctx(self) -> Callable[[web.Application], AsyncIterator[None]]:
        """A ``cleanup_ctx`` scraping each extra upstream every ``scrape.interval_s`` (first before serving)."""

        async def ctx(_app: web.Application) -> AsyncIterator[None]:
            if not self.scrapes:
                yield
                return
            jobs = PeriodicJobs()
            for url, scrape in self.scrapes.items():
                jobs.every(self.config.interval_s, scrape.safe_scrape, name=f"extra upstream scrape {url}")
            jobs.start()
            await asyncio.gather(*(scrape.safe_scrape() for scrape in self.scrapes.values()))
            yield
            jobs.stop()

        return ctx
