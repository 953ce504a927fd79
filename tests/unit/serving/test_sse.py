"""The SSE reader: event splitting, measurement and removal of what the sidecar added."""

from __future__ import annotations

import json
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving import sse
from serving.sse import SseReader


def _event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _chunk(text: str, usage: dict[str, int] | None = None, finish: str | None = None) -> bytes:
    obj: dict[str, object] = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}
    if usage is not None:
        obj["usage"] = usage
    return _event(obj)


def test_events_split_across_network_chunks_are_forwarded_whole() -> None:
    """An event cut in two network chunks is forwarded once, complete, when its end arrives."""
    reader = SseReader(strip_usage_chunk=False, strip_usage_field=False)
    event = _chunk("hello")
    assert reader.feed(event[:10], 1) == b""
    assert reader.feed(event[10:], 2) == event
    assert reader.stats.first_content_ns == 2


def test_gaps_are_measured_between_content_chunks_only() -> None:
    """The role-only first chunk is not content; gaps are taken between content chunks."""
    reader = SseReader(strip_usage_chunk=False, strip_usage_field=False)
    reader.feed(_chunk(""), 0)
    reader.feed(_chunk("a"), 1_000_000_000)
    reader.feed(_chunk("b"), 1_500_000_000)
    reader.feed(_chunk("c", finish="length"), 2_500_000_000)
    assert reader.stats.first_content_ns == 1_000_000_000
    assert reader.stats.gaps_s == [0.5, 1.0]
    assert reader.stats.finish_reason == "length"


def test_injected_usage_chunk_is_removed_when_client_did_not_ask() -> None:
    """The final usage-only chunk is measured but not forwarded when the client did not ask for usage."""
    reader = SseReader(strip_usage_chunk=True, strip_usage_field=False)
    usage_chunk = _event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}})
    assert reader.feed(usage_chunk + b"data: [DONE]\n\n", 5) == b"data: [DONE]\n\n"
    assert (reader.stats.prompt_tokens, reader.stats.completion_tokens) == (3, 4)
    assert reader.stats.done


def test_usage_chunk_is_kept_when_client_asked() -> None:
    """A client that asked for include_usage gets the usage chunk unchanged."""
    reader = SseReader(strip_usage_chunk=False, strip_usage_field=False)
    usage_chunk = _event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}})
    assert reader.feed(usage_chunk, 5) == usage_chunk


def test_per_chunk_usage_is_stripped_and_reported_live() -> None:
    """Continuous usage stats feed the live callback and are removed from the forwarded chunk."""
    seen: list[tuple[int | None, int | None]] = []
    reader = SseReader(strip_usage_chunk=True, strip_usage_field=True, on_usage=lambda p, c: seen.append((p, c)))
    out = reader.feed(_chunk("x", usage={"prompt_tokens": 9, "completion_tokens": 1}), 1)
    assert seen == [(9, 1)]
    assert b"usage" not in out
    assert json.loads(out[6:])["choices"][0]["delta"]["content"] == "x"


def test_crlf_separators_and_comments_pass_through() -> None:
    """CRLF-separated events and comment lines are forwarded unchanged."""
    reader = SseReader(strip_usage_chunk=True, strip_usage_field=True)
    raw = b'data: {"choices": [{"text": "a"}]}\r\n\r\n: comment\r\n\r\n'
    assert reader.feed(raw, 1) == raw
    assert reader.stats.content_events == 1
    assert reader.stats.problem is None


@pytest.mark.parametrize("sep", [b"\n\n", b"\r\n\r\n"], ids=["LF", "CRLF"])
def test_a_data_line_that_is_not_json_stops_the_stream(sep: bytes) -> None:
    """Events before a malformed one are forwarded; it and everything after are not, and the problem is named."""
    reader = SseReader(strip_usage_chunk=True, strip_usage_field=True)
    good = b'data: {"choices": [{"text": "a"}]}' + sep
    assert reader.feed(good + b"data: {not json" + sep + good, 1) == good
    assert reader.stats.undecodable_events == 1
    assert reader.stats.problem == "upstream_malformed_event"
    assert reader.feed(good, 2) == b""
    assert reader.stats.content_events == 1


def test_an_event_larger_than_the_limit_stops_the_stream() -> None:
    """An event (or an unterminated one still growing) beyond max_event_bytes is flagged, not buffered on."""
    reader = SseReader(strip_usage_chunk=False, strip_usage_field=False, max_event_bytes=1000)
    small = b'data: {"choices": [{"text": "a"}]}\n\n'
    assert reader.feed(small, 1) == small
    assert reader.feed(b"data: " + b"x" * 600, 2) == b""
    assert reader.stats.problem is None
    assert reader.feed(b"y" * 600, 3) == b""
    assert reader.stats.problem == "upstream_event_too_large"
    assert reader.pending == 0


def test_error_events_carry_the_trace_id() -> None:
    """An upstream error event is forwarded with the request's trace id added to its error object."""
    reader = SseReader(strip_usage_chunk=False, strip_usage_field=False, trace_id="ab" * 16)
    out = reader.feed(b'data: {"error": {"message": "boom", "type": "InternalServerError"}}\n\n', 1)
    assert json.loads(out[6:])["error"] == {"message": "boom", "type": "InternalServerError", "trace_id": "ab" * 16}
    assert reader.stats.error == "boom"


def test_error_event_is_recorded() -> None:
    """An error object in the stream is remembered for the outcome."""
    reader = SseReader(strip_usage_chunk=True, strip_usage_field=False)
    reader.feed(_event({"error": {"message": "boom"}}), 1)
    assert reader.stats.error == "boom"


def test_many_content_events_in_one_read_are_counted_without_parsing() -> None:
    """A read of ordinary content chunks after the first is forwarded whole, each chunk counted once."""
    reader = SseReader(strip_usage_chunk=True, strip_usage_field=False)
    first = _chunk("a")
    assert reader.feed(first, 0) == first
    burst = b"".join(_chunk(f"w{i}") for i in range(10))
    assert reader.feed(burst, 1_000_000_000) is burst
    assert reader.stats.content_events == 11
    assert reader.stats.gaps_s == [1.0] + [0.0] * 9


def test_a_read_mixing_content_and_the_injected_usage_chunk_still_strips_it() -> None:
    """When the final usage chunk shares a read with content chunks, the content passes and usage is removed."""
    reader = SseReader(strip_usage_chunk=True, strip_usage_field=False)
    reader.feed(_chunk("a"), 0)
    usage = _event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}})
    tail = _chunk("b") + _chunk("c", finish="length") + usage + b"data: [DONE]\n\n"
    assert reader.feed(tail, 5) == _chunk("b") + _chunk("c", finish="length") + b"data: [DONE]\n\n"
    assert (reader.stats.content_events, reader.stats.completion_tokens, reader.stats.finish_reason) == (3, 4, "length")
    assert reader.stats.done


_EVENT_KINDS = st.sampled_from(["content", "content_spaced", "finish", "usage_field", "comment"])


def _events_of(kinds: list[str], role_first: bool) -> tuple[list[bytes], int]:
    """The events of a stream of ``kinds`` (before the usage chunk and [DONE]), and its content events."""
    role = _event({"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]})
    events: list[bytes] = [role] if role_first else []
    content = 0
    for i, kind in enumerate(kinds):
        if kind == "content":
            events.append(_chunk(f"w{i}"))
        elif kind == "content_spaced":  # json.dumps' spacing, as the compact form is vLLM's
            events.append(b'data: {"choices": [{"index": 0, "delta": {"content": "s"}, "finish_reason": null}]}\n\n')
        elif kind == "finish":
            events.append(_chunk(f"f{i}", finish="stop"))
        elif kind == "usage_field":
            events.append(_chunk(f"u{i}", usage={"prompt_tokens": 5, "completion_tokens": i}))
        else:
            events.append(b": keep-alive\n\n")
        content += kind in ("content", "content_spaced", "finish", "usage_field")
    return events, content


def _check_forwarded_and_counted(reads: list[bytes], expected: bytes, kinds: list[str], content: int,
                                 strip: bool) -> None:
    reader = SseReader(strip_usage_chunk=strip, strip_usage_field=False)
    out = b"".join(reader.feed(data, n) for n, data in enumerate(reads))
    assert out + reader.flush() == expected
    stats = reader.stats
    assert stats.content_events == content
    assert len(stats.gaps_s) == max(content - 1, 0)
    assert (stats.prompt_tokens, stats.completion_tokens, stats.done) == (5, 99, True)
    assert stats.finish_reason == ("stop" if "finish" in kinds else None)


_USAGE_CHUNK = _event({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 99}})


@settings(max_examples=300, deadline=None)
@given(kinds=st.lists(_EVENT_KINDS, min_size=1, max_size=40), strip=st.booleans(), role_first=st.booleans(),
       cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=6))
def test_any_stream_cut_anywhere_is_forwarded_and_counted_like_one_event_at_a_time(
    kinds: list[str], strip: bool, role_first: bool, cuts: list[int]
) -> None:
    """Whatever the reads look like (the whole stream in one, or cut anywhere), the bytes forwarded and
    the counts equal what reading each event's JSON on its own gives. (vLLM sends the role-only chunk
    first; after the first content, a running choice is taken for content without reading its JSON.)"""
    events, content = _events_of(kinds, role_first)
    stream = b"".join(events) + _USAGE_CHUNK + b"data: [DONE]\n\n"
    expected = b"".join(events) + (b"" if strip else _USAGE_CHUNK) + b"data: [DONE]\n\n"
    bounds = sorted({0, len(stream), *(cut % (len(stream) + 1) for cut in cuts)})
    _check_forwarded_and_counted([stream[a:b] for a, b in pairwise(bounds)], expected, kinds, content, strip)


@settings(max_examples=300, deadline=None)
@given(kinds=st.lists(_EVENT_KINDS, min_size=1, max_size=40), strip=st.booleans(), role_first=st.booleans())
def test_a_paced_stream_read_one_event_at_a_time_is_forwarded_and_counted_the_same(
    kinds: list[str], strip: bool, role_first: bool
) -> None:
    """One event per read, as a paced upstream sends them (the reader's one-event path): the same bytes
    forwarded and the same counts as reading each event's JSON."""
    events, content = _events_of(kinds, role_first)
    reads = [*events, _USAGE_CHUNK, b"data: [DONE]\n\n"]
    expected = b"".join(events) + (b"" if strip else _USAGE_CHUNK) + b"data: [DONE]\n\n"
    _check_forwarded_and_counted(reads, expected, kinds, content, strip)


_MIDDLES = st.lists(st.sampled_from([b"a", b" ", b'"', b"\\", b"\\n", b"\r", b"\n", b"}", b'"usage"', b'"error"',
                                     b'", "finish_reason": "stop', b'", "usage": {"completion_tokens": 3}, "x": "']),
                    max_size=8)


@settings(max_examples=300, deadline=None)
@given(middle=_MIDDLES, spaced=st.booleans())
def test_the_template_of_a_paced_stream_never_changes_what_is_forwarded_or_counted(middle: list[bytes],
                                                                                   spaced: bool) -> None:
    """After the first plain content event, an event made of its bytes around the text and any text between
    them (quotes, escapes, line ends, members smuggled in) is forwarded and counted as the full tests judge it."""
    role = _event({"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]})
    first = _chunk("a")
    if not spaced:  # vLLM's compact form
        first = b"data: " + json.dumps(json.loads(first[6:]), separators=(",", ":")).encode() + b"\n\n"
    text_at = first.index(b'"a"') + 1
    event = first[:text_at] + b"".join(middle) + first[text_at + 1:]
    results = []
    for template in (True, False):
        reader = SseReader(strip_usage_chunk=False, strip_usage_field=False)
        out = reader.feed(role, 1) + reader.feed(first, 2) + reader.feed(first, 3)
        if not template:
            reader._template = None  # the full tests only, for this event
        out += reader.feed(event, 4) + reader.feed(b"data: [DONE]\n\n", 5) + reader.flush()
        stats = reader.stats
        results.append((out, stats.content_events, stats.gaps_s, stats.problem, stats.finish_reason,
                        stats.completion_tokens))
    assert results[0] == results[1]


def test_a_tool_call_stream_stops_looking_for_a_template_and_still_counts_every_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tool-call stream has no text string to learn a template from: the reader gives up after a few
    plain events rather than scanning every one for it, and counts all of them as before."""
    calls = []
    real = sse._template_of
    monkeypatch.setattr(sse, "_template_of", lambda event: calls.append(event) or real(event))
    reader = SseReader(strip_usage_chunk=False, strip_usage_field=False)
    call = {"index": 0, "function": {"arguments": "{}"}}
    events = [_event({"choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]})] * 40
    out = b"".join(reader.feed(event, n) for n, event in enumerate(events, 1))
    assert out == b"".join(events)
    assert reader.stats.content_events == 40
    assert len(calls) == sse._TEMPLATE_TRIES


def _as_the_relay_reads(reader: SseReader, reads: list[bytes]) -> bytes:
    """What the proxy's relay forwards of ``reads``, each one HTTP chunk read whole: the event itself when
    ``take_event`` takes it (from the framed read, as the relay offers it), else what ``feed`` returns."""
    out = []
    for now_ns, data in enumerate(reads, 1):
        framed = b"%x\r\n%b\r\n" % (len(data), data)
        start = framed.index(b"\r\n") + 2
        out.append(data if reader.take_event(framed, start, len(framed) - 2, now_ns) else reader.feed(data, now_ns))
    return b"".join(out) + reader.flush()


@settings(max_examples=300, deadline=None)
@given(kinds=st.lists(_EVENT_KINDS, min_size=1, max_size=40), strip=st.booleans(), role_first=st.booleans(),
       middle=st.one_of(_MIDDLES, st.just([b"a longer text"])), tight=st.booleans())
def test_events_taken_whole_are_forwarded_and_counted_as_feed_alone_would(
    kinds: list[str], strip: bool, role_first: bool, middle: list[bytes], tight: bool
) -> None:
    """The relay offers a read of one whole HTTP chunk to ``take_event`` first: whatever the events (text
    with quotes, escapes or line ends, members smuggled in, an event over the size limit), what is forwarded
    and counted is what ``feed`` alone gives with its full tests (no template), event by event."""
    events, _ = _events_of(kinds, role_first)
    first = _chunk("a")
    text_at = first.index(b'"a"') + 1
    limit = len(first) if tight else None  # a tight limit: the template's event fits, a longer text does not
    reads = [*events[:1], first, first[:text_at] + b"".join(middle) + first[text_at + 1:], *events[1:],
             _USAGE_CHUNK, b"data: [DONE]\n\n"]
    results = []
    for relayed in (True, False):
        reader = SseReader(strip_usage_chunk=strip, strip_usage_field=False, max_event_bytes=limit)
        if relayed:
            out = _as_the_relay_reads(reader, reads)
        else:  # the full tests only: no template is learnt, so take_event takes nothing
            reader._template_tries = 0
            out = b"".join(reader.feed(data, now_ns) for now_ns, data in enumerate(reads, 1)) + reader.flush()
        stats = reader.stats
        results.append((out, stats.content_ns, stats.problem, stats.finish_reason, stats.completion_tokens,
                        stats.done))
    assert results[0] == results[1]
    assert results[0][0].endswith(b"data: [DONE]\n\n") or results[0][2] is not None


def test_a_paced_streams_plain_events_are_taken_whole() -> None:
    """The role event and the first content event are parsed, the second teaches the template; every one after
    it is taken by ``take_event``, not fed."""
    reader = SseReader(strip_usage_chunk=True, strip_usage_field=False)
    role = _event({"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]})
    words = [_chunk(f"w{i}") for i in range(10)]
    taken = []
    for now_ns, data in enumerate([role, *words], 1):
        framed = b"%x\r\n%b\r\n" % (len(data), data)
        taken.append(reader.take_event(framed, framed.index(b"\r\n") + 2, len(framed) - 2, now_ns)
                     or reader.feed(data, now_ns) != data)
    assert taken == [False, False, False] + [True] * 8
    assert reader.stats.content_events == 10
