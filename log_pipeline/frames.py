"""The frame format of archive segments: a checksummed header, then one independent zstd frame.

On disk a frame is a zstd *skippable frame* carrying our header (so ``zstd -d`` walks a segment
without error), followed by the compressed payload, itself one zstd frame::

    u32 0x184D2A5E | u32 56 | header (52 bytes, see HEADER) | u32 crc32(header) | payload | binary

A ``records`` payload is the frame's records transposed into columns, as compact JSON; the raw
bytes of its hex-id columns follow the compressed payload uncompressed (random bytes do not
compress, and zstd would spend a little on them)::

    {"n": rows, "k": [keys...], "c": [column...], "f": {"i": form of column i},
     "s": {"key": [[rows...], [values...]]}}

``k``/``c`` hold the keys every record has; ``s`` the keys only some records have (errors add
two), as row numbers and values. A column's form is ``t`` (canonical ``YYYY-MM-DDTHH:MM:SS.mmmZ``
timestamps, stored position by position: one string per character position, or one character
when the position never changes), ``h`` (lowercase hex ids as raw bytes; the column holds
``[byte width, offset in the binary section]``), ``d`` (few distinct strings or nulls:
``[values, codes]`` with one code character per row) or absent (plain JSON list). Every form is
exactly reversible. When every ``trace_id`` is a lowercase 32-digit hex id, the binary section
starts with them (16 bytes each, in row order) and the header carries ``FLAG_TRACE_IDS``, so a
lookup can test a frame for an id without decompressing it.

A ``dictionary`` frame holds the zstd dictionary that later frames of its segment name by id.

Every transformation of a column is one C-level call over the column (``zip``, ``str.join``,
``bytes.fromhex``, ``dict.fromkeys``, slicing, orjson); no Python code runs per value.
"""

from __future__ import annotations

import calendar
import json
import operator
import re
import struct
import time
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import compress, islice
from typing import Any

import orjson

SKIPPABLE_MAGIC = 0x184D2A5E
TAG = b"IWFH"
VERSION = 2
KIND_RECORDS = 1
KIND_DICTIONARY = 2
FLAG_TRACE_IDS = 1
"""Header flag: the binary section starts with the frame's trace ids, 16 raw bytes per record."""
TRACE_KEY = "trace_id"
TRACE_ID_BYTES = 16

_PREFIX = struct.Struct("<II")
HEADER = struct.Struct("<4sBBHIIIIIIqqI")
"""tag, version, kind, flags, dict_id, n_records, raw_len, comp_len, bin_len, json_len, ts_min_ms,
ts_max_ms, crc; ``json_len`` is the size of the records as compact JSON lines (for ratios) and
``crc`` covers the compressed payload and the binary section."""
_CRC = struct.Struct("<I")
PREFIX_SIZE = _PREFIX.size
FRAME_OVERHEAD = _PREFIX.size + HEADER.size + _CRC.size
NO_TS = -(2**63)

TS_WIDTH = 24
_TS_RE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
_TS_PATTERN = "dddd-dd-ddTdd:dd:dd.dddZ"
_STDLIB_DUMPS = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str).encode
_STDLIB_DECODE = json.JSONDecoder().decode
_SECONDS: dict[str, int] = {}
_KEY_BYTES: dict[str, int] = {}
_LOWER_HEX = re.compile(r"[0-9a-f]+")
_CODE_CHARS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz-_"
_MIN_CODED_ROWS = 16
_TEXT_KINDS = frozenset({str, type(None)})
_INT_KINDS = frozenset({str, int, type(None)})
_BOOL_KINDS = frozenset({str, bool, type(None)})
_DECIMAL = rb"(?:null|(?!-0\.0[,\]])-?(?:0|[1-9]\d*)\.\d)"
_ONE_DECIMAL = re.compile(rb"\[" + _DECIMAL + rb"(?:," + _DECIMAL + rb")*\]")
_Columns = tuple[tuple[str, ...], list[Any], dict[str, list[list[Any]]]]
"""Keys every record has, their columns, and ``{key: [rows, values]}`` for the other keys."""


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


def header_version(data: bytes) -> int | None:
    """The format version named by the frame header at the start of ``data``; None if there is none."""
    if len(data) < PREFIX_SIZE + 5:
        return None
    magic, size = _PREFIX.unpack_from(data)
    if magic != SKIPPABLE_MAGIC or size != HEADER.size + _CRC.size or data[PREFIX_SIZE:PREFIX_SIZE + 4] != TAG:
        return None
    return data[PREFIX_SIZE + 4]


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
    trace_ids: bytes | None = None
    """Every record's trace id as 16 raw bytes (the binary section's start), or None."""

    @property
    def flags(self) -> int:
        """The header flags this payload calls for."""
        return FLAG_TRACE_IDS if self.trace_ids is not None else 0


def dumps(value: Any) -> bytes:
    """Compact JSON of ``value``, exactly reversible by :func:`loads` (see :func:`dumps_checked`)."""
    return dumps_checked(value)[0]


def dumps_checked(value: Any) -> tuple[bytes, bool]:
    """Compact JSON of ``value``, and True when it had to come from the stdlib encoder.

    orjson writes NaN and infinities as ``null`` and refuses integers beyond 64 bits; a value
    with either (or anything else orjson refuses) goes through the stdlib encoder instead, and
    such text must be parsed back by the stdlib too (orjson reads big integers as floats).
    """
    try:
        text = orjson.dumps(value)
    except TypeError:
        return _STDLIB_DUMPS(value).encode("utf-8", "surrogatepass"), True
    if b"null" in text and _nulls(value) != text.count(b"null") and not _same(orjson.loads(text), value):
        return _STDLIB_DUMPS(value).encode("utf-8", "surrogatepass"), True
    return text, False


def _nulls(value: Any) -> int:
    """How many top-level None a list holds (more nulls in its JSON: nested ones, or non-finite floats)."""
    return value.count(None) if isinstance(value, list | tuple) else int(value is None)


def _same(parsed: Any, value: Any) -> bool:
    """True when JSON parsed back equals the value it was written from (NaN never does)."""
    return bool(parsed == (list(value) if isinstance(value, tuple) else value))


def loads(data: bytes, *, stdlib: bool = False) -> Any:
    """Parse what :func:`dumps` wrote; ``stdlib`` when :func:`dumps_checked` said it used the stdlib."""
    if not stdlib:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return _STDLIB_DECODE(data.decode("utf-8", "surrogatepass"))


def _transpose(records: Sequence[dict[str, Any]]) -> _Columns:
    """Keys every record has, their columns, and ``{key: [rows, values]}`` for the other keys."""
    n = len(records)
    lengths = list(map(len, records))
    shortest = min(lengths)
    base = records[lengths.index(shortest)]
    keys = tuple(base)
    try:
        if len(keys) > 1:
            columns: list[Any] = list(zip(*map(operator.itemgetter(*keys), records), strict=True))
        else:
            columns = [list(map(operator.itemgetter(key), records)) for key in keys]
    except KeyError:
        return _transpose_mixed(records)
    sparse: dict[str, list[list[Any]]] = {}
    if lengths.count(shortest) != n:
        for row in compress(range(n), map(shortest.__ne__, lengths)):
            record = records[row]
            if tuple(islice(record, shortest)) == keys:  # the usual case: extra keys at the end
                extra: Iterable[str] = islice(record, shortest, None)
            else:
                extra = [key for key in record if key not in base]
            for key in extra:
                rows_values = sparse.get(key)
                if rows_values is None:
                    rows_values = sparse[key] = [[], []]
                rows_values[0].append(row)
                rows_values[1].append(record[key])
    return keys, columns, sparse


def _transpose_mixed(records: Sequence[dict[str, Any]]) -> _Columns:
    """The general case of :func:`_transpose`: records whose key sets differ arbitrarily."""
    every: dict[str, int] = {}
    for record in records:
        for key in record:
            every[key] = every.get(key, 0) + 1
    n = len(records)
    keys = tuple(key for key, count in every.items() if count == n)
    columns: list[Any] = [[record[key] for record in records] for key in keys]
    sparse: dict[str, list[list[Any]]] = {}
    for key, count in every.items():
        if count != n:
            rows = [row for row, record in enumerate(records) if key in record]
            sparse[key] = [rows, [records[row][key] for row in rows]]
    return keys, columns, sparse


def _hex_bytes(column: Sequence[Any]) -> bytes | None:
    """The column as raw bytes when every value is a lowercase hex string of one even length (8..64)."""
    first = column[0]
    if not isinstance(first, str) or len(first) % 2 or not 8 <= len(first) <= 64 or not _LOWER_HEX.fullmatch(first):
        return None
    try:
        joined = "".join(column)
        raw = bytes.fromhex(joined)
    except (TypeError, ValueError):
        return None
    if raw.hex() != joined or (len(column) > 1 and set(map(len, column)) != {len(first)}):
        return None  # upper case, spaces, or ids of different lengths
    return raw


def _ts_positions(column: Sequence[Any]) -> tuple[list[str], str, str] | None:
    """Canonical timestamps split by character position (constant ones as one char), with min and max."""
    try:
        joined = "".join(column)
    except TypeError:
        return None
    n = len(column)
    if len(joined) != TS_WIDTH * n or (n > 1 and set(map(len, column)) != {TS_WIDTH}):
        return None
    positions = []
    for j, pattern in enumerate(_TS_PATTERN):
        chars = joined[j::TS_WIDTH]
        if pattern == "d":
            if not (chars.isascii() and chars.isdigit()):
                return None
        elif chars.count(pattern) != n:
            return None
        if j < TS_WIDTH - 1:  # the last character is always "Z"
            positions.append(chars[0] if chars.count(chars[0]) == n else chars)
    return positions, min(column), max(column)


def _codes(column: Sequence[Any]) -> tuple[list[Any], str] | None:
    """Distinct values and one code character per row, for a column of few distinct strings, ints or bools."""
    n = len(column)
    if n < _MIN_CODED_ROWS:
        return None
    first = column[0]
    if type(first) is str and column.count(first) == n:
        return [first], _CODE_CHARS[0] * n  # a constant column (only strings equal a string)
    try:
        lookup: dict[Any, Any] = dict.fromkeys(column)
    except TypeError:
        return None  # lists or objects
    if len(lookup) > min(len(_CODE_CHARS), n // 4):
        return None
    if not set(map(type, lookup)) <= _TEXT_KINDS:
        kinds = set(map(type, column))  # 1 == 1.0 == True: only one kind of number may be coded
        if not (kinds <= _INT_KINDS or kinds <= _BOOL_KINDS):
            return None
    for code, value in zip(_CODE_CHARS, lookup, strict=False):
        lookup[value] = code
    return list(lookup), "".join(map(lookup.__getitem__, column))


def _tenths(text: bytes) -> bytes | None:
    """A JSON list of one-decimal floats (or nulls) as integer tenths, or None when it is not one."""
    if not _ONE_DECIMAL.fullmatch(text):
        return None
    return text.replace(b".", b"").replace(b",0", b",").replace(b"[0", b"[").replace(b"-0", b"-")


def _key_bytes(key: str) -> int:
    """Bytes of ``"key":`` plus the comma after its value, as compact JSON (cached)."""
    size = _KEY_BYTES.get(key)
    if size is None:
        size = len(dumps(key)) + 2
        if len(_KEY_BYTES) < 4096:
            _KEY_BYTES[key] = size
    return size


def _json_size(values: list[Any], counts: list[int]) -> int:
    """Bytes that ``values`` repeated ``counts`` times take as JSON values."""
    return sum(len(dumps(value)) * count for value, count in zip(values, counts, strict=True))


def encode_records(records: Sequence[dict[str, Any]]) -> EncodedRecords:
    """Transpose records into the columnar payload; ``json_bytes`` is their size as JSON lines.

    Each column is stored in the most compact exact form: ``ts`` position by position, hex ids
    as raw bytes after the JSON head, few-valued string columns as a value list plus one code
    character per row, anything else as a JSON list.
    """
    n = len(records)
    if not n:
        return EncodedRecords(b'{"n":0,"k":[],"c":[]}', b"", 0, 0, NO_TS, NO_TS)
    keys, columns, sparse = _transpose(records)
    stdlib = False
    parts: list[bytes] = []
    forms: dict[str, Any] = {}
    blob: list[bytes] = []
    blob_size = 0
    trace_ids: bytes | None = None
    if TRACE_KEY in keys:
        raw = _hex_bytes(columns[keys.index(TRACE_KEY)])
        if raw is not None and len(raw) == TRACE_ID_BYTES * n:
            trace_ids = raw  # first in the binary section, where a lookup expects it
            blob.append(raw)
            blob_size = len(raw)
    json_bytes = 2 * n  # a brace and the newline; the other brace stands in for the last comma
    ts_min = ts_max = NO_TS
    for i, key in enumerate(keys):
        column = columns[i]
        stored: bytes | None = None
        first = column[0]
        if key == TRACE_KEY and trace_ids is not None:
            forms[str(i)], stored = "h", b"[%d,0]" % TRACE_ID_BYTES
            value_bytes = (2 * TRACE_ID_BYTES + 2) * n
        elif type(first) is str:
            if key == "ts" and len(first) == TS_WIDTH:
                split = _ts_positions(column)
                if split is not None:
                    positions, low, high = split
                    forms[str(i)], stored = "t", dumps(positions)
                    value_bytes = (TS_WIDTH + 2) * n
                    low_ms, high_ms = ts_to_ms(low), ts_to_ms(high)
                    if low_ms is not None and high_ms is not None:
                        ts_min, ts_max = low_ms, high_ms
            if stored is None and len(first) % 2 == 0:
                raw = _hex_bytes(column)
                if raw is not None:
                    width = len(raw) // n
                    forms[str(i)], stored = "h", b"[%d,%d]" % (width, blob_size)
                    blob.append(raw)
                    blob_size += len(raw)
                    value_bytes = (2 * width + 2) * n
        if stored is None and type(first) is not float and type(first) is not dict and type(first) is not list:
            coded = _codes(column)
            if coded is not None:
                values, codes = coded
                stored, fallback = dumps_checked([values, codes])
                forms[str(i)], stdlib = "d", stdlib or fallback
                value_bytes = _json_size(values, [codes.count(c) for c in _CODE_CHARS[:len(values)]])
        if stored is None:
            stored, fallback = dumps_checked(column)
            stdlib |= fallback
            value_bytes = len(stored) - 1 - n  # brackets and commas
            if (first is None or type(first) is float) and b"." in stored:
                tenths = _tenths(stored)
                if tenths is not None:
                    forms[str(i)], stored = "x", tenths
        parts.append(stored)
        json_bytes += value_bytes + n * _key_bytes(key)
    for key, (rows, values) in sparse.items():
        json_bytes += len(dumps(values)) - 1 - len(values) + len(rows) * _key_bytes(key)
    if not keys:  # a record without any key is "{}": one byte more than the rule above
        json_bytes += n - len({row for rows, _values in sparse.values() for row in rows})
    head = b'{"n":%d,"k":%s,"c":[%s]' % (n, dumps(keys), b",".join(parts))
    if forms:
        head += b',"f":' + dumps(forms)
    if sparse:
        text, fallback = dumps_checked(sparse)
        head += b',"s":' + text
        stdlib |= fallback
    if stdlib:
        head += b',"j":1'  # parse with the stdlib: the text has big integers, NaN or infinities
    return EncodedRecords(head + b"}", b"".join(blob), n, json_bytes, ts_min, ts_max, trace_ids)


def decode_records(payload: bytes, binary: bytes = b"") -> list[dict[str, Any]]:
    """Rebuild the records of a columnar payload and its binary section; ValueError if malformed."""
    try:
        doc = loads(payload, stdlib=payload.endswith(b',"j":1}'))
    except UnicodeDecodeError as err:
        raise ValueError(f"payload is not UTF-8: {err}") from err
    if not isinstance(doc, dict) or not isinstance(doc.get("k"), list) or not isinstance(doc.get("c"), list):
        raise ValueError("payload is not a columnar record block")
    keys: list[str] = doc["k"]
    columns: list[Any] = doc["c"]
    if len(keys) != len(columns):
        raise ValueError("payload columns do not line up with its keys")
    n = doc.get("n")
    if not isinstance(n, int) or n < 0:
        raise ValueError("payload has no record count")
    forms: dict[str, Any] = doc.get("f") or {}
    try:
        _restore(columns, forms, binary, n)
        if any(len(c) != n for c in columns):
            raise ValueError("payload columns do not line up")
        rows = [dict(zip(keys, values, strict=True)) for values in zip(*columns, strict=True)] if keys else [
            {} for _ in range(n)
        ]
        for key, (where, values) in (doc.get("s") or {}).items():
            for row, value in zip(where, values, strict=True):
                rows[row][key] = value
    except (KeyError, TypeError, IndexError, AttributeError) as err:
        raise ValueError(f"payload column is malformed: {err!r}") from err
    return rows


def _restore(columns: list[Any], forms: dict[str, Any], blob: bytes, n: int) -> None:
    """Turn stored column forms back into plain value lists, in place."""
    for index_text, form in forms.items():
        index = int(index_text)
        column = columns[index]
        if form == "t":
            parts = [p * n if len(p) == 1 else p for p in column]
            if len(parts) != TS_WIDTH - 1 or any(len(p) != n for p in parts):
                raise ValueError("payload ts column is malformed")
            parts.append("Z" * n)
            columns[index] = list(map("".join, zip(*parts, strict=True)))
        elif form == "h":
            width, offset = column
            chunk = blob[offset:offset + width * n]
            if len(chunk) != width * n:
                raise ValueError("payload binary section is too short")
            columns[index] = [chunk[j:j + width].hex() for j in range(0, width * n, width)]
        elif form == "d":
            values, codes = column
            lookup = dict(zip(_CODE_CHARS, values, strict=False))
            columns[index] = [lookup[c] for c in codes]
        elif form == "x":
            columns[index] = [None if v is None else v / 10 for v in column]
        else:
            raise ValueError(f"unknown column form {form!r}")
