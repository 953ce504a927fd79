"""inferwatch's vLLM stat-logger plugin: vLLM's per-request engine numbers, sent to the sidecar.

vLLM (V1, ``vllm serve``) loads the classes of the entry-point group ``vllm.stat_logger_plugins``
and calls :meth:`InferwatchStatLogger.record` in its API-server process after every engine step.
Installed into vLLM's environment (``pip install --no-deps 'inferwatch[vllm-plugin]'``), the plugin
is idle unless ``INFERWATCH_ENGINE_STATS`` names the sidecar's listener, e.g.
``udp://127.0.0.1:9101`` (the sidecar's ``serve.engine_stats_listen``; several, comma-separated, each
get every datagram: a second sidecar, a debugging listener). Then, for each step with
news, it sends the scheduler's state and the requests that finished (queue, prefill and decode
time, preemptions, cached prompt tokens; see :mod:`exporters.engine_stats_wire`) as non-blocking
UDP datagrams, and while vLLM is idle it repeats the latest state each time vLLM logs its stats
(every 10 s, :meth:`InferwatchStatLogger.log`), so that the sidecar can tell an idle engine from an
absent plugin. Nothing here may slow or break vLLM's loop: a datagram that cannot be sent right
now is dropped and counted (the count travels in the next datagram), and any error is swallowed
and counted the same way. Imports: the standard library, vLLM and the wire format.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any
from urllib.parse import urlsplit

from vllm.v1.metrics.loggers import StatLoggerBase

from exporters.engine_stats_wire import EngineRequestStats, EngineStepStats, encode

ENV = "INFERWATCH_ENGINE_STATS"
STEP_INTERVAL_S = 0.1
"""A step with no finished request and the same requests running and waiting sends its scheduler state at most
this often (a change of either, an admission or a preemption, is sent at once: the KV usage jumps with it)."""

log = logging.getLogger(__name__)


def parse_targets(value: str) -> list[tuple[str, int]]:
    """``udp://HOST:PORT[,udp://HOST:PORT...]`` (``udp://`` optional) -> [(host, port)]; ValueError naming what
    is wrong."""
    targets = []
    for item in value.split(","):
        parts = urlsplit(item.strip() if "://" in item else f"udp://{item.strip()}")
        try:
            port = parts.port
        except ValueError:
            port = None
        if parts.scheme != "udp" or not parts.hostname or port is None:
            raise ValueError(f"{ENV}={value!r}: expected udp://HOST:PORT, e.g. udp://127.0.0.1:9101")
        targets.append((parts.hostname, port))
    return targets


def _request(r: Any) -> EngineRequestStats:
    reason = getattr(r.finish_reason, "name", r.finish_reason)
    return EngineRequestStats(
        str(r.request_id), r.queued_time, r.prefill_time, r.decode_time, r.inference_time, r.e2e_latency,
        r.num_preemptions, r.num_cached_tokens, r.num_prompt_tokens, r.num_generation_tokens, str(reason).lower(),
    )


class InferwatchStatLogger(StatLoggerBase):
    """Sends each step's finished requests and scheduler state to the inferwatch sidecar."""

    def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
        self.engine_index = engine_index
        self.dropped = 0
        self.sent = 0
        self._last_step = 0.0
        self._last_counts = (-1, -1)
        """Requests running and waiting in the latest state sent."""
        self._latest: Any = None
        """vLLM's latest scheduler stats, sent or not (what :meth:`log` repeats)."""
        self._socket: socket.socket | None = None
        self._addresses: list[Any] = []
        self.max_num_seqs = int(getattr(getattr(vllm_config, "scheduler_config", None), "max_num_seqs", 0) or 0)
        value = os.environ.get(ENV, "").strip()
        if not value:
            return
        try:
            resolved = [socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_DGRAM)[0]
                        for host, port in parse_targets(value)]
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.setblocking(False)
        except (ValueError, OSError) as err:
            log.warning("inferwatch engine stats stay off: %s", err)
            return
        self._socket, self._addresses = sock, [info[4] for info in resolved]
        log.info("inferwatch engine stats go to %s", value)

    @property
    def active(self) -> bool:
        """True when the plugin sends (``INFERWATCH_ENGINE_STATS`` was set and usable)."""
        return self._socket is not None

    def record(
        self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
    ) -> None:
        """Send what finished in this step (and the scheduler state); never raises, never blocks."""
        if self._socket is None:
            return
        try:
            finished = iteration_stats.finished_requests if iteration_stats is not None else ()
            if scheduler_stats is not None:
                self._latest = scheduler_stats
            if not finished:
                if scheduler_stats is None:
                    return
                counts = (scheduler_stats.num_running_reqs, scheduler_stats.num_waiting_reqs)
                if counts == self._last_counts and time.monotonic() - self._last_step < STEP_INTERVAL_S:
                    return
            step = None
            if scheduler_stats is not None:
                self._last_step = time.monotonic()
                self._last_counts = (scheduler_stats.num_running_reqs, scheduler_stats.num_waiting_reqs)
                step = self._step(scheduler_stats)
            for datagram in encode(step, [_request(r) for r in finished]):
                self._send(datagram)
        except Exception:  # vLLM's loop must never see an error of ours
            self.dropped += 1

    def log(self) -> None:
        """vLLM's periodic stats log (every 10 s, idle or not): send the latest scheduler state again, the
        sidecar's sign that the plugin is alive while vLLM does not step."""
        if self._socket is None:
            return
        try:
            step = self._step(self._latest) if self._latest is not None else None
            for datagram in encode(step, ()):
                self._send(datagram)
        except Exception:  # as in record()
            self.dropped += 1

    def _step(self, scheduler_stats: Any) -> EngineStepStats:
        return EngineStepStats(
            scheduler_stats.kv_cache_usage, scheduler_stats.num_running_reqs, scheduler_stats.num_waiting_reqs,
            getattr(scheduler_stats, "num_skipped_waiting_reqs", 0), self.dropped, self.max_num_seqs,
        )

    def _send(self, datagram: bytes) -> None:
        for address in self._addresses:
            try:
                self._socket.sendto(datagram, address)  # type: ignore[union-attr]
                self.sent += 1
            except OSError:  # a full buffer (BlockingIOError), a refused destination (EACCES, ENETUNREACH), ...
                self.dropped += 1

    def log_engine_initialized(self) -> None:
        """Nothing to announce: the sidecar learns the engine from the first datagram."""
