"""Tests of the frame header and the columnar record payload."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from log_pipeline import frames
from tests.unit.log_pipeline.conftest import make_records

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
_finite_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
_KEYS = st.sampled_from(["ts", "a", "b", "ü", "trace_id"])
_records = st.lists(st.dictionaries(_KEYS, _json, min_size=1), min_size=1, max_size=20)
_finite_records = st.lists(st.dictionaries(_KEYS, _finite_json), min_size=1, max_size=20)


def _json_lines_size(records: list[dict[str, Any]]) -> int:
    return sum(len(orjson.dumps(r)) + 1 for r in records)


def _round_trip(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    encoded = frames.encode_records(records)
    return frames.decode_records(encoded.payload, encoded.binary)


def _forms(payload: bytes) -> dict[str, str]:
    head = json.loads(payload)
    return {head["k"][int(i)]: form for i, form in head.get("f", {}).items()} | head.get("f", {})


class TestRecordPayload:
    @given(_records)
    def test_any_json_records_round_trip(self, records: list[dict[str, Any]]) -> None:
        """Decoding the encoded payload gives back equal records, missing keys included."""
        assert _round_trip(records) == records

    @given(_finite_records)
    def test_json_bytes_is_the_exact_size_as_json_lines(self, records: list[dict[str, Any]]) -> None:
        """json_bytes equals the length of the records written as compact JSON lines (by orjson)."""
        assert frames.encode_records(records).json_bytes == _json_lines_size(records)

    def test_canonical_timestamps_become_deltas_and_come_back_exactly(self) -> None:
        """A column of canonical ts strings is delta-encoded (t flag) and restored to the same strings."""
        records = make_records(50)
        encoded = frames.encode_records(records)
        assert _forms(encoded.payload)["0"] == "t"
        assert frames.decode_records(encoded.payload, encoded.binary) == records
        assert encoded.ts_min_ms == frames.ts_to_ms(records[0]["ts"])
        assert encoded.ts_max_ms == frames.ts_to_ms(records[-1]["ts"])

    def test_a_non_canonical_timestamp_keeps_the_column_as_text(self) -> None:
        """One ts with an offset instead of Z leaves the column as strings, time range unknown."""
        records = make_records(3)
        records[1]["ts"] = "2025-08-07T12:00:00.000+02:00"
        encoded = frames.encode_records(records)
        assert "0" not in _forms(encoded.payload)
        assert encoded.ts_min_ms == frames.NO_TS
        assert frames.decode_records(encoded.payload, encoded.binary) == records

    def test_ids_categories_and_tenths_take_their_compact_forms(self) -> None:
        """Hex ids go binary, few-valued columns get codes, one-decimal floats become tenths."""
        records = make_records(64)
        forms = _forms(frames.encode_records(records).payload)
        assert (forms["trace_id"], forms["span_id"], forms["model"], forms["e2e_ms"]) == ("h", "h", "d", "x")
        assert "prompt_tokens" not in forms

    def test_lookalike_values_keep_their_exact_type_and_text(self) -> None:
        """Uppercase hex, -0.0, True next to 1, and two-decimal floats all come back unchanged."""
        records = [
            {"id": f"ABCDEF{i:010X}", "z": -0.0 if i == 3 else 1.5, "b": True if i % 2 else 1, "f": 0.25 * i}
            for i in range(40)
        ]
        encoded = frames.encode_records(records)
        assert set(_forms(encoded.payload)) & {"id", "z", "f"} == set()
        decoded = frames.decode_records(encoded.payload, encoded.binary)
        assert decoded == records
        assert [type(r["b"]) for r in decoded] == [type(r["b"]) for r in records]
        assert str(decoded[3]["z"]) == "-0.0"

    def test_a_malformed_payload_is_a_value_error(self) -> None:
        """Columns of different lengths are refused."""
        with pytest.raises(ValueError, match="line up"):
            frames.decode_records(b'{"n":2,"k":["a","b"],"c":[[1,2],[3]]}')


class TestHeader:
    def test_round_trip(self) -> None:
        """A packed header unpacks to the same values."""
        header = frames.FrameHeader(frames.KIND_RECORDS, 77, 3, 100, 50, 48, 300, 1, 2, 12345)
        assert frames.unpack_header(header.pack()) == header

    def test_a_flipped_bit_is_detected(self) -> None:
        """Changing one byte of the header body fails its checksum."""
        data = bytearray(frames.FrameHeader(frames.KIND_RECORDS, 0, 3, 100, 50).pack())
        data[20] ^= 1
        with pytest.raises(ValueError, match="checksum"):
            frames.unpack_header(bytes(data))

    def test_foreign_bytes_are_not_a_header(self) -> None:
        """A gzip file's first bytes are reported as not a segment."""
        with pytest.raises(ValueError, match="not an inferwatch archive segment"):
            frames.unpack_header(b"\x1f\x8b" + b"\x00" * 80)
