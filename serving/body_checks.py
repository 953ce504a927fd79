"""Decoding a client's JSON request body, with errors that name the problem and where it is.

The happy path is one ``orjson.loads`` and a count of the body's opening brackets to bound its depth.
Only when orjson refuses the body is time spent finding out why: invalid UTF-8 (orjson reports every
such body as "surrogates not allowed" at char 0), unpaired UTF-16 surrogate escapes, orjson's own
nesting limit, or its syntax message. Offsets are byte offsets into the body.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

ORJSON_MAX_DEPTH = 1024
"""orjson refuses documents nested deeper than this ("depth limit exceeded")."""

_ESCAPE = re.compile(rb"\\u([0-9a-fA-F]{4})|\\.", re.DOTALL)
_ENCODED_SURROGATE = re.compile(rb"\xed[\xa0-\xbf][\x80-\xbf]")
_HIGH_SURROGATES = range(0xD800, 0xDC00)
_LOW_SURROGATES = range(0xDC00, 0xE000)
_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean"}


class BodyError(ValueError):
    """A request body is not a JSON object the sidecar accepts; the message says why."""


def decode_json_object(body: bytes, max_depth: int) -> dict[str, Any]:
    """The JSON object in ``body``, nested at most ``max_depth`` levels (``{}`` is one level).

    A ``max_depth`` above ``ORJSON_MAX_DEPTH`` acts as ``ORJSON_MAX_DEPTH``.

    Raises:
        BodyError: the body is not UTF-8, holds an unpaired surrogate escape, is not JSON, is not
            an object, or is nested too deep.
    """
    limit = min(max_depth, ORJSON_MAX_DEPTH)
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as err:
        raise BodyError(_why_refused(body, err, limit)) from None
    if not isinstance(payload, dict):
        raise BodyError(f"body must be a JSON object, not {_KINDS.get(type(payload), 'null')}")
    if _deeper_than(payload, body, limit):
        raise BodyError(f"body is nested deeper than {limit} levels")
    return payload


def _deeper_than(payload: dict[str, Any], body: bytes, limit: int) -> bool:
    """Whether ``payload`` nests more than ``limit`` objects and arrays; iterative, stops at the first too deep.

    The body has at least as many opening brackets as levels (brackets inside strings only add to the
    count), so when it has at most ``limit`` nothing is too deep, and the Python walk over the decoded
    objects is left for the rare body with more.
    """
    if body.count(b"[") + body.count(b"{") <= limit:  # a C loop over the bytes settles almost every body
        return False
    stack: list[tuple[dict[str, Any] | list[Any], int]] = [(payload, 1)]
    while stack:
        container, depth = stack.pop()
        for child in container.values() if isinstance(container, dict) else container:
            if isinstance(child, (dict, list)):
                if depth == limit:
                    return True
                stack.append((child, depth + 1))
    return False


def _why_refused(body: bytes, err: orjson.JSONDecodeError, limit: int) -> str:
    """The most precise account of why orjson refused ``body``."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as bad:
        return f"body is not valid UTF-8 ({_utf8_problem(body, bad)})"
    if err.msg == "depth limit exceeded":
        return f"body is nested deeper than {limit} levels"
    if "surrogate" in err.msg and (escape := _unpaired_surrogate(body)) is not None:
        return f"body contains an unpaired UTF-16 surrogate ({escape.group().decode()}) at offset {escape.start()}"
    return f"body is not valid JSON: {err}"


def _utf8_problem(body: bytes, bad: UnicodeDecodeError) -> str:
    """What is wrong at the first invalid UTF-8 sequence, and its offset."""
    if (encoded := _ENCODED_SURROGATE.match(body, bad.start)) is not None:
        b0, b1, b2 = encoded.group()
        code = (b0 & 0x0F) << 12 | (b1 & 0x3F) << 6 | (b2 & 0x3F)
        return f"UTF-8-encoded UTF-16 surrogate U+{code:04X} at offset {bad.start}"
    if bad.reason == "invalid start byte":
        return f"invalid byte 0x{body[bad.start]:02x} at offset {bad.start}"
    sequence = " ".join(f"0x{byte:02x}" for byte in body[bad.start:bad.end])
    return f"incomplete sequence {sequence} at offset {bad.start}"


def _unpaired_surrogate(body: bytes) -> re.Match[bytes] | None:
    """The first ``\\uXXXX`` escape of a surrogate that is not half of an adjacent high-low pair.

    Only called once orjson refused a surrogate, so everything before it parsed: every backslash
    up to there is inside a string and starts an escape, which ``_ESCAPE`` consumes pairwise.
    """
    high: re.Match[bytes] | None = None
    for escape in _ESCAPE.finditer(body):
        unit = escape.group(1)
        code = int(unit, 16) if unit is not None else -1
        if high is not None:
            if code in _LOW_SURROGATES and escape.start() == high.end():
                high = None
                continue
            return high
        if code in _HIGH_SURROGATES:
            high = escape
        elif code in _LOW_SURROGATES:
            return escape
    return high
