"""NFC normalization of prompt text: completions prompts, chat contents, and shapes left alone."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from serving.unicode_nfc import normalize_prompt_text

DECOMPOSED = "caf" + "e\u0301"
COMPOSED = "caf\u00e9"
JAMO = "\u1112\u1161\u11ab"  # 한 as conjoining jamo
HANGUL = "\ud55c"
FAMILY = "\U0001f468\u200d\U0001f469\u200d\U0001f467"  # man ZWJ woman ZWJ girl


@pytest.mark.parametrize(
    ("text", "expected"),
    [(DECOMPOSED, COMPOSED), (JAMO, HANGUL), ("A\u030a", "\u00c5"), ("\u212b", "\u00c5")],
    ids=["e with combining acute", "Hangul jamo", "A with combining ring", "the angstrom sign"],
)
def test_a_string_prompt_is_composed(text: str, expected: str) -> None:
    """A prompt string not in NFC is replaced by its NFC form and the change is reported."""
    payload: dict[str, Any] = {"prompt": text}
    assert normalize_prompt_text(payload)
    assert payload["prompt"] == expected


@pytest.mark.parametrize(
    "text",
    [COMPOSED, HANGUL, FAMILY, "\U0001f44d\U0001f3fd", "plain ASCII", "", "\ufb01 ligature kept"],
    ids=["composed text", "a Hangul syllable", "an emoji ZWJ sequence", "an emoji with skin tone",
         "ASCII", "empty", "a compatibility ligature"],
)
def test_text_already_in_nfc_is_untouched(text: str) -> None:
    """Text already in NFC (ZWJ sequences and compatibility characters included) is not changed or copied."""
    payload: dict[str, Any] = {"prompt": text}
    assert not normalize_prompt_text(payload)
    assert payload["prompt"] is text


def test_a_list_of_prompt_strings_is_composed_element_by_element() -> None:
    """Each string of a batched prompt is normalized; those already in NFC keep their identity."""
    kept = "already fine"
    payload: dict[str, Any] = {"prompt": [kept, DECOMPOSED, JAMO]}
    assert normalize_prompt_text(payload)
    assert payload["prompt"] == [kept, COMPOSED, HANGUL]
    assert payload["prompt"][0] is kept


@pytest.mark.parametrize(
    "prompt",
    [[1, 2, 3], [[1, 2], [3]], [], None, 42, {"text": DECOMPOSED}],
    ids=["token ids", "batched token ids", "an empty list", "null", "a number", "an object"],
)
def test_other_prompt_shapes_are_left_alone(prompt: object) -> None:
    """Token ids and prompts of unexpected types are neither changed nor an error."""
    payload: dict[str, Any] = {"prompt": prompt}
    assert not normalize_prompt_text(payload)
    assert payload == {"prompt": prompt}


def test_chat_string_contents_are_composed() -> None:
    """Each message's string content is normalized; other message fields are not."""
    payload: dict[str, Any] = {"messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": DECOMPOSED, "name": DECOMPOSED},
    ]}
    assert normalize_prompt_text(payload)
    assert payload["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": COMPOSED, "name": DECOMPOSED},
    ]


def test_chat_text_parts_are_composed_and_other_parts_left_alone() -> None:
    """In a list of content parts only the ``text`` of ``"type": "text"`` parts is normalized."""
    image = {"type": "image_url", "image_url": {"url": DECOMPOSED}}
    payload: dict[str, Any] = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": JAMO}, image, {"type": "text", "text": 7}, "stray", None,
    ]}]}
    assert normalize_prompt_text(payload)
    assert payload["messages"][0]["content"] == [
        {"type": "text", "text": HANGUL}, image, {"type": "text", "text": 7}, "stray", None,
    ]
    assert image["image_url"] == {"url": DECOMPOSED}


def test_a_chat_already_in_nfc_reports_no_change() -> None:
    """Nothing to normalize in any message: False, and the payload is as it was."""
    messages = [{"role": "user", "content": [{"type": "text", "text": FAMILY}]}, {"role": "user", "content": HANGUL}]
    payload: dict[str, Any] = {"messages": messages}
    assert not normalize_prompt_text(payload)
    assert payload == {"messages": [
        {"role": "user", "content": [{"type": "text", "text": FAMILY}]}, {"role": "user", "content": HANGUL},
    ]}


@pytest.mark.parametrize(
    "payload",
    [None, 3, "text", [DECOMPOSED], {"messages": None}, {"messages": "hi"}, {"messages": [None, 5, "x"]},
     {"messages": [{"content": None}, {"content": 5}, {"content": {"text": DECOMPOSED}}]},
     {"messages": [{"content": [{"type": "text"}, {"text": DECOMPOSED}]}]}],
    ids=["null", "a number", "a string", "a list", "null messages", "string messages",
         "messages that are not objects", "contents of odd types", "parts without type or text"],
)
def test_odd_shapes_are_left_alone(payload: Any) -> None:
    """Bodies and messages of unexpected shapes raise nothing and are not changed."""
    before = copy.deepcopy(payload)
    assert not normalize_prompt_text(payload)
    assert payload == before


def test_prompt_and_messages_are_both_normalized() -> None:
    """A body carrying both fields has both normalized."""
    payload: dict[str, Any] = {"prompt": DECOMPOSED, "messages": [{"content": JAMO}]}
    assert normalize_prompt_text(payload)
    assert payload == {"prompt": COMPOSED, "messages": [{"content": HANGUL}]}
