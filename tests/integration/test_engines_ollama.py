"""The sidecar in front of Ollama (the protocol-faithful fake of tests/fakes/ollama_upstream.py; no real Ollama
installs from the package registries here): the native API and /v1 measured like any request, Ollama's own
durations joined to the trace (record, span, histograms, explain), its models as gauges, readiness from its root,
and the boards' queries answering from a real Prometheus scraping that sidecar.

Every number is checked against what the client received from Ollama (its final message) or what the fake's own
endpoints say, never against our formulas.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from alert_rules.build import outputs as rule_outputs
from alert_rules.config import RulesConfig
from dashboards.build import dashboards
from dashboards.config import DashboardConfig
from exporters.catalog import cutover, gpu, process, vllm
from exporters.catalog import engines as ce
from exporters.catalog import prometheus as pp
from exporters.configuring import from_mapping
from log_pipeline.query import Archive
from serving.tools.launcher import RunningServer, launch
from tests.conftest import require
from tests.harness import servers
from tests.harness.exposition import sample_sum
from tests.harness.otlp_receiver import OtlpReceiver
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.real_server
MODEL = "tinyllama:latest"


def _post(url: str, body: dict[str, Any]) -> tuple[str, bytes, str]:
    """The trace id, body and content type the client got."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.headers["x-trace-id"], response.read(), response.headers["Content-Type"]


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def _metrics(sidecar: servers.SidecarServer) -> str:
    with urllib.request.urlopen(f"{sidecar.base_url}/metrics", timeout=10) as response:
        return str(response.read().decode())


@pytest.fixture(scope="module")
def ollama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """The fake Ollama, a process of its own."""
    port = servers.free_port()
    work = tmp_path_factory.mktemp("ollama")
    process = require(lambda: launch(servers.ManagedProcess(
        "fake ollama", [sys.executable, "-m", "tests.fakes.ollama_upstream", "--port", str(port)],
        work / "ollama.log", cwd=servers.REPO), f"http://127.0.0.1:{port}/", 30))
    yield RunningServer(process, port)
    process.stop()


@pytest.fixture(scope="module")
def ollama_sidecar(ollama: RunningServer, otlp_receiver: OtlpReceiver,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.SidecarServer]:
    """``inferwatch serve`` in front of it with serve.engine left at auto, keeping every request's record."""
    work = tmp_path_factory.mktemp("ollama-sidecar")
    sidecar = require(lambda: servers.start_sidecar(ollama.base_url, work, [
        "--scrape-interval-s", "1", "--rules-evaluation-interval-s", "1", "--tracing-otlp-endpoint",
        otlp_receiver.endpoint, "--logs-dir", str(work / "logs"), "--logs-frame-max-ms", "200",
        "--logs-success-sample-ratio", "1"]))
    # auto has recognized Ollama before the first request, whose span then names it
    wait_for(lambda: bool(sample_sum(_metrics(sidecar), ce.UPSTREAM_ENGINE.name, engine="ollama")),
             "the engine recognized as Ollama", lambda: _metrics(sidecar)[-2000:], 20.0, 0.1)
    yield sidecar
    sidecar.stop()


def _final(body: bytes) -> dict[str, Any]:
    return json.loads(body.strip().splitlines()[-1])


def test_native_streams_and_answers_carry_ollamas_own_account_to_the_trace(
    ollama_sidecar: servers.SidecarServer, otlp_receiver: OtlpReceiver,
) -> None:
    """A streamed /api/generate and a plain /api/chat: tokens, reason, and load/prefill/decode in the record, the
    span, the histograms and explain, equal to the final message the client received."""
    base = ollama_sidecar.base_url
    streamed = _post(f"{base}/api/generate", {"model": MODEL, "prompt": "why is the sky blue"})
    plain = _post(f"{base}/api/chat", {"model": MODEL, "stream": False, "options": {"num_predict": 5},
                                       "messages": [{"role": "user", "content": "hello there"}]})
    assert streamed[2] == "application/x-ndjson"
    assert len(streamed[1].strip().splitlines()) == 9  # eight parts and the final message, forwarded whole
    finals = {trace: _final(body) for trace, body, _ in (streamed, plain)}
    assert finals[streamed[0]]["load_duration"] > 0  # the fake's cold start: the first use of the model
    for trace_id, final in finals.items():
        explanation = _get(f"{base}/admin/requests/{trace_id}")
        parts = {p["name"]: p["ms"] for p in explanation["phases"]}
        assert parts["prefill"] == round(final["prompt_eval_duration"] / 1e6, 1)
        assert parts["decode"] == round(final["eval_duration"] / 1e6, 1)
        assert parts.get("model_load", 0.0) == round(final.get("load_duration", 0) / 1e6, 1)
        assert (explanation["prompt_tokens"], explanation["completion_tokens"]) == (
            final["prompt_eval_count"], final["eval_count"])
        assert explanation["ttft_ms"] >= (final.get("load_duration", 0) + final["prompt_eval_duration"]) / 1e6
        record = _archived(ollama_sidecar, trace_id)
        assert (record["engine_source"], record["finish_reason"]) == ("ollama", final["done_reason"])
        assert record["engine_decode_ms"] == round(final["eval_duration"] / 1e6, 1)
        span = otlp_receiver.wait_for(lambda s, t=trace_id: s.trace_id == t and s.service == "inferwatch")[0]
        assert span.attributes["inferwatch.engine.total_ms"] == round(final["total_duration"] / 1e6, 1)
        assert span.attributes["gen_ai.provider.name"] == "ollama"  # the engine auto recognized, not vLLM
    assert explanation_cause(base, streamed[0]) == "cold_start"
    text = _metrics(ollama_sidecar)
    load = sample_sum(text, ce.REQUEST_ENGINE_LOAD_SECONDS.sum, model_name=MODEL)
    assert load == pytest.approx(sum(f.get("load_duration", 0) for f in finals.values()) / 1e9)


def explanation_cause(base: str, trace_id: str) -> str:
    """The first cause explain gives a request."""
    return str(_get(f"{base}/admin/requests/{trace_id}")["causes"][0]["cause"])


def _archived(sidecar: servers.SidecarServer, trace_id: str) -> dict[str, Any]:
    logs = Path(sidecar.process.log_path).parent / "logs"
    found: list[dict[str, Any]] = []

    def archived() -> bool:
        found[:] = Archive(logs).find(trace_id)
        return bool(found)

    wait_for(archived, f"the record of {trace_id}", lambda: [s.path for s in Archive(logs).segments()], 30.0, 0.1)
    return found[-1]


def test_ollamas_openai_api_is_measured_from_its_usage_chunk(ollama_sidecar: servers.SidecarServer) -> None:
    """/v1 through Ollama: the usage the sidecar asked for is taken out again, the counts are the record's."""
    trace_id, body, _ = _post(f"{ollama_sidecar.base_url}/v1/chat/completions", {
        "model": MODEL, "stream": True, "max_tokens": 6, "messages": [{"role": "user", "content": "a b c"}]})
    assert b'"usage"' not in body  # the client did not ask for it
    explanation = _get(f"{ollama_sidecar.base_url}/admin/requests/{trace_id}")
    assert (explanation["prompt_tokens"], explanation["completion_tokens"]) == (4, 6)
    assert explanation["engine_numbers"] is False  # Ollama's /v1 carries no durations


def test_engine_models_and_readiness_come_from_ollamas_own_endpoints(
    ollama_sidecar: servers.SidecarServer, ollama: RunningServer,
) -> None:
    """auto finds Ollama at its root, /readyz probes that root, and the model gauges are /api/tags and /api/ps."""
    _post(f"{ollama_sidecar.base_url}/api/generate", {"model": MODEL, "prompt": "x", "stream": False})
    ps = {m["name"]: m for m in _get(f"{ollama.base_url}/api/ps")["models"]}
    tags = _get(f"{ollama.base_url}/api/tags")["models"]
    labels = {"model_name": MODEL}
    text = ""

    def polled() -> bool:  # the poll runs every scrape.interval_s
        nonlocal text
        text = _metrics(ollama_sidecar)
        return bool(sample_sum(text, ce.OLLAMA_LOADED_VRAM_BYTES.name, **labels) == ps[MODEL]["size_vram"])

    wait_for(polled, "Ollama's loaded model in the gauges", lambda: text[-2000:], 30.0, 0.2)
    assert sample_sum(text, ce.OLLAMA_LOADED_BYTES.name, **labels) == ps[MODEL]["size"]
    assert sample_sum(text, ce.OLLAMA_MODELS.name) == len(tags)
    assert sample_sum(text, ce.UPSTREAM_ENGINE.name, engine="ollama", detected_by="endpoint") == 1
    with urllib.request.urlopen(f"{ollama_sidecar.base_url}/readyz", timeout=10) as response:
        assert response.status == 200


# ---- the boards, with a real Prometheus scraping the sidecar in front of Ollama

ELSEWHERE = frozenset({
    *(s.name for s in vllm.SPECS), *(s.name for s in (*gpu.SPECS, *process.SPECS)),
    pp.ALERTS.name, pp.NOTIFICATIONS_SENT.name, pp.NOTIFICATIONS_ERRORS.name, pp.NOTIFICATIONS_DROPPED.name,
    cutover.WRONG_MODEL_REQUESTS.name, cutover.TEXT_CLASS_REQUESTS.name,
})
"""Families this stack cannot have whatever the engine: vLLM's own, GPUs and a watched process (none here), an
Alertmanager's notifications and firing alerts, wrong-model and classified requests (test_dashboards_real.py's
stack has those)."""


def _feeds_ollama(target_expr: str, description: str) -> bool:
    """Whether a target can have data in front of Ollama: not a panel that says it has none there, nor one that
    reads what this stack cannot have (:data:`ELSEWHERE`, and the shadow copies of a canary upstream)."""
    if "Ollama" in description:
        return False
    names = ce.families_in(target_expr)
    return not names & ELSEWHERE and not any(name.startswith("inferwatch_shadow_") for name in names)


def test_the_boards_queries_answer_with_data_in_front_of_ollama(
    ollama_sidecar: servers.SidecarServer, tmp_path: Path,
) -> None:
    """Every target that can have data in front of Ollama returns series from Prometheus; the others' panels say
    on which engines they stay empty."""
    config: RulesConfig = from_mapping(RulesConfig, {"evaluation_interval_s": 1.0}, "rules")
    for rel, text in rule_outputs(config).items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    job, prometheus_job, port = DashboardConfig().sidecar_job, DashboardConfig().prometheus_job, servers.free_port()
    prometheus_yml = f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
rule_files: ["{tmp_path}/rules/*.yml"]
scrape_configs:
  - {{job_name: {job}, static_configs: [{{targets: ["{ollama_sidecar.base_url.split('//', 1)[1]}"]}}]}}
  - {{job_name: {prometheus_job}, static_configs: [{{targets: ["127.0.0.1:{port}"]}}]}}
"""
    prometheus = require(lambda: servers.start_prometheus(prometheus_yml, tmp_path / "prometheus", port=port))
    try:
        _every_target_answers(ollama_sidecar, prometheus, config)
    finally:
        prometheus.stop()


def _every_target_answers(
    ollama_sidecar: servers.SidecarServer, prometheus: servers.PrometheusServer, config: RulesConfig,
) -> None:
    targets = [(f"{board} / {panel['title']}", t) for board, b in dashboards(DashboardConfig(), config).items()
               for panel in b["panels"] for t in panel.get("targets", [])
               if _feeds_ollama(t["expr"], panel.get("description", ""))]
    start = time.time()
    pending = dict(targets)
    deadline = time.monotonic() + 40
    while pending and time.monotonic() < deadline:
        _post(f"{ollama_sidecar.base_url}/api/generate", {"model": MODEL, "prompt": "one two", "stream": True})
        _post(f"{ollama_sidecar.base_url}/api/chat", {"model": MODEL, "stream": False, "messages": []})
        for where, target in list(pending.items()):
            if _answers(prometheus, target["expr"], start):
                del pending[where]
        time.sleep(1)
    assert {where: t["expr"] for where, t in pending.items()} == {}


def _answers(prometheus: servers.PrometheusServer, expr: str, start: float) -> bool:
    for var, value in (("$__rate_interval", "5s"), ("$__range", f"{max(1, int(time.time() - start))}s"),
                       ("$__interval", "1s"), ("$model_name", ".*"), ("$instance", ".*"), ("$engine", ".*"),
                       ("$gpu", ".*")):
        expr = expr.replace(var, value)
    query = urllib.parse.urlencode({"query": expr, "start": f"{start:.3f}", "end": f"{time.time():.3f}", "step": "1"})
    answer = _get(f"{prometheus.base_url}/api/v1/query_range?{query}")
    return answer.get("status") == "success" and bool(answer["data"]["result"])
