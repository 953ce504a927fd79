"""``serve --workers N``: N processes answer on one port (SO_REUSEPORT), one of them keeps the books.

The first process (the primary) is the whole sidecar: it proxies its share of the connections and
alone runs what must run once: the metrics registry behind ``/metrics``, the log archive writer,
the OTLP log shipper, the vLLM scraper and NVML reader, the rule engine, the readiness job and the
stat-logger plugin's UDP listener. It also listens on a private Unix socket and starts the other
N - 1 processes (secondaries) as copies of its own command line with ``--worker-of SOCKET``.

A secondary only proxies. Each finished request's record goes to the primary in small batches
over the Unix socket (:class:`RecordForwarder`, never on the request path: a batch leaves at
most :data:`FLUSH_INTERVAL_S` after the request ended), and the primary runs the same observers
on it as on its own requests: one registry, so counters and histograms are simply the sum of all
processes' requests and every latency keeps its trace-id exemplar; one archive writer. The
batches also carry the secondary's in-flight table (the KV-fragmentation estimate sees every
request) and their answer brings back which models are being shed (``serve.shed_on_degrade``).
``/metrics``, ``/readyz`` and ``/admin/*`` reaching a secondary are answered by the primary
(:class:`PrimaryForwarder`), so every connection sees the same view.

Limits: ``serve.max_inflight`` is shared out, each process admitting its part; a record still
batched in a secondary that is killed (not stopped) is lost, as is any request in flight there.
With the stat-logger plugin, the engine numbers of a secondary's requests reach the metrics and
the log record but not its span (the span ended in the secondary before the join).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from array import array
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import structlog
from aiohttp import web
from opentelemetry.trace import INVALID_SPAN, Span
from prometheus_client import CollectorRegistry, Counter

from exporters.catalog import request as cat
from exporters.errors import ConfigError
from exporters.inflight import InFlight, InFlightRequests, InFlightTokens
from exporters.records import AnswerPhases, Outcome, RequestRecord
from serving.front import Front

log = structlog.get_logger(__name__)

RECORDS_PATH = "/_inferwatch/worker/records"
"""Where secondaries post their records; answered on the primary's Unix socket only."""
GC_YOUNG_THRESHOLD = 20_000
"""Net allocations of container objects between two collections of the youngest generation."""
FORWARDED_PATHS = ("/metrics", "/metrics/upstream", "/readyz")
"""A secondary's own endpoints that the primary answers (with ``/admin/*``)."""
FLUSH_INTERVAL_S = 0.1
IDLE_INTERVAL_S = 1.0
"""With nothing to send, a secondary still asks the primary this often (which models are shed)."""
MAX_BATCH = 512
"""Records per post; more wait for the next one (a burst is sent in several)."""
MAX_PENDING = 65_536
"""Records a secondary holds while the primary does not answer; older ones are dropped first."""
REMOTE_INFLIGHT_TTL_S = 2.0
"""A secondary's in-flight table counts for this long after its last batch (a dead one's is forgotten)."""
RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0)
_RECORD_FIELDS = frozenset(f.name for f in fields(RequestRecord))


def shares(max_inflight: int, workers: int) -> int:
    """Each process's part of ``serve.max_inflight`` (rounded up, at least one)."""
    return max(1, math.ceil(max_inflight / workers))


def _wire_default(value: object) -> object:
    """What orjson cannot write itself: a record's gaps between tokens (``array('d')``) as a list."""
    if isinstance(value, array):
        return value.tolist()
    raise TypeError(f"cannot send {type(value).__name__} to the primary")


def record_from_wire(data: dict[str, Any]) -> RequestRecord:
    """The record a secondary sent (unknown keys ignored; engine numbers are joined here, never sent).

    Raises:
        ValueError: the data is not a record.
    """
    values = {key: value for key, value in data.items() if key in _RECORD_FIELDS and key != "engine"}
    try:
        values["outcome"] = Outcome(values.get("outcome", "ok"))
        if isinstance(values.get("answer_phases"), dict):  # Ollama's or llama.cpp's numbers, from their answer
            values["answer_phases"] = AnswerPhases(**values["answer_phases"])
        return RequestRecord(**values)
    except TypeError as err:
        raise ValueError(f"not a request record: {err}") from err


def from_unix_socket(request: web.Request) -> bool:
    """Whether the request came in on a Unix socket (the primary's private one), not over TCP."""
    transport = request.transport
    return transport is not None and isinstance(transport.get_extra_info("sockname"), str)


# ---- secondary side -----------------------------------------------------------------------------


class PrimaryLink:
    """A secondary's one HTTP client to its primary's Unix socket, shared by the records and the forwarded reads."""

    def __init__(self, socket_path: str) -> None:
        self._socket_path = socket_path
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        """The client, made on first use (inside the running loop)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.UnixConnector(self._socket_path))
        return self._session

    async def close(self, _app: web.Application | None = None) -> None:
        """Close the client (an ``on_cleanup`` callback, after the last records went)."""
        if self._session is not None:
            await self._session.close()


class RecordForwarder:
    """Collects a secondary's finished records and posts them to the primary, with its in-flight table."""

    def __init__(self, link: PrimaryLink, worker: int, inflight: InFlightTokens, requests: InFlightRequests) -> None:
        self._link = link
        self._worker = worker
        self._inflight = inflight
        self._requests = requests
        self._pending: list[RequestRecord] = []
        self.degraded: frozenset[str] = frozenset()
        """Models the primary's rule engine sheds (its InferwatchCircuitBreakerDegrade alerts)."""
        self.dropped = 0
        self._failing = False
        self._idle_sent = False
        self._last_sent = float("-inf")

    def observe(self, record: RequestRecord, _span: Span) -> None:
        """The secondary's only observer: queue the record for the next batch."""
        pending = self._pending
        pending.append(record)
        if len(pending) > MAX_PENDING:  # the primary has not answered for a long while
            del pending[0]
            self.dropped += 1

    async def flush(self) -> bool:
        """Post one batch (and the in-flight table); False when the primary did not take it."""
        batch = self._pending[:MAX_BATCH]
        inflight = [[e.model, e.tokens, e.started_ns, e.generating] for e in self._inflight.local_snapshot()]
        body = orjson.dumps({"worker": self._worker, "records": batch, "inflight": inflight,
                             "in_flight_requests": self._requests.local_counts()}, default=_wire_default)
        try:
            async with self._link.session().post(f"http://primary{RECORDS_PATH}", data=body,
                                          headers={"Content-Type": "application/json"},
                                          timeout=aiohttp.ClientTimeout(total=5)) as response:
                if response.status == 400:  # the primary cannot read it: retrying would block every later one
                    log.error("worker_records_refused", status=response.status, worker=self._worker,
                              records=len(batch), error=(await response.text())[:200])
                    del self._pending[: len(batch)]
                    self.dropped += len(batch)
                    return False
                if response.status != 200:
                    log.warning("worker_records_refused", status=response.status, worker=self._worker)
                    return False
                answer = await response.json(loads=orjson.loads)
        except (aiohttp.ClientError, TimeoutError, ValueError) as err:
            if not self._failing:  # once per outage, not every 0.1 s
                log.warning("worker_records_unsent", error=repr(err), worker=self._worker,
                            pending=len(self._pending), dropped=self.dropped)
            self._failing = True
            return False
        if self._failing:
            log.info("worker_records_sent_again", worker=self._worker, dropped=self.dropped)
            self._failing = False
        del self._pending[: len(batch)]
        self.degraded = frozenset(answer.get("degraded", ()))
        self._idle_sent = not batch and not inflight and not self._requests.any_local()
        self._last_sent = time.monotonic()
        return True

    async def run(self) -> None:
        """Flush every :data:`FLUSH_INTERVAL_S` (sooner while a burst is still queued; idle, every
        :data:`IDLE_INTERVAL_S` for the shedding state)."""
        while True:
            idle = (self._idle_sent and not self._pending and not self._inflight.has_local()
                    and not self._requests.any_local()
                    and time.monotonic() - self._last_sent < IDLE_INTERVAL_S)
            sent = False if idle else await self.flush()
            if not (sent and len(self._pending) >= MAX_BATCH):
                await asyncio.sleep(FLUSH_INTERVAL_S)

    async def close(self) -> None:
        """Send what is left (a few tries while the primary answers)."""
        for _ in range(20):
            if not self._pending:
                break
            if not await self.flush():
                await asyncio.sleep(0.1)
        if self._pending:
            log.warning("worker_records_lost_at_exit", records=len(self._pending), worker=self._worker)


def forwarder_ctx(forwarder: RecordForwarder) -> Callable[[web.Application], AsyncIterator[None]]:
    """Cleanup context: flush on a timer while the secondary runs, send the rest at shutdown."""

    async def ctx(_app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(forwarder.run())
        yield
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await forwarder.close()

    return ctx


class PrimaryForwarder:
    """Answers a secondary's request with the primary's answer to it (``/metrics``, ``/readyz``, admin)."""

    def __init__(self, link: PrimaryLink) -> None:
        self._link = link

    async def handle(self, request: web.Request) -> web.Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("accept", "authorization")}
        try:
            async with self._link.session().get(f"http://primary{request.path_qs}", headers=headers,
                                         timeout=aiohttp.ClientTimeout(total=10)) as answer:
                body = await answer.read()
                kept = {k: v for k, v in answer.headers.items() if k.lower() in ("content-type", "cache-control")}
                return web.Response(body=body, status=answer.status, headers=kept)
        except (aiohttp.ClientError, TimeoutError) as err:
            log.warning("worker_primary_unreachable", path=request.path, error=repr(err))
            return web.json_response({"error": {"message": "the primary sidecar process does not answer",
                                                "type": "primary_unreachable"}}, status=503)


async def watch_parent(parent_pid: int, socket_path: str) -> None:
    """Stop this secondary when the primary that started it is gone (it would be an orphan), and remove
    the socket the primary could not (it was killed)."""
    while os.getppid() == parent_pid:  # noqa: ASYNC110 - no event announces the parent's death: poll
        await asyncio.sleep(1.0)
    log.warning("worker_primary_gone", parent=parent_pid)
    socket = Path(socket_path)
    socket.unlink(missing_ok=True)  # noqa: ASYNC240 - one unlink on the way out
    with contextlib.suppress(OSError):  # another secondary may have been first, or the directory is not empty
        socket.parent.rmdir()
    os.kill(os.getpid(), signal.SIGTERM)


# ---- primary side -------------------------------------------------------------------------------


class RecordIntake:
    """The primary's end: records from secondaries go through the same finish as its own requests."""

    def __init__(
        self,
        finish: Callable[[RequestRecord, Span], None],
        inflight: InFlightTokens,
        requests: InFlightRequests,
        degraded: Callable[[], frozenset[str]],
        registry: CollectorRegistry,
    ) -> None:
        self._finish = finish
        self._inflight = inflight
        self._requests = requests
        self._degraded = degraded
        spec = cat.WORKER_RECORDS
        self.received = Counter(spec.name, spec.help, spec.labels, registry=registry)

    async def handle(self, request: web.Request) -> web.Response:
        """POST of a batch; 404 unless it came over the private Unix socket."""
        if not from_unix_socket(request):
            raise web.HTTPNotFound()
        try:
            batch = orjson.loads(await request.read())
            worker = int(batch["worker"])
            records = [record_from_wire(item) for item in batch["records"]]
            remote = [InFlight(str(m), int(t), int(s), bool(g)) for m, t, s, g in batch.get("inflight", [])]
            counts = [(str(m), str(r), int(n)) for m, r, n in batch.get("in_flight_requests", [])]
        except (ValueError, KeyError, TypeError) as err:
            return web.json_response({"error": f"malformed worker batch: {err}"}, status=400)
        self._inflight.set_remote(f"worker-{worker}", remote, ttl_s=REMOTE_INFLIGHT_TTL_S)
        self._requests.set_remote(f"worker-{worker}", counts, ttl_s=REMOTE_INFLIGHT_TTL_S)
        for record in records:
            self._finish(record, INVALID_SPAN)
        self.received.labels(str(worker)).inc(len(records))
        return web.json_response({"degraded": sorted(self._degraded())})


class Secondaries:
    """Starts the N - 1 secondary processes, restarts one that dies, stops them first at shutdown."""

    def __init__(self, argv: Sequence[str], count: int, socket_path: str) -> None:
        self._argv = list(argv)
        self._count = count
        self._socket_path = socket_path
        self._processes: dict[int, subprocess.Popen[bytes]] = {}
        self._restarts: dict[int, int] = {}
        self._stopping = False

    def command(self, index: int) -> list[str]:
        """The secondary's command line: this one's, plus where the primary is and which worker it is."""
        return [sys.executable, "-m", "serving.cli", *self._argv,
                "--worker-of", self._socket_path, "--worker-index", str(index)]

    def start(self) -> None:
        for index in range(1, self._count):
            self._spawn(index)

    def _spawn(self, index: int) -> None:
        self._processes[index] = subprocess.Popen(self.command(index))  # noqa: S603 - our own argv (sys.executable -m serving.cli), no shell

    async def watch(self) -> None:
        """Restart a secondary that exited while we were not stopping (with growing back-off)."""
        while not self._stopping:
            await asyncio.sleep(0.5)
            for index, process in list(self._processes.items()):
                if process.poll() is None or self._stopping:
                    continue
                tries = self._restarts.get(index, 0)
                delay = RESTART_BACKOFF_S[min(tries, len(RESTART_BACKOFF_S) - 1)]
                log.warning("worker_exited", worker=index, returncode=process.returncode, restart_in_s=delay)
                self._restarts[index] = tries + 1
                await asyncio.sleep(delay)
                if not self._stopping:
                    self._spawn(index)

    async def stop(self, timeout_s: float) -> None:
        """SIGTERM every secondary (each finishes its requests and sends its records), then wait."""
        self._stopping = True
        for process in self._processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for process in self._processes.values():
            while process.poll() is None and time.monotonic() < deadline:  # noqa: ASYNC110 - a child's exit is polled (Popen has no awaitable)
                await asyncio.sleep(0.05)
            if process.poll() is None:
                log.warning("worker_killed", pid=process.pid)
                process.kill()
                process.wait()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._processes.values() if p.poll() is None]


def private_socket_path() -> str:
    """A Unix socket path in a fresh directory only this user can enter."""
    return str(Path(tempfile.mkdtemp(prefix="inferwatch-workers-")) / "primary.sock")


async def serve_until_signal(
    app: web.Application, front: Front, host: str, port: int, *, reuse_port: bool, unix_path: str | None,
    secondaries: Secondaries | None, shutdown_timeout_s: float, server_options: dict[str, Any],
) -> None:
    """Run ``app`` behind ``front`` on HOST:PORT (and alone on the Unix socket) until SIGINT/SIGTERM.

    At the end the secondaries stop first, then the front lets the requests it is answering finish
    (up to ``shutdown_timeout_s``), then aiohttp's server does the same with its connections.

    Raises:
        ConfigError: HOST:PORT cannot be listened on (in use, not an address of this host).
    """
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=shutdown_timeout_s, **server_options)
    await runner.setup()
    gc.freeze()  # what start-up made lives as long as the process: keep it out of every later collection
    # Collect young objects after GC_YOUNG_THRESHOLD net allocations, not CPython's 700: with 128 requests
    # in flight their live objects alone passed 700, so a collection ran about every 24 requests and
    # found next to nothing to free (requests leave no cycles), 6.5 us a non-streamed request.
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    watching = None
    try:
        try:
            await front.listen(runner, host, port, reuse_port=reuse_port)
        except OSError as err:
            raise ConfigError("serve.listen", f"cannot listen there: {err.strerror or err}",
                              f"{host}:{port}") from None
        if unix_path is not None:
            await web.UnixSite(runner, unix_path).start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        if secondaries is not None:
            secondaries.start()
            watching = asyncio.create_task(secondaries.watch())
        await stop.wait()
    finally:
        if secondaries is not None:  # while the primary still takes their last records
            await secondaries.stop(shutdown_timeout_s + 5.0)
        if watching is not None:
            watching.cancel()
        await front.shutdown(shutdown_timeout_s)
        await runner.cleanup()
        if unix_path is not None:
            Path(unix_path).unlink(missing_ok=True)  # noqa: ASYNC240 - one unlink at shutdown
            Path(unix_path).parent.rmdir()
