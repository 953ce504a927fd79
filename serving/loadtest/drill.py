"""The kill drill: SIGKILL the engine under a steady load, restart it, and measure the recovery.

A steady closed-loop load runs for ``before_s`` (each worker backing off after a failed request as
a load test's do: ``backoff.Backoff`` with the load test's defaults); then the process (found by pid or by a pattern
matched against command lines) gets SIGKILL, the restart command runs, and readiness and the
first token are measured as for a cold start; the load goes on for ``after_s`` after the first
token. Beside the load, the sidecar (when there is one) is read every second: its
``inferwatch_upstream_process_restarts_total`` before and after, and the alerts of its embedded
rule engine (``/admin/alerts``) that were pending or firing after the kill.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import psutil
from prometheus_client.parser import text_string_to_metric_families

from exporters.catalog import process as cp
from exporters.errors import ConfigError
from serving.loadtest.backoff import INITIAL_MS, MAX_MS, Backoff
from serving.loadtest.client import RequestResult, send_request
from serving.loadtest.coldstart import ColdStart, Probe, Restart, cold_start
from serving.loadtest.prompts import RequestPlan, build_payload, prompt_text
from serving.loadtest.spec import base_url, endpoint
from serving.loadtest.stats import error_counts

ALERTS_PATH = "/admin/alerts"


def find_process(pid: int | None, pattern: str | None) -> psutil.Process:
    """The one process with ``pid``, or the one whose command line matches ``pattern`` (ConfigError otherwise)."""
    if pid is not None:
        try:
            return psutil.Process(pid)
        except psutil.NoSuchProcess:
            raise ConfigError("--pid", "no such process", pid) from None
    if not pattern:
        raise ConfigError("--pid", "give the process to kill: --pid PID or --match PATTERN")
    try:
        wanted = re.compile(pattern)
    except re.error as err:
        raise ConfigError("--match", f"not a regular expression: {err}", pattern) from None
    me = os.getpid()
    found = []
    for process in psutil.process_iter(["pid", "cmdline", "name"]):
        line = " ".join(process.info["cmdline"] or []) or (process.info["name"] or "")
        if process.info["pid"] != me and wanted.search(line):
            found.append(process)
    if len(found) != 1:
        listed = ", ".join(str(p.pid) for p in found[:10]) or "none"
        raise ConfigError("--match", f"must match exactly one process; matched {len(found)} ({listed})", pattern)
    return found[0]


@dataclass(frozen=True, slots=True)
class DrillSpec:
    """What to load, what to kill and how to bring it back."""

    url: str
    model: str
    restart: Restart
    sidecar_url: str | None = None
    health_path: str = "/health"
    concurrency: int = 2
    prompt_words: int = 32
    max_tokens: int = 32
    before_s: float = 10.0
    after_s: float = 10.0
    timeout_s: float = 60.0
    ready_deadline_s: float = 600.0


@dataclass(slots=True)
class DrillResult:
    """What the drill measured; times are seconds after the start of the load."""

    pid: int
    command: str
    recovery: ColdStart | None = None
    results: list[RequestResult] = field(default_factory=list)
    restarts_before: dict[str, float] | None = None
    restarts_after: dict[str, float] | None = None
    alerts: dict[str, str] = field(default_factory=dict)
    sidecar_note: str = ""

    @property
    def failed(self) -> int:
        """Requests that failed."""
        return sum(1 for r in self.results if not r.ok)

    @property
    def restarts_counted(self) -> dict[str, float] | None:
        """Restarts the sidecar counted during the drill, by reason (None without a sidecar)."""
        if self.restarts_before is None or self.restarts_after is None:
            return None
        reasons = set(self.restarts_before) | set(self.restarts_after)
        return {r: self.restarts_after.get(r, 0.0) - self.restarts_before.get(r, 0.0) for r in sorted(reasons)}

    @property
    def recovered(self) -> bool:
        """Whether the engine came back and answered a request."""
        return self.recovery is not None and not self.recovery.error and self.recovery.first_token_s is not None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        errors, details = error_counts(self.results)
        return {"pid": self.pid, "command": self.command, "recovered": self.recovered,
                "recovery": self.recovery.to_dict() if self.recovery else None,
                "requests": {"sent": len(self.results), "failed": self.failed}, "errors": errors,
                "error_details": details, "restarts_counted": self.restarts_counted, "alerts": dict(self.alerts),
                "sidecar_note": self.sidecar_note}


async def _restarts(session: aiohttp.ClientSession, sidecar: str) -> dict[str, float]:
    async with session.get(f"{sidecar}/metrics", timeout=aiohttp.ClientTimeout(total=5)) as reply:
        text = (await reply.read()).decode("utf-8", "replace")
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == cp.PROCESS_RESTARTS.series:
                counts[sample.labels.get("reason", "")] = sample.value
    return counts


async def watch_alerts(session: aiohttp.ClientSession, sidecar: str, into: dict[str, str]) -> None:
    """Every second, note each alert's strongest state (pending < firing) from the sidecar's rule engine."""
    while True:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError, orjson.JSONDecodeError):
            async with session.get(sidecar + ALERTS_PATH, timeout=aiohttp.ClientTimeout(total=5)) as reply:
                body = orjson.loads(await reply.read())
            for alert in body.get("alerts", []) if isinstance(body, dict) else []:
                name, state = alert.get("labels", {}).get("alertname", "?"), alert.get("state", "")
                if state in ("pending", "firing") and into.get(name) != "firing":
                    into[name] = state
        await asyncio.sleep(1.0)


async def kill_drill(spec: DrillSpec, process: psutil.Process, *, say: Callable[[str], None]) -> DrillResult:
    """Run the drill against ``process``."""
    result = DrillResult(process.pid, " ".join(process.cmdline()))
    origin = time.monotonic()
    stop = asyncio.Event()
    target = endpoint(spec.url, chat=False)

    async def worker(session: aiohttp.ClientSession, number: int) -> None:
        index = number
        backoff = Backoff(INITIAL_MS / 1000, MAX_MS / 1000, random.Random(number))  # noqa: S311 - jitter, not a secret
        pause_s = 0.0
        while not stop.is_set():
            plan = RequestPlan(prompt_text(spec.prompt_words, index), max_tokens=spec.max_tokens)
            sent = time.monotonic() - origin
            answer = await send_request(session, target, build_payload(spec.model, plan, stream=True,
                                                                       ignore_eos=True),
                                        timeout_s=spec.timeout_s, index=index)
            answer.sent_s, answer.retry, answer.backoff_s = sent, backoff.failures_in_a_row, pause_s
            result.results.append(answer)
            index += spec.concurrency
            pause_s = backoff.pause_after(answer.ok, answer.retry_after_s)
            if pause_s:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), pause_s)

    async def kill_and_restart() -> None:
        say(f"SIGKILL pid {process.pid} ({result.command[:80]})")
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
        await spec.restart()

    async with aiohttp.ClientSession() as session:
        sidecar = spec.sidecar_url.rstrip("/") if spec.sidecar_url else None
        if sidecar:
            try:
                result.restarts_before = await _restarts(session, sidecar)
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as err:
                result.sidecar_note = f"no sidecar metrics at {sidecar}: {type(err).__name__}: {err}"
                sidecar = None
        workers = [asyncio.create_task(worker(session, n)) for n in range(spec.concurrency)]
        watcher = None
        try:
            say(f"steady load at concurrency {spec.concurrency} for {spec.before_s:g} s")
            await asyncio.sleep(spec.before_s)
            if sidecar:
                watcher = asyncio.create_task(watch_alerts(session, sidecar, result.alerts))
            probe = Probe(base_url(spec.url) + spec.health_path, target, spec.model,
                          ready_deadline_s=spec.ready_deadline_s)
            result.recovery = await cold_start(1, kill_and_restart, probe, session, origin=origin,
                                               clock=time.monotonic, sleep=asyncio.sleep)
            say(f"recovery: {result.recovery.error or 'ready and answering'}; load goes on for {spec.after_s:g} s")
            await asyncio.sleep(spec.after_s)
        finally:
            stop.set()
            await asyncio.gather(*workers, return_exceptions=True)
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
        if sidecar:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError, ValueError):
                result.restarts_after = await _restarts(session, sidecar)
    return result
