"""The upstream choice through a real sidecar on loopback: the long-prompt lane and its fallback, the canary's
stickiness, the priority field, and shadow copies that are compared, dropped and counted, never awaited.

Each upstream is a fake in a thread of its own (tests/fakes); which one got a request is read from the
fakes' own request lists, never from the sidecar.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from serving.app import PROXY
from serving.upstream_choice import UpstreamChoice
from tests.fakes.faulty_upstream import CHUNKS_BEFORE_FAULT, FaultyUpstream, ThreadedServer
from tests.fakes.openai_upstream import FakeOpenAI
from tests.unit.serving.inprocess import Sidecar, record_of, send, start_sidecar, wait_for

LONG_PROMPT = "word " * 80  # 400 characters: 100 tokens by the first estimate (4 characters a token), 81 in usage
SHORT_PROMPT = "hi there"


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture(name="primary")
def _primary() -> Iterator[tuple[FakeOpenAI, ThreadedServer]]:
    fake = FakeOpenAI(count_prompt_words=True)
    with ThreadedServer(fake.app) as server:
        yield fake, server


@pytest.fixture(name="second")
def _second() -> Iterator[tuple[FaultyUpstream, ThreadedServer]]:
    fake = FaultyUpstream(count_prompt_words=True)
    with ThreadedServer(fake.app) as server:
        yield fake, server


@asynccontextmanager
async def _sidecar(upstream: str, logs: Path, **serve: Any) -> AsyncIterator[Sidecar]:
    sidecar, runner = await start_sidecar(upstream, logs, **serve)
    try:
        yield sidecar
    finally:
        await sidecar.session.close()
        await runner.cleanup()


def _choice(sidecar: Sidecar) -> UpstreamChoice:
    return sidecar.app[PROXY].choice


def _samples(registry: CollectorRegistry, name: str) -> list[tuple[dict[str, str], float]]:
    return [(dict(s.labels), s.value) for family in registry.collect() for s in family.samples if s.name == name]


def _count(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return sum(value for found, value in _samples(registry, name) if labels.items() <= found.items())


def _prompts(fake: FakeOpenAI) -> list[str]:
    return [request["body"].get("prompt", "") for request in fake.requests]


async def test_long_prompts_take_the_long_lane_and_short_ones_never(
    primary: tuple[FakeOpenAI, ThreadedServer], second: tuple[FaultyUpstream, ThreadedServer], tmp_path: Path,
) -> None:
    """A prompt estimated above serve.long_prompt_tokens reaches the long lane and only it; a short one never does;
    the metrics, the records and the estimate's error say which lane served each."""
    (main_fake, main), (long_fake, long) = primary, second
    async with _sidecar(main.url, tmp_path / "logs", long_prompt_upstream=long.url, long_prompt_tokens=50) as sidecar:
        answers = [await send(sidecar, None, stream=stream, prompt=prompt)
                   for prompt in (LONG_PROMPT, SHORT_PROMPT) * 3 for stream in (False, True)]
        assert [a.status for a in answers] == [200] * 12
        assert _prompts(long_fake) == [LONG_PROMPT] * 6
        assert _prompts(main_fake) == [SHORT_PROMPT] * 6
        registry = sidecar.registry
        assert _count(registry, "inferwatch_requests_total", lane="long", role="primary") == 6
        assert _count(registry, "inferwatch_requests_total", lane="default", role="primary") == 6
        assert _count(registry, "inferwatch_e2e_request_latency_seconds_count", lane="long") == 6
        record = await record_of(sidecar.logs, answers[0].headers["x-trace-id"])
        assert record is not None
        assert (record["lane"], record["role"], record["upstream"]) == ("long", "primary", long.url)
        assert record["prompt_tokens_estimate"] == 100
        assert record["prompt_tokens"] == 81
        # the estimate against usage: 100 / 81 for the first long prompt, then learnt from usage (never short here)
        name = "inferwatch_prompt_estimate_to_usage_ratio"
        assert _count(registry, f"{name}_count", lane="long") == 6
        assert _count(registry, f"{name}_bucket", lane="long", le="1.25") == 6
        assert _count(registry, f"{name}_bucket", lane="long", le="0.99") == 0


async def test_a_long_prompt_falls_back_to_the_main_upstream_while_the_lane_is_down(
    primary: tuple[FakeOpenAI, ThreadedServer], tmp_path: Path,
) -> None:
    """A long lane on a closed port: its probe fails, long prompts go to the main upstream, counted not_ready."""
    main_fake, main = primary
    lane = _closed_port_url()
    async with _sidecar(main.url, tmp_path / "logs", long_prompt_upstream=lane, long_prompt_tokens=50) as sidecar:
        assert await wait_for(lambda: _choice(sidecar).ready.get(lane) is False)
        answer = await send(sidecar, None, stream=False, prompt=LONG_PROMPT)
        assert answer.status == 200
        assert _prompts(main_fake) == [LONG_PROMPT]
        record = await record_of(sidecar.logs, answer.headers["x-trace-id"])
        assert record is not None
        assert (record["lane"], record["lane_fallback"]) == ("default", "not_ready")
        assert _count(sidecar.registry, "inferwatch_long_lane_fallbacks_total", reason="not_ready",
                      fallback="main") == 1
        assert _count(sidecar.registry, "inferwatch_upstream_ready", upstream=lane) == 0


async def test_a_lane_that_refuses_the_connection_sends_the_request_to_the_main_upstream(
    primary: tuple[FakeOpenAI, ThreadedServer], tmp_path: Path,
) -> None:
    """The lane was ready at its last probe and then went away: the refused request goes to the main upstream,
    counted unreachable; with serve.long_prompt_fallback = refuse the client gets 503 instead."""
    main_fake, main = primary
    long_fake = FakeOpenAI()
    long = ThreadedServer(long_fake.app).__enter__()
    stopped = False
    try:
        for fallback in ("main", "refuse"):
            async with _sidecar(main.url, tmp_path / fallback, long_prompt_upstream=long.url, long_prompt_tokens=50,
                                long_prompt_fallback=fallback) as sidecar:
                choice = _choice(sidecar)
                assert await wait_for(lambda choice=choice: long.url in choice.ready)  # its first probe is done
                if not stopped:
                    long.__exit__(None, None, None)  # ready at its last probe, refusing now
                    stopped = True
                choice.ready[long.url] = True  # as a probe while it was up left it (the next is a minute away)
                answer = await send(sidecar, None, stream=False, prompt=LONG_PROMPT)
                record = await record_of(sidecar.logs, answer.headers["x-trace-id"])
                assert record is not None
                assert record["lane_fallback"] == "unreachable"
                assert _count(sidecar.registry, "inferwatch_long_lane_fallbacks_total", reason="unreachable",
                              fallback=fallback) == 1
                if fallback == "main":
                    assert answer.status == 200
                    assert _prompts(main_fake) == [LONG_PROMPT]
                else:
                    assert answer.status == 503
                    assert b"long_lane_down" in answer.body
                    assert answer.headers["Retry-After"] == "1"
                    assert len(main_fake.requests) == 1
    finally:
        if not stopped:
            long.__exit__(None, None, None)


async def test_canary_clients_are_sticky_and_their_requests_carry_role_canary(
    primary: tuple[FakeOpenAI, ThreadedServer], second: tuple[FaultyUpstream, ThreadedServer], tmp_path: Path,
) -> None:
    """Each client stays on one side for every request; the canary's requests reach only the canary fake and carry
    role=canary on their metrics and records."""
    (main_fake, main), (canary_fake, canary) = primary, second
    async with _sidecar(main.url, tmp_path / "logs", canary_upstream=canary.url, canary_weight=0.5) as sidecar:
        sides: dict[str, set[str]] = {}
        for round_ in range(3):
            for client in range(16):
                answer = await send(sidecar, None, stream=False, prompt=f"client {client} round {round_}",
                                    headers={"x-client-id": f"client-{client}"})
                assert answer.status == 200
        for fake, side in ((main_fake, "primary"), (canary_fake, "canary")):
            for request in fake.requests:
                sides.setdefault(request["body"]["prompt"].split()[1], set()).add(side)
        assert all(len(found) == 1 for found in sides.values())  # sticky
        on_canary = sum(found == {"canary"} for found in sides.values())
        assert 0 < on_canary < 16
        assert _count(sidecar.registry, "inferwatch_requests_total", role="canary") == 3 * on_canary
        assert _count(sidecar.registry, "inferwatch_requests_total", role="primary") == 3 * (16 - on_canary)


async def test_the_priority_header_goes_to_vllms_priority_field_negated(
    primary: tuple[FakeOpenAI, ThreadedServer], tmp_path: Path,
) -> None:
    """x-priority 5 becomes priority -5 (vLLM: lower is earlier), -2 becomes 2, none adds nothing, a client's own
    field wins; latency is counted by the bounded priority class."""
    main_fake, main = primary
    async with _sidecar(main.url, tmp_path / "logs", pass_priority=True) as sidecar:
        for headers in ({"x-priority": "5"}, {"x-priority": "-2"}, {}, {"x-priority": "nope"}):
            assert (await send(sidecar, None, stream=False, headers=headers)).status == 200
        assert [r["body"].get("priority") for r in main_fake.requests] == [-5, 2, None, None]
        registry = sidecar.registry
        name = "inferwatch_priority_e2e_request_latency_seconds_count"
        assert {c: _count(registry, name, priority_class=c) for c in ("high", "default", "low")} == {
            "high": 1, "default": 2, "low": 1}


async def test_shadow_copies_are_compared_and_never_change_the_clients_answer(
    primary: tuple[FakeOpenAI, ThreadedServer], tmp_path: Path,
) -> None:
    """Every request copied to an identical shadow: the client's answer is the primary's, the records carry both
    sides, and greedy outputs match."""
    main_fake, main = primary
    shadow_fake = FakeOpenAI(count_prompt_words=True)
    with ThreadedServer(shadow_fake.app) as shadow:
        async with _sidecar(main.url, tmp_path / "logs", shadow_upstream=shadow.url, shadow_ratio=1.0) as sidecar:
            answers = [await send(sidecar, None, stream=stream, prompt="one two") for stream in (False, True)]
            records = [await record_of(sidecar.logs, a.headers["x-trace-id"]) for a in answers]
    assert len(main_fake.requests) == 2
    assert len(shadow_fake.requests) == 2
    assert shadow_fake.requests[0]["headers"]["x-inferwatch-shadow"] == "1"
    plain, streamed = records
    assert plain is not None
    assert streamed is not None
    assert (plain["shadow_result"], plain["shadow_status"], plain["shadow_distance"]) == ("match", 200, 0.0)
    assert plain["shadow_prompt_tokens"] == plain["prompt_tokens"] == 3
    assert plain["shadow_e2e_ms"] is not None
    assert plain["shadow_ttft_ms"] is not None
    assert streamed["shadow_result"] == "match"  # the text the relay forwarded, against the shadow's stream
    assert streamed["shadow_completion_tokens"] == 8
    assert _count(sidecar.registry, "inferwatch_shadow_requests_total", result="match") == 2
    assert _count(sidecar.registry, "inferwatch_shadow_e2e_request_latency_seconds_count", side="shadow") == 2


async def test_the_shadow_sample_is_chosen_by_trace_id(
    primary: tuple[FakeOpenAI, ThreadedServer], tmp_path: Path,
) -> None:
    """At serve.shadow_ratio 0.5 exactly the requests whose trace id's high 64 bits fall below 2^63 are copied."""
    _main_fake, main = primary
    shadow_fake = FakeOpenAI()
    with ThreadedServer(shadow_fake.app) as shadow:
        async with _sidecar(main.url, tmp_path / "logs", shadow_upstream=shadow.url, shadow_ratio=0.5) as sidecar:
            answers = [await send(sidecar, None, stream=False, prompt=f"p{i}") for i in range(24)]
            expected = sorted(f"p{i}" for i, a in enumerate(answers) if int(a.headers["x-trace-id"][:16], 16) < 2**63)
            assert await wait_for(lambda: len(shadow_fake.requests) >= len(expected))
    assert 0 < len(expected) < 24
    assert sorted(_prompts(shadow_fake)) == expected


async def test_a_silent_shadow_is_dropped_as_slow_and_the_client_never_waits_for_it(
    primary: tuple[FakeOpenAI, ThreadedServer], second: tuple[FaultyUpstream, ThreadedServer], tmp_path: Path,
) -> None:
    """The shadow holds its copy without answering: the client's answer (the primary's) arrives while the copy is
    still out, the next copy past serve.shadow_max_inflight is dropped as full, and the silent one as slow once
    serve.shadow_timeout_s passed; the records and counters say so."""
    main_fake, main = primary
    shadow_fake, shadow = second
    async with _sidecar(main.url, tmp_path / "logs", shadow_upstream=shadow.url, shadow_ratio=1.0,
                        shadow_max_inflight=1, shadow_timeout_s=1.0) as sidecar:
        copies = _choice(sidecar).shadow
        assert copies is not None
        held = await send(sidecar, "silent_before_status", stream=False)  # the primary ignores the fault header
        assert held.status == 200
        assert copies.in_flight == 1
        assert await wait_for(lambda: shadow_fake.faults_served == ["silent_before_status"])
        full = await send(sidecar, None, stream=False)
        assert full.status == 200
        assert copies.in_flight == 1
        assert len(main_fake.requests) == 2
        assert len(shadow_fake.requests) == 0
        held_record = await record_of(sidecar.logs, held.headers["x-trace-id"])
        full_record = await record_of(sidecar.logs, full.headers["x-trace-id"])
        assert held_record is not None
        assert held_record["shadow_result"] == "dropped_slow"
        assert full_record is not None
        assert full_record["shadow_result"] == "dropped_full"
        assert _count(sidecar.registry, "inferwatch_shadow_dropped_total", reason="slow") == 1
        assert _count(sidecar.registry, "inferwatch_shadow_dropped_total", reason="full") == 1
        assert copies.in_flight == 0


async def test_a_shadow_that_is_down_is_dropped_and_counted(
    primary: tuple[FakeOpenAI, ThreadedServer], tmp_path: Path,
) -> None:
    """A shadow on a closed port: every client answer is the primary's, every copy dropped as down."""
    main_fake, main = primary
    async with _sidecar(main.url, tmp_path / "logs", shadow_upstream=_closed_port_url(), shadow_ratio=1.0) as sidecar:
        answers = [await send(sidecar, None, stream=stream) for stream in (False, True, False)]
        assert [a.status for a in answers] == [200] * 3
        assert len(main_fake.requests) == 3
        records = [await record_of(sidecar.logs, a.headers["x-trace-id"]) for a in answers]
        assert [r and r["shadow_result"] for r in records] == ["dropped_down"] * 3
        assert _count(sidecar.registry, "inferwatch_shadow_dropped_total", reason="down") == 3


async def test_lane_and_role_take_three_label_pairs_at_most(
    primary: tuple[FakeOpenAI, ThreadedServer], second: tuple[FaultyUpstream, ThreadedServer], tmp_path: Path,
) -> None:
    """With a long lane and a canary, the request families carry (default, primary), (long, primary) and
    (default, canary) only: a canary client's long prompt stays on the canary, so the label budget grows by
    three times at most (README, "Long prompts in their own lane")."""
    (_main_fake, main), (_other_fake, other) = primary, second
    with ThreadedServer(FakeOpenAI().app) as canary:
        async with _sidecar(main.url, tmp_path / "logs", long_prompt_upstream=other.url, long_prompt_tokens=50,
                            canary_upstream=canary.url, canary_weight=0.5) as sidecar:
            for client in range(12):
                for prompt in (LONG_PROMPT, SHORT_PROMPT):
                    answer = await send(sidecar, None, stream=False, prompt=prompt,
                                        headers={"x-client-id": f"client-{client}"})
                    assert answer.status == 200
            pairs = {(labels["lane"], labels["role"]) for labels, value in
                     _samples(sidecar.registry, "inferwatch_e2e_request_latency_seconds_count") if value}
    assert pairs == {("default", "primary"), ("long", "primary"), ("default", "canary")}


async def test_a_shadowed_stream_is_compared_with_the_text_the_client_got(
    primary: tuple[FakeOpenAI, ThreadedServer], second: tuple[FaultyUpstream, ThreadedServer], tmp_path: Path,
) -> None:
    """The shadow's stream ends after CHUNKS_BEFORE_FAULT of the 8 words the client got: a mismatch at the edit
    distance of the 5 missing words over 8."""
    (_main_fake, main), (_shadow_fake, shadow) = primary, second
    async with _sidecar(main.url, tmp_path / "logs", shadow_upstream=shadow.url, shadow_ratio=1.0) as sidecar:
        answer = await send(sidecar, "mid_stream_error_event", stream=True)
        record = await record_of(sidecar.logs, answer.headers["x-trace-id"])
    assert answer.status == 200
    assert record is not None
    assert record["shadow_result"] == "mismatch"
    assert record["shadow_distance"] == (8 - CHUNKS_BEFORE_FAULT) / 8


async def test_without_the_client_header_the_address_keeps_a_client_on_its_side(
    primary: tuple[FakeOpenAI, ThreadedServer], second: tuple[FaultyUpstream, ThreadedServer], tmp_path: Path,
) -> None:
    """Requests without x-client-id all come from 127.0.0.1: one key, so all of them land on one side."""
    (main_fake, main), (canary_fake, canary) = primary, second
    async with _sidecar(main.url, tmp_path / "logs", canary_upstream=canary.url, canary_weight=0.5) as sidecar:
        for _ in range(6):
            assert (await send(sidecar, None, stream=False)).status == 200
    assert sorted((len(main_fake.requests), len(canary_fake.requests))) == [0, 6]
