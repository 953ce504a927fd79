"""A frozen vLLM-CPU (SIGSTOP) behind the sidecar: its engine series leave /metrics after N failed scrapes.

SIGSTOP is the fault a busy or wedged engine shows: its port still accepts connections (the kernel
completes the handshake) but nothing answers, so every scrape times out and every readiness probe
too (a timeout is not readiness lost). The series must stay through the first failed scrapes (one
slow scrape of a busy vLLM-CPU is not an outage) and go at the ``scrape.stale_after_failures``-th in a
row, with the scrape health saying why; SIGCONT brings them back. Runs on the session's vLLM.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporters.catalog import engine as ce
from tests.conftest import require
from tests.harness import servers
from tests.harness.engine_series import EngineSeriesReading, live, poll_until

pytestmark = pytest.mark.real_server

STALE_AFTER = 3
SCRAPE_INTERVAL_S = 0.5
SCRAPE_TIMEOUT_S = 0.4


@pytest.fixture(name="quick_sidecar")
def _quick_sidecar(vllm_server: servers.VllmServer, tmp_path: Path) -> Iterator[servers.SidecarServer]:
    """A sidecar scraping the session's vLLM every 0.5 s (0.4 s timeout), stale after 3 failures in a row."""
    server = require(lambda: servers.start_sidecar(
        vllm_server.base_url, tmp_path,
        ["--scrape-interval-s", str(SCRAPE_INTERVAL_S), "--scrape-timeout-s", str(SCRAPE_TIMEOUT_S),
         "--scrape-stale-after-failures", str(STALE_AFTER), "--serve-readiness-interval-s", "0.5"],
        ready_path="/readyz"))
    yield server
    server.stop()


def test_a_frozen_vllms_engine_series_go_stale_after_n_failed_scrapes_and_come_back(
    vllm_server: servers.VllmServer, quick_sidecar: servers.SidecarServer, record_property: Any
) -> None:
    """While vLLM is stopped: the series stay through 1 and 2 failed scrapes, are absent from the 3rd in a row
    with scrape_up 0, stale 1 and 3+ timeouts counted; after SIGCONT they are back with stale 0."""
    vllm_server.wait_idle()
    base = quick_sidecar.base_url
    before = poll_until(base, live, 30)
    assert before is not None, "the sidecar never exported vLLM's engine series"
    seen: list[EngineSeriesReading] = []
    os.kill(vllm_server.pid, signal.SIGSTOP)
    try:
        gone = poll_until(base, lambda r: not r.engine, 30, seen)
    finally:
        os.kill(vllm_server.pid, signal.SIGCONT)
    back = poll_until(base, live, 60)
    assert gone is not None, f"the engine series were still exported 30 s after vLLM froze: {seen[-1]}"
    record_property("drill_frozen_to_engine_series_gone_s", round(gone.at - seen[0].at, 2))
    assert (gone.scrape_up, gone.stale) == (0.0, 1.0), gone
    assert (gone.consecutive_failures or 0) >= STALE_AFTER, gone
    assert gone.failures.get("timeout", 0) - before.failures.get("timeout", 0) >= STALE_AFTER, gone
    kept = [r for r in seen if r.engine]
    assert all((r.consecutive_failures or 0) < STALE_AFTER for r in kept), kept
    assert any((r.consecutive_failures or 0) >= 1 for r in kept), \
        "no reading showed a failed scrape with the series still there (one slow scrape must not drop them)"
    assert back is not None, "the engine series did not come back within 60 s of SIGCONT"
    assert ce.ENGINE_REQUESTS.series in back.engine
    assert ce.KV_USAGE.series in back.engine
    assert (back.scrape_up, back.consecutive_failures) == (1.0, 0.0)
