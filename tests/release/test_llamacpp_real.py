"""The sidecar in front of a real llama.cpp server (``make release-check-llamacpp``; not part of ``make test``:
building llama-server takes about 8.5 minutes on 2 cores).

llama-server is built from the llama.cpp source vendored in the llama-cpp-python sdist and serves a tiny
random-weights GGUF (tests/harness/build_llama_server.sh; the paths come in INFERWATCH_LLAMA_SERVER and
INFERWATCH_TINY_GGUF). Checked against llama.cpp's own account: its ``/metrics`` read directly, and the
``timings`` of the answers the client received. With INFERWATCH_CAPTURE_DIR set, the real exposition is written
there (tests/data/llamacpp_real_0.3.36.prom is such a capture).
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporters.catalog import engine as ce
from exporters.catalog import engines as engines_cat
from exporters.catalog import llamacpp as cl
from serving.tools.launcher import RunningServer, launch
from tests.conftest import require
from tests.harness import servers
from tests.harness.exposition import sample_sum

pytestmark = pytest.mark.real_server


def _path(variable: str) -> Path:
    value = os.environ.get(variable, "")
    if not value or not Path(value).exists():
        raise servers.ServerUnavailable(f"{variable} names no file (run make release-check-llamacpp)")
    return Path(value)


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """llama-server with --metrics, two slots of 256 tokens, on the tiny GGUF."""
    work = tmp_path_factory.mktemp("llamacpp")
    port = servers.free_port()

    def start() -> RunningServer:
        argv = [str(_path("INFERWATCH_LLAMA_SERVER")), "-m", str(_path("INFERWATCH_TINY_GGUF")), "--host",
                "127.0.0.1", "--port", str(port), "--metrics", "-c", "512", "-np", "2", "--no-webui", "-t", "2"]
        process = launch(servers.ManagedProcess("llama-server", argv, work / "llama-server.log"),
                         f"http://127.0.0.1:{port}/health", 60)
        return RunningServer(process, port)

    server = require(start)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def llama_sidecar(llama_server: RunningServer, tmp_path_factory: pytest.TempPathFactory,
                  ) -> Iterator[servers.SidecarServer]:
    """The sidecar in front of it, serve.engine left at auto."""
    work = tmp_path_factory.mktemp("llamacpp-sidecar")
    sidecar = require(lambda: servers.start_sidecar(llama_server.base_url, work, ["--scrape-interval-s", "1"]))
    yield sidecar
    sidecar.stop()


def _post(url: str, body: dict[str, Any]) -> tuple[str, bytes]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.headers.get("x-trace-id", ""), response.read()


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def test_each_answers_timings_are_the_requests_engine_phases(llama_sidecar: servers.SidecarServer) -> None:
    """A plain completion and a chat stream asking for usage: explain's prefill and decode are the timings the
    client received, and the record's cached tokens are its cache_n."""
    base = llama_sidecar.base_url
    plain_id, plain = _post(f"{base}/v1/completions", {"model": "tiny", "prompt": "the quick brown fox",
                                                        "max_tokens": 8})
    stream_id, stream = _post(f"{base}/v1/chat/completions", {
        "model": "tiny", "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "hello there"}]})
    timings = {plain_id: json.loads(plain)["timings"]}
    for line in stream.decode().splitlines():
        if line.startswith("data: {") and '"timings"' in line:
            timings[stream_id] = json.loads(line[6:])["timings"]
    assert set(timings) == {plain_id, stream_id}
    for trace_id, received in timings.items():
        explanation = json.loads(_get(f"{base}/admin/requests/{trace_id}"))
        parts = {p["name"]: p["ms"] for p in explanation["phases"]}
        assert parts["prefill"] == round(received["prompt_ms"], 1)
        assert parts["decode"] == round(received["predicted_ms"], 1)
        assert explanation["cached_tokens"] == received["cache_n"]
        assert sum(parts.values()) == pytest.approx(explanation["e2e_ms"], abs=0.5)


def test_the_engine_view_is_llamacpps_own_metrics_and_kv_usage_stays_unknown(
    llama_sidecar: servers.SidecarServer, llama_server: RunningServer,
) -> None:
    """auto recognizes llama.cpp by its families; the engine series equal llama-server's own counters once idle;
    no KV usage series (llama-server exports none)."""
    _post(f"{llama_sidecar.base_url}/v1/completions", {"model": "tiny", "prompt": "one two three", "max_tokens": 6})
    own = text = ""
    for _ in range(50):  # the sidecar scrapes every second; both read once the server's counters settled
        own = _get(f"{llama_server.base_url}/metrics")
        text = _get(f"{llama_sidecar.base_url}/metrics")
        decode_s = sample_sum(own, cl.TOKENS_PREDICTED_SECONDS.name)
        if decode_s > 0 and sample_sum(text, ce.ENGINE_DECODE_SECONDS.series) == pytest.approx(decode_s):
            break
        time.sleep(0.2)
    capture = os.environ.get("INFERWATCH_CAPTURE_DIR")
    if capture:
        Path(capture).mkdir(parents=True, exist_ok=True)
        (Path(capture) / "llamacpp_real.prom").write_text(own)
    assert {f.name for f in text_string_to_metric_families(own)} >= {s.name.removesuffix("_total") for s in cl.SPECS}
    assert sample_sum(text, ce.ENGINE_DECODE_SECONDS.series) == pytest.approx(decode_s)
    assert sample_sum(text, ce.ENGINE_PREFILL_SECONDS.series) == pytest.approx(sample_sum(own, cl.PROMPT_SECONDS.name))
    assert sample_sum(text, ce.ENGINE_GENERATION_TOKENS.series) == sample_sum(own, cl.TOKENS_PREDICTED.name)
    assert sample_sum(text, engines_cat.UPSTREAM_ENGINE.name, engine="llamacpp", detected_by="metrics") == 1
    assert sample_sum(text, ce.ENGINE_INFO.name, generation="llamacpp") == 1
    assert not [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == ce.KV_USAGE.name]
