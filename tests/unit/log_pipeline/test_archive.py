"""Tests of the archive writer and the segment reader: frames, rotation, recovery, retention."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from log_pipeline import frames
from log_pipeline.archive import ArchiveWriter
from log_pipeline.config import LogConfig
from log_pipeline.reader import SegmentReader
from log_pipeline.segments import list_segments
from tests.unit.log_pipeline.conftest import Clock, make_records


def _config(directory: Path, **changes: Any) -> LogConfig:
    values: dict[str, Any] = {"dir": str(directory), "frame_max_records": 64, "use_dictionary": False}
    values.update(changes)
    return LogConfig(**values)


def _read_all(directory: Path, problems: list[str] | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for segment in list_segments(directory):
        with SegmentReader(segment.path, on_problem=(problems if problems is not None else []).append) as r:
            for _frame, records in r.iter_records():
                out.extend(records)
    return out


class TestWriter:
    def test_records_come_back_in_order_from_a_published_segment(self, tmp_path: Path) -> None:
        """1000 records written and closed read back equal, from one finished, indexed segment."""
        records = make_records(1000)
        writer = ArchiveWriter(_config(tmp_path))
        for record in records:
            writer.append(record)
        writer.close()
        segments = list_segments(tmp_path)
        assert [s.finished for s in segments] == [True]
        assert segments[0].index_path.exists()
        assert _read_all(tmp_path) == records
        assert (writer.stats.records, writer.stats.frames) == (1000, 16)

    def test_a_frame_closes_after_frame_max_ms_on_tick(self, tmp_path: Path, clock: Clock) -> None:
        """A lone record reaches the file once tick() runs frame_max_ms after it, not before."""
        writer = ArchiveWriter(_config(tmp_path, frame_max_ms=200.0), monotonic=clock)
        writer.append(make_records(1)[0])
        clock.now += 0.1
        writer.tick()
        assert writer.stats.frames == 0
        assert writer.due_in() == pytest.approx(0.1)
        clock.now += 0.1
        writer.tick()
        assert writer.stats.frames == 1
        assert len(_read_all(tmp_path)) == 1

    def test_segments_rotate_by_size(self, tmp_path: Path) -> None:
        """With a 64 KiB limit, 6000 records spread over several published segments, none lost."""
        records = make_records(6000)
        writer = ArchiveWriter(_config(tmp_path, segment_max_bytes=65536))
        for record in records:
            writer.append(record)
        writer.close()
        assert len(list_segments(tmp_path)) > 2
        assert _read_all(tmp_path) == records

    def test_segments_rotate_by_age(self, tmp_path: Path, clock: Clock) -> None:
        """A segment older than segment_max_age_s is published on tick."""
        writer = ArchiveWriter(_config(tmp_path, segment_max_age_s=60.0), monotonic=clock)
        writer.append(make_records(1)[0])
        writer.flush()
        clock.now += 61
        writer.tick()
        assert [s.finished for s in list_segments(tmp_path)] == [True]

    def test_retention_by_size_deletes_the_oldest_segments(self, tmp_path: Path) -> None:
        """With a 150 KiB retention, old segments go and the newest records stay."""
        records = make_records(20000)
        writer = ArchiveWriter(_config(tmp_path, segment_max_bytes=65536, retention_bytes=150_000))
        for record in records:
            writer.append(record)
        writer.close()
        total = sum(p.stat().st_size for p in tmp_path.iterdir())
        assert total <= 150_000
        assert writer.stats.segments_deleted["size"] > 0
        kept = _read_all(tmp_path)
        assert kept == records[-len(kept):]

    def test_retention_by_age(self, tmp_path: Path) -> None:
        """A finished segment whose file is older than retention_age_s is deleted."""
        writer = ArchiveWriter(_config(tmp_path, retention_age_s=3600.0))
        writer.append(make_records(1)[0])
        writer.close()
        (segment,) = list_segments(tmp_path)
        os.utime(segment.path, (1, 1))
        writer.enforce_retention()
        assert list_segments(tmp_path) == []
        assert writer.stats.segments_deleted["age"] == 1

    def test_a_dictionary_is_trained_and_its_frames_read_back(self, tmp_path: Path) -> None:
        """With use_dictionary, a dictionary frame appears and later frames decode through it."""
        records = make_records(3000)
        writer = ArchiveWriter(_config(tmp_path, use_dictionary=True, dictionary_sample_records=512))
        for record in records:
            writer.append(record)
        writer.close()
        assert writer.stats.dictionaries == 1
        (segment,) = list_segments(tmp_path)
        with SegmentReader(segment.path) as reader:
            kinds = [f.header.kind for f in reader.frames()]
            dict_ids = {f.header.dict_id for f in reader.frames() if f.header.kind == frames.KIND_RECORDS}
        assert frames.KIND_DICTIONARY in kinds
        assert len(dict_ids - {0}) == 1
        assert _read_all(tmp_path) == records

    def test_a_failed_write_counts_the_frame_as_lost_and_continues(self, tmp_path: Path) -> None:
        """When the segment's descriptor breaks, its frame is counted lost and a new segment takes over."""
        writer = ArchiveWriter(_config(tmp_path))
        writer.append(make_records(1)[0])
        writer.flush()
        assert writer._segment is not None
        os.close(writer._segment.fd)
        writer.append(make_records(1, seed=2)[0])
        writer.flush()
        assert writer.stats.lost_records == 1
        writer.append(make_records(1, seed=3)[0])
        writer.flush()
        assert writer.stats.records == 2


class TestRecovery:
    def _killed_segment(self, tmp_path: Path, n: int, tear: int) -> tuple[list[dict[str, Any]], Path]:
        records = make_records(n)
        writer = ArchiveWriter(_config(tmp_path))
        for record in records:
            writer.append(record)
        writer.flush()
        segment = writer._segment
        assert segment is not None
        os.close(segment.fd)  # the process "dies": no publish, lock released
        with open(segment.path, "ab") as handle:
            handle.write(b"\x5e\x2a\x4d\x18" + b"\x00" * tear)  # a torn frame header
        return records, segment.path

    def test_reader_keeps_everything_before_a_torn_tail_and_warns(self, tmp_path: Path) -> None:
        """The reader returns every complete frame of an open segment and reports the torn bytes."""
        records, _path = self._killed_segment(tmp_path, 200, 20)
        problems: list[str] = []
        assert _read_all(tmp_path, problems) == records
        assert any("torn tail" in p for p in problems)

    def test_recover_cuts_the_tail_indexes_and_publishes(self, tmp_path: Path) -> None:
        """A new writer publishes the killed writer's segment, truncated to its last intact frame."""
        records, path = self._killed_segment(tmp_path, 200, 20)
        problems: list[str] = []
        recovered = ArchiveWriter(_config(tmp_path), on_problem=problems.append).recover()
        assert len(recovered) == 1
        assert not path.exists()
        assert [s.finished for s in list_segments(tmp_path)] == [True]
        fresh: list[str] = []
        assert _read_all(tmp_path, fresh) == records
        assert fresh == []

    def test_a_segment_held_by_a_live_writer_is_left_alone(self, tmp_path: Path) -> None:
        """recover() skips an open segment whose writer still holds the lock."""
        live = ArchiveWriter(_config(tmp_path))
        live.append(make_records(1)[0])
        live.flush()
        assert ArchiveWriter(_config(tmp_path)).recover() == []
        live.close()


class TestDamage:
    def test_a_damaged_middle_frame_is_skipped_and_later_frames_survive(self, tmp_path: Path) -> None:
        """Flipping a payload byte of frame 2 loses exactly its 64 records; the rest read back."""
        records = make_records(64 * 4)
        writer = ArchiveWriter(_config(tmp_path))
        for record in records:
            writer.append(record)
        writer.close()
        (segment,) = list_segments(tmp_path)
        with SegmentReader(segment.path) as reader:
            offsets = [f.offset for f in reader.frames()]
        data = bytearray(segment.path.read_bytes())
        data[offsets[1] + frames.FRAME_OVERHEAD + 5] ^= 0xFF
        segment.path.write_bytes(bytes(data))
        problems: list[str] = []
        assert _read_all(tmp_path, problems) == records[:64] + records[128:]
        assert any("checksum mismatch" in p for p in problems)

    def test_a_file_that_is_not_a_segment_is_refused(self, tmp_path: Path) -> None:
        """Opening a gzip file named like a segment raises a clear ArchiveError."""
        path = tmp_path / "x.izst"
        path.write_bytes(b"\x1f\x8b\x08\x00garbage")
        with pytest.raises(ValueError, match="not an inferwatch archive segment"):
            SegmentReader(path)

    def test_a_segment_of_another_format_version_is_refused_by_name(self, tmp_path: Path) -> None:
        """A segment whose first header names format version 1 is refused, saying which version it is."""
        writer = ArchiveWriter(_config(tmp_path))
        for record in make_records(10):
            writer.append(record)
        writer.close()
        (segment,) = list_segments(tmp_path)
        data = bytearray(segment.path.read_bytes())
        data[frames.PREFIX_SIZE + 4] = 1
        segment.path.write_bytes(bytes(data))
        with pytest.raises(ValueError, match="format version 1; this inferwatch reads version 2"):
            SegmentReader(segment.path)

    def test_frames_carry_hex_trace_ids_raw_for_lookups(self, tmp_path: Path) -> None:
        """Frames of hex trace ids are flagged and tested without decoding; one with a non-hex id is not."""
        records = make_records(128)
        records[100]["trace_id"] = "req-7"
        writer = ArchiveWriter(_config(tmp_path))
        for record in records:
            writer.append(record)
        writer.close()
        (segment,) = list_segments(tmp_path)
        with SegmentReader(segment.path) as reader:
            first, second = list(reader.frames())
            assert first.header.flags & frames.FLAG_TRACE_IDS
            assert not second.header.flags & frames.FLAG_TRACE_IDS
            assert reader.may_hold(first, bytes.fromhex(records[5]["trace_id"]))
            assert not reader.may_hold(first, bytes.fromhex(records[70]["trace_id"]))
            assert reader.may_hold(second, bytes.fromhex(records[5]["trace_id"]))  # unflagged: must decode
