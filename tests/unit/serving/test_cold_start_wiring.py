"""The sidecar measures a cold start itself: readiness lost or not yet there, to the first good token after."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.faulty_upstream import ThreadedServer
from tests.fakes.openai_upstream import FakeOpenAI
from tests.unit.serving.inprocess import send, start_sidecar, wait_for


@pytest.fixture(name="starting")
def _starting() -> Iterator[tuple[ThreadedServer, FakeOpenAI]]:
    """An upstream whose first three health checks answer 503, as a vLLM still loading its model."""
    fake = FakeOpenAI(unhealthy_for=3)
    with ThreadedServer(fake.app) as server:
        yield server, fake


async def test_a_cold_start_is_measured_from_not_ready_to_the_first_token(
    starting: tuple[ThreadedServer, FakeOpenAI], tmp_path: Path
) -> None:
    """/readyz reports the cold start in progress, then the finished one; the histogram counts it once."""
    server, fake = starting
    sidecar, runner = await start_sidecar(server.url, tmp_path / "logs", readiness_interval_s=0.1)
    try:
        async with sidecar.session.get(sidecar.url + "/readyz") as response:
            first = await response.json()
        assert response.status == 503
        assert first["cold_start_in_progress"] is not None
        assert await wait_for(lambda: fake.health_checks > 3)
        assert (await send(sidecar, None, stream=True)).status == 200

        def counted() -> float:
            return sidecar.registry.get_sample_value("inferwatch_upstream_cold_start_seconds_count") or 0.0

        assert await wait_for(lambda: counted() == 1.0)
        async with sidecar.session.get(sidecar.url + "/readyz") as response:
            body = await response.json()
        assert response.status == 200
        assert body["cold_start_in_progress"] is None
        (cold_start,) = body["recent_cold_starts"]
        assert cold_start["cause"] == "not_ready_at_start"
        assert 0 < cold_start["ready_after_s"] <= cold_start["first_token_after_s"]
    finally:
        await sidecar.session.close()
        await runner.cleanup()
