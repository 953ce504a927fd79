"""Load generation and warm-up for an OpenAI-compatible server: vLLM directly, or through the sidecar.

A run is bounded (a request count, a duration, or both) and paced either by a fixed number of
concurrent workers (closed loop) or by an arrival rate on an absolute schedule (open loop: request
``i`` is due ``i / rate`` seconds after the start, however late the previous ones left). Each request
is measured from the client's side: time to the first content chunk (found by ``SseReader``), the
gaps between content chunks, end-to-end time, tokens from ``usage`` and the sidecar's ``x-trace-id``.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from exporters.errors import ConfigError
from serving.sse import SseReader

TRACE_HEADER = "x-trace-id"
MAX_REQUESTS = 1_000_000
MAX_DURATION_S = 86_400.0
MAX_CONCURRENCY = 4096
MAX_RATE = 100_000.0
MAX_TOKENS_LIMIT = 1_048_576
SLOWEST_SHOWN = 5
DETAIL_CHARS = 200
_WORDS = (
    "the", "of", "and", "to", "in", "is", "it", "you", "that", "was", "for", "on", "are", "with", "as", "his",
    "they", "be", "at", "one", "have", "this", "from", "or", "had", "by", "word", "but", "what", "some", "we",
    "can", "out", "other", "were", "all", "there", "when", "up", "use", "your", "how", "said", "an", "each", "she",
    "which", "do", "their", "time", "if", "will", "way", "about", "many", "then", "them", "write", "would", "like",
    "so", "these", "her", "long", "make", "thing", "see", "him", "two"
)

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """What to send, how much, and how fast."""

    url: str
    model: str
    requests: int | None = None
    duration_s: float | None = None
    concurrency: int | None = None
    rate: float | None = None
    stream: bool = True
    chat: bool = False
    prompt_tokens: int = 32
    max_tokens: int = 64
    ignore_eos: bool = False
    timeout_s: float = 60.0
    max_in_flight: int = 256

    def validate(self) -> LoadSpec:
        """Return the spec when it is bounded and in range; raise ConfigError naming the option otherwise."""
        check_url(self.url)
        if not self.model:
            raise ConfigError("--model", "must name the served model")
        if self.requests is None and self.duration_s is None:
            raise ConfigError("--requests", "a load test must be bounded: give a request count or a duration")
        _check_range("--requests", self.requests, 1, MAX_REQUESTS)
        _check_range("--duration", self.duration_s, 0.0, MAX_DURATION_S, open_low=True)
        if self.concurrency is not None and self.rate is not None:
            raise ConfigError("--rate", "give either a concurrency or a rate, not both", self.rate)
        if self.concurrency is None and self.rate is None:
            raise ConfigError("--concurrency", "give a concurrency (closed loop) or a rate (open loop)")
        _check_range("--concurrency", self.concurrency, 1, MAX_CONCURRENCY)
        _check_range("--rate", self.rate, 0.0, MAX_RATE, open_low=True)
        _check_range("--prompt-tokens", self.prompt_tokens, 1, MAX_TOKENS_LIMIT)
        _check_range("--max-tokens", self.max_tokens, 1, MAX_TOKENS_LIMIT)
        _check_range("--timeout", self.timeout_s, 0.0, MAX_DURATION_S, open_low=True)
        _check_range("--max-in-flight", self.max_in_flight, 1, MAX_CONCURRENCY)
        return self

    @property
    def endpoint(self) -> str:
        """The full URL requests are posted to."""
        return endpoint(self.url, chat=self.chat)


def _check_range(key: str, value: float | None, low: float, high: float, *, open_low: bool = False) -> None:
    if value is None:
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(key, "must be a finite number", value)
    if value < low or (open_low and value == low) or value > high:
        lower = f"> {low:g}" if open_low else f">= {low:g}"
        raise ConfigError(key, f"must be {lower} and <= {high:g}", value)


def check_url(url: str) -> str:
    """Return ``url`` when it is an http(s) URL with a host; raise ConfigError otherwise."""
    parts = urlsplit(url)
    try:
        port_ok = parts.port is None or parts.port > 0
    except ValueError:
        port_ok = False
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise ConfigError("--url", "must be an http:// or https:// base URL with a host, e.g. http://127.0.0.1:9100",
                          url)
    return url


def endpoint(url: str, *, chat: bool) -> str:
    """The completions (or chat completions) URL under a base URL, which may already end in ``/v1``."""
    base = url.rstrip("/")
    base = base.removesuffix("/v1")
    return f"{base}/v1/chat/completions" if chat else f"{base}/v1/completions"


def make_prompt(tokens: int, index: int) -> str:
    """About ``tokens`` common words (one token each in most vocabularies), starting at a word chosen by ``index``."""
    start = (index * 7) % len(_WORDS)
    return " ".join(_WORDS[(start + k) % len(_WORDS)] for k in range(tokens))


def build_payload(
    model: str, *, index: int, prompt_tokens: int, max_tokens: int, stream: bool, chat: bool, ignore_eos: bool
) -> dict[str, Any]:
    """The JSON body of request ``index``; streamed requests ask for the final usage chunk."""
    prompt = make_prompt(prompt_tokens, index)
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "stream": stream}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if stream:
        body["stream_options"] = {"include_usage": True}
    if ignore_eos:
        body["ignore_eos"] = True
    return body


@dataclass(slots=True)
class RequestResult:
    """One request as the client saw it; ``error`` is None when it succeeded."""

    index: int
    due_s: float = 0.0
    lag_s: float = 0.0
    status: int | None = None
    error: str | None = None
    detail: str = ""
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    e2e_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    trace_id: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the request succeeded."""
        return self.error is None


async def send_request(
    session: aiohttp.ClientSession, url: str, payload: dict[str, Any], *, timeout_s: float, index: int = 0
) -> RequestResult:
    """Post one request and measure it; never raises except on cancellation."""
    result = RequestResult(index=index)
    start_ns = time.perf_counter_ns()
    try:
        async with session.post(url, data=orjson.dumps(payload), headers={"Content-Type": "application/json"},
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            result.status = response.status
            result.trace_id = response.headers.get(TRACE_HEADER)
            if response.status >= 400:
                result.error = str(response.status)
                result.detail = _error_detail(await response.content.read(64 * 1024))
            elif payload.get("stream"):
                await _read_stream(response, result, start_ns)
            else:
                _read_body(await response.read(), result)
    except TimeoutError:
        result.error, result.detail = "timeout", f"no complete answer within {timeout_s:g} s"
    except aiohttp.ClientConnectorError as err:
        result.error, result.detail = "connection_error", str(err)
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as err:
        result.error, result.detail = "disconnected", str(err) or type(err).__name__
    except aiohttp.ClientError as err:
        result.error, result.detail = "client_error", f"{type(err).__name__}: {err}"
    except OSError as err:
        result.error, result.detail = "connection_error", f"{type(err).__name__}: {err}"
    result.e2e_s = (time.perf_counter_ns() - start_ns) / 1e9
    return result


async def _read_stream(response: aiohttp.ClientResponse, result: RequestResult, start_ns: int) -> None:
    reader = SseReader(strip_usage_chunk=False, strip_usage_field=False)
    async for data in response.content.iter_any():
        reader.feed(data, time.perf_counter_ns())
    reader.flush()
    stats = reader.stats
    result.ttft_s = stats.ttft_s(start_ns)
    result.itl_s = stats.gaps_s
    result.prompt_tokens = stats.prompt_tokens
    result.completion_tokens = stats.completion_tokens
    if stats.error is not None:
        result.error, result.detail = "stream_error", stats.error[:DETAIL_CHARS]
    elif not stats.done:
        result.error, result.detail = "incomplete_stream", "the stream ended without data: [DONE]"


def _read_body(raw: bytes, result: RequestResult) -> None:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        result.error, result.detail = "bad_response", f"not JSON: {raw[:80]!r}"
        return
    usage = body.get("usage") if isinstance(body, dict) else None
    if isinstance(usage, dict):
        result.prompt_tokens = usage.get("prompt_tokens")
        result.completion_tokens = usage.get("completion_tokens")


def _error_detail(raw: bytes) -> str:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw[:DETAIL_CHARS].decode("utf-8", "replace").strip()
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else (error or body)
    return str(message)[:DETAIL_CHARS]


@dataclass(frozen=True, slots=True)
class Slot:
    """A paced request: its index, when it was due (seconds after the start) and how late it left."""

    index: int
    due_s: float
    lag_s: float


async def paced_slots(
    rate: float, *, count: int | None, duration_s: float | None, clock: Clock, sleep: Sleep
) -> AsyncIterator[Slot]:
    """Yield request slots at ``rate`` per second on an absolute schedule: slot ``i`` is due at ``i / rate``.

    A slot that is already due is yielded at once (with its lag), so a late start never shifts
    the slots after it. Stops after ``count`` slots or at the first slot due at or after ``duration_s``.
    """
    if count is None and duration_s is None:
        raise ConfigError("--requests", "a paced run must be bounded: give a request count or a duration")
    start = clock()
    index = 0
    while count is None or index < count:
        due = index / rate
        if duration_s is not None and due >= duration_s:
            return
        wait = start + due - clock()
        if wait > 0:
            await sleep(wait)
        yield Slot(index, due, max(0.0, clock() - start - due))
        index += 1


@dataclass(frozen=True, slots=True)
class Progress:
    """A progress reading taken during a run."""

    elapsed_s: float
    done: int
    errors: int
    in_flight: int
    current_rps: float
    total: int | None
    duration_s: float | None


@dataclass(frozen=True, slots=True)
class Distribution:
    """Percentiles (linear interpolation between closest ranks) of one measurement, in its own unit."""

    count: int
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    mean: float | None = None
    min: float | None = None
    max: float | None = None

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution:
        """The distribution of ``values`` (all None when empty)."""
        if not values:
            return cls(0)
        ordered = sorted(values)
        return cls(len(ordered), percentile(ordered, 50), percentile(ordered, 90), percentile(ordered, 99),
                   statistics.fmean(ordered), ordered[0], ordered[-1])


def percentile(ordered: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of sorted values, interpolating linearly between closest ranks."""
    if not ordered:
        raise ValueError("percentile of no values")
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True, slots=True)
class Slow:
    """One of the slowest requests, for `inferwatch logs search --trace-id`."""

    index: int
    e2e_s: float
    status: int | None
    error: str | None
    trace_id: str | None


@dataclass(frozen=True, slots=True)
class LoadReport:
    """The summary of a run."""

    url: str
    model: str
    mode: str
    stream: bool
    sent: int
    ok: int
    failed: int
    errors: dict[str, int]
    error_details: dict[str, str]
    wall_s: float
    requests_per_s: float
    output_tokens_per_s: float
    prompt_tokens: int
    completion_tokens: int
    tokens_per_request: Distribution
    ttft_s: Distribution
    itl_s: Distribution
    e2e_s: Distribution
    slowest: list[Slow]
    trace_ids_missing: int
    max_start_lag_s: float

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (durations in seconds)."""
        def dist(d: Distribution) -> dict[str, Any]:
            return {k: getattr(d, k) for k in ("count", "p50", "p90", "p99", "mean", "min", "max")}

        return {
            "url": self.url, "model": self.model, "mode": self.mode, "stream": self.stream,
            "requests": {"sent": self.sent, "ok": self.ok, "failed": self.failed},
            "errors": dict(self.errors), "error_details": dict(self.error_details),
            "wall_s": self.wall_s, "requests_per_s": self.requests_per_s,
            "output_tokens_per_s": self.output_tokens_per_s,
            "tokens": {"prompt": self.prompt_tokens, "completion": self.completion_tokens,
                       "completion_per_request": dist(self.tokens_per_request)},
            "ttft_s": dist(self.ttft_s), "itl_s": dist(self.itl_s), "e2e_s": dist(self.e2e_s),
            "slowest": [{"index": s.index, "e2e_s": s.e2e_s, "status": s.status, "error": s.error,
                         "trace_id": s.trace_id} for s in self.slowest],
            "trace_ids_missing": self.trace_ids_missing, "max_start_lag_s": self.max_start_lag_s,
        }


def summarize(spec: LoadSpec, results: Sequence[RequestResult], wall_s: float) -> LoadReport:
    """Aggregate per-request results into a report."""
    ok = [r for r in results if r.ok]
    errors: dict[str, int] = {}
    details: dict[str, str] = {}
    for r in results:
        if r.error is not None:
            errors[r.error] = errors.get(r.error, 0) + 1
            details.setdefault(r.error, r.detail)
    completion = sum(r.completion_tokens or 0 for r in ok)
    timed = sorted((r for r in results if r.e2e_s is not None), key=lambda r: r.e2e_s or 0.0, reverse=True)
    per_second = wall_s if wall_s > 0 else math.inf
    return LoadReport(
        url=spec.endpoint, model=spec.model, mode="rate" if spec.rate is not None else "concurrency",
        stream=spec.stream, sent=len(results), ok=len(ok), failed=len(results) - len(ok),
        errors=dict(sorted(errors.items())), error_details=dict(sorted(details.items())),
        wall_s=wall_s, requests_per_s=len(ok) / per_second, output_tokens_per_s=completion / per_second,
        prompt_tokens=sum(r.prompt_tokens or 0 for r in ok), completion_tokens=completion,
        tokens_per_request=Distribution.of([r.completion_tokens for r in ok if r.completion_tokens is not None]),
        ttft_s=Distribution.of([r.ttft_s for r in ok if r.ttft_s is not None]),
        itl_s=Distribution.of([gap for r in ok for gap in r.itl_s]),
        e2e_s=Distribution.of([r.e2e_s for r in ok if r.e2e_s is not None]),
        slowest=[Slow(r.index, r.e2e_s or 0.0, r.status, r.error, r.trace_id) for r in timed[:SLOWEST_SHOWN]],
        trace_ids_missing=sum(1 for r in results if r.status is not None and not r.trace_id),
        max_start_lag_s=max((r.lag_s for r in results), default=0.0),
    )


class _Tracker:
    """Counts finished requests for progress lines."""

    def __init__(self, spec: LoadSpec, clock: Clock) -> None:
        self.spec = spec
        self.clock = clock
        self.start = clock()
        self.done = self.errors = self.in_flight = 0
        self._last_done, self._last_t = 0, self.start

    def finished(self, result: RequestResult) -> None:
        self.done += 1
        self.errors += 0 if result.ok else 1

    def reading(self) -> Progress:
        now = self.clock()
        interval = now - self._last_t
        rps = (self.done - self._last_done) / interval if interval > 0 else 0.0
        self._last_done, self._last_t = self.done, now
        return Progress(now - self.start, self.done, self.errors, self.in_flight, rps, self.spec.requests,
                        self.spec.duration_s)


async def run_load(
    spec: LoadSpec,
    *,
    clock: Clock = time.monotonic,
    sleep: Sleep = asyncio.sleep,
    on_progress: Callable[[Progress], None] | None = None,
    progress_every_s: float = 1.0,
) -> LoadReport:
    """Run a validated load test against ``spec.url`` and return its report."""
    spec.validate()
    payload_of = _payloads(spec)
    results: list[RequestResult] = []
    tracker = _Tracker(spec, clock)
    limit = spec.concurrency if spec.concurrency is not None else spec.max_in_flight
    connector = aiohttp.TCPConnector(limit=limit)
    ticker = asyncio.create_task(_tick(tracker, on_progress, progress_every_s)) if on_progress else None

    async def one(session: aiohttp.ClientSession, index: int, due_s: float, lag_s: float) -> None:
        tracker.in_flight += 1
        try:
            result = await send_request(session, spec.endpoint, payload_of(index), timeout_s=spec.timeout_s,
                                        index=index)
        finally:
            tracker.in_flight -= 1
        result.due_s, result.lag_s = due_s, lag_s
        results.append(result)
        tracker.finished(result)

    try:
        async with aiohttp.ClientSession(connector=connector) as session:
            if spec.rate is not None:
                await _open_loop(spec, session, one, clock, sleep)
            else:
                await _closed_loop(spec, session, one, clock, tracker.start)
    finally:
        if ticker is not None:
            ticker.cancel()
    wall_s = clock() - tracker.start
    if on_progress is not None:
        on_progress(tracker.reading())
    return summarize(spec, sorted(results, key=lambda r: r.index), wall_s)


def _payloads(spec: LoadSpec) -> Callable[[int], dict[str, Any]]:
    def payload(index: int) -> dict[str, Any]:
        return build_payload(spec.model, index=index, prompt_tokens=spec.prompt_tokens, max_tokens=spec.max_tokens,
                             stream=spec.stream, chat=spec.chat, ignore_eos=spec.ignore_eos)

    return payload


One = Callable[[aiohttp.ClientSession, int, float, float], Awaitable[None]]


async def _closed_loop(spec: LoadSpec, session: aiohttp.ClientSession, one: One, clock: Clock, start: float) -> None:
    """``concurrency`` workers, each sending its next request as soon as the previous one ends."""
    issued = 0
    limit = spec.requests if spec.requests is not None else MAX_REQUESTS

    async def worker() -> None:
        nonlocal issued
        while issued < limit:
            now = clock() - start
            if spec.duration_s is not None and now >= spec.duration_s:
                return
            index, issued = issued, issued + 1
            await one(session, index, now, 0.0)

    await asyncio.gather(*(worker() for _ in range(spec.concurrency or 1)))


async def _open_loop(spec: LoadSpec, session: aiohttp.ClientSession, one: One, clock: Clock, sleep: Sleep) -> None:
    """Requests started on the absolute schedule of ``paced_slots``, at most ``max_in_flight`` at a time."""
    assert spec.rate is not None
    gate = asyncio.Semaphore(spec.max_in_flight)
    tasks: set[asyncio.Task[None]] = set()

    async def gated(slot: Slot, lag_s: float) -> None:
        try:
            await one(session, slot.index, slot.due_s, lag_s)
        finally:
            gate.release()

    try:
        slots = paced_slots(spec.rate, count=spec.requests, duration_s=spec.duration_s, clock=clock, sleep=sleep)
        async for slot in slots:
            blocked_at = clock()
            await gate.acquire()
            task = asyncio.create_task(gated(slot, slot.lag_s + clock() - blocked_at))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()


async def _tick(tracker: _Tracker, on_progress: Callable[[Progress], None], every_s: float) -> None:
    """Report progress every ``every_s`` seconds of real time (the injected clock only paces requests)."""
    while True:
        await asyncio.sleep(every_s)
        on_progress(tracker.reading())


def format_progress(progress: Progress) -> str:
    """One progress line: how far, how fast right now, how many errors."""
    if progress.total is not None:
        where = f"{progress.done}/{progress.total} done"
    else:
        where = f"{progress.elapsed_s:.1f}/{progress.duration_s:g} s, {progress.done} done"
    return (f"loadtest: {where}, {progress.current_rps:.1f} req/s now, {progress.in_flight} in flight, "
            f"{progress.errors} errors")


@dataclass(frozen=True, slots=True)
class WarmupSpec:
    """How to warm a cold server: wait for health, then send small requests until TTFT settles."""

    url: str
    model: str
    max_requests: int = 50
    timeout_s: float = 300.0
    settle_ratio: float = 0.2
    settle_floor_s: float = 0.02
    window: int = 5
    health_path: str = "/health"
    chat: bool = False
    prompt_tokens: int = 16
    max_tokens: int = 4
    request_timeout_s: float = 60.0
    max_consecutive_failures: int = 3
    health_poll_s: float = 0.5

    def tolerance_s(self, median_s: float) -> float:
        """How far a TTFT may lie from the window's median and still count as settled."""
        return max(self.settle_ratio * median_s, self.settle_floor_s)

    def validate(self) -> WarmupSpec:
        """Return the spec when its values are in range; raise ConfigError naming the option otherwise."""
        check_url(self.url)
        if not self.model:
            raise ConfigError("--model", "must name the served model")
        _check_range("--window", self.window, 2, 1000)
        _check_range("--max-requests", self.max_requests, self.window, MAX_REQUESTS)
        _check_range("--timeout", self.timeout_s, 0.0, MAX_DURATION_S, open_low=True)
        _check_range("--settle-ratio", self.settle_ratio, 0.0, 1.0, open_low=True)
        _check_range("--settle-floor-ms", self.settle_floor_s, 0.0, 60.0)
        if not self.health_path.startswith("/"):
            raise ConfigError("--health-path", "must start with /", self.health_path)
        return self


@dataclass(slots=True)
class WarmupResult:
    """What a warm-up did and whether TTFT settled."""

    settled: bool = False
    reason: str = ""
    health_wait_s: float | None = None
    ttfts_s: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    requests: int = 0
    elapsed_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (durations in seconds)."""
        return {"settled": self.settled, "reason": self.reason, "health_wait_s": self.health_wait_s,
                "requests": self.requests, "ttfts_s": list(self.ttfts_s), "errors": dict(self.errors),
                "elapsed_s": self.elapsed_s}


@dataclass(frozen=True, slots=True)
class Spread:
    """How much the last few TTFTs vary: their median and the largest distance of one from it."""

    median_s: float
    deviation_s: float

    @property
    def ratio(self) -> float:
        """The deviation as a share of the median."""
        return self.deviation_s / self.median_s if self.median_s > 0 else math.inf


def ttft_spread(ttfts: Sequence[float], window: int) -> Spread | None:
    """The spread of the last ``window`` TTFTs (None when there are fewer)."""
    if len(ttfts) < window:
        return None
    last = ttfts[-window:]
    median = statistics.median(last)
    return Spread(median, max(abs(t - median) for t in last))


async def wait_healthy(
    session: aiohttp.ClientSession, url: str, *, deadline: float, poll_s: float, clock: Clock, sleep: Sleep
) -> tuple[bool, str]:
    """Poll GET ``url`` until it answers 200 or ``deadline`` (a ``clock`` time) passes; return (ok, last seen)."""
    last = "no answer yet"
    while True:
        remaining = deadline - clock()
        if remaining <= 0:
            return False, last
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=min(5.0, remaining))) as response:
                await response.read()
                if response.status == 200:
                    return True, "200"
                last = f"status {response.status}"
        except TimeoutError:
            last = "timed out"
        except (aiohttp.ClientError, OSError) as err:
            last = f"{type(err).__name__}: {err}"
        await sleep(max(0.0, min(poll_s, deadline - clock())))


async def warm_up(
    spec: WarmupSpec,
    *,
    clock: Clock = time.monotonic,
    sleep: Sleep = asyncio.sleep,
    on_step: Callable[[str], None] | None = None,
) -> WarmupResult:
    """Wait for the health endpoint, then send small streamed requests one at a time until TTFT settles."""
    spec.validate()
    say = on_step or (lambda _line: None)
    result = WarmupResult()
    start = clock()
    deadline = start + spec.timeout_s
    base = spec.url.rstrip("/").removesuffix("/v1")
    async with aiohttp.ClientSession() as session:
        healthy, last = await wait_healthy(session, base + spec.health_path, deadline=deadline,
                                           poll_s=spec.health_poll_s, clock=clock, sleep=sleep)
        if not healthy:
            result.reason = (f"GET {base}{spec.health_path} did not answer 200 within {spec.timeout_s:g} s "
                             f"(last: {last})")
            result.elapsed_s = clock() - start
            return result
        result.health_wait_s = clock() - start
        say(f"health: {base}{spec.health_path} answered 200 after {result.health_wait_s:.1f} s")
        result.reason = await _warm_requests(spec, session, result, deadline, clock, say)
    result.elapsed_s = clock() - start
    return result


async def _warm_requests(
    spec: WarmupSpec, session: aiohttp.ClientSession, result: WarmupResult, deadline: float, clock: Clock,
    say: Callable[[str], None],
) -> str:
    """Send the warm-up requests; return the reason the loop stopped (and set ``result.settled``)."""
    url = endpoint(spec.url, chat=spec.chat)
    failures_in_row = 0
    while result.requests < spec.max_requests:
        remaining = deadline - clock()
        if remaining <= 0:
            return f"the {spec.timeout_s:g} s budget ran out after {result.requests} requests; " + _spread_note(
                spec, result.ttfts_s)
        payload = build_payload(spec.model, index=result.requests, prompt_tokens=spec.prompt_tokens,
                                max_tokens=spec.max_tokens, stream=True, chat=spec.chat, ignore_eos=False)
        answer = await send_request(session, url, payload, timeout_s=min(spec.request_timeout_s, remaining),
                                    index=result.requests)
        result.requests += 1
        if answer.error is not None or answer.ttft_s is None:
            kind = answer.error or "no_content"
            result.errors[kind] = result.errors.get(kind, 0) + 1
            failures_in_row += 1
            say(f"request {result.requests}: failed ({kind}: {answer.detail or 'no content chunk'})")
            if failures_in_row >= spec.max_consecutive_failures:
                return (f"{failures_in_row} requests in a row failed; last: {kind}: "
                        f"{answer.detail or 'no content chunk'}")
            continue
        failures_in_row = 0
        result.ttfts_s.append(answer.ttft_s)
        say(f"request {result.requests}: TTFT {answer.ttft_s * 1000:.1f} ms")
        spread = ttft_spread(result.ttfts_s, spec.window)
        if spread is not None and spread.deviation_s < spec.tolerance_s(spread.median_s):
            result.settled = True
            return f"TTFT settled after {result.requests} requests: " + _spread_note(spec, result.ttfts_s)
    return f"{spec.max_requests} requests sent and TTFT has not settled; " + _spread_note(spec, result.ttfts_s)


def _spread_note(spec: WarmupSpec, ttfts: Sequence[float]) -> str:
    spread = ttft_spread(ttfts, spec.window)
    if spread is None:
        return f"fewer than {spec.window} successful requests to judge TTFT by"
    return (f"the last {spec.window} TTFTs lie within {spread.deviation_s * 1000:.1f} ms ({spread.ratio:.0%}) of "
            f"their median {spread.median_s * 1000:.1f} ms (allowed: {spec.settle_ratio:.0%} of it or "
            f"{spec.settle_floor_s * 1000:g} ms, whichever is larger)")
