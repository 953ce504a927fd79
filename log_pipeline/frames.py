"""The frame format of archive segments: a checksummed header, then one independent zstd frame.

On disk a frame is a zstd *skippable frame* carrying our header (so ``zstd -d`` walks a segment
without error), followed by the compressed payload, itself one zstd frame::

    u32 0x184D2A5E | u32 56 | header (52 bytes, see HEADER) | u32 crc32(header) | payload | binary

A ``records`` payload is the frame's records transposed into columns, as compact JSON; the raw
bytes of its hex-id columns follow the compressed payload uncompressed (random bytes do not
compress, and zstd would spend a little on them)::

    {"n": rows, "k": [keys...], "c": [column...], "a": {"i": [rows lacking key i]},
     "f": {"i": form of column i}}

Columns of like values compress far better than rows. A column's form is ``t`` (canonical
``YYYY-MM-DDTHH:MM:SS.mmmZ`` timestamps as millisecond deltas), ``h`` (lowercase hex ids as raw
bytes; the column holds the byte width), ``d`` (few distinct values: ``[values, codes]`` with
one code character per row), ``x`` (one-decimal floats as integer tenths) or absent (plain JSON
list). Every form is exactly reversible.
A ``dictionary`` frame holds the zstd dictionary that later frames of its segment name by id.
"""

from __future__ import annotations

import calendar
import json
import math
import operator
import re
import struct
import time
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
HEADER = struct.Struct("<4sBBHIIIIIIqqI")
"""tag, version, kind, flags, dict_id, n_records, raw_len, comp_len, bin_len, json_len, ts_min_ms,
ts_max_ms, crc; ``json_len`` is the size of the records as compact JSON lines (for ratios) and
``crc`` covers the compressed payload and the binary section."""
_CRC = struct.Struct("<I")
PREFIX_SIZE = _PREFIX.size
FRAME_OVERHEAD = _PREFIX.size + HEADER.size + _CRC.size
NO_TS = -(2**63)

_TS_RE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
_DUMPS = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str).encode
_DECODE = json.JSONDecoder().decode
_MISSING: Any = object()
_SECONDS: dict[str, int] = {}
_LOWER_HEX = re.compile(r"[0-9a-f]+")
_CODE_CHARS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz-_"
_CODABLE = frozenset({str, int, bool, type(None)})


@dataclass(frozen=True, slots=True)
class FrameHeader:
    """What precedes every payload: its kind, size, checksum, record count and time range."""

    kind: int
    dict_id: int
    n_records: int
    raw_len: int
    comp_len: int
    bin_len: int = 0
    json_len: int = 0
    ts_min_ms: int = NO_TS
    ts_max_ms: int = NO_TS
    payload_crc: int = 0
    flags: int = 0

    def pack(self) -> bytes:
        """The header bytes, skippable-frame prefix and header checksum included."""
        body = HEADER.pack(
            TAG, VERSION, self.kind, self.flags, self.dict_id, self.n_records, self.raw_len,
            self.comp_len, self.bin_len, self.json_len, self.ts_min_ms, self.ts_max_ms, self.payload_crc,
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
    tag, version, kind, flags, dict_id, n, raw_len, comp_len, bin_len, json_len, ts_min, ts_max, pcrc = (
        HEADER.unpack(body)
    )
    if tag != TAG:
        raise ValueError(f"unknown header tag {tag!r}")
    if version != VERSION:
        raise ValueError(f"unsupported frame version {version}")
    if kind not in (KIND_RECORDS, KIND_DICTIONARY):
        raise ValueError(f"unknown frame kind {kind}")
    return FrameHeader(kind, dict_id, n, raw_len, comp_len, bin_len, json_len, ts_min, ts_max, pcrc, flags)


def ts_to_ms(ts: object) -> int | None:
    """Milliseconds since the epoch of a ``YYYY-MM-DDTHH:MM:SS.mmmZ`` string, else None."""
    if not isinstance(ts, str) or not _TS_RE.fullmatch(ts):
        return None
    seconds = _SECONDS.get(ts[:19])
    if seconds is None:
        fields = (int(ts[0:4]), int(ts[5:7]), int(ts[8:10]), int(ts[11:13]), int(ts[14:16]), int(ts[17:19]))
        try:
            seconds = calendar.timegm((*fields, 0, 0, 0))
        except (ValueError, OverflowError):
            return None
        if tuple(time.gmtime(seconds)[:6]) != fields:
            return None  # e.g. February 30th: not a date format_ts would write back
        if len(_SECONDS) > 4096:
            _SECONDS.clear()
        _SECONDS[ts[:19]] = seconds
    return seconds * 1000 + int(ts[20:23])


@dataclass(frozen=True, slots=True)
class EncodedRecords:
    """A frame's payload before compression, with what the header needs."""

    payload: bytes
    binary: bytes
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


def _hex_bytes(column: list[Any]) -> bytes | None:
    """The column as raw bytes when every value is a lowercase hex string of one even length (8..64)."""
    first = column[0]
    if not isinstance(first, str) or len(first) % 2 or not 8 <= len(first) <= 64:
        return None
    if set(map(type, column)) != {str} or set(map(len, column)) != {len(first)}:
        return None
    joined = "".join(column)
    return bytes.fromhex(joined) if _LOWER_HEX.fullmatch(joined) else None


def _codes(column: list[Any]) -> tuple[list[Any], str] | None:
    """Distinct values and one code character per row, for a column of few distinct non-float scalars."""
    n = len(column)
    if n < 16:
        return None
    try:
        distinct = set(column)
    except TypeError:
        return None  # lists or objects
    if len(distinct) > min(len(_CODE_CHARS), n // 4):
        return None
    kinds = set(map(type, column))
    if not kinds <= _CODABLE or {int, bool} <= kinds:
        return None  # floats (0.0 == -0.0) and ints next to bools (1 == True) would merge
    values = list(dict.fromkeys(column))
    lookup = {v: _CODE_CHARS[i] for i, v in enumerate(values)}
    return values, "".join(map(lookup.__getitem__, column))


def _tenths(column: list[Any]) -> list[int | None] | None:
    """Each float times ten as an int when that is exact (values with one decimal), None stays None."""
    kinds = {type(v) for v in column}
    if kinds != {float} and kinds != {float, type(None)}:
        return None
    try:
        tenths = [None if v is None else round(v * 10) for v in column]
    except (OverflowError, ValueError):
        return None
    back = [None if t is None else t / 10 for t in tenths]
    if back != column or any(v == 0 and math.copysign(1.0, v) < 0 for v in column if v is not None):
        return None
    return tenths


def encode_records(records: Sequence[dict[str, Any]]) -> EncodedRecords:
    """Transpose records into the columnar payload; ``json_bytes`` is their size as JSON lines.

    Each column is stored in the most compact exact form: ``ts`` as millisecond deltas, hex ids
    as raw bytes after the JSON head, few-valued columns as a value list plus one code character
    per row, one-decimal floats as integer tenths, anything else as a JSON list.
    """
    keys = dict.fromkeys(records[0]) if records else {}
    for record in records:
        if len(record) != len(keys) or record.keys() != keys.keys():
            keys.update(dict.fromkeys(record))
    n = len(records)
    missing: dict[str, list[int]] = {}
    template = dict.fromkeys(keys, _MISSING)
    filled = list(records)
    for row, record in enumerate(records):
        if len(record) != len(keys):
            filled[row] = {**template, **record}
            for key in keys:
                if key not in record:
                    missing.setdefault(key, []).append(row)
    if len(keys) > 1:
        transposed = [list(c) for c in zip(*map(operator.itemgetter(*keys), filled), strict=True)]
    else:
        transposed = [[record.get(key, _MISSING) for record in filled] for key in keys]
    columns: list[str] = []
    forms: dict[str, str] = {}
    absent: dict[str, list[int]] = {}
    blob: list[bytes] = []
    json_bytes = n  # newlines
    ts_min = ts_max = NO_TS
    for i, key in enumerate(keys):
        column = transposed[i]
        holes = missing.get(key, [])
        if holes:
            absent[str(i)] = holes
            for row in holes:
                column[row] = None
        text = _DUMPS(column)
        stored = None
        if key == "ts" and not holes:
            deltas = _ts_column(column)
            if deltas is not None:
                absolute = _cumulative(deltas)
                ts_min, ts_max = min(absolute), max(absolute)
                forms[str(i)], stored = "t", _DUMPS(deltas)
        if stored is None and not holes:
            raw = _hex_bytes(column)
            if raw is not None:
                blob.append(raw)
                forms[str(i)], stored = "h", str(len(raw) // n)
        if stored is None:
            coded = _codes(column)
            if coded is not None:
                forms[str(i)], stored = "d", _DUMPS(list(coded))
        if stored is None:
            tenths = _tenths(column)
            if tenths is not None:
                forms[str(i)], stored = "x", _DUMPS(tenths)
        columns.append(text if stored is None else stored)
        present = n - len(holes)
        value_bytes = len(text.encode()) if not text.isascii() else len(text)
        value_bytes -= 2 + (n - 1) + 4 * len(holes)
        key_bytes = len(_DUMPS(key).encode())
        json_bytes += value_bytes + present * (key_bytes + 2)  # '"k":' + ',' (or a brace) per value
    json_bytes += n  # the second brace of each record
    head = '{"n":' + str(n) + ',"k":' + _DUMPS(list(keys)) + ',"c":[' + ",".join(columns) + "]"
    if absent:
        head += ',"a":' + _DUMPS(absent)
    if forms:
        head += ',"f":' + _DUMPS(forms)
    return EncodedRecords((head + "}").encode(), b"".join(blob), n, json_bytes, ts_min, ts_max)


def _cumulative(deltas: list[int]) -> list[int]:
    total = 0
    out = []
    for delta in deltas:
        total += delta
        out.append(total)
    return out


def decode_records(payload: bytes, binary: bytes = b"") -> list[dict[str, Any]]:
    """Rebuild the records of a columnar payload and its binary section; ValueError if malformed."""
    doc = _DECODE(payload.decode())
    if not isinstance(doc, dict) or not isinstance(doc.get("k"), list) or not isinstance(doc.get("c"), list):
        raise ValueError("payload is not a columnar record block")
    keys: list[str] = doc["k"]
    columns: list[Any] = doc["c"]
    if len(keys) != len(columns):
        raise ValueError("payload columns do not line up with its keys")
    n = doc.get("n")
    if not isinstance(n, int) or n < 0:
        raise ValueError("payload has no record count")
    forms: dict[str, str] = doc.get("f") or {}
    try:
        _restore(columns, forms, binary, n)
    except (KeyError, TypeError, IndexError, AttributeError) as err:
        raise ValueError(f"payload column is malformed: {err!r}") from err
    if any(len(c) != n for c in columns):
        raise ValueError("payload columns do not line up")
    rows = [dict(zip(keys, values, strict=True)) for values in zip(*columns, strict=True)] if n else []
    for key_index, holes in (doc.get("a") or {}).items():
        key = keys[int(key_index)]
        for row in holes:
            del rows[row][key]
    return rows


def _restore(columns: list[Any], forms: dict[str, str], blob: bytes, n: int) -> None:
    """Turn stored column forms back into plain value lists, in place."""
    offset = 0
    for index_text, form in sorted(forms.items(), key=lambda item: int(item[0])):
        index = int(index_text)
        column = columns[index]
        if form == "t":
            columns[index] = [format_ts(ms / 1000) for ms in _cumulative(column)]
        elif form == "h":
            width = int(column)
            chunk = blob[offset:offset + width * n]
            if len(chunk) != width * n:
                raise ValueError("payload binary section is too short")
            columns[index] = [chunk[j:j + width].hex() for j in range(0, width * n, width)]
            offset += width * n
        elif form == "d":
            values, codes = column
            lookup = {_CODE_CHARS[j]: v for j, v in enumerate(values)}
            columns[index] = [lookup[c] for c in codes]
        elif form == "x":
            columns[index] = [None if v is None else v / 10 for v in column]
        else:
            raise ValueError(f"unknown column form {form!r}")
