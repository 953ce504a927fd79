"""Decoding request bodies: UTF-8, surrogates, syntax, top-level type and nesting depth, each named precisely."""

from __future__ import annotations

import orjson
import pytest

from serving.body_checks import ORJSON_MAX_DEPTH, BodyError, _deeper_than, decode_json_object

LONG_PROMPT = 4096
"""Token ids in a long prompt."""


def _problem(body: bytes, max_depth: int = 64) -> str:
    with pytest.raises(BodyError) as info:
        decode_json_object(body, max_depth)
    return str(info.value)


def _nested(depth: int) -> bytes:
    """An object nesting ``depth`` objects and arrays in all, alternating, innermost empty."""
    outer = range(depth - 1)
    opening = "".join('{"a":' if level % 2 == 0 else "[" for level in outer)
    closing = "".join("}" if level % 2 == 0 else "]" for level in reversed(outer))
    return (opening + ("{}" if (depth - 1) % 2 == 0 else "[]") + closing).encode()


def test_nested_builds_the_depth_it_names() -> None:
    """The helper's bodies nest exactly as deep as asked."""
    assert _nested(1) == b"{}"
    assert _nested(2) == b'{"a":[]}'
    assert _nested(3) == b'{"a":[{}]}'


def test_a_chat_body_decodes() -> None:
    """An ordinary chat request comes back as the dict it encodes."""
    body = '{"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "héllo 😀"}]}]}'
    assert decode_json_object(body.encode(), 64) == {
        "model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "héllo 😀"}]}],
    }


def test_a_surrogate_pair_escape_decodes() -> None:
    """A properly paired surrogate escape is one astral character, not an error."""
    assert decode_json_object(rb'{"a": "\ud83d\ude00"}', 64) == {"a": "😀"}


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b'{"prompt": "caf\xe9 ok"}', "incomplete sequence 0xe9 at offset 15"),
        (b'{"prompt": "abc"}\xff', "invalid byte 0xff at offset 17"),
        (b'{"a": "\xe2\x82x"}', "incomplete sequence 0xe2 0x82 at offset 7"),
        (b'{"a": "x"} \xe2\x82', "incomplete sequence 0xe2 0x82 at offset 11"),
        (b'{"a": "\xed\xa0\x80"}', "UTF-8-encoded UTF-16 surrogate U+D800 at offset 7"),
        (b'{"a": "\xed\xbf\xbf"}', "UTF-8-encoded UTF-16 surrogate U+DFFF at offset 7"),
        (b'{"a": "\xc0\x80"}', "invalid byte 0xc0 at offset 7"),
    ],
    ids=["a Latin-1 byte", "a stray byte after the object", "an interrupted sequence", "a truncated body",
         "an encoded high surrogate", "an encoded low surrogate", "an overlong encoding"],
)
def test_invalid_utf8_is_named_with_its_offset(body: bytes, problem: str) -> None:
    """A body that is not UTF-8 names the first bad byte and its byte offset, not orjson's 'char 0'."""
    assert _problem(body) == f"body is not valid UTF-8 ({problem})"


@pytest.mark.parametrize(
    ("body", "escape"),
    [
        (rb'{"a": "\ud800"}', r"\ud800"),
        (rb'{"a": "x\uDC00"}', r"\uDC00"),
        (rb'{"a": "\ud800abc"}', r"\ud800"),
        (rb'{"a": "\ude00\ud83d"}', r"\ude00"),
        (rb'{"a": "\ud83d\ud83d\ude00"}', r"\ud83d"),
        (rb'{"a": "\ud83d\n\ude00"}', r"\ud83d"),
        (rb'{"a": "\ud83d \ude00"}', r"\ud83d"),
        (rb'{"\ud800": 1}', r"\ud800"),
    ],
    ids=["a lone high", "a lone low in capitals", "a high before text", "a reversed pair",
         "a high before a pair", "a high before another escape",
         "a high and a low apart", "in a key"],
)
def test_unpaired_surrogate_escapes_are_named_with_their_offset(body: bytes, escape: str) -> None:
    """The first escape that is not half of a high-low pair is quoted with its byte offset."""
    offset = body.index(escape.encode())
    assert _problem(body) == f"body contains an unpaired UTF-16 surrogate ({escape}) at offset {offset}"


def test_surrogate_offset_is_counted_in_bytes() -> None:
    """Multi-byte characters before the escape move its byte offset past orjson's character position."""
    body = '{"é€😀": "ok", "b": "\\ud800"}'.encode()
    assert _problem(body) == r"body contains an unpaired UTF-16 surrogate (\ud800) at offset 26"


def test_escaped_backslashes_are_not_mistaken_for_surrogate_escapes() -> None:
    """In ``"\\\\ud800"`` the backslash is escaped and ud800 is plain text; the real culprit comes later."""
    body = rb'{"a": "\\ud800 \\\ud800"}'
    assert _problem(body) == r"body contains an unpaired UTF-16 surrogate (\ud800) at offset 17"
    assert decode_json_object(rb'{"a": "\\ud800"}', 64) == {"a": r"\ud800"}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"a": ', "unexpected end of data: line 1 column 7 (char 6)"),
        (b"", "Input is a zero-length, empty document: line 1 column 1 (char 0)"),
        (b'{"a": NaN}', "unexpected character, expected a JSON value: line 1 column 7 (char 6)"),
        (b"\xef\xbb\xbf{}", "UTF-8 byte order mark (BOM) is not supported: line 1 column 1 (char 0)"),
    ],
    ids=["a truncated body", "an empty body", "NaN", "a byte order mark"],
)
def test_invalid_json_carries_orjsons_message(body: bytes, message: str) -> None:
    """A syntax error is reported with orjson's own message and position."""
    assert _problem(body) == f"body is not valid JSON: {message}"


@pytest.mark.parametrize(
    ("body", "kind"),
    [(b"[1]", "an array"), (b'"x"', "a string"), (b"1", "a number"), (b"1.5", "a number"),
     (b"true", "a boolean"), (b"null", "null")],
    ids=["an array", "a string", "an integer", "a float", "a boolean", "null"],
)
def test_a_body_that_is_not_an_object_names_what_it_is(body: bytes, kind: str) -> None:
    """Only a JSON object is a request; anything else is named."""
    assert _problem(body) == f"body must be a JSON object, not {kind}"


@pytest.mark.parametrize("max_depth", [1, 2, 3, 64])
def test_exactly_max_depth_is_accepted(max_depth: int) -> None:
    """A body nested exactly max_depth levels decodes."""
    assert isinstance(decode_json_object(_nested(max_depth), max_depth), dict)


@pytest.mark.parametrize("max_depth", [1, 2, 3, 64])
def test_one_level_more_is_refused(max_depth: int) -> None:
    """A body nested max_depth + 1 levels is refused with the limit in the message."""
    assert _problem(_nested(max_depth + 1), max_depth) == f"body is nested deeper than {max_depth} levels"


def test_depth_is_the_deepest_branch_not_the_first() -> None:
    """A shallow first branch does not hide a deep later one."""
    body = b'{"messages": [{"content": "x"}], "deep": [[[[1]]]]}'
    assert decode_json_object(body, 5) == {"messages": [{"content": "x"}], "deep": [[[[1]]]]}
    assert _problem(body, 4) == "body is nested deeper than 4 levels"


def test_a_long_token_id_list_in_a_shallow_body_is_accepted() -> None:
    """A prompt of many token ids in a shallow body decodes."""
    prompt = list(range(LONG_PROMPT))
    assert decode_json_object(orjson.dumps({"prompt": prompt}), 2) == {"prompt": prompt}


def test_a_long_list_does_not_hide_deep_nesting() -> None:
    """With more opening brackets than the limit, the walk goes past a long list and finds the deep branch."""
    body = orjson.dumps({"deep": [[[[1]]]], "prompt": list(range(LONG_PROMPT))})
    assert _problem(body, 4) == "body is nested deeper than 4 levels"


def test_the_bracket_count_decides_first_and_the_walk_only_past_it() -> None:
    """At most ``limit`` opening brackets in the body: not too deep, unwalked; more: the decoded objects decide."""
    deep = {"deep": [[[[1]]]]}
    assert not _deeper_than(deep, b"{[[[", 4)  # four brackets cannot make five levels (the count alone)
    assert _deeper_than(deep, b"{[[[[", 4)
    assert not _deeper_than({"shallow": [[1]]}, b"{[[[[[", 4)  # the walk finds three levels


def test_brackets_inside_strings_do_not_count_as_depth() -> None:
    """Brackets in text make the count too high, and the walk still finds the body shallow."""
    body = orjson.dumps({"prompt": "[{" * 100, "ids": list(range(LONG_PROMPT))})
    assert decode_json_object(body, 2) == {"prompt": "[{" * 100, "ids": list(range(LONG_PROMPT))}


@pytest.mark.parametrize("max_depth", [64, ORJSON_MAX_DEPTH, 5000])
def test_orjsons_own_limit_is_reported_as_depth(max_depth: int) -> None:
    """Beyond orjson's 1024 levels its refusal becomes the depth message, naming the effective limit."""
    limit = min(max_depth, ORJSON_MAX_DEPTH)
    assert _problem(_nested(ORJSON_MAX_DEPTH + 1), max_depth) == f"body is nested deeper than {limit} levels"
    assert _problem(b"[" * 5000, max_depth) == f"body is nested deeper than {limit} levels"


def test_orjsons_limit_itself_is_accepted() -> None:
    """A body nested exactly 1024 levels decodes when the limit allows it."""
    assert isinstance(decode_json_object(_nested(ORJSON_MAX_DEPTH), ORJSON_MAX_DEPTH), dict)


def test_body_error_is_a_value_error() -> None:
    """Callers that catch ValueError for malformed bodies keep working."""
    assert issubclass(BodyError, ValueError)
