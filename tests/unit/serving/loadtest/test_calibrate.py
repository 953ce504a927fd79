"""Prompt lengths calibrated in the target's tokens, by /tokenize or by usage, capped to the context."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from serving.loadtest.calibrate import calibrate, fit_words, max_model_len
from tests.fakes.openai_upstream import FakeOpenAI

Servers = Callable[..., Awaitable[TestServer]]


def _counter(tokens_of: Callable[[int], int]) -> tuple[Callable[[int], Awaitable[int]], list[int]]:
    asked: list[int] = []

    async def count(words: int) -> int:
        asked.append(words)
        return tokens_of(words)

    return count, asked


class TestFitWords:
    """The word count search never overshoots the asked length."""

    async def test_finds_an_exact_length(self) -> None:
        """With 1.3 tokens per word plus 2, 1000 tokens are hit exactly when a word count gives them."""
        count, asked = _counter(lambda w: 2 + (13 * w) // 10)
        words, tokens, made = await fit_words(1000, count, 1000)
        assert tokens == 1000
        assert 2 + (13 * words) // 10 == 1000
        assert made == len(asked) <= 6

    async def test_takes_the_longest_prompt_below_an_unreachable_length(self) -> None:
        """When every word is two tokens, 101 tokens cannot be hit: 50 words (100 tokens) are taken."""
        count, _ = _counter(lambda w: 2 * w)
        assert (await fit_words(101, count, 10))[:2] == (50, 100)

    async def test_overhead_above_the_length_keeps_the_shortest(self) -> None:
        """A template of 20 tokens cannot fit 5: the one-word prompt is returned with its real count."""
        count, _ = _counter(lambda w: 20 + w)
        assert (await fit_words(5, count, 5))[:2] == (1, 21)


async def _url(aiohttp_server: Servers, fake: FakeOpenAI) -> str:
    server = await aiohttp_server(fake.app())
    return str(server.make_url("")).rstrip("/")


class TestCalibrate:
    """Against the fake upstream, whose prompts are one token per word plus one."""

    async def test_tokenize_gives_exact_lengths_without_generating(self, aiohttp_server: Servers) -> None:
        """Every asked length is found exactly through /tokenize, and no generation request is sent."""
        fake = FakeOpenAI(count_prompt_words=True, model_name="m", max_model_len=10_000)
        url = await _url(aiohttp_server, fake)
        async with aiohttp.ClientSession() as session:
            found = await calibrate(session, url, "m", [64, 700], chat=False, max_tokens=8, say=lambda _: None)
        assert found.method == "tokenize"
        assert [(length.asked, length.words, length.tokens) for length in found.lengths] == [(64, 63, 64),
                                                                                         (700, 699, 700)]
        assert fake.requests == []
        assert found.max_model_len == 10_000

    async def test_usage_is_the_fallback_without_tokenize(self, aiohttp_server: Servers) -> None:
        """Without /tokenize the counts come from one-token completions' usage."""
        fake = FakeOpenAI(count_prompt_words=True, tokenize=False, model_name="m")
        url = await _url(aiohttp_server, fake)
        async with aiohttp.ClientSession() as session:
            found = await calibrate(session, url, "m", [40], chat=True, max_tokens=8, say=lambda _: None)
        assert found.method == "usage"
        assert found.lengths[0].tokens == 40
        assert found.lengths[0].words == 36  # one chat message: four tokens of template
        assert all(r["body"]["max_tokens"] == 1 for r in fake.requests)
        assert found.max_model_len is None

    async def test_lengths_above_the_context_are_capped_with_a_warning(self, aiohttp_server: Servers) -> None:
        """A 5000-token length against a 2048 context with 48 output tokens is capped at 2000."""
        fake = FakeOpenAI(count_prompt_words=True, model_name="m", max_model_len=2048)
        url = await _url(aiohttp_server, fake)
        lines: list[str] = []
        async with aiohttp.ClientSession() as session:
            found = await calibrate(session, url, "m", [5000], chat=False, max_tokens=48, say=lines.append)
            assert await max_model_len(session, url, "other") is None
        assert (found.lengths[0].asked, found.lengths[0].tokens) == (5000, 2000)
        assert "capped at 2000" in found.warnings[0]
        assert any("warning" in line for line in lines)

    async def test_no_room_for_a_prompt_is_an_error(self, aiohttp_server: Servers) -> None:
        """max_tokens at or above the context leaves nothing to calibrate."""
        from serving.loadtest.errors import LoadTestError

        url = await _url(aiohttp_server, FakeOpenAI(model_name="m", max_model_len=16))
        async with aiohttp.ClientSession() as session:
            with pytest.raises(LoadTestError, match="no room"):
                await calibrate(session, url, "m", [8], chat=False, max_tokens=16, say=lambda _: None)

    async def test_no_two_probes_are_the_same_request(self, aiohttp_server: Servers) -> None:
        """Two calibrations of the same length (two checklist lines, say) send no body twice: a sidecar would count
        the second as a client's fast retry. The probes still hold the same words, so they count alike."""
        fake = FakeOpenAI(count_prompt_words=True, tokenize=False, model_name="m")
        url = await _url(aiohttp_server, fake)
        async with aiohttp.ClientSession() as session:
            for _ in range(2):
                found = await calibrate(session, url, "m", [40], chat=False, max_tokens=8, say=lambda _: None)
                assert found.lengths[0].tokens == 40
        prompts = [r["body"]["prompt"] for r in fake.requests]
        assert len(prompts) >= 4
        assert len(set(prompts)) == len(prompts)
