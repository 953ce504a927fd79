"""The frame format of archive segments: a checksummed header, then one independent zstd frame.

On disk a frame is a zstd *skippable frame* carrying our header (so ``zstd -d`` walks a segment
without error), followed by the compressed payload, itself one zstd frame::

    u32 0x184D2A5E | u32 52 | header (48 bytes, see HEADER) | u32 crc32(header) | payload

A ``records`` payload is the frame's records transposed into columns, as compact JSON::

    {"k": [keys...], "c": [[column values...], ...], "a": {"i": [rows lacking key i]}, "t": 1}

Columns of like values compress far better than rows. ``t`` marks a ``ts`` column of
``YYYY-MM-DDTHH:MM:SS.mmmZ`` strings stored as millisecond deltas (exactly reversible).
A ``dictionary`` frame holds the zstd dictionary that later frames of its segment name by id.
"""

from __future__ import annotations

import calendar
import json
import re
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from log_pipeline.records import format_ts

SKIPPABLE_MAGIC = 0x184D2A5E
TAG = b"IWFH"
VERSION = 1
KIND_RECORDS = 1
KIND_DICTIONARY = 2

_PREFIX = struct.Struct("<II")
HEADER = struct.Struct("<4sBBHIIIIIqqI")
"""tag, version, kind, flags, dict_id, n_records, raw_len, comp_len, json_len, ts_min_ms, ts_max_ms,
payload_crc; ``json_len`` is the size of the records as compact JSON lines (for ratios)."""
_CRC = struct.Struct("<I")
PREFIX_SIZE = _PREFIX.size
FRAME_OVERHEAD = _PREFIX.size + HEADER.size + _CRC.size
NO_TS = -(2**63)

_TS_RE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
_DUMPS = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str).encode
_DECODE = json.JSONDecoder().decode
_MISSING: Any = object()


@dataclass(frozen=True, slots=True)
class FrameHeader:
    """What precedes every payload: its kind, size, checksum, record count and time range."""

    kind: int
    dict_id: int
    n_records: int
    raw_len: int
    comp_len: int
    json_len: int = 0
    ts_min_ms: int = NO_TS
    ts_max_ms: int = NO_TS
    payload_crc: int = 0
    flags: int = 0

    def pack(self) -> bytes:
        """The header bytes, skippable-frame prefix and header checksum included."""
        body = HEADER.pack(
            TAG, VERSION, self.kind, self.flags, self.dict_id, self.n_records, self.raw_len,
            self.comp_len, self.json_len, self.ts_min_ms, self.ts_max_ms, self.payload_crc,
        )
        return _PREFIX.pack(SKIPPABLE_MAGIC, HEADER.size + _CRC.size) + body + _CRC.pack(zlib.crc32(body))


def unpack_header(data: bytes) -> FrameHeader:
    """Parse ``FRAME_OVERHEAD`` bytes; raises ValueError saying what is wrong."""
    if len(data) < FRAME_OVERHEAD:
        raise ValueError(f"truncated header ({len(data)} of {FRAME_OVERHEAD} bytes)")
    magic, size = _PREFIX.unpack_from(data)
    if magic != SKIPPABLE_MAGIC or size != HEADER.size + _CRC.size:
        raise ValueError("no frame header here (not an inferwatch archive segment, or damaged)")
    body = data[PREFIX_SIZE:PREFIX_SIZE + HEADER.size]
    (crc,) = _CRC.unpack_from(data, PREFIX_SIZE + HEADER.size)
    if zlib.crc32(body) != crc:
        raise ValueError("header checksum mismatch")
    tag, version, kind, flags, dict_id, n, raw_len, comp_len, json_len, ts_min, ts_max, pcrc = HEADER.unpack(body)
    if tag != TAG:
        raise ValueError(f"unknown header tag {tag!r}")
    if version != VERSION:
        raise ValueError(f"unsupported frame version {version}")
    if kind not in (KIND_RECORDS, KIND_DICTIONARY):
        raise ValueError(f"unknown frame kind {kind}")
    return FrameHeader(kind, dict_id, n, raw_len, comp_len, json_len, ts_min, ts_max, pcrc, flags)


def ts_to_ms(ts: object) -> int | None:
    """Milliseconds since the epoch of a ``YYYY-MM-DDTHH:MM:SS.mmmZ`` string, else None."""
    if not isinstance(ts, str) or not _TS_RE.fullmatch(ts):
        return None
    try:
        seconds = calendar.timegm((int(ts[0:4]), int(ts[5:7]), int(ts[8:10]), int(ts[11:13]),
                                   int(ts[14:16]), int(ts[17:19]), 0, 0, 0))
    except (ValueError, OverflowError):
        return None
    ms = seconds * 1000 + int(ts[20:23])
    return ms if format_ts(ms / 1000) == ts else None


@dataclass(frozen=True, slots=True)
class EncodedRecords:
    """A frame's payload before compression, with what the header needs."""

    payload: bytes
    n_records: int
    json_bytes: int
    ts_min_ms: int
    ts_max_ms: int


def _ts_column(values: list[Any]) -> list[int] | None:
    """Millisecond deltas of a ts column, or None when a value is not a canonical timestamp."""
    deltas: list[int] = []
    previous = 0
    for value in values:
        ms = ts_to_ms(value)
        if ms is None:
            return None
        deltas.append(ms - previous)
        previous = ms
    return deltas


def encode_records(records: Sequence[dict[str, Any]]) -> EncodedRecords:
    """Transpose records into the columnar payload; ``json_bytes`` is their size as JSON lines."""
    keys: dict[str, None] = {}
    for record in records:
        keys.update(dict.fromkeys(record))
    n = len(records)
    columns: list[str] = []
    absent: dict[str, list[int]] = {}
    json_bytes = n  # newlines
    ts_min = ts_max = NO_TS
    ts_delta = False
    for i, key in enumerate(keys):
        column = [record.get(key, _MISSING) for record in records]
        holes = [row for row, value in enumerate(column) if value is _MISSING]
        if holes:
            absent[str(i)] = holes
            for row in holes:
                column[row] = None
        if key == "ts" and not holes:
            deltas = _ts_column(column)
            if deltas is not None:
                ts_delta = True
                absolute = _cumulative(deltas)
                ts_min, ts_max = min(absolute), max(absolute)
                text = _DUMPS(column)  # for the exact JSON size only
                columns.append(_DUMPS(deltas))
            else:
                text = _DUMPS(column)
                columns.append(text)
        else:
            text = _DUMPS(column)
            columns.append(text)
        present = n - len(holes)
        value_bytes = len(text.encode()) if not text.isascii() else len(text)
        value_bytes -= 2 + (n - 1) + 4 * len(holes)
        key_bytes = len(_DUMPS(key).encode())
        json_bytes += value_bytes + present * (key_bytes + 2)  # '"k":' + ',' (or a brace) per value
    json_bytes += n  # the second brace of each record
    head = '{"k":' + _DUMPS(list(keys)) + ',"c":[' + ",".join(columns) + "]"
    if absent:
        head += ',"a":' + _DUMPS(absent)
    if ts_delta:
        head += ',"t":1'
    payload = (head + "}").encode()
    return EncodedRecords(payload, n, json_bytes, ts_min, ts_max)


def _cumulative(deltas: list[int]) -> list[int]:
    total = 0
    out = []
    for delta in deltas:
        total += delta
        out.append(total)
    return out


def decode_records(payload: bytes) -> list[dict[str, Any]]:
    """Rebuild the records of a columnar payload; raises ValueError if it is malformed."""
    doc = _DECODE(payload.decode())
    if not isinstance(doc, dict) or not isinstance(doc.get("k"), list) or not isinstance(doc.get("c"), list):
        raise ValueError("payload is not a columnar record block")
    keys: list[str] = doc["k"]
    columns: list[list[Any]] = doc["c"]
    if len(keys) != len(columns) or len({len(c) for c in columns}) > 1:
        raise ValueError("payload columns do not line up")
    n = len(columns[0]) if columns else 0
    if doc.get("t") and "ts" in keys:
        index = keys.index("ts")
        columns[index] = [format_ts(ms / 1000) for ms in _cumulative(columns[index])]
    rows = [dict(zip(keys, values, strict=True)) for values in zip(*columns, strict=True)] if n else []
    for key_index, holes in (doc.get("a") or {}).items():
        key = keys[int(key_index)]
        for row in holes:
            del rows[row][key]
    return rows
