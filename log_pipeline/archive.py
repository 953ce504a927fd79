"""The archive writer: records → frames → segments, rotated, indexed, published and retired.

Crash safety: each frame reaches the kernel in one ``write`` as soon as it is closed (after
``frame_max_records`` records, or ``frame_max_ms`` after its first record: the owner calls
:meth:`ArchiveWriter.tick`), so a ``kill -9`` loses at most the open frame. A segment is
published by writing its index (temp file + rename), then renaming ``.izst.open`` to ``.izst``.
Segments left open by a killed writer are recovered (torn tail cut, index built) by the next one.

Not thread-safe: one thread (the sink's writer, or ``logs ingest``) owns a writer.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zstandard

from log_pipeline import frames
from log_pipeline.config import LogConfig
from log_pipeline.index import MAX_FRAMES, IndexBuilder, trace_key, write_index
from log_pipeline.reader import SegmentReader
from log_pipeline.segments import INDEX_SUFFIX, OPEN_SUFFIX, SEGMENT_SUFFIX, archive_dir, list_segments

Report = Callable[[str], None]
_SAMPLE_CHUNK = 16  # records per training sample: dictionaries matter most for small frames


def _ignore(_message: str) -> None:
    return None


@dataclass(slots=True)
class WriterStats:
    """Running totals of one writer (the sink turns their increments into metrics)."""

    records: int = 0
    frames: int = 0
    bytes_written: int = 0
    json_bytes: int = 0
    segments_published: int = 0
    segments_deleted: dict[str, int] = field(default_factory=lambda: {"size": 0, "age": 0})
    dictionaries: int = 0
    lost_records: int = 0


class _OpenSegment:
    """The segment being written: its file, lock, frame offsets and index entries."""

    def __init__(self, root: Path, name: str, opened_at: float) -> None:
        self.name = name
        self.path = root / f"{name}{OPEN_SUFFIX}"
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self.opened_at = opened_at
        self.size = 0
        self.records = 0
        self.index = IndexBuilder()
        self.ts_min = self.ts_max = frames.NO_TS
        self.compressor: zstandard.ZstdCompressor | None = None
        self.dict_id = 0
        self.samples: list[dict[str, Any]] | None = []

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(self.fd, view)
            view = view[written:]
        self.size += len(data)


def _ts_range(current: tuple[int, int], new_min: int, new_max: int) -> tuple[int, int]:
    low, high = current
    if new_min == frames.NO_TS:
        return current
    low = new_min if low == frames.NO_TS else min(low, new_min)
    high = new_max if high == frames.NO_TS else max(high, new_max)
    return low, high


class ArchiveWriter:
    """Appends records to an archive directory."""

    def __init__(
        self,
        config: LogConfig,
        *,
        directory: str | os.PathLike[str] | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        on_problem: Report = _ignore,
    ) -> None:
        self.config = config
        self.root = archive_dir(directory if directory is not None else config.dir, create=True)
        self.stats = WriterStats()
        self._clock = clock
        self._monotonic = monotonic
        self._on_problem = on_problem
        self._plain = zstandard.ZstdCompressor(
            level=config.compression_level, write_checksum=False, write_content_size=True
        )
        self._segment: _OpenSegment | None = None
        self._pending: list[dict[str, Any]] = []
        self._pending_since = 0.0
        self._sequence = 0

    # -- records and frames ------------------------------------------------------------------

    def append(self, record: dict[str, Any]) -> None:
        """Add a record to the open frame; closes the frame once it holds ``frame_max_records``."""
        if not self._pending:
            self._pending_since = self._monotonic()
        self._pending.append(record)
        if len(self._pending) >= self.config.frame_max_records:
            self.flush()

    @property
    def frame_open(self) -> bool:
        """Records wait in the open frame (it closes at ``frame_max_records`` or ``frame_max_ms``)."""
        return bool(self._pending)

    def due_in(self) -> float | None:
        """Seconds until :meth:`tick` has work (close the frame, rotate the segment); None: idle."""
        now = self._monotonic()
        waits = []
        if self._pending:
            waits.append(self._pending_since + self.config.frame_max_ms / 1000.0 - now)
        if self._segment is not None:
            waits.append(self._segment.opened_at + self.config.segment_max_age_s - now)
        return max(0.0, min(waits)) if waits else None

    def tick(self) -> None:
        """Close the open frame when it is old enough, and publish the segment when it is."""
        now = self._monotonic()
        if self._pending and now - self._pending_since >= self.config.frame_max_ms / 1000.0:
            self.flush()
        segment = self._segment
        if segment is not None and now - segment.opened_at >= self.config.segment_max_age_s:
            self.publish()

    def flush(self) -> None:
        """Compress the open frame and write it out (no-op when empty)."""
        if not self._pending:
            return
        records, self._pending = self._pending, []
        try:
            segment = self._segment or self._open_segment()
        except OSError as err:
            self.stats.lost_records += len(records)
            self._on_problem(f"{self.root}: cannot open a segment ({err}); {len(records)} records lost")
            return
        encoded = frames.encode_records(records)
        compressor = segment.compressor or self._plain
        payload = compressor.compress(encoded.payload)
        body = payload + encoded.binary
        header = frames.FrameHeader(
            frames.KIND_RECORDS, segment.dict_id, encoded.n_records, len(encoded.payload), len(payload),
            len(encoded.binary), encoded.json_bytes, encoded.ts_min_ms, encoded.ts_max_ms, _crc(body),
            encoded.flags,
        )
        offset = segment.size
        try:
            segment.write(header.pack() + body)
        except OSError as err:
            self._abandon(segment, err, len(records))
            return
        keys = encoded.trace_ids
        segment.index.add_frame(offset, keys if keys is not None else _trace_keys(records))
        segment.records += len(records)
        segment.ts_min, segment.ts_max = _ts_range(
            (segment.ts_min, segment.ts_max), encoded.ts_min_ms, encoded.ts_max_ms
        )
        self.stats.records += len(records)
        self.stats.frames += 1
        self.stats.bytes_written += frames.FRAME_OVERHEAD + len(body)
        self.stats.json_bytes += encoded.json_bytes
        if segment.samples is not None and self.config.use_dictionary:
            segment.samples.extend(records)
            if len(segment.samples) >= self.config.dictionary_sample_records:
                self._train(segment)
        if (
            segment.size >= self.config.segment_max_bytes
            or len(segment.index.offsets) >= MAX_FRAMES
        ):
            self.publish()

    def _abandon(self, segment: _OpenSegment, err: OSError, lost: int) -> None:
        """A write failed: count the frame's records as lost and leave the segment for recovery."""
        self.stats.lost_records += lost
        self._on_problem(f"{segment.path}: write failed ({err}); {lost} records lost, starting a new segment")
        self._segment = None
        with contextlib.suppress(OSError):
            os.close(segment.fd)

    def _train(self, segment: _OpenSegment) -> None:
        """Train this segment's dictionary from its first records and write it as a frame."""
        samples, segment.samples = segment.samples or [], None
        chunks: list[bytes | bytearray | memoryview[int]] = [
            frames.encode_records(samples[i:i + _SAMPLE_CHUNK]).payload
            for i in range(0, len(samples), _SAMPLE_CHUNK)
        ]
        dict_id = secrets.randbelow(2**31 - 32768) + 32768  # ids below 32768 are reserved by zstd
        try:
            trained = zstandard.train_dictionary(
                self.config.dictionary_bytes, chunks, k=64, d=8, dict_id=dict_id,
                level=self.config.compression_level,
            )
        except zstandard.ZstdError as err:
            self._on_problem(f"{segment.path}: no dictionary for this segment ({err})")
            return
        content = trained.as_bytes()
        payload = self._plain.compress(content)
        header = frames.FrameHeader(
            frames.KIND_DICTIONARY, dict_id, 0, len(content), len(payload), payload_crc=_crc(payload)
        )
        try:
            segment.write(header.pack() + payload)
        except OSError as err:
            self._abandon(segment, err, 0)
            return
        self.stats.bytes_written += frames.FRAME_OVERHEAD + len(payload)
        self.stats.dictionaries += 1
        segment.dict_id = dict_id
        segment.compressor = zstandard.ZstdCompressor(
            level=self.config.compression_level, dict_data=trained, write_checksum=False,
            write_content_size=True, write_dict_id=False,
        )

    # -- segments ------------------------------------------------------------------------------

    def _open_segment(self) -> _OpenSegment:
        now = self._clock()
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f"{int(now * 1e6) % 1_000_000:06d}"
        self._sequence += 1
        name = f"{stamp}-{os.getpid()}-{self._sequence:04d}-{secrets.token_hex(3)}"
        self._segment = _OpenSegment(self.root, name, self._monotonic())
        return self._segment

    def publish(self) -> None:
        """Close the open frame, then publish the open segment (index first, then rename)."""
        self.flush()
        segment, self._segment = self._segment, None
        if segment is None:
            return
        try:
            os.fsync(segment.fd)
            if segment.records:
                segment.index.write(self.root / f"{segment.name}{INDEX_SUFFIX}", segment.ts_min, segment.ts_max)
                os.replace(segment.path, self.root / f"{segment.name}{SEGMENT_SUFFIX}")
                self.stats.segments_published += 1
            else:
                segment.path.unlink()
        finally:
            os.close(segment.fd)
        _fsync_dir(self.root)
        self.enforce_retention()

    def close(self) -> None:
        """Write the open frame and publish the open segment."""
        self.publish()

    # -- recovery and retention ----------------------------------------------------------------

    def recover(self) -> list[Path]:
        """Publish segments left open by a killed writer (not ones another writer still holds)."""
        recovered: list[Path] = []
        for segment in list_segments(self.root):
            if segment.finished:
                continue
            try:
                fd = os.open(segment.path, os.O_RDWR)
            except OSError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    continue  # a live writer owns it
                published = self._recover_one(segment.path, segment.name, fd)
                if published is not None:
                    recovered.append(published)
            finally:
                os.close(fd)
        return recovered

    def _recover_one(self, path: Path, name: str, fd: int) -> Path | None:
        entries: list[tuple[int, bytes]] = []
        records_seen = 0
        ts = (frames.NO_TS, frames.NO_TS)
        end = 0
        try:
            reader = SegmentReader(path, on_problem=self._on_problem)
        except OSError as err:
            self._on_problem(f"{path}: left alone, cannot be recovered ({err})")
            return None
        with reader:
            for frame, records in reader.iter_records():
                if len(entries) >= MAX_FRAMES:
                    break
                entries.append((frame.offset, _trace_keys(records)))
                records_seen += len(records)
                ts = _ts_range(ts, frame.header.ts_min_ms, frame.header.ts_max_ms)
                end = frame.end
            for frame in reader.frames(end):  # a dictionary frame may follow the last records frame
                if frame.header.kind == frames.KIND_DICTIONARY:
                    end = frame.end
                break
        if not entries:
            path.unlink()
            self._on_problem(f"{path}: removed, it held no intact frame")
            return None
        if end < os.fstat(fd).st_size:
            os.ftruncate(fd, end)
        os.fsync(fd)
        write_index(self.root / f"{name}{INDEX_SUFFIX}", entries, *ts)
        final = self.root / f"{name}{SEGMENT_SUFFIX}"
        os.replace(path, final)
        _fsync_dir(self.root)
        self._on_problem(f"{path}: recovered {records_seen} records in {len(entries)} frames")
        return final

    def enforce_retention(self) -> None:
        """Delete the oldest finished segments beyond ``retention_bytes`` or ``retention_age_s``."""
        finished = [s for s in list_segments(self.root) if s.finished]
        sizes: list[tuple[Path, Path, int, float]] = []
        for segment in finished:
            try:
                info = segment.path.stat()
                index_size = segment.index_path.stat().st_size if segment.index_path.exists() else 0
            except OSError:
                continue
            sizes.append((segment.path, segment.index_path, info.st_size + index_size, info.st_mtime))
        total = sum(size for _, _, size, _ in sizes)
        now = self._clock()
        for path, index_path, size, mtime in sizes:
            too_old = self.config.retention_age_s > 0 and now - mtime > self.config.retention_age_s
            too_big = self.config.retention_bytes > 0 and total > self.config.retention_bytes
            if not (too_old or too_big):
                continue
            with contextlib.suppress(FileNotFoundError):
                index_path.unlink()
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            total -= size
            self.stats.segments_deleted["age" if too_old else "size"] += 1


def _trace_id(record: dict[str, Any]) -> str:
    value = record.get(frames.TRACE_KEY)
    return value if isinstance(value, str) else ""


def _trace_keys(records: list[dict[str, Any]]) -> bytes:
    """The index keys of the records' trace ids, concatenated (the slow path: ids not all hex)."""
    return b"".join([trace_key(_trace_id(r)) for r in records])


def _crc(data: bytes) -> int:
    return zlib.crc32(data)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
