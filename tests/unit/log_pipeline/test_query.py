"""Tests of archive queries: trace lookup through the index, filtered listing, statistics, errors."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from log_pipeline.archive import ArchiveWriter
from log_pipeline.config import LogConfig
from log_pipeline.errors import ArchiveError
from log_pipeline.frames import ts_to_ms
from log_pipeline.index import SegmentIndex, trace_key
from log_pipeline.query import Archive, Filter
from log_pipeline.reader import SegmentReader
from log_pipeline.segments import list_segments
from tests.unit.log_pipeline.conftest import make_records


def _write(directory: Path, records: list[dict[str, Any]], *, close: bool = True, **changes: Any) -> ArchiveWriter:
    values: dict[str, Any] = {"dir": str(directory), "frame_max_records": 50, "segment_max_bytes": 65536}
    values.update(changes)
    writer = ArchiveWriter(LogConfig(**values))
    for record in records:
        writer.append(record)
    if close:
        writer.close()
    else:
        writer.flush()
    return writer


class TestFind:
    def test_every_record_of_a_trace_is_found_across_segments(self, tmp_path: Path) -> None:
        """A trace with records in several segments, the last one still open, is found whole and in order."""
        records = make_records(9000)
        trace = records[10]["trace_id"]
        for i in (4000, 8990):
            records[i]["trace_id"] = trace
        _write(tmp_path, records[:8000])
        live = _write(tmp_path, records[8000:], close=False)
        found = list(Archive(tmp_path).find(trace))
        assert [r["seq"] for r in found] == [10, 4000, 8990]
        live.close()

    def test_a_missing_trace_finds_nothing(self, tmp_path: Path) -> None:
        """An id that was never written yields no record."""
        _write(tmp_path, make_records(500))
        assert list(Archive(tmp_path).find("0" * 32)) == []

    def test_the_index_narrows_the_lookup_to_one_frame(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A lookup decompresses only the frame that holds the trace, though its group names more."""
        records = make_records(500)
        _write(tmp_path, records)
        (segment,) = list_segments(tmp_path)
        with SegmentIndex(segment.index_path) as index:
            offsets = index.frame_offsets_for(records[321]["trace_id"])
            assert index.n_entries == 500
        assert len(offsets) == index.n_frames  # 500 records: one group
        decoded: list[int] = []
        original = SegmentReader.records
        monkeypatch.setattr(SegmentReader, "records", lambda self, frame: decoded.append(frame.offset)
                            or original(self, frame))
        assert list(Archive(tmp_path).find(records[321]["trace_id"])) == [records[321]]
        assert len(decoded) == 1

    def test_groups_of_a_large_segment_rule_out_most_frames(self, tmp_path: Path) -> None:
        """In a segment of many groups, a present id names one group's frames and an absent one almost none."""
        records = make_records(40_000)
        _write(tmp_path, records, frame_max_records=256, segment_max_bytes=64 * 1024 * 1024)
        (segment,) = list_segments(tmp_path)
        with SegmentIndex(segment.index_path) as index:
            hit = index.frame_offsets_for(records[12_345]["trace_id"])
            misses = [len(index.frame_offsets_for(f"{i:032x}")) for i in range(200)]
            n_frames = index.n_frames
        assert 0 < len(hit) < n_frames / 4
        assert sum(misses) / len(misses) < n_frames / 20

    def test_a_missing_index_falls_back_to_a_scan_with_a_warning(self, tmp_path: Path) -> None:
        """Deleting the index still finds the record and reports the missing index."""
        records = make_records(300)
        _write(tmp_path, records)
        (segment,) = list_segments(tmp_path)
        segment.index_path.unlink()
        problems: list[str] = []
        found = list(Archive(tmp_path, on_problem=problems.append).find(records[7]["trace_id"]))
        assert found == [records[7]]
        assert any("index missing" in p for p in problems)

    def test_a_truncated_index_is_reported_and_scanned_around(self, tmp_path: Path) -> None:
        """An index cut short is called unusable and the record is still found."""
        records = make_records(300)
        _write(tmp_path, records)
        (segment,) = list_segments(tmp_path)
        segment.index_path.write_bytes(segment.index_path.read_bytes()[:100])
        problems: list[str] = []
        assert list(Archive(tmp_path, on_problem=problems.append).find(records[7]["trace_id"])) == [records[7]]
        assert any("unusable index" in p for p in problems)

    def test_malformed_trace_ids_are_indexed_by_hash(self, tmp_path: Path) -> None:
        """A record whose trace id is not hex is found by that exact id."""
        records = make_records(100)
        records[5]["trace_id"] = "req-42"
        _write(tmp_path, records)
        assert list(Archive(tmp_path).find("req-42")) == [records[5]]
        assert trace_key("req-42") == trace_key("req-42") != trace_key("req-43")
        assert trace_key("0123456789abcdef" * 2) == bytes.fromhex("0123456789abcdef" * 2)


class TestErrors:
    def test_a_segment_linking_outside_the_archive_is_refused(self, tmp_path: Path) -> None:
        """A symlinked segment that resolves outside the directory raises ArchiveError naming both."""
        outside = tmp_path / "elsewhere"
        archive = tmp_path / "archive"
        _write(outside, make_records(10))
        archive.mkdir()
        (segment,) = list_segments(outside)
        os.symlink(segment.path, archive / segment.path.name)
        with pytest.raises(ArchiveError, match="outside the archive directory"):
            list(Archive(archive).find("0" * 32))

    def test_a_missing_directory_is_a_clear_error(self, tmp_path: Path) -> None:
        """Opening a directory that does not exist says so."""
        with pytest.raises(ArchiveError, match="does not exist"):
            Archive(tmp_path / "nope")

    def test_a_corrupt_segment_is_named(self, tmp_path: Path) -> None:
        """A file with the segment suffix but foreign content raises an error naming the file."""
        (tmp_path / "20250101T000000000000-1-0001-abc.izst").write_bytes(b"PK\x03\x04 not ours")
        with pytest.raises(ArchiveError, match="not an inferwatch archive segment"):
            list(Archive(tmp_path).records())


class TestRecordsAndStats:
    def test_filters_by_time_level_and_outcome(self, tmp_path: Path) -> None:
        """cat's filter keeps records in the inclusive time range with the wanted outcome only."""
        records = make_records(2000)
        _write(tmp_path, records)
        since, until = ts_to_ms(records[100]["ts"]), ts_to_ms(records[1500]["ts"])
        where = Filter(since, until, frozenset({"error"}), frozenset({"timeout"}))
        expected = [r for r in records[100:1501] if r["outcome"] == "timeout"]
        assert list(Archive(tmp_path).records(where)) == expected

    def test_stats_count_records_and_bytes(self, tmp_path: Path) -> None:
        """Stats report every record, segment and a ratio above 1 for realistic records."""
        _write(tmp_path, make_records(3000))
        stats = Archive(tmp_path).stats()
        assert stats.records == 3000
        assert stats.segments == len(list_segments(tmp_path))
        assert stats.ratio > 1.0
        assert stats.segment_bytes + stats.index_bytes == sum(p.stat().st_size for p in tmp_path.iterdir())
