"""Warm a cold server: wait for its health endpoint, then send small requests until TTFT settles."""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from exporters.errors import ConfigError
from serving.loadtest.client import send_request
from serving.loadtest.pacing import Clock, Sleep
from serving.loadtest.prompts import RequestPlan, build_payload, prompt_text
from serving.loadtest.spec import MAX_DURATION_S, MAX_REQUESTS, base_url, check_range, check_url, endpoint


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
        check_range("--window", self.window, 2, 1000)
        check_range("--max-requests", self.max_requests, self.window, MAX_REQUESTS)
        check_range("--timeout", self.timeout_s, 0.0, MAX_DURATION_S, open_low=True)
        check_range("--settle-ratio", self.settle_ratio, 0.0, 1.0, open_low=True)
        check_range("--settle-floor-ms", self.settle_floor_s, 0.0, 60.0)
        check_health_path(self.health_path)
        return self


def check_health_path(path: str) -> str:
    """Return ``path`` when it starts with ``/``; raise ConfigError otherwise."""
    if not path.startswith("/"):
        raise ConfigError("--health-path", "must start with /", path)
    return path


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


PROBE_TIMEOUT_S = 5.0


async def wait_healthy(
    session: aiohttp.ClientSession, url: str, *, deadline: float, poll_s: float, clock: Clock, sleep: Sleep
) -> tuple[bool, str]:
    """Poll GET ``url`` until it answers 200 or ``deadline`` (a ``clock`` time) passes; return (ok, last seen)."""
    last = "no answer yet"
    while True:
        remaining = deadline - clock()
        if remaining <= 0:
            return False, last
        timeout_s = min(PROBE_TIMEOUT_S, remaining)
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
                await response.read()
                if response.status == 200:
                    return True, "200"
                last = f"status {response.status}"
        except TimeoutError:
            if timeout_s == PROBE_TIMEOUT_S or last == "no answer yet":  # a probe cut short by the deadline
                last = "timed out"  # would hide the answer seen before it
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
    base = base_url(spec.url)
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
        text = prompt_text(spec.prompt_tokens, result.requests)
        plan = RequestPlan(None if spec.chat else text, [{"role": "user", "content": text}] if spec.chat else None,
                           spec.max_tokens)
        answer = await send_request(session, url, build_payload(spec.model, plan, stream=True, ignore_eos=False),
                                    timeout_s=min(spec.request_timeout_s, remaining), index=result.requests)
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
