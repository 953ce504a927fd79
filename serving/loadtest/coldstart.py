"""Cold starts in the middle of a run: restart the upstream, then measure restart -> ready -> first token.

A restart runs the restart command (``--restart-cmd``, through the shell) while the health URL
is polled every ``poll_s``. The upstream counts as ready at the first 200 after the command has
ended and a failed probe was seen (when every probe succeeded, at the end of the command: it
blocked while the upstream was down). Then one small streamed request measures the first token
a client gets. The latency shock is the p99 end-to-end latency of the run's successful requests
sent in the window before the restart and in the window after ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from serving.loadtest.client import RequestResult, send_request
from serving.loadtest.errors import LoadTestError
from serving.loadtest.pacing import Clock, Sleep
from serving.loadtest.prompts import RequestPlan, build_payload, prompt_text
from serving.loadtest.stats import Distribution

Restart = Callable[[], Coroutine[Any, Any, None]]
"""Restarts the upstream; returns when the restart command has ended, raises LoadTestError when it failed."""

PROBE_WORDS = 16
PROBE_MAX_TOKENS = 4


def shell_restart(command: str, *, timeout_s: float) -> Restart:
    """A restart that runs ``command`` through ``/bin/sh`` and fails on a non-zero exit status.

    The command runs in a session of its own; past ``timeout_s`` its whole process group is killed.
    """

    async def restart() -> None:
        process = await asyncio.create_subprocess_shell(command, stdin=asyncio.subprocess.DEVNULL,
                                                        stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        try:
            output, _ = await asyncio.wait_for(process.communicate(), timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
            raise LoadTestError(command, f"the restart command ran longer than {timeout_s:g} s") from None
        if process.returncode != 0:
            tail = output.decode("utf-8", "replace").strip()[-300:]
            raise LoadTestError(command, f"the restart command exited with status {process.returncode}: {tail}")

    return restart


@dataclass(slots=True)
class ColdStart:
    """One restart; times are seconds after the start of the run, None when not reached."""

    number: int
    restart_s: float
    command_done_s: float | None = None
    down_s: float | None = None
    ready_s: float | None = None
    first_token_s: float | None = None
    error: str = ""
    failed_indexes: tuple[int, ...] = ()
    """The failed requests that overlapped this restart (``restart_failures``): the report's column and the
    requests the exit code excuses are this one set."""
    p99_before_s: float | None = None
    p99_after_s: float | None = None
    requests_before: int = 0
    requests_after: int = 0

    @property
    def failed_requests(self) -> int:
        """How many requests failed because of this restart."""
        return len(self.failed_indexes)

    @property
    def ready_after_s(self) -> float | None:
        """Restart to ready, in seconds."""
        return None if self.ready_s is None else self.ready_s - self.restart_s

    @property
    def first_token_after_s(self) -> float | None:
        """Restart to the first token a client got, in seconds."""
        return None if self.first_token_s is None else self.first_token_s - self.restart_s

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        names = ("number", "restart_s", "command_done_s", "down_s", "ready_s", "first_token_s", "error",
                 "failed_requests", "p99_before_s", "p99_after_s", "requests_before", "requests_after")
        return {**{n: getattr(self, n) for n in names}, "failed_request_indexes": list(self.failed_indexes),
                "ready_after_s": self.ready_after_s, "first_token_after_s": self.first_token_after_s}


def restart_offsets(count: int, total_s: float) -> list[float]:
    """``count`` restart times spread evenly over a run of ``total_s`` seconds (none at its ends)."""
    return [total_s * k / (count + 1) for k in range(1, count + 1)]


async def _healthy(session: aiohttp.ClientSession, url: str, timeout_s: float) -> bool:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as reply:
            await reply.read()
            return reply.status == 200
    except (aiohttp.ClientError, TimeoutError, OSError):
        return False


@dataclass(frozen=True, slots=True)
class Probe:
    """Where and what to probe: the health URL and the request that measures the first token."""

    health_url: str
    endpoint: str
    model: str
    poll_s: float = 0.1
    ready_deadline_s: float = 600.0


async def cold_start(
    number: int, restart: Restart, probe: Probe, session: aiohttp.ClientSession, *, origin: float, clock: Clock,
    sleep: Sleep,
) -> ColdStart:
    """Restart the upstream once and measure restart -> ready -> first token; a failure is kept in ``error``."""
    event = ColdStart(number, clock() - origin)
    command = asyncio.create_task(restart())
    deadline = clock() + probe.ready_deadline_s
    while clock() < deadline:
        healthy = await _healthy(session, probe.health_url, max(1.0, probe.poll_s * 10))
        now = clock() - origin
        if command.done() and event.command_done_s is None:
            event.command_done_s = now
            if command.exception() is not None:
                event.error = str(command.exception())
                return event
        if not healthy and event.down_s is None:
            event.down_s = now
        if healthy and command.done():
            event.ready_s = now
            break
        await sleep(probe.poll_s)
    else:
        event.error = f"not ready within {probe.ready_deadline_s:g} s of the restart"
        command.cancel()
        return event
    plan = RequestPlan(prompt_text(PROBE_WORDS, number), max_tokens=PROBE_MAX_TOKENS)
    answer = await send_request(session, probe.endpoint, build_payload(probe.model, plan, stream=True,
                                                                       ignore_eos=True), timeout_s=60.0)
    if answer.ok and answer.ttft_s is not None:
        event.first_token_s = event.ready_s + answer.ttft_s
    else:
        event.error = f"the first request after ready failed: {answer.error}: {answer.detail}"
    return event


def measure_shock(event: ColdStart, results: Sequence[RequestResult], window_s: float) -> None:
    """Fill in the p99 latency before and after a restart and the requests that failed because of it."""
    before = [r.e2e_s for r in results if r.ok and r.e2e_s is not None
              and event.restart_s - window_s <= r.sent_s < event.restart_s]
    end = event.ready_s if event.ready_s is not None else float("inf")
    after = [r.e2e_s for r in results if r.ok and r.e2e_s is not None and end <= r.sent_s < end + window_s]
    event.requests_before, event.requests_after = len(before), len(after)
    event.p99_before_s = Distribution.of(before).p99
    event.p99_after_s = Distribution.of(after).p99
    event.failed_indexes = restart_failures(results, event)


def restart_failures(results: Sequence[RequestResult], event: ColdStart) -> tuple[int, ...]:
    """Indexes of the failed requests that overlapped the restart (expected failures), in order.

    A request overlaps when it was still running as the restart began (sent before it, ended
    after it: the restart killed it) or was sent after it and before the upstream was ready again.
    """
    ready = event.ready_s if event.ready_s is not None else float("inf")
    return tuple(sorted(r.index for r in results if not r.ok
                        and r.sent_s + (r.e2e_s or 0.0) >= event.restart_s and r.sent_s < ready))


def unexpected_failures(results: Sequence[RequestResult], events: Sequence[ColdStart]) -> list[RequestResult]:
    """The failed requests that no restart explains (``ColdStart.failed_indexes`` of each, after
    ``measure_shock``): they make the load test's exit code 1."""
    expected = {index for event in events for index in event.failed_indexes}
    return [r for r in results if not r.ok and r.index not in expected]

