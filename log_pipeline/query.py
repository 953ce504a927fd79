"""Reading an archive directory: find a trace, list records in a time range, sum up statistics.

Finished segments are searched through their index (only the frames it names are decoded);
open segments (being written, or left by a killed writer) and finished ones whose index is
missing or damaged are scanned frame by frame. Problems (torn tail, damaged frame, unreadable
index) are reported through ``on_problem`` and never stop the read.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from log_pipeline import frames
from log_pipeline.errors import ArchiveError, CorruptFrameError
from log_pipeline.index import SegmentIndex
from log_pipeline.reader import SegmentReader
from log_pipeline.segments import SegmentFile, archive_dir, inside, list_segments

Problem = Callable[[str], None]


def _ignore(_message: str) -> None:
    return None


def ts_ms(ts: object) -> int | None:
    """Epoch milliseconds of a record's ``ts``, compared as a time, not as text; None when it is no time.

    The sidecar's canonical ``YYYY-MM-DDTHH:MM:SS.mmmZ`` is read on the fast path; any other ISO 8601
    time (records replayed by ``logs ingest`` from elsewhere: no fraction, microseconds, an offset)
    is parsed in full, UTC unless it gives an offset, as ``--since`` and ``--until`` read theirs.
    """
    ms = frames.ts_to_ms(ts)
    if ms is not None or not isinstance(ts, str):
        return ms
    try:
        parsed = datetime.fromisoformat(ts)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return math.floor(parsed.timestamp() * 1000)


@dataclass(frozen=True, slots=True)
class Filter:
    """Which records ``cat`` prints: a ts range in epoch ms (inclusive) and allowed levels/outcomes."""

    since_ms: int | None = None
    until_ms: int | None = None
    levels: frozenset[str] | None = None
    outcomes: frozenset[str] | None = None

    def frame_may_match(self, header: frames.FrameHeader) -> bool:
        """False when the frame's time range lies wholly outside the filter's."""
        if header.ts_min_ms == frames.NO_TS:
            return True
        if self.since_ms is not None and header.ts_max_ms < self.since_ms:
            return False
        return not (self.until_ms is not None and header.ts_min_ms > self.until_ms)

    def matches(self, record: dict[str, Any]) -> bool:
        """True when the record passes every condition (a record without a usable ts fails a range)."""
        if self.levels is not None and record.get("level") not in self.levels:
            return False
        if self.outcomes is not None and record.get("outcome") not in self.outcomes:
            return False
        if self.since_ms is None and self.until_ms is None:
            return True
        ms = ts_ms(record.get("ts"))
        if ms is None:
            return False
        if self.since_ms is not None and ms < self.since_ms:
            return False
        return self.until_ms is None or ms <= self.until_ms


@dataclass(frozen=True, slots=True)
class ArchiveStats:
    """What ``logs stats`` prints."""

    segments: int
    open_segments: int
    frames: int
    records: int
    segment_bytes: int
    index_bytes: int
    json_bytes: int

    @property
    def ratio(self) -> float:
        """Raw JSON bytes per archived byte (segments and indexes together); 0 when empty."""
        stored = self.segment_bytes + self.index_bytes
        return self.json_bytes / stored if stored else 0.0


def _raw_trace_id(trace_id: str) -> bytes | None:
    """The 16 bytes of a 32-digit lowercase hex id (as frames carry them), else None."""
    if len(trace_id) != 2 * frames.TRACE_ID_BYTES:
        return None
    try:
        raw = bytes.fromhex(trace_id)
    except ValueError:
        return None
    return raw if raw.hex() == trace_id else None


class Archive:
    """A read-only view of an archive directory."""

    def __init__(self, directory: str | os.PathLike[str], *, on_problem: Problem = _ignore) -> None:
        self.root = archive_dir(directory)
        self._on_problem = on_problem

    def segments(self) -> list[SegmentFile]:
        """Every segment, oldest first; one whose path leads outside the directory is an ArchiveError."""
        found = list_segments(self.root)
        for segment in found:
            inside(self.root, segment.path)
        return found

    def _reader(self, segment: SegmentFile) -> SegmentReader:
        return SegmentReader(inside(self.root, segment.path), on_problem=self._on_problem)

    def _index(self, segment: SegmentFile) -> SegmentIndex | None:
        if not segment.finished:
            return None
        try:
            return SegmentIndex(inside(self.root, segment.index_path))
        except FileNotFoundError:
            self._on_problem(f"{segment.index_path}: index missing; scanning the segment instead")
        except (OSError, ArchiveError) as err:
            self._on_problem(f"{segment.index_path}: unusable index ({err}); scanning the segment instead")
        return None

    def find(self, trace_id: str) -> Iterator[dict[str, Any]]:
        """Every record whose ``trace_id`` equals ``trace_id``, oldest segment first."""
        for segment in self.segments():
            index = self._index(segment)
            with self._reader(segment) as reader:
                if index is None:
                    for _frame, records in reader.iter_records():
                        yield from (r for r in records if r.get("trace_id") == trace_id)
                    continue
                with index:
                    offsets = index.frame_offsets_for(trace_id)
                raw_id = _raw_trace_id(trace_id)
                for offset in offsets:
                    try:
                        frame = reader.frame_at(offset)
                        if raw_id is not None and not reader.may_hold(frame, raw_id):
                            continue
                        records = reader.records(frame)
                    except CorruptFrameError as err:
                        self._on_problem(str(err))
                        continue
                    yield from (r for r in records if r.get("trace_id") == trace_id)

    def records(self, where: Filter | None = None) -> Iterator[dict[str, Any]]:
        """Every record passing ``where``, in archive order."""
        where = where or Filter()
        for segment in self.segments():
            with self._reader(segment) as reader:
                for frame in reader.frames():
                    if frame.header.kind == frames.KIND_DICTIONARY:
                        reader.load_dictionary(frame)
                        continue
                    if not where.frame_may_match(frame.header):
                        continue
                    try:
                        records = reader.records(frame)
                    except CorruptFrameError as err:
                        self._on_problem(str(err))
                        continue
                    yield from (r for r in records if where.matches(r))

    def stats(self) -> ArchiveStats:
        """Counts and sizes from the frame headers (no payload is decompressed)."""
        segments = self.segments()
        n_frames = n_records = seg_bytes = idx_bytes = json_bytes = 0
        for segment in segments:
            with self._reader(segment) as reader:
                seg_bytes += reader.size
                for frame in reader.frames():
                    if frame.header.kind == frames.KIND_RECORDS:
                        n_frames += 1
                        n_records += frame.header.n_records
                        json_bytes += frame.header.json_len
            if segment.finished and segment.index_path.exists():
                idx_bytes += inside(self.root, segment.index_path).stat().st_size
        open_count = sum(1 for s in segments if not s.finished)
        return ArchiveStats(
            len(segments) - open_count, open_count, n_frames, n_records, seg_bytes, idx_bytes, json_bytes
        )

