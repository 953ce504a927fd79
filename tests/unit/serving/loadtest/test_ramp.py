"""The progressive warm-up: the ramp's schedule, when latency settled, and the SLO at the target rate."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from aiohttp.test_utils import TestServer

from exporters.errors import ConfigError
from serving.loadtest.capacity import SloTarget
from serving.loadtest.ramp import RampSpec, Window, ramp_offsets, ramp_up, settled_at
from serving.loadtest.run import default_source
from serving.loadtest.spec import LoadSpec
from tests.fakes.openai_upstream import FakeOpenAI

Servers = Callable[..., Awaitable[TestServer]]


class TestSchedule:
    """Request i leaves when the integral of the rate reaches i."""

    def test_linear_ramp_then_hold(self) -> None:
        """1 -> 9 req/s over 10 s sends 50 requests (the area of the ramp), then 9/s for 2 s sends 18 more."""
        offsets = ramp_offsets(RampSpec(1.0, 9.0, 10.0, hold_s=2.0))
        ramp = [t for t in offsets if t < 10.0]
        assert len(ramp) == 50
        assert len(offsets) - len(ramp) == 18
        assert offsets == sorted(offsets)
        assert offsets[0] == 0.0
        assert offsets[1] == pytest.approx(0.7655644, rel=1e-6)  # t + 0.4 t^2 = 1

    def test_a_flat_ramp_is_a_fixed_rate(self) -> None:
        """From 4 to 4 req/s every gap is a quarter second."""
        offsets = ramp_offsets(RampSpec(4.0, 4.0, 2.0, hold_s=1.0))
        assert offsets == pytest.approx([i / 4 for i in range(12)])

    def test_bad_values_name_their_option(self) -> None:
        """A zero target rate and a window longer than the whole warm-up are refused."""
        with pytest.raises(ConfigError) as caught:
            RampSpec(1.0, 0.0, 10.0).validate()
        assert caught.value.key == "--to-rps"
        with pytest.raises(ConfigError) as caught:
            RampSpec(1.0, 2.0, 1.0, hold_s=1.0, window_s=5.0).validate()
        assert caught.value.key == "--window-s"


def _windows(*medians: float | None) -> list[Window]:
    return [Window(5.0 * i, 5.0 * (i + 1), 1.0, 10, 0, m) for i, m in enumerate(medians)]


@pytest.mark.parametrize(("medians", "expected"), [
    pytest.param((0.9, 0.5, 0.11, 0.1, 0.1), 10.0, id="settled once the cold windows passed"),
    pytest.param((0.1, 0.1, 0.1), 0.0, id="settled from the start"),
    pytest.param((0.1, 0.1, 0.5), 10.0, id="a slow last window is its own settled state"),
    pytest.param((0.1, None, 0.1), 0.0, id="windows without data are skipped"),
    pytest.param((None, None), None, id="no data: never settled"),
])
def test_settled_at(medians: tuple[float | None, ...], expected: float | None) -> None:
    """Settled at the first window from which every median is within 20 % (or 20 ms) of the last one's."""
    assert settled_at(RampSpec(1.0, 2.0, 10.0, hold_s=15.0), _windows(*medians)) == expected


class TestRampRun:
    """Ramps against the fake upstream."""

    async def test_the_slo_is_judged_at_the_target_rate(self, aiohttp_server: Servers) -> None:
        """A fast upstream meets the SLO at 20 req/s; the verdict counts only the requests of the hold."""
        server = await aiohttp_server(FakeOpenAI(model_name="m").app())
        load = LoadSpec(url=str(server.make_url("")), model="m", requests=1, rate=20.0, max_tokens=2).validate()
        spec = RampSpec(5.0, 20.0, 0.6, hold_s=0.5, window_s=0.2)
        result = await ramp_up(load, spec, default_source(load), SloTarget(0.5, 0.9))
        assert len(result.results) == len(ramp_offsets(spec))
        assert result.at_target.sent == sum(1 for r in result.results if r.due_s >= 0.6)
        assert result.at_target.meets_slo
        assert result.settled_at_s is not None
        assert [w.rate for w in result.windows][:3] == pytest.approx([5.0, 10.0, 15.0])

    async def test_a_failing_upstream_misses_the_slo(self, aiohttp_server: Servers) -> None:
        """Every request failing at the target rate is a missed SLO."""
        server = await aiohttp_server(FakeOpenAI().app())
        load = LoadSpec(url=str(server.make_url("")), model="fail", requests=1, rate=10.0, max_tokens=2).validate()
        result = await ramp_up(load, RampSpec(5.0, 10.0, 0.3, hold_s=0.3, window_s=0.3), default_source(load),
                               SloTarget(0.5, 0.9))
        assert not result.at_target.meets_slo
        assert result.at_target.goodput == 0.0
