"""One load-test step and the settle warm-up against the in-process fake upstream; pacing on an injected clock."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from exporters.errors import ConfigError
from serving import cli
from serving import config as cfg
from serving.app import build_app
from serving.loadtest.client import RequestResult
from serving.loadtest.pacing import paced_slots
from serving.loadtest.progress import Progress, format_progress
from serving.loadtest.run import run_load
from serving.loadtest.spec import LoadSpec, endpoint
from serving.loadtest.stats import Distribution, percentile, summarize
from serving.loadtest.table import format_report
from serving.loadtest.warmup import WarmupSpec, ttft_spread, wait_healthy, warm_up
from tests.fakes.openai_upstream import PROMPT_TOKENS, FakeOpenAI

Servers = Callable[..., Awaitable[TestServer]]
HEX32 = re.compile(r"[0-9a-f]{32}")


class FakeClock:
    """A monotonic clock that only moves when sleep() is awaited (plus an optional overshoot per sleep)."""

    def __init__(self, overshoot_s: float = 0.0) -> None:
        self.now = 100.0
        self.overshoot_s = overshoot_s
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds + self.overshoot_s
        await asyncio.sleep(0)


async def _collect(gen: Any) -> list[Any]:
    return [item async for item in gen]


@pytest.fixture(name="cli_main")
def _cli_main() -> Callable[[list[str]], int]:
    assert "load" in cli.COMMAND_MODULES, "the loadtest and warmup commands are registered"
    return cli.main


async def _upstream(aiohttp_server: Servers, fake: FakeOpenAI) -> str:
    server = await aiohttp_server(fake.app())
    return str(server.make_url("")).rstrip("/")


def _spec(url: str = "http://127.0.0.1:8000", **overrides: Any) -> LoadSpec:
    values: dict[str, Any] = {"url": url, "model": "m", "requests": 6, "concurrency": 2, "max_tokens": 5}
    values.update(overrides)
    return LoadSpec(**values)


class TestPacing:
    """Open-loop slots sit on an absolute schedule."""

    async def test_slots_keep_the_absolute_schedule_when_sleep_overshoots(self) -> None:
        """Each sleep that overshoots by 3 ms shortens the next one, so slot i still leaves near i/rate."""
        clock = FakeClock(overshoot_s=0.003)
        slots = await _collect(paced_slots(10.0, count=50, duration_s=None, clock=clock, sleep=clock.sleep))
        assert [s.index for s in slots] == list(range(50))
        assert [s.due_s for s in slots] == [i / 10 for i in range(50)]
        assert clock.sleeps[0] == pytest.approx(0.1)
        assert all(s == pytest.approx(0.097) for s in clock.sleeps[1:])
        assert max(s.lag_s for s in slots) == pytest.approx(0.003)
        assert clock.now - 100.0 == pytest.approx(4.9 + 0.003)

    async def test_late_slots_leave_at_once_and_report_their_lag(self) -> None:
        """After a stall of 0.35 s the overdue slots are yielded without sleeping, each with its lag."""
        clock = FakeClock()
        slots = []
        async for slot in paced_slots(10.0, count=8, duration_s=None, clock=clock, sleep=clock.sleep):
            slots.append(slot)
            if slot.index == 1:
                clock.now += 0.35
        assert [round(s.lag_s, 6) for s in slots] == [0.0, 0.0, 0.25, 0.15, 0.05, 0.0, 0.0, 0.0]
        assert clock.sleeps == pytest.approx([0.1, 0.05, 0.1, 0.1])

    async def test_duration_bounds_the_number_of_slots(self) -> None:
        """At 4 requests/s for 2.5 s the slots due at 0, 0.25, ..., 2.25 s are sent: 10 of them."""
        clock = FakeClock()
        slots = await _collect(paced_slots(4.0, count=None, duration_s=2.5, clock=clock, sleep=clock.sleep))
        assert len(slots) == 10
        assert slots[-1].due_s == 2.25

    async def test_unbounded_schedule_is_refused(self) -> None:
        """A schedule with neither a count nor a duration raises ConfigError."""
        clock = FakeClock()
        with pytest.raises(ConfigError, match="bounded"):
            await _collect(paced_slots(4.0, count=None, duration_s=None, clock=clock, sleep=clock.sleep))

    async def test_rate_run_sends_each_request_at_its_due_time(self, aiohttp_server: Servers) -> None:
        """A rate run on the injected clock sends duration x rate requests, each due at index / rate."""
        fake = FakeOpenAI()
        url = await _upstream(aiohttp_server, fake)
        clock = FakeClock()
        report_spec = _spec(url, requests=None, duration_s=2.0, concurrency=None, rate=5.0)
        report = await run_load(report_spec, clock=clock, sleep=clock.sleep)
        assert report.sent == report.ok == 10
        assert len(fake.requests) == 10
        assert report.mode == "rate"
        assert clock.sleeps[:9] == pytest.approx([0.2] * 9)


class TestPercentiles:
    """Percentiles interpolate linearly between closest ranks."""

    def test_known_values(self) -> None:
        """Of 1..10, p50 is 5.5, p90 9.1 and p99 9.91."""
        values = [float(v) for v in range(1, 11)]
        assert percentile(values, 50) == pytest.approx(5.5)
        assert percentile(values, 90) == pytest.approx(9.1)
        assert percentile(values, 99) == pytest.approx(9.91)

    def test_single_value_and_empty(self) -> None:
        """One value is every percentile; an empty distribution has count 0 and no values."""
        assert Distribution.of([0.25]) == Distribution(1, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25)
        assert Distribution.of([]) == Distribution(0)
        with pytest.raises(ValueError, match="no values"):
            percentile([], 50)

    def test_distribution_sorts_its_input(self) -> None:
        """Distribution.of does not depend on the order of its values."""
        assert Distribution.of([3.0, 1.0, 2.0]) == Distribution.of([1.0, 2.0, 3.0])


class TestSummary:
    """The report aggregates per-request results."""

    def test_errors_slowest_and_rates(self) -> None:
        """Errors count by kind, the five slowest come first-slowest with their trace ids, rates use ok requests."""
        results = [RequestResult(index=i, status=200, e2e_s=0.1 * (i + 1), ttft_s=0.01, itl_s=[0.002, 0.004],
                                 prompt_tokens=7, completion_tokens=3, trace_id=f"{i:032x}") for i in range(8)]
        results.append(RequestResult(index=8, status=500, error="500", detail="boom", e2e_s=0.05, trace_id="t"))
        results.append(RequestResult(index=9, error="timeout", e2e_s=5.0))
        report = summarize(_spec("http://127.0.0.1:1"), results, wall_s=2.0)
        assert (report.sent, report.ok, report.failed) == (10, 8, 2)
        assert report.errors == {"500": 1, "timeout": 1}
        assert report.error_details["500"] == "boom"
        assert [s.index for s in report.slowest] == [9, 7, 6, 5, 4]
        assert report.slowest[1].trace_id == f"{7:032x}"
        assert report.requests_per_s == 4.0
        assert report.output_tokens_per_s == 12.0
        assert report.itl_s.count == 16
        assert report.e2e_s.count == 8
        assert report.trace_ids_missing == 0


class TestRun:
    """Runs against the fake upstream."""

    async def test_request_count_and_measurements(self, aiohttp_server: Servers) -> None:
        """Exactly N streamed requests are sent, asking for usage, and each one's tokens and TTFT are measured."""
        fake = FakeOpenAI()
        url = await _upstream(aiohttp_server, fake)
        readings: list[Any] = []
        report = await run_load(_spec(url, requests=7, ignore_eos=True), on_progress=readings.append)
        assert (report.sent, report.ok, report.failed) == (7, 7, 0)
        assert len(fake.requests) == 7
        body = fake.requests[0]["body"]
        assert body["stream_options"] == {"include_usage": True}
        assert body["ignore_eos"] is True
        assert fake.requests[0]["path"] == "/v1/completions"
        assert report.completion_tokens == 35
        assert report.prompt_tokens == 7 * PROMPT_TOKENS
        assert report.tokens_per_request.min == report.tokens_per_request.max == 5
        assert report.ttft_s.count == 7
        assert report.itl_s.count == 7 * 4
        assert readings[-1].done == 7

    async def test_chat_without_streaming(self, aiohttp_server: Servers) -> None:
        """Non-streamed chat requests count tokens from usage and have no TTFT."""
        fake = FakeOpenAI()
        url = await _upstream(aiohttp_server, fake)
        report = await run_load(_spec(url + "/v1", chat=True, stream=False, requests=3))
        assert fake.requests[0]["path"] == "/v1/chat/completions"
        assert "stream_options" not in fake.requests[0]["body"]
        assert report.completion_tokens == 15
        assert report.ttft_s.count == 0
        assert report.e2e_s.count == 3

    async def test_duration_bounds_a_closed_loop_run(self, aiohttp_server: Servers) -> None:
        """With only a duration, the workers stop starting requests once the injected clock passes it."""
        fake = FakeOpenAI()
        url = await _upstream(aiohttp_server, fake)
        ticks = iter(range(1000))

        def clock() -> float:
            return float(next(ticks)) * 0.1

        report = await run_load(_spec(url, requests=None, duration_s=1.0, concurrency=1), clock=clock)
        assert 0 < report.sent < 10
        assert report.sent == len(fake.requests)

    @pytest.mark.parametrize(("model", "kinds"), [
        pytest.param("fail", {"500"}, id="a 500 counts under its status"),
        pytest.param("overloaded", {"503"}, id="a 503 counts under its status"),
        pytest.param("break", {"disconnected", "incomplete_stream"}, id="a cut stream counts as a failure"),
    ])
    async def test_errors_are_counted_by_kind(self, aiohttp_server: Servers, model: str, kinds: set[str]) -> None:
        """Failed requests are counted per status or failure kind."""
        url = await _upstream(aiohttp_server, FakeOpenAI())
        report = await run_load(_spec(url, model=model, requests=4))
        assert report.failed == 4
        assert report.ok == 0
        assert set(report.errors) <= kinds
        assert sum(report.errors.values()) == 4

    async def test_timeout_and_refused_connection(self, aiohttp_server: Servers, unused_tcp_port: int) -> None:
        """A request slower than --timeout counts as a timeout; a closed port as a connection error."""
        url = await _upstream(aiohttp_server, FakeOpenAI())
        stalled = await run_load(_spec(url, model="stall", requests=2, timeout_s=0.2))
        assert stalled.errors == {"timeout": 2}
        refused = await run_load(_spec(f"http://127.0.0.1:{unused_tcp_port}", requests=2))
        assert refused.errors == {"connection_error": 2}

    async def test_slowest_requests_come_first(self, aiohttp_server: Servers) -> None:
        """The request the upstream held back longest heads the slowest list."""
        fake = FakeOpenAI(first_token_delays_s=(0, 0, 0, 0.6, 0))  # longer than a busy machine's stalls
        url = await _upstream(aiohttp_server, fake)
        report = await run_load(_spec(url, requests=5, concurrency=1))
        assert report.slowest[0].index == 3
        assert len(report.slowest) == 5

    async def test_trace_ids_come_from_the_sidecar(
        self, aiohttp_server: Servers, aiohttp_client: Callable[..., Awaitable[Any]]
    ) -> None:
        """Through the in-process sidecar every request gets a distinct 32-hex trace id, the slowest listed."""
        url = await _upstream(aiohttp_server, FakeOpenAI())
        settings = cfg.replace(cfg.defaults(), "serve", upstream=url, read_timeout_s=5.0)
        sidecar = await aiohttp_client(build_app(settings, CollectorRegistry()))
        report = await run_load(_spec(str(sidecar.make_url("")), requests=6))
        assert report.ok == 6
        assert report.trace_ids_missing == 0
        ids = [s.trace_id for s in report.slowest]
        assert len(ids) == 5
        assert all(HEX32.fullmatch(i or "") for i in ids)
        assert len(set(ids)) == 5


class TestValidation:
    """Bad specs raise ConfigError naming the option."""

    @pytest.mark.parametrize(("overrides", "key"), [
        pytest.param({"requests": None, "duration_s": None}, "--requests", id="an unbounded run is refused"),
        pytest.param({"concurrency": None, "rate": None}, "--concurrency", id="no pacing is refused"),
        pytest.param({"rate": 5.0}, "--rate", id="concurrency and rate together are refused"),
        pytest.param({"concurrency": None, "rate": 0.0}, "--rate", id="a zero rate is refused"),
        pytest.param({"requests": 0}, "--requests", id="zero requests are refused"),
        pytest.param({"duration_s": float("inf")}, "--duration", id="an infinite duration is refused"),
        pytest.param({"url": "ftp://127.0.0.1"}, "--url", id="a non-http URL is refused"),
        pytest.param({"url": "http://127.0.0.1:port"}, "--url", id="a URL with a bad port is refused"),
        pytest.param({"max_tokens": 0}, "--max-tokens", id="zero max_tokens are refused"),
    ])
    def test_bad_spec(self, overrides: dict[str, Any], key: str) -> None:
        """The error names the offending option."""
        values = {"url": "http://127.0.0.1:8000", **overrides}
        with pytest.raises(ConfigError) as caught:
            _spec(**values).validate()
        assert caught.value.key == key

    def test_endpoint_accepts_a_trailing_v1(self) -> None:
        """Base URLs with or without /v1 (and a trailing slash) give the same endpoint."""
        for url in ("http://127.0.0.1:9100", "http://127.0.0.1:9100/", "http://127.0.0.1:9100/v1/"):
            assert endpoint(url, chat=False) == "http://127.0.0.1:9100/v1/completions"
        assert endpoint("http://h:1/v1", chat=True) == "http://h:1/v1/chat/completions"


class TestWarmup:
    """Warm-up waits for health, then for TTFT to settle."""

    def test_spread_of_the_last_window(self) -> None:
        """The spread is the median of the last window and the largest distance of one TTFT from it."""
        assert ttft_spread([1.0, 1.0, 1.0], 5) is None
        spread = ttft_spread([9.0, 1.0, 1.1, 0.9, 1.0, 1.0], 5)
        assert spread is not None
        assert spread.median_s == 1.0
        assert spread.deviation_s == pytest.approx(0.1)
        assert spread.ratio == pytest.approx(0.1)

    def test_tolerance_is_a_ratio_with_a_floor(self) -> None:
        """Allowed deviation is settle_ratio of the median, or settle_floor_s when that is larger."""
        spec = WarmupSpec("http://127.0.0.1:8000", "m", settle_ratio=0.2, settle_floor_s=0.02)
        assert spec.tolerance_s(1.0) == pytest.approx(0.2)
        assert spec.tolerance_s(0.01) == pytest.approx(0.02)

    async def test_jitter_under_the_floor_counts_as_settled(self, aiohttp_server: Servers) -> None:
        """TTFTs alternating between 5 and 45 ms settle with a 100 ms floor but not with a 10 ms one."""
        delays = [0.005, 0.045] * 10
        url = await _upstream(aiohttp_server, FakeOpenAI(first_token_delays_s=delays))
        loose = await warm_up(WarmupSpec(url, "m", max_requests=6, timeout_s=30, settle_floor_s=0.1))
        assert loose.settled, loose.reason
        assert loose.requests == 5
        url = await _upstream(aiohttp_server, FakeOpenAI(first_token_delays_s=delays))
        strict = await warm_up(WarmupSpec(url, "m", max_requests=6, timeout_s=30, settle_floor_s=0.01))
        assert not strict.settled
        assert "whichever is larger" in strict.reason

    async def test_settles_after_the_cold_requests(self, aiohttp_server: Servers) -> None:
        """Two slow cold requests, then steady ones: health waited for, settled once the slow ones left the window."""
        fake = FakeOpenAI(first_token_delays_s=(0.4, 0.2, *([0.05] * 20)), unhealthy_for=2)
        url = await _upstream(aiohttp_server, fake)
        steps: list[str] = []
        result = await warm_up(WarmupSpec(url, "m", max_requests=20, timeout_s=30, settle_ratio=0.5,
                                          health_poll_s=0.01), on_step=steps.append)
        assert result.settled, result.reason
        assert fake.health_checks == 3
        assert result.requests >= 7
        assert "settled" in result.reason
        assert steps[0].startswith("health:")

    async def test_budget_runs_out(self, aiohttp_server: Servers) -> None:
        """With fewer requests allowed than the cold ones need, it reports that TTFT has not settled."""
        fake = FakeOpenAI(first_token_delays_s=(0.3, 0.15, 0.02, 0.02, 0.02))
        url = await _upstream(aiohttp_server, fake)
        result = await warm_up(WarmupSpec(url, "m", max_requests=5, timeout_s=30, settle_ratio=0.5))
        assert not result.settled
        assert result.requests == 5
        assert "has not settled" in result.reason

    async def test_health_deadline(self, aiohttp_server: Servers) -> None:
        """A server that never becomes healthy is reported with the last status seen.

        The budget leaves room for a slow first connection on a busy machine (0.2 s once ran out
        before any answer, leaving "timed out" as the last thing seen).
        """
        url = await _upstream(aiohttp_server, FakeOpenAI(unhealthy_for=10_000))
        result = await warm_up(WarmupSpec(url, "m", timeout_s=2.0, health_poll_s=0.02))
        assert not result.settled
        assert result.health_wait_s is None
        assert "did not answer 200" in result.reason
        assert "status 503" in result.reason

    async def test_stops_after_consecutive_failures(self, aiohttp_server: Servers) -> None:
        """A model that always fails stops the warm-up after three failures in a row, naming the error."""
        url = await _upstream(aiohttp_server, FakeOpenAI())
        result = await warm_up(WarmupSpec(url, "fail", timeout_s=30))
        assert not result.settled
        assert result.requests == 3
        assert result.errors == {"500": 3}
        assert "internal failure" in result.reason


class TestCli:
    """`inferwatch loadtest` and `inferwatch warmup` exit codes and output."""

    async def test_loadtest_json_shape(
        self, aiohttp_server: Servers, cli_main: Callable[[list[str]], int], capsys: pytest.CaptureFixture[str]
    ) -> None:
        """--json prints one object with counts, percentiles, throughput, errors and the slowest; exit 0."""
        url = await _upstream(aiohttp_server, FakeOpenAI())
        code = await asyncio.to_thread(cli_main, ["loadtest", "--url", url, "--model", "m", "--requests", "5",
                                                  "--concurrency", "2", "--max-tokens", "3", "--json"])
        captured = capsys.readouterr()
        assert code == 0
        report = json.loads(captured.out)
        assert set(report) >= {"requests", "errors", "wall_s", "requests_per_s", "output_tokens_per_s", "tokens",
                               "ttft_s", "itl_s", "e2e_s", "slowest"}
        assert report["requests"] == {"sent": 5, "ok": 5, "failed": 0}
        assert set(report["ttft_s"]) >= {"p50", "p90", "p99"}
        assert report["tokens"]["completion"] == 15
        assert "5/5 done" in captured.err

    async def test_loadtest_failure_exits_1_with_a_table(
        self, aiohttp_server: Servers, cli_main: Callable[[list[str]], int], capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Any failed request makes the exit code 1; the table lists the error with its message."""
        url = await _upstream(aiohttp_server, FakeOpenAI())
        code = await asyncio.to_thread(cli_main, ["loadtest", "--url", url, "--model", "fail", "--requests", "2",
                                                  "--rate", "50", "--quiet"])
        out = capsys.readouterr().out
        assert code == 1
        assert "500: 2 (internal failure)" in out
        assert "TTFT" in out

    @pytest.mark.parametrize("argv", [
        pytest.param(["--rate", "0"], id="a zero rate"),
        pytest.param(["--requests", "-3"], id="a negative count"),
        pytest.param(["--url", "localhost:8000"], id="a URL without scheme"),
    ])
    def test_loadtest_bad_arguments_exit_2(
        self, argv: list[str], cli_main: Callable[[list[str]], int], capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Out-of-range or malformed options are usage errors (exit 2) naming the option."""
        base = ["loadtest", "--url", "http://127.0.0.1:1", "--model", "m"]
        assert cli_main(base + argv) == 2
        assert argv[0] in capsys.readouterr().err

    def test_concurrency_and_rate_together_exit_2(self, cli_main: Callable[[list[str]], int]) -> None:
        """--concurrency and --rate are mutually exclusive (argparse exits 2)."""
        with pytest.raises(SystemExit) as caught:
            cli_main(["loadtest", "--url", "http://127.0.0.1:1", "--model", "m", "--concurrency", "2", "--rate", "3"])
        assert caught.value.code == 2

    async def test_warmup_exit_codes(
        self, aiohttp_server: Servers, cli_main: Callable[[list[str]], int], capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Warm-up exits 0 when TTFT settled and 1 with the reason when it did not."""
        fake = FakeOpenAI(first_token_delays_s=[0.03] * 40)
        url = await _upstream(aiohttp_server, fake)
        ok = await asyncio.to_thread(cli_main, ["warmup", "--url", url, "--model", "m", "--settle-ratio", "0.9",
                                                "--timeout", "30"])
        assert ok == 0
        assert "warmup: settled" in capsys.readouterr().out
        failed = await asyncio.to_thread(cli_main, ["warmup", "--url", url, "--model", "fail", "--timeout", "30"])
        assert failed == 1
        assert "NOT settled" in capsys.readouterr().out

    def test_report_table_names_the_target_and_pacing(self) -> None:
        """The table says where the load went, how it was paced, and marks a target that sends no trace ids."""
        spec = _spec("http://127.0.0.1:8000", concurrency=None, rate=2.5)
        results = [RequestResult(index=0, status=200, e2e_s=0.2, ttft_s=0.05, completion_tokens=5)]
        text = format_report(spec, summarize(spec, results, 1.0))
        assert "http://127.0.0.1:8000/v1/completions" in text
        assert "at 2.5 requests/s (open loop)" in text
        assert "not the sidecar" in text

    def test_progress_lines(self) -> None:
        """Progress shows done/total for a count and elapsed/duration for a duration."""
        assert format_progress(Progress(1.2, 40, 1, 3, 19.5, 100, None)).startswith("loadtest: 40/100 done, 19.5")
        assert "12.0/30 s, 40 done" in format_progress(Progress(12.0, 40, 0, 3, 3.0, None, 30.0))



async def test_a_probe_cut_short_by_the_deadline_keeps_the_answer_seen_before(
    aiohttp_server: Callable[[web.Application], Awaitable[TestServer]],
) -> None:
    """The last probe only gets what is left of the deadline; its time-out must not hide the 503 before it
    (CI once reported "last: timed out" for a server that answered 503 all along)."""
    probes = 0

    async def health(_request: web.Request) -> web.Response:
        nonlocal probes
        probes += 1
        if probes > 1:
            await asyncio.sleep(2.0)  # longer than the 0.2 s left to the second probe
        return web.Response(status=503)

    app = web.Application()
    app.router.add_get("/health", health)
    server = await aiohttp_server(app)
    times = iter([0.0, 0.0, 1.8, 1.8, 2.5])  # the clock at each of wait_healthy's reads

    async def no_sleep(_seconds: float) -> None:
        return None

    async with aiohttp.ClientSession() as session:
        ok, last = await wait_healthy(session, str(server.make_url("/health")), deadline=2.0, poll_s=0.02,
                                      clock=lambda: next(times), sleep=no_sleep)
    assert (ok, last, probes) == (False, "status 503", 2)
