"""The request-record sink: sample, count, and queue kept records for a writer thread.

Records are counted in one place, :meth:`RecordSink._admit` and the enqueue that follows it
(shared by ``offer`` and ``put``): seen, kept by reason, dropped by reason (the ``LOG_RECORDS_*``
specs of ``exporters.catalog.pipeline``), so that seen = kept + dropped. ``offer`` never
blocks: when the bounded queue is full the record is dropped and counted as ``queue_full``. The writer thread owns the
:class:`~log_pipeline.archive.ArchiveWriter`, closes frames on time even when no record arrives,
and publishes the open segment on :meth:`RecordSink.close`.

The writer wakes once per frame, not once per record: the first record of a frame wakes it, then
it sleeps until the frame is due (``frame_max_ms``) or until a frame's worth of records waits in
the queue. Each wake-up of a thread beside the event loop cost the 2-core machine about 100 µs of
CPU (the thread switch and the hand-over of the GIL), some 20 times a record's own encoding.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Mapping
from typing import Any

import structlog
from prometheus_client import CollectorRegistry

from exporters.records import Outcome, RequestRecord
from log_pipeline.archive import ArchiveWriter
from log_pipeline.config import LogConfig
from log_pipeline.metrics import (
    DROP_CLOSED,
    DROP_NO_ARCHIVE,
    DROP_QUEUE_FULL,
    DROP_SAMPLING,
    PipelineMetrics,
)
from log_pipeline.records import event_from_record, is_slow, level_of, milliseconds
from log_pipeline.sampling import ERROR, SAMPLED, Decision, Sampler, classify_fields
from log_pipeline.worker import stop_worker

log = structlog.get_logger(__name__)
_SHADOW_SAMPLE = Decision(True, SAMPLED)
_WRONG_MODEL = Decision(True, ERROR)
"""A wrong-model request is kept as an error: its client got an answer from another model than it asked for."""
_STOP: Any = object()
_DRAIN = 512  # records taken from the queue per wake-up before the writer checks its clocks


def _log_problem(message: str) -> None:
    log.warning("log archive problem", problem=message)


class RecordSink:
    """Sampling, counting and a bounded queue in front of the archive writer thread."""

    def __init__(
        self,
        config: LogConfig,
        registry: CollectorRegistry,
        *,
        on_problem: Callable[[str], None] = _log_problem,
    ) -> None:
        self.config = config
        self.sampler = Sampler(config.success_sample_ratio)
        self._slow_after_ms = config.slow_request_s * 1000.0
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=config.queue_size)
        self.metrics = PipelineMetrics(registry, self._queue.qsize, config.queue_size)
        self._on_problem = on_problem
        self._wakeup = threading.Event()  # set when a frame's worth of records waits, and on close
        self._wake_after = max(1, min(config.frame_max_records, config.queue_size // 2))
        self._since_wakeup = 0  # records queued since the last time the writer was woken (offer's side only)
        self._writer: ArchiveWriter | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def archiving(self) -> bool:
        """True when kept records go to an archive directory."""
        return bool(self.config.dir)

    def start(self) -> None:
        """Open the archive (recovering segments a killed writer left) and start the writer thread."""
        if not self.archiving or self._thread is not None:
            return
        self._writer = ArchiveWriter(self.config, on_problem=self._on_problem)
        self._writer.recover()
        self._thread = threading.Thread(target=self._run, name="inferwatch-log-writer", daemon=True)
        self._thread.start()

    def decide(self, event: Mapping[str, Any]) -> Decision:
        """The sampling decision for an event (pure; replays such as ``logs ingest`` decide this way)."""
        return self.sampler.decide_event(event, slow_after_ms=self._slow_after_ms)

    def decide_request(self, record: RequestRecord, *, sla_s: float | None) -> Decision:
        """What :meth:`decide` answers for the request's event: the same rule, fed only the fields it reads
        (made as the event makes them), without building the event or a mapping of them."""
        outcome = record.outcome if type(record.outcome) is Outcome else Outcome(record.outcome)
        slow_after_ms = self._slow_after_ms
        is_error, slow = classify_fields(
            outcome, level_of(outcome), is_slow(record, sla_s),  # a StrEnum member compares as its value
            milliseconds(record.e2e_s) if slow_after_ms > 0 else None, slow_after_ms=slow_after_ms,
        )
        decision = self.sampler.decide(record.trace_id, is_error=is_error, slow=slow)
        if not decision.keep and record.wrong_model is not None:
            return _WRONG_MODEL  # every one kept: the stale clients are found by the records' client key
        if not decision.keep and record.shadow_result is not None:
            return _SHADOW_SAMPLE  # a shadow comparison is a sample already (serve.shadow_ratio): kept for its report
        return decision

    def offer_request(
        self, record: RequestRecord, *, sla_s: float | None, capture_prompt_hash: bool = False
    ) -> tuple[Decision, dict[str, Any] | None]:
        """Decide on a finished request, build its event only when it is kept, and :meth:`offer` it.

        Sampling drops most successes (all but ``success_sample_ratio`` of them), and theirs are never
        built. Returns the decision and the event (None when dropped), never blocking.
        """
        decision = self.decide_request(record, sla_s=sla_s)
        if not decision.keep:
            self._admit(None, decision)  # counted as seen and dropped, like an offered event
            return decision, None
        event = event_from_record(record, sla_s=sla_s, capture_prompt_hash=capture_prompt_hash)
        self.offer(event, decision)
        return decision, event

    def _admit(self, event: Mapping[str, Any] | None, decision: Decision | None) -> tuple[Decision, str | None]:
        """Count the event as seen; return its decision and why it is not to be queued (None: queue it)."""
        self.metrics.seen.inc()
        if decision is None:
            assert event is not None, "an event or its decision"
            decision = self.decide(event)
        if not decision.keep:
            why = DROP_SAMPLING
        elif not self.archiving:
            why = DROP_NO_ARCHIVE
        elif self._closed:
            why = DROP_CLOSED
        else:
            return decision, None
        self.metrics.dropped[why].inc()
        return decision, why

    def offer(self, event: dict[str, Any], decision: Decision | None = None) -> bool:
        """Sample, count and queue an event without ever blocking.

        Returns False only when the event was kept by sampling but could not be queued (queue
        full, sink closed); an event dropped by sampling returns True. Pass ``decision`` when
        the caller already has one from :meth:`decide`.
        """
        decision, dropped = self._admit(event, decision)
        if dropped is not None:
            return dropped != DROP_CLOSED
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self.metrics.dropped[DROP_QUEUE_FULL].inc()
            return False
        self.metrics.kept[decision.reason].inc()
        self._queued()
        return True

    def put(self, event: dict[str, Any], decision: Decision | None = None) -> Decision:
        """Like :meth:`offer`, but wait for room in the queue (for replays such as ``logs ingest``)."""
        decision, dropped = self._admit(event, decision)
        if dropped is None:
            self._queue.put(event)
            self.metrics.kept[decision.reason].inc()
            self._queued()
        return decision

    def _queued(self) -> None:
        """Wake the writer once a frame's worth of records waits (else it wakes when its open frame is due)."""
        self._since_wakeup += 1
        if self._since_wakeup >= self._wake_after:
            self._since_wakeup = 0
            self._wakeup.set()

    def _first_record(self, writer: ArchiveWriter, backlog: bool) -> Any:
        """The first queued record of the writer's next round, or None when none came in time (a tick).

        With a frame open the writer sleeps until it is due, or until :meth:`_queued` or :meth:`close`
        wakes it; idle, it waits for the first record (or the open segment's age limit).
        """
        if backlog:  # the last round stopped at _DRAIN records: more wait
            return self._take()
        if writer.frame_open and not self._closed:
            self._wakeup.wait(writer.due_in())
            self._wakeup.clear()
            return self._take()
        try:
            return self._queue.get(timeout=writer.due_in())
        except queue.Empty:
            return None

    def _take(self) -> Any:
        try:
            return self._queue.get_nowait()
        except queue.Empty:
            return None

    def _run(self) -> None:
        writer = self._writer
        assert writer is not None
        stop, backlog = False, False
        while not stop:
            item = self._first_record(writer, backlog)
            taken = 0
            try:
                while item is not None:
                    if item is _STOP:
                        stop = True
                        break
                    writer.append(item)
                    taken += 1
                    if taken >= _DRAIN:
                        break
                    item = self._take()
                writer.tick()
            except Exception as err:  # the writer thread must outlive any bad record or disk error
                self._on_problem(f"log writer error: {err!r}")
            backlog = taken >= _DRAIN
            self.metrics.writer_progress(writer.stats)
        try:
            writer.close()
        except Exception as err:
            self._on_problem(f"log writer error while closing: {err!r}")
        self.metrics.writer_progress(writer.stats)

    def close(self, timeout_s: float = 5.0) -> bool:
        """Stop accepting records, write what is queued, close the frame and publish the segment.

        Returns False when the writer did not finish within ``timeout_s`` (what was still queued is
        counted as lost with reason ``shutdown``).
        """
        self._closed = True
        self._wakeup.set()  # a writer asleep on its open frame waits for the queue from now on
        thread = self._thread
        if thread is None:
            return True
        if not stop_worker(self._queue, thread, _STOP, timeout_s):
            self.metrics.lost["shutdown"].inc(self._queue.qsize())
            return False
        self._thread = None
        return True

    @property
    def writer(self) -> ArchiveWriter | None:
        """The archive writer (for statistics after :meth:`close`)."""
        return self._writer
