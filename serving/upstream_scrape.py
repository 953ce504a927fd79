"""One upstream's /metrics, scraped: fetch, parse, publish, and the stale rule.

:class:`UpstreamScrape` is what the main upstream's watch (serving/engine_watch.py, which adds the GPU and
process polls) and each extra upstream's scrape (serving/extra_upstreams.py: the long lane, the canary, the
shadow) share. Each scrape fetches ``scrape.path`` with ``scrape.timeout_s`` and reads at most
``scrape.max_bytes``; a good answer is parsed (the configured engine's format, else the one its families name)
and published as an :class:`~exporters.collectors.EngineState`, a failure is counted by reason. The engine
series go stale, that is leave the exposition, once ``scrape.stale_after_failures`` scrapes in a row have
failed or a readiness probe found the upstream not ready, and come back with the next successful scrape of a
ready upstream.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import aiohttp
import structlog

from exporters import derive
from exporters.catalog import engine as ce
from exporters.catalog.engines import Engine
from exporters.collectors import EngineCollector, EngineState, SampledHistogram
from exporters.config import ScrapeConfig
from exporters.engine_parse import parse_engine_exposition
from exporters.engine_stats_wire import EngineStepStats
from exporters.inflight import InFlightTokens
from exporters.vllm_parse import EMPTY, EngineSnapshot
from serving.bounded_read import read_at_most

log = structlog.get_logger(__name__)


class UpstreamScrape:
    """The latest scrape of one upstream's /metrics, and the scrape that refreshes it."""

    def __init__(
        self,
        upstream: str,
        config: ScrapeConfig,
        *,
        readiness_lost: Callable[[], bool] | None = None,
        session_getter: Callable[[], aiohttp.ClientSession] | None = None,
        engine: Callable[[], str | None] | None = None,
        on_exposition: Callable[[str], None] | None = None,
        engine_steps: Callable[[float], list[EngineStepStats]] | None = None,
    ) -> None:
        """``engine``: the engine behind the upstream (None while unknown: the exposition's families tell how to
        read it; Ollama has no /metrics: no scrape); ``on_exposition`` hears each scraped text;
        ``readiness_lost``: whether the last readiness probe with an outcome found the upstream not ready, which
        takes the engine series out at once; ``engine_steps``: the stat-logger plugin's scheduler states since a
        time (the exact running batch)."""
        self.config = config
        self.upstream = upstream.rstrip("/")
        self.url = self.upstream + config.path
        self.latest_text: str | None = None
        self.latest_snapshot: EngineSnapshot = EMPTY
        self.state = EngineState(self.upstream)
        self._engine = engine or (lambda: None)
        self._on_exposition = on_exposition
        self._readiness_lost = readiness_lost
        self._session_getter = session_getter
        self._own_session: aiohttp.ClientSession | None = None
        self._failures: dict[str, int] = {}
        self._consecutive_failures = 0
        self._parse_errors = 0
        self._batch = SampledHistogram(ce.ENGINE_BATCH_REQUESTS.buckets or (1,))
        self._engine_steps = engine_steps
        self._batch_since = time.time()
        self._previous: tuple[dict[str, float], dict[str, float | None]] | None = None

    def collector(
        self, inflight: InFlightTokens | None = None, engine_step: Callable[[], EngineStepStats | None] | None = None,
    ) -> EngineCollector:
        """The scrape-health and engine families of this upstream, read from what it last published."""
        return EngineCollector(self.published_state, inflight, engine_step)

    def _session(self) -> aiohttp.ClientSession:
        if self._session_getter is not None:
            return self._session_getter()
        if self._own_session is None or self._own_session.closed:
            self._own_session = aiohttp.ClientSession()
        return self._own_session

    async def close(self) -> None:
        """Close the client session this scrape opened itself (none when it was given one)."""
        if self._own_session is not None:
            await self._own_session.close()

    async def scrape_once(self) -> None:
        """Fetch, parse and publish the upstream's /metrics once; failures are counted, never raised."""
        if self._engine() == Engine.OLLAMA:
            return  # no /metrics: serving/ollama_watch.py polls its models instead
        started = time.perf_counter()
        cfg = self.config
        reason: str | None = None
        text: str | None = None
        try:
            timeout = aiohttp.ClientTimeout(total=cfg.timeout_s)
            async with self._session().get(self.url, timeout=timeout) as response:
                if response.status != 200:
                    reason = "http_status"
                else:
                    body = await read_at_most(response.content, cfg.max_bytes)
                    if len(body) > cfg.max_bytes:
                        reason = "too_large"
                    else:
                        text = body.decode("utf-8", errors="replace")
        except TimeoutError:
            reason = "timeout"
        except aiohttp.ClientConnectionError:
            reason = "connect"
        except aiohttp.ClientError:
            reason = "error"
        if text is not None:
            duration = time.perf_counter() - started
            self._publish(text, duration, await self._serving_energy())
        else:
            self._fail(reason or "error", time.perf_counter() - started)

    async def safe_scrape(self) -> None:
        """:meth:`scrape_once` for a periodic job: a crash is logged, never raised."""
        try:
            await self.scrape_once()
        except Exception:
            log.exception("upstream_scrape_crashed", url=self.url)

    async def _serving_energy(self) -> dict[str, float | None]:
        """The energy counters of the GPUs serving this upstream (UUID -> joules), read right after a scrape;
        none known here (the main upstream's watch reads NVML)."""
        return {}

    def _fail(self, reason: str, duration: float) -> None:
        self._failures[reason] = self._failures.get(reason, 0) + 1
        self._consecutive_failures += 1
        log.debug("upstream_scrape_failed", url=self.url, reason=reason, in_a_row=self._consecutive_failures)
        self.state = EngineState(
            self.upstream, self.latest_snapshot, False, duration, tuple(sorted(self._failures.items())),
            self._parse_errors, self.state.last_success_timestamp, self.state.tokens_per_joule,
            self._batch.histograms(), self._consecutive_failures,
        )

    def _stale(self, state: EngineState) -> bool:
        """Whether the engine series are left out now: too many failed scrapes in a row, or readiness lost."""
        if state.consecutive_failures >= self.config.stale_after_failures:
            return True
        return self._readiness_lost is not None and self._readiness_lost()

    def published_state(self) -> EngineState:
        """The state the collector exports: the latest one, marked stale when the engine series must go."""
        state = self.state
        return dataclasses.replace(state, stale=True) if self._stale(state) else state

    def live_text(self) -> str | None:
        """The latest raw scrape while the engine series are exported, else None (for the rule engine's store)."""
        return None if self._stale(self.state) else self.latest_text

    def _publish(self, text: str, duration: float, energy: dict[str, float | None]) -> None:
        if self._on_exposition is not None:
            self._on_exposition(text)
        snapshot = parse_engine_exposition(text, self._engine())
        self._parse_errors += snapshot.parse_errors
        views = derive.model_views(snapshot)
        self._observe_batch(views)
        tpj = self._tokens_per_joule(views, energy)
        self.latest_text, self.latest_snapshot = text, snapshot
        self._consecutive_failures = 0
        self.state = EngineState(
            self.upstream, snapshot, True, duration, tuple(sorted(self._failures.items())), self._parse_errors,
            time.time(), tpj, self._batch.histograms(),
        )

    def _observe_batch(self, views: list[derive.ModelView]) -> None:
        """The running batch since the last scrape: every scheduler state the plugin sent (each change of the
        running count, and every 0.1 s while vLLM steps), when it is heard and vLLM serves one model; else the
        gauge this scrape read."""
        now = time.time()
        steps = self._engine_steps(self._batch_since) if self._engine_steps is not None else []
        self._batch_since = now
        for view in views:
            if steps and len(views) == 1:
                for step in steps:
                    self._batch.observe(view.model, step.running)
            elif view.running is not None:
                self._batch.observe(view.model, view.running)

    def _tokens_per_joule(
        self, views: list[derive.ModelView], energy: dict[str, float | None]
    ) -> tuple[tuple[str, float], ...]:
        """Each model's token increase over the serving GPUs' energy used since the last successful scrape."""
        tokens = {v.model: v.generation_tokens for v in views if v.generation_tokens is not None}
        previous, self._previous = self._previous, (tokens, energy)
        if previous is None:
            return ()
        before, energy_before = previous
        joules = derive.energy_used(energy_before, energy)
        out = []
        for model, count in sorted(tokens.items()):
            value = derive.tokens_per_joule(before.get(model), count, joules)
            if value is not None:
                out.append((model, value))
        return tuple(out)
