"""Soak: tens of thousands of mixed requests through a real `inferwatch serve`, a share of them faulty.

The fault-injecting fake upstream (tests/fakes/faulty_upstream.py) runs in its own process and the
sidecar in another; this process is the closed-loop client. Requests mix completions and chat,
streamed and not, several model names, prompt and output lengths; ``--fault-ratio`` of them ask
the upstream for a fault (``x-fault``), mostly ones that end fast and a few that end in the
sidecar's short read and request timeouts. Checks, with the goals of issue 10 §5: every request
gets a well-formed answer; the sidecar's asyncio tasks and file descriptors come back to where
they were after the warm-up (the first 5,000 requests, then idle until the embedded rule engine
has evaluated three times) and its resident memory stays flat; every log record offered to the
sink reaches the archive (every record is kept; the sidecar is stopped with SIGTERM to flush).

What grows with time is the rule engine's store: each series keeps its samples for the retention.
``--retention-s`` and ``--evaluation-interval-s`` shorten both for the run and ``--duration-s`` runs the
load that long, so that the store fills within the run; RSS is read under load every
``--sample-every-s``, and the section gives the bound per series, the slope while the store fills and
after, and the steady-state RSS (judged on the plateau when the run reaches it).

    .venv/bin/python benchmarks/soak.py [--requests 50000 | --duration-s 240] [--concurrency 32]
        [--fault-ratio 0.1] [--max-seconds 480] [--warmup-evaluations 3] [--retention-s 60]
        [--evaluation-interval-s 1] [--sample-every-s 5] [--no-write]

Writes the "## Soak" section of BENCHMARKS.md unless ``--no-write``; exits 1 when a goal is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import multiprocessing
import random
import sys
import tempfile
import threading
import time
import urllib.request
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psutil
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from alert_rules.config import RulesConfig
from alert_rules.engine_config import EngineConfig
from alert_rules.store import TRIM_SLACK
from benchmarks._common import machine, percentile, publish, revision
from exporters.catalog import pipeline as cat
from exporters.catalog.request import REQUESTS
from exporters.catalog.rules import RULE_EVALUATION_SECONDS, RULE_STORED_SERIES
from log_pipeline.query import Archive
from serving.proxy import TRACE_HEADER
from serving.tools.launcher import SidecarServer, free_port, start_sidecar
from tests.fakes.faulty_upstream import FAULT_HEADER

MODELS = ("fake-model", "llama-3.1-8b-instruct", "qwen2.5-7b-instruct", "mistral-7b-instruct")
PROMPT_WORDS = (3, 60, 600, 3000)
MAX_TOKENS = (1, 8, 32, 128)
# Faults that end within ~50 ms, by whether the request streams (each one exercises that mode).
FAST_FAULTS = {
    True: ("reset_before_status", "reset_mid_stream", "error_500_json", "error_500_html", "error_503_retry_after",
           "error_429_retry_after", "error_500_oom", "bad_json_event", "truncated_event", "no_done",
           "oversized_event", "mid_stream_error_event", "mid_stream_oom_event", "echo_prompt_400"),
    False: ("reset_before_status", "reset_mid_body", "error_500_json", "error_500_html", "error_503_retry_after",
            "error_429_retry_after", "error_500_oom", "echo_prompt_400", "own_cache_control"),
}
# Faults that end only in the sidecar's read timeout (silent) or request timeout (drip).
TIMEOUT_FAULTS = {True: ("silent_before_status", "silent_mid_stream", "drip"),
                  False: ("silent_before_status", "drip_body")}
TIMEOUT_SHARE = 0.02
"""Share of the faulty requests that get a timeout fault (each holds a worker up to REQUEST_TIMEOUT_S)."""
READ_TIMEOUT_S = 0.5
REQUEST_TIMEOUT_S = 2.0
MAX_EVENT_BYTES = 64 * 1024  # below the upstream's oversized event, so that it ends in an error event
CLIENT_TIMEOUT_S = 10.0
WARMUP_REQUESTS = 5000
WARMUP_EVALUATIONS = 3
"""Embedded rule-engine evaluations the warm-up waits for (idle) after its requests, by default: the
engine's store creates its series and query caches over its first evaluations."""
PROGRESS_EVERY_S = 5.0
SETTLE_S = 10.0
READINGS = 5
RSS_GROWTH_GOAL = 0.05
EXAMPLES = 10
SEED = 20261130

@dataclass(frozen=True, slots=True)
class Spec:
    """One request of the plan."""

    chat: bool
    stream: bool
    model: str
    prompt_words: int
    max_tokens: int
    fault: str | None

    def request(self) -> tuple[str, bytes, dict[str, str]]:
        """Path, JSON body and headers."""
        prompt = " ".join(f"w{i % 97}" for i in range(self.prompt_words))
        payload: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens, "stream": self.stream}
        payload.update({"messages": [{"role": "user", "content": prompt}]} if self.chat else {"prompt": prompt})
        headers = {"Content-Type": "application/json", **({FAULT_HEADER: self.fault} if self.fault else {})}
        return ("/v1/chat/completions" if self.chat else "/v1/completions"), orjson.dumps(payload), headers

    def describe(self) -> str:
        """A short description for examples."""
        kind = ("chat" if self.chat else "completions") + (" stream" if self.stream else "")
        return f"{kind} {self.model} max_tokens={self.max_tokens} fault={self.fault or 'none'}"


def plan_stream(fault_ratio: float, seed: int = SEED) -> Iterator[Spec]:
    """The request mix, drawn from a seeded generator, without end."""
    rng = random.Random(seed)
    while True:
        stream = rng.random() < 0.5
        fault = None
        if rng.random() < fault_ratio:
            pool = TIMEOUT_FAULTS if rng.random() < TIMEOUT_SHARE else FAST_FAULTS
            fault = rng.choice(pool[stream])
        yield Spec(rng.random() < 0.5, stream, rng.choice(MODELS), rng.choice(PROMPT_WORDS), rng.choice(MAX_TOKENS),
                   fault)


def plan(requests: int, fault_ratio: float, seed: int = SEED) -> list[Spec]:
    """The first ``requests`` of :func:`plan_stream`."""
    return list(itertools.islice(plan_stream(fault_ratio, seed), requests))


def sse_events(body: bytes) -> list[Any]:
    """The data of each event of a whole SSE body ("[DONE]" as that string).

    Raises:
        ValueError: the body is not a sequence of complete ``data:`` events with JSON data.
    """
    if not body.endswith(b"\n\n"):
        raise ValueError("the stream does not end at an event boundary")
    events = []
    for block in body[:-2].split(b"\n\n"):
        if not block.startswith(b"data: "):
            raise ValueError(f"not a data event: {block[:60]!r}")
        data = block[6:]
        events.append("[DONE]" if data == b"[DONE]" else orjson.loads(data))
    return events


def answer_problem(status: int, headers: Mapping[str, str], body: bytes) -> str | None:
    """What makes an answer malformed, or None when it is well formed.

    Well formed: the trace id header and either a JSON object (for an error status one with
    ``error.type`` and that ``trace_id``) or an SSE stream ending in [DONE] or in an error event with it.
    """
    trace_id = headers.get(TRACE_HEADER)
    if not trace_id:
        return f"no {TRACE_HEADER} header"
    if headers.get("Content-Type", "").startswith("text/event-stream"):
        try:
            events = sse_events(body)
        except ValueError as err:
            return f"SSE body: {err}"
        if "[DONE]" in events[:-1]:
            return "events after [DONE]"
        last = events[-1]
        error = last.get("error") if isinstance(last, dict) else None
        if last == "[DONE]" or (isinstance(error, dict) and error.get("trace_id") == trace_id):
            return None
        return "the stream ends neither in [DONE] nor in an error event with the trace id"
    try:
        obj = orjson.loads(body)
    except ValueError:
        return "the body is not JSON"
    if not isinstance(obj, dict):
        return "the JSON body is not an object"
    if status < 400:
        return None
    error = obj.get("error")
    if not isinstance(error, dict) or not isinstance(error.get("type"), str):
        return "a JSON error without error.type"
    return None if error.get("trace_id") == trace_id else "a JSON error without the trace id"


def tokens_in(body: bytes, spec: Spec) -> int:
    """Output tokens of a well-formed successful answer (the fake upstream sends one word per token)."""
    if spec.stream:
        return sum(1 for event in sse_events(body) if isinstance(event, dict) and event.get("choices"))
    choice = orjson.loads(body)["choices"][0]
    return len((choice["message"]["content"] if spec.chat else choice["text"]).split())


@dataclass
class Tally:
    """What the client saw."""

    total: int | None
    """Requests planned; None when the load runs for a time instead (``--duration-s``)."""
    sent: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    """Faults asked for, over the requests sent."""
    statuses: Counter[int] = field(default_factory=Counter)
    stream_ends: Counter[str] = field(default_factory=Counter)
    trace_ids: set[str] = field(default_factory=set)
    malformed: list[str] = field(default_factory=list)
    unanswered: list[str] = field(default_factory=list)
    clean_failed: list[str] = field(default_factory=list)
    """Fault-free requests not answered 200 with every token asked for."""

    @property
    def answered(self) -> int:
        """Requests that got a status line and a whole body."""
        return self.statuses.total()

    def judge(self, spec: Spec, status: int, headers: Mapping[str, str], body: bytes) -> None:
        """Count one answer and classify it."""
        self.statuses[status] += 1
        if trace_id := headers.get(TRACE_HEADER):
            self.trace_ids.add(trace_id)
        problem = answer_problem(status, headers, body)
        if problem is not None:
            self.malformed.append(f"{spec.describe()}: HTTP {status}: {problem}: {body[:120]!r}")
            return
        if headers.get("Content-Type", "").startswith("text/event-stream"):
            self.stream_ends["[DONE]" if sse_events(body)[-1] == "[DONE]" else "error event"] += 1
        if spec.fault is None and (status != 200 or tokens_in(body, spec) != spec.max_tokens):
            self.clean_failed.append(f"{spec.describe()}: HTTP {status}: {body[:160]!r}")


async def _one(session: aiohttp.ClientSession, spec: Spec, tally: Tally) -> None:
    path, body, headers = spec.request()
    tally.sent += 1
    if spec.fault:
        tally.faults[spec.fault] += 1
    try:
        async with session.post(path, data=body, headers=headers) as response:
            data = await response.read()
    except (aiohttp.ClientError, TimeoutError) as err:
        tally.unanswered.append(f"{spec.describe()}: {err!r}")
        return
    tally.judge(spec, response.status, response.headers, data)


async def _progress(tally: Tally) -> None:
    """A line on stderr every PROGRESS_EVERY_S, with the rate of the current phase."""
    started, before = time.monotonic(), tally.answered
    while True:
        await asyncio.sleep(PROGRESS_EVERY_S)
        rate = (tally.answered - before) / (time.monotonic() - started)
        print(f"soak: {tally.sent}/{tally.total or 'until the deadline'} sent, {tally.answered} answered "
              f"({rate:.0f} req/s in this phase), {len(tally.malformed)} malformed, "
              f"{len(tally.unanswered)} unanswered, {len(tally.clean_failed)} fault-free failed",
              file=sys.stderr, flush=True)


async def _load(url: str, specs: Iterable[Spec], concurrency: int, deadline: float, tally: Tally) -> None:
    """Send ``specs`` in a closed loop of ``concurrency`` workers until done or ``deadline`` (monotonic)."""
    connector = aiohttp.TCPConnector(limit=concurrency)
    pending = iter(specs)
    async with aiohttp.ClientSession(url, connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)) as session:

        async def worker() -> None:
            for spec in pending:
                if time.monotonic() > deadline:
                    return
                await _one(session, spec, tally)

        await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _soak(url: str, specs: Iterable[Spec], concurrency: int, deadline: float, tally: Tally) -> None:
    ticker = asyncio.create_task(_progress(tally))
    try:
        await _load(url, specs, concurrency, deadline, tally)
    finally:
        ticker.cancel()


def _send(sidecar: SidecarServer, specs: Iterable[Spec], concurrency: int, deadline: float, tally: Tally) -> float:
    """Send ``specs`` (see :func:`_load`); the seconds it took."""
    started = time.monotonic()
    asyncio.run(_soak(sidecar.base_url, specs, concurrency, deadline, tally))
    return time.monotonic() - started


@dataclass(frozen=True)
class Snapshot:
    """The sidecar process at rest: no request in flight, no client connected."""

    when: str
    requests: int
    tasks: int
    fds: int
    upstream_connections: int
    rss_bytes: int
    evaluations: int
    stored_series: int
    settled: bool
    """Whether it came to rest within SETTLE_S."""

    @property
    def other_fds(self) -> int:
        """Descriptors other than pooled upstream connections (listening sockets, files, event loop)."""
        return self.fds - self.upstream_connections


def _runtime(sidecar: SidecarServer) -> dict[str, int]:
    with urllib.request.urlopen(sidecar.base_url + "/admin/runtime", timeout=5) as response:
        return json.load(response)


def _scrape(sidecar: SidecarServer) -> dict[tuple[str, str], float]:
    """The sidecar's /metrics: sample values by (sample name, reason label or ""), summed over other labels."""
    with urllib.request.urlopen(sidecar.base_url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, sample.labels.get("reason", ""))
            out[key] = out.get(key, 0.0) + sample.value
    return out


def _evaluations(sidecar: SidecarServer) -> int:
    return int(_scrape(sidecar).get((RULE_EVALUATION_SECONDS.count, ""), 0))


def _await_evaluations(sidecar: SidecarServer, more: int, interval: float) -> None:
    """Wait (bounded) until the embedded rule engine, evaluating every ``interval`` s, has completed ``more``
    evaluations."""
    target = _evaluations(sidecar) + more
    give_up = time.monotonic() + (more + 1) * interval
    while (done := _evaluations(sidecar)) < target and time.monotonic() < give_up:
        print(f"soak: warm-up: waiting for the rule engine's evaluations ({done}/{target})", file=sys.stderr,
              flush=True)
        time.sleep(interval / 3)


def _connections(proc: psutil.Process, port: int, *, remote: bool) -> int:
    """The process's established TCP connections to (remote) or on (local) ``port``."""
    return sum(1 for c in proc.net_connections("tcp") if c.status == psutil.CONN_ESTABLISHED and c.raddr
               and (c.raddr.port if remote else c.laddr.port) == port)


def snapshot(when: str, sidecar: SidecarServer, upstream_port: int, requests: int) -> Snapshot:
    """Once the sidecar is at rest (or after SETTLE_S), the lowest of READINGS readings 0.1 s apart.

    Tasks come from ``GET /admin/runtime`` (its own handler included); descriptors, connections and
    memory are read from outside the process (psutil), between admin requests.
    """
    proc = psutil.Process(sidecar.pid)
    settle_by = time.monotonic() + SETTLE_S
    while not (settled := _runtime(sidecar)["active_requests"] == 0
               and _connections(proc, sidecar.port, remote=False) == 0) and time.monotonic() < settle_by:
        time.sleep(0.1)
    readings = []
    for _ in range(READINGS):
        tasks = _runtime(sidecar)["asyncio_tasks"]
        readings.append((tasks, proc.num_fds(), _connections(proc, upstream_port, remote=True)))
        time.sleep(0.1)
    rss = proc.memory_info().rss
    samples = _scrape(sidecar)
    return Snapshot(when, requests, min(r[0] for r in readings), min(r[1] for r in readings),
                    min(r[2] for r in readings), rss, int(samples.get((RULE_EVALUATION_SECONDS.count, ""), 0)),
                    int(samples.get((RULE_STORED_SERIES.series, ""), 0)), settled)


@dataclass
class Records:
    """The log pipeline's counters at the end of the load, and what the archive holds after shutdown."""

    offered: float
    kept: dict[str, float]
    dropped: dict[str, float]
    lost: dict[str, float]
    proxied: float
    archived: int = 0
    missing_trace_ids: int = 0

    @classmethod
    def read(cls, sidecar: SidecarServer) -> Records:
        """Scrape the sidecar's /metrics."""
        samples = _scrape(sidecar)

        def by_reason(name: str) -> dict[str, float]:
            return {reason: value for (sample, reason), value in samples.items() if sample == name}

        proxied = sum(v for (name, _), v in samples.items() if name == REQUESTS.series)
        return cls(samples.get((cat.LOG_RECORDS_SEEN.series, ""), 0.0), by_reason(cat.LOG_RECORDS_KEPT.series),
                   by_reason(cat.LOG_RECORDS_DROPPED.series), by_reason(cat.LOG_RECORDS_LOST.series), proxied)

    def count_archive(self, directory: Path, client_trace_ids: set[str]) -> None:
        """Count the archived records and the client's trace ids none of them carries."""
        seen: set[str] = set()
        for record in Archive(directory).records():
            self.archived += 1
            seen.add(str(record.get("trace_id")))
        self.missing_trace_ids = len(client_trace_ids - seen)


def _diagnostics(log_path: Path) -> tuple[Counter[str], list[str]]:
    """The sidecar's own log lines by level, and examples of those at error level or above or not JSON."""
    levels: Counter[str] = Counter()
    bad: list[str] = []
    for line in log_path.read_text(errors="replace").splitlines():
        try:
            level = str(json.loads(line).get("level", "none"))
        except (ValueError, AttributeError):
            level = "not JSON"
        levels[level] += 1
        if level in ("error", "critical", "not JSON") and len(bad) < EXAMPLES:
            bad.append(line[:300])
    return levels, bad


def _run_upstream(port: int) -> None:
    from aiohttp import web

    from tests.fakes.faulty_upstream import FaultyUpstream

    web.run_app(FaultyUpstream(record=False).app(), host="127.0.0.1", port=port, print=None, access_log=None,
                handler_cancellation=True, shutdown_timeout=1)


@dataclass(frozen=True)
class StoreConfig:
    """The embedded rule engine's settings the run gives the sidecar (None: the sidecar's default)."""

    retention_s: float | None = None
    """Raw samples and recorded (and ALERTS) series alike: ``--rule-engine-retention-s`` and
    ``--rule-engine-recorded-retention-s``."""
    evaluation_interval_s: float | None = None
    """``--rules-evaluation-interval-s``: one sample per series per evaluation."""

    @property
    def raw_retention(self) -> float:
        return self.retention_s or EngineConfig().retention_s

    @property
    def recorded_retention(self) -> float:
        return self.retention_s or EngineConfig().recorded_retention_s

    @property
    def interval(self) -> float:
        return self.evaluation_interval_s or RulesConfig().evaluation_interval_s

    def flags(self) -> list[str]:
        """The sidecar's command-line flags for these settings."""
        out = []
        if self.retention_s is not None:
            out += ["--rule-engine-retention-s", f"{self.retention_s:g}",
                    "--rule-engine-recorded-retention-s", f"{self.retention_s:g}"]
        if self.evaluation_interval_s is not None:
            out += ["--rules-evaluation-interval-s", f"{self.evaluation_interval_s:g}"]
        return out

    def fill_s(self) -> float:
        """Seconds after a series' first sample by which it holds the most samples it ever will."""
        return max(self.raw_retention, self.recorded_retention) * (1 + TRIM_SLACK) + self.interval


BYTES_PER_SAMPLE = array("q").itemsize + array("d").itemsize
"""A stored sample's share of its series' buffers: an int64 time and a float64 value (alert_rules/store.py)."""


def samples_bound(retention_s: float, interval_s: float) -> int:
    """The most samples a series holds: a series is trimmed once its oldest sample is TRIM_SLACK of the retention
    past it, and gets at most one sample per evaluation."""
    return int(retention_s * (1 + TRIM_SLACK) / interval_s) + 1


@dataclass(frozen=True)
class Reading:
    """The sidecar process under load, read every ``--sample-every-s``."""

    t_s: float
    """Seconds since the sidecar was ready."""
    requests: int
    rss_bytes: int
    stored_series: int


class Timeline:
    """A thread reading the sidecar's RSS (psutil) and its rule store's series (/metrics) at a fixed period."""

    def __init__(self, sidecar: SidecarServer, tally: Tally, every_s: float) -> None:
        self.readings: list[Reading] = []
        self.started = time.monotonic()
        self._sidecar, self._tally, self._every_s = sidecar, tally, every_s
        self._stop = threading.Event()
        self.quiet = threading.Lock()
        """Held while a snapshot reads the sidecar at rest, so that no reading of this thread is in flight."""
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def since_start(self) -> float:
        return time.monotonic() - self.started

    def _run(self) -> None:
        proc = psutil.Process(self._sidecar.pid)
        while not self._stop.wait(self._every_s):
            with self.quiet:
                self._read(proc)

    def _read(self, proc: psutil.Process) -> None:
        try:
            series = int(_scrape(self._sidecar).get((RULE_STORED_SERIES.series, ""), 0))
            self.readings.append(Reading(self.since_start(), self._tally.sent, proc.memory_info().rss, series))
        except (OSError, psutil.Error) as err:  # a slow scrape under load: skip this reading
            print(f"soak: timeline: reading skipped: {err!r}", file=sys.stderr, flush=True)

    def stop(self) -> list[Reading]:
        """Stop reading (idempotent); the readings so far."""
        self._stop.set()
        self._thread.join()
        return self.readings


def slope(points: Sequence[Reading]) -> float | None:
    """RSS growth over ``points``, bytes per second (least squares); None for fewer than 3 points."""
    if len(points) < 3:
        return None
    mean_t = sum(p.t_s for p in points) / len(points)
    mean_r = sum(p.rss_bytes for p in points) / len(points)
    var = sum((p.t_s - mean_t) ** 2 for p in points)
    return sum((p.t_s - mean_t) * (p.rss_bytes - mean_r) for p in points) / var if var else None


MIN_PLATEAU_READINGS = 6
EDGE_READINGS = 3
"""Readings whose median stands for the start and the end of the plateau."""


@dataclass(frozen=True)
class Growth:
    """RSS under load, split at the time the rule store can first be full."""

    warm_s: float
    fill_s: float
    """When the store can first hold all it ever will for the series present after the warm-up."""
    filling: list[Reading]
    full: list[Reading]

    @classmethod
    def split(cls, readings: Sequence[Reading], warm_s: float, store: StoreConfig) -> Growth:
        fill_s = warm_s + store.fill_s()
        return cls(warm_s, fill_s, [r for r in readings if warm_s <= r.t_s < fill_s],
                   [r for r in readings if r.t_s >= fill_s])

    @property
    def plateau_reached(self) -> bool:
        """Whether the run went on long enough past the fill to judge the plateau."""
        return len(self.full) >= MIN_PLATEAU_READINGS

    def edges(self) -> tuple[float, float]:
        """RSS at the start and at the end of the plateau: medians of its first and last EDGE_READINGS readings."""
        first = [float(r.rss_bytes) for r in self.full[:EDGE_READINGS]]
        last = [float(r.rss_bytes) for r in self.full[-EDGE_READINGS:]]
        return percentile(first, 0.5), percentile(last, 0.5)


@dataclass
class Result:
    """Everything one soak measured."""

    tally: Tally
    snapshots: list[Snapshot]
    records: Records
    exit_code: int | None
    levels: Counter[str]
    bad_lines: list[str]
    seconds: float
    """Time spent sending (the snapshots between the phases not included)."""
    timeline: list[Reading] = field(default_factory=list)
    warm_s: float = 0.0
    """When the warm-up ended (the "after warm-up" snapshot), seconds since the sidecar was ready."""
    store: StoreConfig = field(default_factory=StoreConfig)
    sample_every_s: float = 0.0

    def growth(self) -> Growth:
        return Growth.split(self.timeline, self.warm_s, self.store)


SAMPLE_EVERY_S = 5.0


def soak(requests: int, concurrency: int, fault_ratio: float, max_seconds: float,
         warmup_evaluations: int = WARMUP_EVALUATIONS, *, duration_s: float | None = None,
         store: StoreConfig | None = None, sample_every_s: float = SAMPLE_EVERY_S) -> Result:
    """Start the upstream and the sidecar, send the plan in two phases (warm-up, the rest), read everything.

    With ``duration_s``, the second phase runs that long on an endless plan instead of ``requests``."""
    store = store or StoreConfig()
    if duration_s is None:
        specs: Iterator[Spec] = iter(plan(requests, fault_ratio))
        total: int | None = requests
        warmup = min(WARMUP_REQUESTS, requests // 10)
    else:
        specs, total, warmup = plan_stream(fault_ratio), None, WARMUP_REQUESTS
    with tempfile.TemporaryDirectory(prefix="inferwatch-soak-") as directory:
        return _soak_in(Path(directory), specs, total, warmup, concurrency, max_seconds, warmup_evaluations,
                        duration_s, store, sample_every_s)


def _soak_in(directory: Path, specs: Iterator[Spec], total: int | None, warmup: int, concurrency: int,
             max_seconds: float, warmup_evaluations: int, duration_s: float | None, store: StoreConfig,
             sample_every_s: float) -> Result:
    """:func:`soak` with its logs, archive and the sidecar's log in ``directory``."""
    logs = directory / "logs"
    upstream_port = free_port()
    upstream = multiprocessing.Process(target=_run_upstream, args=(upstream_port,), daemon=True)
    upstream.start()
    tally = Tally(total)
    try:
        sidecar = start_sidecar(
            f"http://127.0.0.1:{upstream_port}", directory,
            ["--gpu-enabled", "false", "--logs-dir", str(logs), "--logs-success-sample-ratio", "1.0",
             "--serve-read-timeout-s", str(READ_TIMEOUT_S), "--serve-request-timeout-s", str(REQUEST_TIMEOUT_S),
             "--serve-max-event-bytes", str(MAX_EVENT_BYTES), *store.flags()],
            ready_path="/readyz")
        timeline = Timeline(sidecar, tally, sample_every_s)
        try:
            with timeline.quiet:
                snapshots = [snapshot("start", sidecar, upstream_port, 0)]
            deadline = time.monotonic() + max_seconds
            seconds = _send(sidecar, itertools.islice(specs, warmup), concurrency, deadline, tally)
            with timeline.quiet:
                snapshots.append(snapshot(f"after the first {tally.sent:,} requests", sidecar, upstream_port,
                                          tally.sent))
            _await_evaluations(sidecar, warmup_evaluations, store.interval)
            with timeline.quiet:
                snapshots.append(snapshot(f"after warm-up (+{warmup_evaluations} rule-engine evaluations, idle)",
                                          sidecar, upstream_port, tally.sent))
            warm_s = timeline.since_start()
            if duration_s is not None:
                deadline = time.monotonic() + duration_s
            seconds += _send(sidecar, specs, concurrency, deadline, tally)
            readings = timeline.stop()
            snapshots.append(snapshot("end", sidecar, upstream_port, tally.sent))
            records = Records.read(sidecar)
        finally:
            timeline.stop()
            sidecar.stop()
        assert sidecar.process.proc is not None
        records.count_archive(logs, tally.trace_ids)
        levels, bad_lines = _diagnostics(sidecar.process.log_path)
        return Result(tally, snapshots, records, sidecar.process.proc.returncode, levels, bad_lines, seconds,
                      readings, warm_s, store, sample_every_s)
    finally:
        upstream.terminate()
        upstream.join(10)


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def _per_min(rate: float | None) -> str:
    return "—" if rate is None else f"{rate * 60 / 2**20:+.2f} MiB/min"


def memory_goal(result: Result) -> tuple[str, bool]:
    """Resident memory flat: across the plateau once the rule store has filled, or else from warm-up to the end."""
    growth = result.growth()
    if growth.plateau_reached:
        first, last = growth.edges()
        change = last / first - 1
        return (f"resident memory flat once the rule engine's store has filled (from {growth.fill_s:.0f} s on, "
                f"{len(growth.full)} readings under load): {change:+.2%} ({_mib(first)} -> {_mib(last)}, medians of "
                f"the first and last {EDGE_READINGS} readings), slope {_per_min(slope(growth.full))}; "
                f"goal under {RSS_GROWTH_GOAL:.0%}", change < RSS_GROWTH_GOAL)
    warm, end = result.snapshots[-2], result.snapshots[-1]
    change = end.rss_bytes / warm.rss_bytes - 1
    return (f"resident memory growth after warm-up under {RSS_GROWTH_GOAL:.0%}: {change:+.2%} "
            f"({_mib(warm.rss_bytes)} -> {_mib(end.rss_bytes)}); the run ended before the rule engine's store could "
            f"fill ({growth.fill_s:.0f} s after the sidecar was ready), so this includes the store's growth",
            change < RSS_GROWTH_GOAL)


def goals(result: Result, concurrency: int) -> list[tuple[str, bool]]:
    """Each goal, in words with its measured figures, and whether it was met."""
    t, r = result.tally, result.records
    warm, end = result.snapshots[-2], result.snapshots[-1]
    dropped = sum(r.dropped.values())
    lost = sum(r.lost.values())
    pool_bound = 2 * concurrency + 2
    planned = "" if t.total is None else f" of {t.total:,} planned"
    return [
        (f"every request answered, well-formed: {t.answered:,} answered, {t.sent:,} sent{planned}, "
         f"{len(t.malformed)} malformed, {len(t.unanswered)} without an answer",
         t.answered == t.sent and (t.total is None or t.sent == t.total) and not t.malformed),
        (f"every fault-free request answered 200 with its tokens: {len(t.clean_failed)} not", not t.clean_failed),
        (f"the sidecar back at rest (no request in flight, no client connection) within {SETTLE_S:g} s of each "
         f"phase: {sum(s.settled for s in result.snapshots)} of {len(result.snapshots)} readings",
         all(s.settled for s in result.snapshots)),
        (f"no asyncio task left behind: {end.tasks} at the end, {warm.tasks} after warm-up", end.tasks <= warm.tasks),
        (f"no file descriptor left behind: {end.other_fds} besides pooled upstream connections at the end, "
         f"{warm.other_fds} after warm-up; {end.upstream_connections} pooled upstream connections "
         f"(bound: 2 x concurrency + 2 = {pool_bound})",
         end.other_fds <= warm.other_fds and end.upstream_connections <= pool_bound),
        memory_goal(result),
        (f"every log record offered is archived: {r.offered:,.0f} offered for {t.sent:,} requests sent, "
         f"{dropped:,.0f} dropped, {lost:,.0f} lost, {r.archived:,} archived, {r.missing_trace_ids} of the "
         f"client's trace ids not in the archive; sidecar exit status {result.exit_code} after SIGTERM",
         r.offered == t.sent and dropped == 0 and lost == 0 and r.archived == r.offered
         and r.missing_trace_ids == 0 and result.exit_code == 0),
        (f"no error-level line in the sidecar's diagnostics: error {result.levels['error']}, "
         f"critical {result.levels['critical']}, not JSON {result.levels['not JSON']}",
         not result.bad_lines),
    ]


def _counts(counter: Mapping[Any, float]) -> str:
    return ", ".join(f"{key} {value:,.0f}" for key, value in sorted(counter.items(), key=lambda kv: str(kv[0]))) \
        or "none"


TIMELINE_ROWS = 16


def store_lines(result: Result) -> list[str]:
    """What grows with time: the rule store's bound per series, and RSS over time against it."""
    store, growth, end = result.store, result.growth(), result.snapshots[-1]
    raw, recorded = (samples_bound(retention, store.interval) for retention in (store.raw_retention,
                                                                                 store.recorded_retention))
    defaults = StoreConfig()
    default_raw, default_recorded = (samples_bound(retention, defaults.interval) for retention in (
        defaults.raw_retention, defaults.recorded_retention))
    settings = " ".join(store.flags()) or "the defaults"
    lines = [
        f"The embedded rule engine's store holds, per series, the samples of the last `rule_engine.retention_s` "
        f"(raw series) or `rule_engine.recorded_retention_s` (recorded and ALERTS series), one sample per evaluation, "
        f"and trims a series once its oldest sample is {TRIM_SLACK:.1%} of the retention past it. In this run "
        f"({settings}: retention {store.raw_retention:g} s raw, {store.recorded_retention:g} s recorded, an evaluation "
        f"every {store.interval:g} s) that is at most {raw:,} samples per raw series and {recorded:,} per recorded "
        f"one, {raw * BYTES_PER_SAMPLE:,} and {recorded * BYTES_PER_SAMPLE:,} bytes of sample buffers at "
        f"{BYTES_PER_SAMPLE} bytes a sample (an int64 time and a float64 value); for the {end.stored_series:,} series "
        f"in the store at the end, at most {_mib(end.stored_series * max(raw, recorded) * BYTES_PER_SAMPLE)} of sample "
        f"buffers. At the defaults ({defaults.raw_retention:,.0f} s, {defaults.recorded_retention:,.0f} s, every "
        f"{defaults.interval:g} s) "
        f"the bound is {default_raw:,} samples ({default_raw * BYTES_PER_SAMPLE / 1024:,.1f} KiB) per raw series and "
        f"{default_recorded:,} ({default_recorded * BYTES_PER_SAMPLE / 1024:,.1f} KiB) per recorded one, reached "
        f"{defaults.raw_retention * (1 + TRIM_SLACK) / 3600:.1f} h and "
        f"{defaults.recorded_retention * (1 + TRIM_SLACK) / 3600:.1f} h after a series first appears.",
        "",
    ]
    if not result.timeline:
        return lines
    before, after = slope(growth.filling), slope(growth.full)
    lines.append(
        f"RSS under load, read every {result.sample_every_s:g} s "
        f"({len(result.timeline)} readings): the warm-up ended {growth.warm_s:.0f} s after the sidecar was ready, so "
        f"the store could be full from {growth.fill_s:.0f} s on. Slope while it filled: {_per_min(before)} "
        f"({len(growth.filling)} readings); after: {_per_min(after)} ({len(growth.full)} readings).")
    if before is not None and growth.filling:
        series = percentile([float(r.stored_series) for r in growth.filling], 0.5)
        if series:
            per_sample = before * store.interval / series
            lines[-1] += (f" While it filled, RSS grew by {per_sample:,.0f} bytes per sample the store took in "
                          f"({series:,.0f} series, one sample each per {store.interval:g} s), against the "
                          f"{BYTES_PER_SAMPLE} of a sample's buffers.")
    if growth.plateau_reached:
        steady = [float(r.rss_bytes) for r in growth.full]
        lines[-1] += (f" Steady state: RSS {_mib(percentile(steady, 0.5))} (median of the {len(steady)} readings "
                      f"after the fill; {_mib(min(steady))} to {_mib(max(steady))}).")
    else:
        lines[-1] += (f" The run ended with {len(growth.full)} readings after the fill, fewer than "
                      f"{MIN_PLATEAU_READINGS}: it does not show the steady state (run longer than the retention, "
                      "e.g. `--retention-s 60 --evaluation-interval-s 1 --duration-s 240`).")
    step = max(1, -(-len(result.timeline) // TIMELINE_ROWS))
    shown = result.timeline[::step]
    if shown[-1] is not result.timeline[-1]:
        shown.append(result.timeline[-1])
    lines += ["", "| seconds since ready | requests sent | RSS | series in the store | |", "|---:|---:|---:|---:|---|",
              *(f"| {r.t_s:.0f} | {r.requests:,} | {_mib(r.rss_bytes)} | {r.stored_series:,} | "
                f"{'store full' if r.t_s >= growth.fill_s else 'filling' if r.t_s >= growth.warm_s else 'warm-up'} |"
                for r in shown)]
    return lines


def report(result: Result, args: argparse.Namespace, command: str) -> str:
    """The BENCHMARKS.md section, from the measurements."""
    t, r = result.tally, result.records
    first, warm, end = result.snapshots[1:]
    timeouts = sum(n for fault, n in t.faults.items() if fault in {*TIMEOUT_FAULTS[True], *TIMEOUT_FAULTS[False]})
    bounded = (f"bounded by count and by a {args.max_seconds:g} s cap" if t.total is not None
               else f"for {args.duration_s:g} s after the warm-up")
    checked = goals(result, args.concurrency)
    lines = [
        f"Command: `{command}` (revision {revision()}, {machine()}).",
        "",
        f"{t.sent:,} requests through a real `inferwatch serve` process in {result.seconds:.0f} s of sending "
        f"({t.answered / result.seconds:.0f} requests/s), closed loop at concurrency {args.concurrency}, {bounded}. "
        "The fault-injecting fake upstream "
        "(`tests/fakes/faulty_upstream.py`) runs in its own process, the client in a third; all three share the "
        "machine's cores. Mix (seeded): completions and chat, streamed and not (half each), models "
        f"{', '.join(MODELS)}, prompts of {'/'.join(map(str, PROMPT_WORDS))} words, max_tokens "
        f"{'/'.join(map(str, MAX_TOKENS))}. {t.faults.total():,} requests "
        f"({t.faults.total() / max(t.sent, 1):.0%}) carry an "
        f"`x-fault`: fast faults (streamed: {', '.join(FAST_FAULTS[True])}; non-streamed: "
        f"{', '.join(FAST_FAULTS[False])}) and {timeouts} timeout faults "
        f"({', '.join(sorted({*TIMEOUT_FAULTS[True], *TIMEOUT_FAULTS[False]}))}) against "
        f"`--serve-read-timeout-s {READ_TIMEOUT_S:g} --serve-request-timeout-s {REQUEST_TIMEOUT_S:g}`; "
        f"`--serve-max-event-bytes {MAX_EVENT_BYTES}` makes `oversized_event` end in an error event. The sidecar "
        "keeps every record (`--logs-success-sample-ratio 1.0`, `--logs-dir` in a temporary directory).",
        "",
        "Against the goals (issue 10 §5):",
        "",
        *(f"- {text}: **{'met' if ok else 'missed'}**." for text, ok in checked),
        "",
        "The sidecar at rest (no request in flight, the client's connections closed), the lowest of "
        f"{READINGS} readings 0.1 s apart; tasks from `GET /admin/runtime` (its own handler included), the rest "
        "read from outside the process with psutil:",
        "",
        "| when | requests so far | asyncio tasks | open fds | of them pooled upstream connections | RSS "
        "| rule-engine evaluations | series in its store |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *(f"| {s.when} | {s.requests:,} | {s.tasks} | {s.fds} | {s.upstream_connections} | "
          f"{s.rss_bytes / 2**20:.1f} MiB | {s.evaluations} | {s.stored_series:,} |" for s in result.snapshots),
        "",
        f"The warm-up waits, with no request in flight, for {args.warmup_evaluations} evaluations of the embedded "
        "rule engine: over that idle wait the store went from "
        f"{first.stored_series:,} to {warm.stored_series:,} series and RSS changed by "
        f"{(warm.rss_bytes - first.rss_bytes) / 2**20:+.1f} MiB; from then to the end, "
        f"{end.requests - warm.requests:,} requests later, by {(end.rss_bytes - warm.rss_bytes) / 2**20:+.1f} MiB "
        f"with {end.stored_series - warm.stored_series:+,} series.",
        "",
        *store_lines(result),
        "",
        f"Answers by status: {_counts(t.statuses)}. Streams ending in: {_counts(t.stream_ends)}. "
        f"Requests counted by the sidecar (`{REQUESTS.series}`): {r.proxied:,.0f}.",
        "",
        f"Log records: offered {r.offered:,.0f}; kept {_counts(r.kept)}; dropped {_counts(r.dropped)}; "
        f"lost {_counts(r.lost)}; archived (read back after SIGTERM) {r.archived:,}.",
        "",
        f"Sidecar diagnostics by level: {_counts(result.levels)}.",
    ]
    for title, examples in (("Malformed answers", t.malformed), ("Requests without an answer", t.unanswered),
                            ("Fault-free requests that failed", t.clean_failed),
                            ("Diagnostics at error level or not JSON", result.bad_lines)):
        if examples:
            lines += ["", f"{title} ({len(examples)}; first {min(len(examples), EXAMPLES)}):", "",
                      *(f"- `{example}`" for example in examples[:EXAMPLES])]
    return "\n".join(lines)


def main() -> int:
    """Run the soak, print (and unless --no-write, record) the section; 1 when a goal is missed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50_000, help="requests to send (default 50000)")
    parser.add_argument("--duration-s", type=float, help="send for this long after the warm-up instead of "
                        "--requests")
    parser.add_argument("--concurrency", type=int, default=32, help="closed-loop workers (default 32)")
    parser.add_argument("--fault-ratio", type=float, default=0.1, help="share of requests with a fault (0.1)")
    parser.add_argument("--max-seconds", type=float, default=480.0, help="time cap of the load (default 480)")
    parser.add_argument("--warmup-evaluations", type=int, default=WARMUP_EVALUATIONS,
                        help=f"rule-engine evaluations the warm-up waits for (default {WARMUP_EVALUATIONS})")
    parser.add_argument("--retention-s", type=float, help="the rule engine's raw and recorded retention "
                        "(default: the sidecar's)")
    parser.add_argument("--evaluation-interval-s", type=float, help="the rule engine's evaluation interval "
                        "(default: the sidecar's)")
    parser.add_argument("--sample-every-s", type=float, default=SAMPLE_EVERY_S,
                        help=f"seconds between RSS readings under load (default {SAMPLE_EVERY_S:g})")
    parser.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    args = parser.parse_args()
    if (args.requests < 10 or args.concurrency < 1 or not 0 <= args.fault_ratio <= 1 or args.max_seconds <= 0
            or args.warmup_evaluations < 0 or (args.duration_s is not None and args.duration_s <= 0)
            or any(v is not None and v <= 0 for v in (args.retention_s, args.evaluation_interval_s))
            or args.sample_every_s <= 0):
        parser.error("need --requests >= 10, --concurrency >= 1, 0 <= --fault-ratio <= 1, --max-seconds > 0, "
                     "--warmup-evaluations >= 0, and --duration-s, --retention-s, --evaluation-interval-s, "
                     "--sample-every-s > 0")
    result = soak(args.requests, args.concurrency, args.fault_ratio, args.max_seconds, args.warmup_evaluations,
                  duration_s=args.duration_s, store=StoreConfig(args.retention_s, args.evaluation_interval_s),
                  sample_every_s=args.sample_every_s)
    command = " ".join([".venv/bin/python benchmarks/soak.py", *sys.argv[1:]])
    text = report(result, args, command)
    publish("Soak", text, not args.no_write)
    return 0 if all(ok for _, ok in goals(result, args.concurrency)) else 1


if __name__ == "__main__":
    sys.exit(main())
