"""Live token counts of the requests in flight, written by the proxy, read by the KV-fragmentation signal.

Two ways to know a request's size while it runs:

- estimated (the default, free for vLLM): the prompt's tokens estimated from its characters
  with a tokens-per-character ratio calibrated on the ``usage`` that finished requests report
  (:class:`PromptSizeEstimator`), plus one token per content chunk streamed so far, read from
  the stream's own counter when the table is read (:meth:`InFlightTokens.track`);
- exact (``serve.exact_live_token_counts``): vLLM's ``/tokenize`` count and its per-chunk
  ``usage`` (:meth:`InFlightTokens.update`), at the price of an extra call per non-streamed
  request and usage serialized on every chunk.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.core import GaugeMetricFamily, Metric

from exporters.catalog.request import REQUESTS_IN_FLIGHT


@dataclass(frozen=True, slots=True)
class InFlight:
    """One request's current size in tokens (prompt plus generated so far)."""

    model: str
    tokens: int
    started_ns: int = 0
    """When the request entered the table (``time.monotonic_ns``: one clock for every process of the host)."""
    generating: bool = False
    """Its tokens are coming (a stream with content lately): vLLM is running it, whatever its place in line."""
    quiet_ns: int | None = None
    """How long since its latest content chunk when the table was read (None: no chunk yet, or not known). Among
    generating streams, the quietest is the likeliest to have been preempted since."""


GENERATING_WITHIN_NS = 2_000_000_000
"""A stream whose last content chunk came within this long is taken as running in vLLM. One whose tokens
stopped (preempted: back in vLLM's queue with its blocks freed, though it has had content) is not."""


class ContentCounter(Protocol):
    """What a stream's statistics offer: the content chunks seen so far (one token each), and when the last came."""

    @property
    def content_events(self) -> int:
        """Content chunks so far."""

    @property
    def last_content_ns(self) -> int | None:
        """``time.perf_counter_ns`` of the latest content chunk."""


class InFlightTokens:
    """A table ``request key -> [model, tokens, stream counter, start]``.

    It sits on the request path, so writes are a dict lookup and an item store, with no lock:
    each operation is a single atomic step under the GIL, and readers take a copy. A tracked
    stream costs nothing per chunk: its counter is read when the table is. With ``serve --workers``
    the primary also holds the other processes' tables (:meth:`set_remote`), merged in start order.
    """

    def __init__(self) -> None:
        self._table: dict[str, list[object]] = {}
        self._remote: dict[str, tuple[float, list[InFlight]]] = {}

    def update(self, key: str, model: str, tokens: int) -> None:
        """Set the token count of a request (exact mode: on start and on every usage chunk)."""
        entry = self._table.get(key)
        if entry is None:
            self._table[key] = [model, tokens, None, time.monotonic_ns()]
        else:
            entry[1] = tokens

    def track(self, key: str, model: str, prompt_tokens: int, stream: ContentCounter | None = None) -> None:
        """Enter a request with its (estimated) prompt size; a stream adds its content chunks as it goes."""
        self._table[key] = [model, prompt_tokens, stream, time.monotonic_ns()]

    def remove(self, key: str) -> None:
        """Forget a finished request."""
        self._table.pop(key, None)

    def has_local(self) -> bool:
        """Whether this process has a request in the table."""
        return bool(self._table)

    def local_snapshot(self) -> list[InFlight]:
        """A copy of this process's entries, in start order."""
        out, now_ns = [], time.perf_counter_ns()
        for model, tokens, stream, started in list(self._table.values()):
            generated, generating, quiet = 0, False, None
            if stream is not None:
                generated, last = stream.content_events, stream.last_content_ns  # type: ignore[attr-defined]
                quiet = now_ns - last if last is not None else None
                generating = quiet is not None and quiet < GENERATING_WITHIN_NS
            out.append(InFlight(str(model), int(tokens) + int(generated), started, generating, quiet))  # type: ignore[call-overload, arg-type]
        return out

    def set_remote(self, source: str, entries: list[InFlight], *, ttl_s: float) -> None:
        """Replace another process's entries; they count for ``ttl_s`` unless replaced again."""
        self._remote[source] = (time.monotonic() + ttl_s, entries)

    def snapshot(self) -> list[InFlight]:
        """A copy of the current entries (this process's and the fresh remote ones), in start order."""
        out = self.local_snapshot()
        if self._remote:
            now = time.monotonic()
            for source, (expires, entries) in list(self._remote.items()):
                if expires < now:
                    self._remote.pop(source, None)
                else:
                    out.extend(entries)
            out.sort(key=lambda entry: entry.started_ns)
        return out


class PromptSizeEstimator:
    """Tokens per prompt character, per model, learned from finished requests' ``usage``.

    Starts at ``initial`` (about four characters a token, English text under a BPE tokenizer)
    and moves towards each finished request's ratio by ``weight`` (an exponential average), so
    it follows the model's tokenizer and chat template without asking vLLM. At most
    ``max_models`` models are kept (the proxy's model labels are bounded the same way).
    """

    def __init__(self, initial: float = 0.25, weight: float = 0.05, max_models: int = 64) -> None:
        self._initial = initial
        self._weight = weight
        self._max_models = max_models
        self._ratio: dict[str, float] = {}

    def estimate(self, model: str, chars: int) -> int:
        """The estimated prompt tokens of ``chars`` characters for ``model``."""
        return round(chars * self._ratio.get(model, self._initial))

    def learn(self, model: str, chars: int, tokens: int) -> None:
        """Fold in a finished request's true prompt size."""
        if chars <= 0 or tokens <= 0:
            return
        ratio = tokens / chars
        current = self._ratio.get(model)
        if current is None:
            if len(self._ratio) < self._max_models:
                self._ratio[model] = ratio
            return
        self._ratio[model] = current + self._weight * (ratio - current)


class InFlightRequests:
    """Requests being proxied right now, by model and route: ``inferwatch_requests_in_flight`` at scrape time.

    The proxy adds a request once its model is known and removes it when it ends (a dict update
    each). With ``serve --workers`` the primary also holds the other processes' counts
    (:meth:`set_remote`), summed in.
    """

    def __init__(self) -> None:
        self._local: dict[tuple[str, str], int] = {}
        self._remote: dict[str, tuple[float, list[tuple[str, str, int]]]] = {}

    def precreate(self, key: tuple[str, str]) -> None:
        """Show ``(model, route)`` at zero before its first request."""
        self._local.setdefault(key, 0)

    def add(self, key: tuple[str, str]) -> None:
        """One more request of ``(model, route)``."""
        self._local[key] = self._local.get(key, 0) + 1

    def remove(self, key: tuple[str, str]) -> None:
        """One request of ``(model, route)`` ended."""
        self._local[key] -= 1

    def any_local(self) -> bool:
        """Whether this process is proxying a request now."""
        return any(self._local.values())

    def local_counts(self) -> list[tuple[str, str, int]]:
        """This process's ``(model, route, requests)``, zero counts included (the series stays)."""
        return [(model, route, count) for (model, route), count in list(self._local.items())]

    def set_remote(self, source: str, counts: list[tuple[str, str, int]], *, ttl_s: float) -> None:
        """Replace another process's counts; they count for ``ttl_s`` unless replaced again."""
        self._remote[source] = (time.monotonic() + ttl_s, counts)

    def counts(self) -> dict[tuple[str, str], int]:
        """Every process's requests in flight, by ``(model, route)``."""
        total = dict(self._local)
        now = time.monotonic()
        for source, (expires, counts) in list(self._remote.items()):
            if expires < now:
                self._remote.pop(source, None)
                continue
            for model, route, count in counts:
                total[model, route] = total.get((model, route), 0) + count
        return total

    def collect(self) -> Iterator[Metric]:
        """The ``inferwatch_requests_in_flight`` family (a registry collector)."""
        spec = REQUESTS_IN_FLIGHT
        family = GaugeMetricFamily(spec.name, spec.help, labels=spec.labels)
        for (model, route), count in sorted(self.counts().items()):
            family.add_metric([model, route], count)
        yield family
