"""``inferwatch prelaunch`` end to end on the real vLLM-CPU tiny model, behind a sidecar this module controls.

The kill -9 and cold-start lines restart what the checklist's URL points at. Killing the session's shared vLLM
would break other tests, so the target is a sidecar of this module's own (``inferwatch serve`` in front of
``vllm_server``), started by a shell script that is also the restart command: it SIGKILLs the sidecar of its
port if one runs and starts a new one. ``--kill-match`` names that sidecar's command line. The checklist runs
with small counts; the sidecar has no long lane, so that line must fail (exit 1); a second run with a restart
command that brings nothing back must fail the kill -9 line. A client that sends one request twice at once is
what the fast-retry count must show. The sidecar runs with the fake NVML (tests/harness/sidecar_fake_nvml.py, two
GPUs at the fake's default power and temperature), so the baseline line sees power and temperature as on a GPU
host; the session's plain sidecar (no NVML on this machine) is the host without a GPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import require
from tests.fakes.nvml import FakeGpu
from tests.harness import servers
from tests.harness.exposition import sample_sum

pytestmark = pytest.mark.real_server

FAST_RETRIES = "inferwatch_fast_retries_total"
FAKE_GPUS = 2
FAKE_GPU = FakeGpu(0, "GPU-0")
"""The fake NVML's GPU as configured (every GPU of the wrapper is one of these): the truth for power and temperature."""


@dataclass
class OwnSidecar:
    """The module's sidecar: its URL, the script that (re)starts it and the file holding its pid."""

    url: str
    port: int
    script: Path
    pid_file: Path

    def pid(self) -> int:
        return int(self.pid_file.read_text().strip())


def _ready(url: str, deadline_s: float = 60.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if servers.http_status(url + "/readyz") == 200:
            return
        time.sleep(0.2)
    raise servers.ServerUnavailable(f"{url} not ready after {deadline_s:g} s")


@pytest.fixture(scope="module")
def own_sidecar(vllm_server: servers.VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnSidecar]:
    """A sidecar in front of the shared vLLM, started (and restartable) by a script; stopped at the end."""
    work = tmp_path_factory.mktemp("prelaunch")
    port = servers.free_port()
    pid_file, script = work / "sidecar.pid", work / "restart.sh"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        # Restart this module's sidecar: SIGKILL the running one (if any), start a new one on the same port.
        if [ -f {pid_file} ]; then kill -9 "$(cat {pid_file})" 2>/dev/null; sleep 0.2; fi
        cd {servers.REPO}
        INFERWATCH_FAKE_GPUS={FAKE_GPUS} INFERWATCH_FAKE_XID_AFTER_S=-1 setsid {sys.executable} \\
            -m tests.harness.sidecar_fake_nvml serve --upstream {vllm_server.base_url} --listen 127.0.0.1:{port} \\
            --scrape-interval-s 1 --gpu-interval-s 1 >> {work}/sidecar.log 2>&1 < /dev/null &
        echo $! > {pid_file}
        """))
    subprocess.run(["sh", str(script)], check=True, timeout=30)
    sidecar = OwnSidecar(f"http://127.0.0.1:{port}", port, script, pid_file)
    try:
        require(lambda: _ready(sidecar.url))
        yield sidecar
    finally:
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(sidecar.pid(), signal.SIGKILL)


def _prelaunch(sidecar: OwnSidecar, vllm: servers.VllmServer, report: Path, *extra: str,
               on_line: Callable[[str], None] = lambda _line: None) -> tuple[int, dict[str, Any]]:
    argv = [sys.executable, "-m", "serving.cli", "prelaunch", "--url", sidecar.url, "--model", "tiny-llm",
            "--report", str(report), "--engine-metrics-url", vllm.base_url + "/metrics", "--health-path", "/readyz",
            "--kill-match", rf"sidecar_fake_nvml serve .* --listen 127\.0\.0\.1:{sidecar.port}\b", *extra]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        assert process.stderr is not None
        lines = []
        for line in process.stderr:  # progress lines, as they come
            lines.append(line)
            on_line(line)
        process.wait(timeout=300)
    stderr = "".join(lines)
    assert (report / "checklist.json").exists(), stderr[-3000:]
    return process.returncode, json.loads((report / "checklist.json").read_text()) | {"stderr": stderr}


def _counter(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def _metrics(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as reply:
        return str(reply.read().decode())


def _post(url: str, body: bytes) -> None:
    request = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json",
                                                                      "User-Agent": "prelaunch-test-client"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        reply.read()


@pytest.fixture(scope="module")
def checklist_run(own_sidecar: OwnSidecar, vllm_server: servers.VllmServer,
                  tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run of every line with small counts, a baseline saved, and a client sending one request twice at
    once while it runs (before the fast-retry line reads the count); vLLM's own /metrics read as the mix line
    starts and as it ends."""
    work = tmp_path_factory.mktemp("checklist")
    started_pid = own_sidecar.pid()
    body = json.dumps({"model": "tiny-llm", "prompt": f"retried at once {time.time()}", "max_tokens": 2}).encode()
    around_mix: list[tuple[float, str]] = []

    def retry_at_once(line: str) -> None:
        if "] mix" in line or ": A 512/8k/32k mix" in line:
            around_mix.append((time.monotonic(), _metrics(vllm_server.base_url)))
        if "] long lane" in line:  # after the warm-up read the count: this client's pair must show
            _post(own_sidecar.url, body)
            _post(own_sidecar.url, body)

    rc, doc = _prelaunch(
        own_sidecar, vllm_server, work / "report",
        "--restart-cmd", f"sh {own_sidecar.script}", "--restart-timeout", "60", "--expected-rpm", "6",
        "--baseline", str(work / "baseline.json"), "--mix-requests", "6", "--concurrency", "2",
        "--long-requests", "2", "--cold-starts", "1", "--cold-start-duration", "6", "--jitter-min-ms", "50",
        "--jitter-max-ms", "300", "--jitter-requests", "4", "--jitter-timeout", "30", "--prefix-requests", "6",
        "--prefix-tokens", "4000", "--max-tokens", "4", "--kill-load", "1",
        "--only", "mix,long_lane,long_context,jitter,shared_prefix,capacity,baseline,fast_retries,cold_starts,kill_9",
        on_line=retry_at_once)
    return {"rc": rc, "doc": doc, "items": {i["key"]: i for i in doc["items"]}, "started_pid": started_pid,
            "work": work, "around_mix": around_mix}


def test_each_line_has_a_verdict_and_the_report_reads_on_its_own(checklist_run: dict[str, Any]) -> None:
    """checklist.json has one item per line run, each pass, fail or manual; checklist.md names every line."""
    items = checklist_run["items"]
    assert set(items) == {"mix", "long_lane", "long_context", "jitter", "shared_prefix", "capacity", "baseline",
                          "fast_retries", "cold_starts", "kill_9"}
    assert all(i["verdict"] in ("pass", "fail", "manual") for i in items.values())
    text = (checklist_run["work"] / "report" / "checklist.md").read_text()
    assert all(i["line"] in text for i in items.values())
    assert checklist_run["doc"]["stderr"].count("prelaunch: [") == 2 * len(items)  # a line before and after each


def test_no_long_lane_fails_its_line_and_the_exit_code(checklist_run: dict[str, Any]) -> None:
    """The sidecar routes nothing to a long lane: that line fails with the sidecar's own counts, and exit is 1."""
    lane = checklist_run["items"]["long_lane"]
    assert lane["verdict"] == "fail"
    assert lane["evidence"]["requests_by_lane"].get("long", 0) == 0
    assert lane["evidence"]["requests_by_lane"]["default"] > 0
    assert checklist_run["rc"] == 1


def test_lengths_above_the_context_are_capped_with_a_warning(checklist_run: dict[str, Any]) -> None:
    """The 8k and 32k lengths and the long prefix do not fit the tiny model's 2048 tokens: capped, and said."""
    warnings = " ".join(checklist_run["doc"]["warnings"])
    assert "8192" in warnings
    assert "32768" in warnings
    assert "shared prefix of 4000 tokens capped" in warnings
    mix = checklist_run["items"]["mix"]
    assert mix["verdict"] == "pass", mix
    assert mix["evidence"]["requests"] == 6


def test_the_kill_line_killed_the_sidecar_and_saw_it_back(checklist_run: dict[str, Any],
                                                          own_sidecar: OwnSidecar) -> None:
    """kill -9 hit the sidecar's process of the time (gone now), the restart script brought a new one that answers."""
    kill = checklist_run["items"]["kill_9"]
    assert kill["verdict"] == "pass", kill
    killed = kill["evidence"]["pid"]
    assert killed != checklist_run["started_pid"]  # the cold-start line had restarted it already
    assert not psutil.pid_exists(killed)
    assert own_sidecar.pid() != killed
    assert servers.http_status(own_sidecar.url + "/readyz") == 200


def test_prefix_verdict_follows_vllms_counters(checklist_run: dict[str, Any]) -> None:
    """The shared-prefix verdict is vLLM's hit ratio against 85 %, with the distinct-prefix load beside it."""
    prefix = checklist_run["items"]["shared_prefix"]
    shared, distinct = prefix["evidence"]["shared"], prefix["evidence"]["distinct"]
    assert shared["requests"] == distinct["requests"] == 6
    assert shared["failed"] == distinct["failed"] == 0, prefix
    ratio = shared["prefix_cache_hit_ratio"]
    assert ratio is not None, prefix
    assert ratio == pytest.approx(shared["prefix_cache_hit_tokens"] / shared["prefix_cache_queried_tokens"])
    assert prefix["verdict"] == ("pass" if ratio >= 0.85 else "fail")
    assert ratio > (distinct["prefix_cache_hit_ratio"] or 0.0)


def test_the_baseline_holds_the_gpus_power_and_temperature_during_the_mix(checklist_run: dict[str, Any]) -> None:
    """The baseline line passes with the fake NVML's figures: the power its GPUs draw, summed, and its temperature;
    tokens per joule are vLLM's own count of the mix's generated tokens over the energy the fake's counter gains at
    that draw (its power reading, every second) during the mix."""
    item = checklist_run["items"]["baseline"]
    assert item["verdict"] == "pass", item
    saved = json.loads((checklist_run["work"] / "baseline.json").read_text())
    watts = FAKE_GPUS * FAKE_GPU.power_mw / 1000
    assert saved["gpus"] == FAKE_GPUS
    assert saved["power_watts"] == saved["power_watts_max"] == pytest.approx(watts)
    assert saved["temperature_celsius_max"] == FAKE_GPU.temperature
    (start, before), (end, after) = checklist_run["around_mix"]
    generated = sample_sum(after, "vllm:generation_tokens_total") - sample_sum(before, "vllm:generation_tokens_total")
    calibration = (sample_sum(after, "vllm:request_generation_tokens_bucket", le="1.0")  # max_tokens 1 each
                   - sample_sum(before, "vllm:request_generation_tokens_bucket", le="1.0"))
    assert calibration > 0
    mix_tokens = generated - calibration
    assert mix_tokens == saved["requests"] * 4  # --max-tokens 4, ignore_eos
    assert 0 < saved["wall_s"] <= end - start
    assert saved["tokens_per_joule"] == pytest.approx(mix_tokens / (watts * saved["wall_s"]))


def test_the_baseline_compares_and_a_regression_fails(checklist_run: dict[str, Any], own_sidecar: OwnSidecar,
                                                      vllm_server: servers.VllmServer) -> None:
    """The saved profile holds the mix's p99; compared with a baseline ten times faster, a hundred times as
    efficient (two short loads' throughputs differ by several times), with 20 % less power and a GPU 6 degrees
    cooler, the line fails on each."""
    saved = json.loads((checklist_run["work"] / "baseline.json").read_text())
    assert saved["e2e_p99_s"] == checklist_run["items"]["mix"]["evidence"]["e2e_p99_s"]
    better = {"e2e_p99_s": saved["e2e_p99_s"] / 10, "tokens_per_joule": saved["tokens_per_joule"] * 100,
              "power_watts": saved["power_watts"] / 1.2,
              "temperature_celsius_max": saved["temperature_celsius_max"] - 6}
    faster = checklist_run["work"] / "faster.json"
    faster.write_text(json.dumps(saved | better))
    rc, doc = _prelaunch(own_sidecar, vllm_server, checklist_run["work"] / "compare", "--compare", str(faster),
                         "--mix-requests", "4", "--max-tokens", "4", "--only", "mix,baseline")
    baseline = {i["key"]: i for i in doc["items"]}["baseline"]
    assert (rc, baseline["verdict"]) == (1, "fail")
    flagged = {sentence.split()[0] for sentence in baseline["evidence"]["regressions"]}
    assert set(better) <= flagged, baseline
    assert all(key in baseline["finding"] for key in better)
    assert "+20% against" in baseline["finding"]  # the power: 1.2 times the baseline's


def test_a_restart_that_brings_nothing_back_fails_the_kill_line(checklist_run: dict[str, Any],
                                                                own_sidecar: OwnSidecar,
                                                                vllm_server: servers.VllmServer) -> None:
    """With `true` as the restart command the killed sidecar stays down: the line fails, exit 1 (run last)."""
    rc, doc = _prelaunch(own_sidecar, vllm_server, checklist_run["work"] / "dead", "--restart-cmd", "true",
                         "--restart-timeout", "5", "--kill-load", "1", "--max-tokens", "4", "--only", "kill_9")
    kill = doc["items"][0]
    assert (rc, kill["verdict"]) == (1, "fail"), kill
    assert servers.http_status(own_sidecar.url + "/readyz") != 200
    subprocess.run(["sh", str(own_sidecar.script)], check=True, timeout=30)  # back for the tests after this one


def test_the_same_request_twice_at_once_is_a_fast_retry(sidecar: servers.SidecarServer) -> None:
    """Two identical requests from one client, the second sent as the first ends, count one fast retry; the same
    body a second later does not (the window is 500 ms)."""
    url = sidecar.base_url
    body = json.dumps({"model": "tiny-llm", "prompt": f"fast retry {time.time()}", "max_tokens": 2}).encode()
    before = _counter(url, FAST_RETRIES)
    _post(url, body)
    _post(url, body)
    assert _counter(url, FAST_RETRIES) - before == 1
    time.sleep(1.0)
    _post(url, body)
    assert _counter(url, FAST_RETRIES) - before == 1


def _by_bucket(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as reply:
        text = reply.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "inferwatch_requests_total":
                bucket = sample.labels.get("length_bucket", "")
                out[bucket] = out.get(bucket, 0.0) + sample.value
    return out


def test_a_real_request_is_classed_by_the_usage_vllm_reports(sidecar: servers.SidecarServer) -> None:
    """A real prompt's class comes from vLLM's usage, as the README's table edges say (the tiny model holds 2048
    tokens, so the 32,000-token class is checked at unit level: tests/unit/exporters/test_length_classes.py)."""
    url = sidecar.base_url
    body = json.dumps({"model": "tiny-llm", "prompt": " ".join(["the"] * 700), "max_tokens": 1}).encode()
    request = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    before = _by_bucket(url)
    with urllib.request.urlopen(request, timeout=60) as reply:
        usage = json.loads(reply.read())["usage"]["prompt_tokens"]
    after = _by_bucket(url)
    expected = "le512" if usage <= 512 else "512-4k" if usage <= 4096 else "4k-16k"
    assert usage > 512
    assert {k: after[k] - before.get(k, 0.0) for k in after if after[k] != before.get(k, 0.0)} == {expected: 1.0}


def test_a_client_retrying_at_once_fails_the_retry_line(checklist_run: dict[str, Any]) -> None:
    """The pair this module's client sent during the run is the one fast retry the line reports."""
    line = checklist_run["items"]["fast_retries"]
    assert (line["verdict"], line["evidence"]["fast_retries"]) == ("fail", 1.0)


def test_the_other_measured_lines_pass(checklist_run: dict[str, Any]) -> None:
    """Long context, jitter (its timeout above the delays), capacity, baseline and one cold start pass."""
    items = checklist_run["items"]
    for key in ("long_context", "jitter", "capacity", "baseline", "cold_starts"):
        assert items[key]["verdict"] == "pass", items[key]
    assert items["jitter"]["evidence"]["requests"] == 4
    assert len(items["cold_starts"]["evidence"]["restarts"]) == 1


def test_jitter_past_the_timeout_and_too_little_capacity_fail_and_missing_commands_are_manual(
        checklist_run: dict[str, Any], own_sidecar: OwnSidecar, vllm_server: servers.VllmServer,
        sidecar: servers.SidecarServer) -> None:
    """Delays of 1.5 s against a 0.5 s client timeout fail the jitter line with its timeouts counted; a million
    requests a minute are more than this deployment serves; without a restart command both restart lines are
    manual, saying what they need. The GPU series read from the session's sidecar, on a host without a GPU
    driver: the baseline is saved without power and temperature, and its line is manual, saying why."""
    no_gpu = sample_sum(_metrics(sidecar.base_url), "inferwatch_gpu_exporter_up") == 0
    saved = checklist_run["work"] / "no-gpu.json"
    rc, doc = _prelaunch(own_sidecar, vllm_server, checklist_run["work"] / "short", "--mix-requests", "2",
                         "--max-tokens", "4", "--jitter-min-ms", "1500", "--jitter-max-ms", "1500",
                         "--jitter-timeout", "0.5", "--jitter-requests", "2", "--expected-rpm", "1000000",
                         "--baseline", str(saved), "--metrics-url", sidecar.base_url + "/metrics",
                         "--only", "mix,jitter,capacity,baseline,cold_starts,kill_9")
    items = {i["key"]: i for i in doc["items"]}
    assert rc == 1
    assert items["jitter"]["verdict"] == "fail"
    assert items["jitter"]["evidence"]["timeouts"] == items["jitter"]["evidence"]["failed"] == 2
    assert items["capacity"]["verdict"] == "fail"
    assert items["capacity"]["evidence"]["replicas"] > 1
    assert (items["cold_starts"]["verdict"], items["kill_9"]["verdict"]) == ("manual", "manual")
    assert "--restart-cmd" in items["kill_9"]["finding"]
    profile = json.loads(saved.read_text())
    if no_gpu:  # a GPU host (real NVML at the sidecar) passes instead
        assert items["baseline"]["verdict"] == "manual", items["baseline"]
        assert "has no NVML (inferwatch_gpu_exporter_up 0" in items["baseline"]["finding"]
        assert (profile["power_watts"], profile["temperature_celsius_max"], profile["tokens_per_joule"]) == (
            None, None, None)
    else:
        assert items["baseline"]["verdict"] == "pass", items["baseline"]
