"""Prompt lengths in the target's own tokens, and the model's context length.

A length is asked in tokens; the generated prompt is a number of words (see ``prompts``), so the
word count that gives exactly that many tokens is searched for. Tokens are counted by vLLM's
``POST /tokenize`` when the target has it (cheap, no generation), else from the ``usage`` of a
one-token completion. The count never exceeds the asked length: when no word count hits it
exactly (a word of two tokens at the boundary), the longest prompt below it is taken. Lengths
above the model's context (``max_model_len`` of ``GET /v1/models``, less ``max_tokens`` for the
answer) are capped with a warning.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from serving.loadtest.errors import LoadTestError
from serving.loadtest.prompts import Length, prompt_text
from serving.loadtest.spec import base_url, endpoint

MAX_COUNTS_PER_LENGTH = 16
TIMEOUT_S = 60.0

Count = Callable[[int], Awaitable[int]]
"""Tokens of the generated prompt of so many words."""


@dataclass(slots=True)
class Calibration:
    """What calibration did: how it counted, the context length, the lengths found and any warnings."""

    method: str
    max_model_len: int | None
    lengths: list[Length] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    counts: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"method": self.method, "max_model_len": self.max_model_len, "counts": self.counts,
                "lengths": [length.to_dict() for length in self.lengths], "warnings": list(self.warnings)}


async def max_model_len(session: aiohttp.ClientSession, url: str, model: str) -> int | None:
    """The ``max_model_len`` that ``GET /v1/models`` gives for ``model`` (None when it says nothing)."""
    try:
        async with session.get(f"{base_url(url)}/v1/models", timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as reply:
            if reply.status != 200:
                return None
            body = orjson.loads(await reply.read())
    except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError, OSError):
        return None
    cards = body.get("data") if isinstance(body, dict) else None
    for card in cards if isinstance(cards, list) else []:
        if isinstance(card, dict) and card.get("id") == model and isinstance(card.get("max_model_len"), int):
            return int(card["max_model_len"])
    return None


_PROBE_ORDERS = itertools.count()
"""Each counting probe's word order: every probe's text differs (the same words, so the same count), so a
calibration's probes are never identical requests, which a sidecar would count as fast retries."""


def _content(words: int, chat: bool) -> dict[str, Any]:
    text = prompt_text(words, next(_PROBE_ORDERS))
    return {"messages": [{"role": "user", "content": text}]} if chat else {"prompt": text}


def tokenize_count(session: aiohttp.ClientSession, url: str, model: str, *, chat: bool) -> Count:
    """Count with ``POST /tokenize``; LookupError when the target has no such endpoint."""
    target = f"{base_url(url)}/tokenize"

    async def count(words: int) -> int:
        body = {"model": model, **_content(words, chat)}
        async with session.post(target, data=orjson.dumps(body), headers={"Content-Type": "application/json"},
                                timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as reply:
            raw = await reply.read()
            if reply.status in (404, 405):
                raise LookupError(target)
            answer = orjson.loads(raw) if reply.status == 200 else None
        if not isinstance(answer, dict) or not isinstance(answer.get("count"), int):
            raise LoadTestError(url, f"POST {target} answered {reply.status} without a token count")
        return int(answer["count"])

    return count


def usage_count(session: aiohttp.ClientSession, url: str, model: str, *, chat: bool) -> Count:
    """Count from the ``usage.prompt_tokens`` of a non-streamed one-token completion."""
    target = endpoint(url, chat=chat)

    async def count(words: int) -> int:
        body = {"model": model, "max_tokens": 1, "stream": False, **_content(words, chat)}
        async with session.post(target, data=orjson.dumps(body), headers={"Content-Type": "application/json"},
                                timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as reply:
            raw = await reply.read()
        try:
            tokens = orjson.loads(raw)["usage"]["prompt_tokens"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            tokens = None
        if reply.status != 200 or not isinstance(tokens, int):
            raise LoadTestError(url, f"POST {target} answered {reply.status} without usage.prompt_tokens: "
                                     f"{raw[:200]!r}")
        return tokens

    return count


PROBE_TOKENS = 64
"""The short prompt that gives the tokens-per-word ratio before a length near the context is guessed."""
CAP_AIM = 0.97
"""A length capped to the context is first guessed this much below it (an overshoot is a refused request)."""


async def fit_words(target: int, count: Count, first_guess: int) -> tuple[int, int, int]:
    """The word count whose prompt has the most tokens not above ``target``: (words, tokens, counts made).

    Each word is at least one token, so tokens grow with words; the guess is scaled by the
    tokens-per-word ratio seen so far and stops when it hits ``target`` or steps between two
    neighbours that straddle it.
    """
    words = max(1, first_guess)
    seen: dict[int, int] = {}
    while len(seen) < MAX_COUNTS_PER_LENGTH:
        tokens = seen[words] = await count(words)
        if tokens == target:
            break
        guess = max(1, round(words * target / max(tokens, 1)))
        if guess in seen:  # the ratio leads back: step one word towards the target
            guess = words + (1 if tokens < target else -1)
        if guess < 1 or guess in seen:
            break
        words = guess
    fitting = [(t, -w) for w, t in seen.items() if t <= target]
    if not fitting:
        smallest = min(seen)
        return smallest, seen[smallest], len(seen)
    tokens, negative_words = max(fitting)
    return -negative_words, tokens, len(seen)


async def calibrate(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    targets: Sequence[int],
    *,
    chat: bool,
    max_tokens: int,
    say: Callable[[str], None],
) -> Calibration:
    """Find the words of each asked length (capped to the context), counting by /tokenize or else by usage."""
    context = await max_model_len(session, url, model)
    limit = None if context is None else context - max_tokens
    if limit is not None and limit < 1:
        raise LoadTestError(url, f"max_tokens {max_tokens} leaves no room for a prompt in max_model_len {context}")
    result = Calibration("tokenize", context)
    count = tokenize_count(session, url, model, chat=chat)
    ratio: float | None = None
    fitted: dict[int, tuple[int, int]] = {}

    async def fit(goal: int, guess: int) -> tuple[int, int, int]:
        nonlocal count
        try:
            return await fit_words(goal, count, guess)
        except LookupError:
            result.method = "usage"
            count = usage_count(session, url, model, chat=chat)
            return await fit_words(goal, count, guess)
        except (aiohttp.ClientError, TimeoutError, OSError) as err:
            raise LoadTestError(url, f"cannot count prompt tokens: {type(err).__name__}: {err}") from err

    for asked in targets:
        goal = asked
        if limit is not None and asked > limit:
            goal = limit
            result.warnings.append(f"prompt length {asked} is above the model's context (max_model_len {context} "
                                   f"less max_tokens {max_tokens}); capped at {limit} tokens")
            say(f"warning: {result.warnings[-1]}")
        if goal in fitted:  # two lengths capped to the same context: count nothing twice
            words, tokens = fitted[goal]
            result.lengths.append(Length(asked, words, tokens, str(asked)))
            say(f"calibrated {asked} tokens: {words} words = {tokens} tokens (as {goal})")
            continue
        if ratio is None and limit is not None and goal > PROBE_TOKENS:
            # Counting by usage, a first guess over the context is refused outright: learn the ratio on a short
            # prompt, and aim a little below the goal at first.
            words, tokens, made = await fit(PROBE_TOKENS, PROBE_TOKENS)
            result.counts += made
            ratio = tokens / words if words else 1.0
        first_guess = round(goal / (ratio or 1.0) * (CAP_AIM if limit is not None and goal == limit else 1.0))
        words, tokens, made = await fit(goal, first_guess)
        result.counts += made
        fitted[goal] = (words, tokens)
        ratio = tokens / words if words else ratio
        if tokens != goal:
            result.warnings.append(f"no prompt of exactly {goal} tokens: {words} words give {tokens}")
        result.lengths.append(Length(asked, words, tokens, str(asked)))
        say(f"calibrated {asked} tokens: {words} words = {tokens} tokens ({result.method})")
    return result
