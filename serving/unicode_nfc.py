"""Optional Unicode NFC normalization of prompt text before it reaches the tokenizer.

The same text typed on different systems can arrive composed ("é", U+00E9) or decomposed ("e" followed
by U+0301); tokenizers give them different tokens, which defeats prefix caching and changes outputs.
NFC makes them one. Pure: edits a decoded request body in place and never raises on odd shapes.
"""

from __future__ import annotations

import unicodedata
from typing import Any


def _normalize_field(obj: dict[str, Any], key: str) -> bool:
    """NFC-normalize ``obj[key]`` in place when it is a string not in NFC; True when it changed."""
    value = obj.get(key)
    if not isinstance(value, str) or unicodedata.is_normalized("NFC", value):
        return False
    obj[key] = unicodedata.normalize("NFC", value)
    return True


def _normalize_strings(items: list[Any]) -> bool:
    """NFC-normalize the strings of a list of strings in place; True when one changed.

    A list that does not start with a string (token ids, batches of token ids) is left alone
    without looking at the rest, so long token-id prompts cost nothing.
    """
    if not items or not isinstance(items[0], str):
        return False
    changed = False
    for index, value in enumerate(items):
        if isinstance(value, str) and not unicodedata.is_normalized("NFC", value):
            items[index] = unicodedata.normalize("NFC", value)
            changed = True
    return changed


def _normalize_content(message: dict[str, Any]) -> bool:
    """NFC-normalize a chat message's ``content``: a string, or the ``text`` of its ``"type": "text"`` parts."""
    content = message.get("content")
    if isinstance(content, str):
        return _normalize_field(message, "content")
    changed = False
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                changed |= _normalize_field(part, "text")
    return changed


def normalize_prompt_text(payload: dict[str, Any]) -> bool:
    """NFC-normalize a request's ``prompt`` and chat ``messages[*].content`` in place; True iff anything changed.

    Strings already in NFC are skipped without a copy; values of any other shape are left as they are.
    """
    if not isinstance(payload, dict):
        return False
    changed = False
    prompt = payload.get("prompt")
    if isinstance(prompt, str):
        changed |= _normalize_field(payload, "prompt")
    elif isinstance(prompt, list):
        changed |= _normalize_strings(prompt)
    messages = payload.get("messages")
    if isinstance(messages, list):
        for message in messages:
            if isinstance(message, dict):
                changed |= _normalize_content(message)
    return changed
