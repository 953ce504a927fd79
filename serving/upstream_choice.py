"""Which upstream serves a request, and what goes with it, chosen once per request before it goes out.

- Canary (serve.canary_upstream): serve.canary_weight of the clients, sticky per client. A client's
  key (the serve.client_header value, else its address), hashed with BLAKE2b to 64 bits, is
  a canary client's while it falls below weight x 2^64: the same client stays on its side for as
  long as the weight stays. Its requests carry ``role=canary``. Canary clients stay on the canary
  whatever their prompts' length: the canary is one upstream.
- Long-prompt lane (serve.long_prompt_upstream): a generation request whose prompt is estimated
  above serve.long_prompt_tokens goes there (``lane=long``). The estimate is the prompt's characters
  times the tokens-per-character ratio learnt from finished requests' usage
  (:class:`exporters.inflight.PromptSizeEstimator`); its error against the usage vLLM returns is
  ``inferwatch_prompt_estimate_to_usage_ratio`` and the record's ``prompt_tokens_estimate``. While the
  lane's last readiness probe failed, or when it refuses the connection (nothing was sent), a long
  prompt gets serve.long_prompt_fallback: ``main`` (the main upstream serves it) or ``refuse`` (503
  with Retry-After); either way the record's ``lane_fallback`` says why, and
  ``inferwatch_long_lane_fallbacks_total`` counts it.
- Priority (serve.pass_priority): the priority header's integer (higher = more important, as load
  shedding reads it) goes into the body's ``priority`` negated (vLLM: lower = earlier), unless the
  body has its own; the record gets its bounded class: ``high`` (> 0), ``default`` (0), ``low`` (< 0).
- Shadow (serve.shadow_upstream): whether a copy goes there, by the trace id's high 64 bits against
  serve.shadow_ratio x 2^64, so every process and every retry of a trace agrees (log sampling reads
  the low 64 bits: the two choices are independent).

With none of these set, :attr:`UpstreamChoice.active` is false and the proxy does not call in.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp
import structlog
from aiohttp import web

from exporters.inflight import PromptSizeEstimator
from exporters.records import Outcome, RequestRecord
from serving.admission import Refusal, request_priority
from serving.background import PeriodicJobs
from serving.config import ServeConfig
from serving.exchange import Exchange
from serving.upstream_http import UpstreamPool

if TYPE_CHECKING:
    from serving.shadow import ShadowCopies

log = structlog.get_logger(__name__)

_BOUND = 2**64
_PRIORITY_LIMIT = 2**62
"""Priorities are clamped to this magnitude: vLLM takes a 64-bit integer, and it is negated on the way."""


@dataclass(frozen=True, slots=True)
class Upstream:
    """One upstream a request can go to, with the labels its requests carry."""

    url: str
    pool: UpstreamPool
    lane: str = "default"
    role: str = "primary"


def _point(text: str) -> int:
    """A stable 64-bit point of ``text`` (BLAKE2b), the same in every process and on every restart."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


def priority_class(priority: int) -> str:
    """The bounded label of a priority: ``high``, ``default`` or ``low``."""
    return "high" if priority > 0 else "low" if priority < 0 else "default"


class UpstreamChoice:
    """The lane, role, priority and shadow decision of each request (see the module's docstring)."""

    def __init__(self, config: ServeConfig, main: UpstreamPool, estimator: PromptSizeEstimator,
                 shadow: ShadowCopies | None = None) -> None:
        self.main = Upstream(config.upstream.rstrip("/"), main)
        self.long = self._extra(config, config.long_prompt_upstream, lane="long")
        self.canary = self._extra(config, config.canary_upstream, role="canary") if config.canary_weight else None
        self.shadow = shadow if config.shadow_ratio else None
        self.ready: dict[str, bool] = {}
        """Each extra upstream's last readiness probe, by URL (absent before the first)."""
        self._estimator = estimator
        self._long_tokens = config.long_prompt_tokens
        self._refuse_long = config.long_prompt_fallback == "refuse"
        self._retry_after_s = config.retry_after_s
        self._canary_bound = round(config.canary_weight * _BOUND)
        self._client_header = config.client_header
        self._priority_header = config.priority_header if config.pass_priority else None
        self._shadow_bound = round(config.shadow_ratio * _BOUND)
        self.active = self.long is not None or self.canary is not None or self._priority_header is not None
        """Whether :meth:`choose` has anything to decide (else every request goes to :attr:`main`)."""

    @staticmethod
    def _extra(config: ServeConfig, url: str, **labels: str) -> Upstream | None:
        url = url.rstrip("/")
        return Upstream(url, UpstreamPool(url, config.connect_timeout_s), **labels) if url else None

    @property
    def extra_upstreams(self) -> tuple[str, ...]:
        """The URLs probed for readiness besides the main upstream: the long lane, the canary, the shadow."""
        found = (self.long.url if self.long else "", self.canary.url if self.canary else "",
                 self.shadow.upstream if self.shadow else "")
        return tuple(url for url in dict.fromkeys(found) if url)

    @property
    def label_pairs(self) -> tuple[tuple[str, str], ...]:
        """The (lane, role) pairs this sidecar's requests can carry."""
        pairs = [(self.main.lane, self.main.role)]
        pairs += [(u.lane, u.role) for u in (self.long, self.canary) if u is not None]
        return tuple(pairs)

    def choose(self, request: Exchange, payload: dict[str, Any] | None, record: RequestRecord) -> tuple[Upstream, bool]:
        """The upstream of one admitted request, and whether ``payload`` changed (its priority was added).

        Raises:
            Refusal: a long prompt while the long lane is down and serve.long_prompt_fallback is ``refuse``.
        """
        changed = False
        if self._priority_header is not None and payload is not None:
            changed = self._pass_priority(request.headers, payload, record)
        if self.canary is not None and self._is_canary_client(request):
            return self._to(self.canary, record), changed
        if self.long is not None and payload is not None and self._is_long(record):
            if self.ready.get(self.long.url) is False:
                return self.fall_back(record, "not_ready"), changed
            return self._to(self.long, record), changed
        return self.main, changed

    def fall_back(self, record: RequestRecord, reason: str) -> Upstream:
        """The main upstream for a long prompt the long lane cannot take, counted on the record.

        Raises:
            Refusal: serve.long_prompt_fallback is ``refuse``.
        """
        record.lane_fallback = reason
        if self._refuse_long:
            raise Refusal(503, Outcome.OVERLOADED, "long_lane_down",
                          f"the long-prompt lane is down ({reason}) and serve.long_prompt_fallback is refuse; "
                          "retry with exponential backoff", self._retry_after_s)
        return self._to(self.main, record)

    def shadow_for(self, record: RequestRecord) -> ShadowCopies | None:
        """Where a copy of this generation request goes, if it is sampled (by its trace id's high 64 bits)."""
        if self.shadow is None or int(record.trace_id[:16], 16) >= self._shadow_bound:
            return None
        return self.shadow

    @staticmethod
    def _to(upstream: Upstream, record: RequestRecord) -> Upstream:
        record.upstream, record.lane, record.role = upstream.url, upstream.lane, upstream.role
        return upstream

    def _is_canary_client(self, request: Exchange) -> bool:
        key = request.headers.get(self._client_header) or request.client_address
        return _point(key) < self._canary_bound

    def _is_long(self, record: RequestRecord) -> bool:
        if record.prompt_tokens_estimate is None:
            record.prompt_tokens_estimate = self._estimator.estimate(record.model, record.prompt_chars or 0)
        return record.prompt_tokens_estimate > self._long_tokens

    def _pass_priority(self, headers: Mapping[str, str], payload: dict[str, Any], record: RequestRecord) -> bool:
        priority = request_priority(headers, self._priority_header or "")
        record.priority_class = priority_class(priority)
        if priority == 0 or "priority" in payload:  # the client's own field wins
            return False
        payload["priority"] = -max(-_PRIORITY_LIMIT, min(_PRIORITY_LIMIT, priority))
        return True


async def _probe(session: aiohttp.ClientSession, url: str, path: str) -> bool:
    try:
        async with session.get(url + path, timeout=aiohttp.ClientTimeout(total=5)) as response:
            return response.status == 200
    except (aiohttp.ClientError, TimeoutError, OSError):
        return False


def readiness_ctx(
    choice: UpstreamChoice, session: Callable[[], aiohttp.ClientSession], path: str, interval_s: float,
    on_result: Callable[[str, bool], None],
) -> Callable[[web.Application], AsyncIterator[None]]:
    """A ``cleanup_ctx`` probing the extra upstreams (long lane, canary, shadow) every ``interval_s``."""

    async def probe_all() -> None:
        for url in choice.extra_upstreams:  # a probe never raises: a failure is a not-ready upstream
            ok = await _probe(session(), url, path)
            if choice.ready.get(url) != ok:
                log.info("upstream_readiness_changed", upstream=url, ready=ok)
            choice.ready[url] = ok
            if choice.shadow is not None and url == choice.shadow.upstream:
                choice.shadow.ready = ok
            on_result(url, ok)

    async def ctx(_app: web.Application) -> AsyncIterator[None]:
        if not choice.extra_upstreams:
            yield
            return
        jobs = PeriodicJobs()
        jobs.every(interval_s, probe_all, name="extra upstream readiness")
        await probe_all()
        jobs.start()
        yield
        jobs.stop()
        for upstream in (choice.long, choice.canary):
            if upstream is not None:
                upstream.pool.close()
        if choice.shadow is not None:
            choice.shadow.cancel_all()

    return ctx
