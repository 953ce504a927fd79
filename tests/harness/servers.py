"""The test harness's view of the server launchers (serving/tools/launcher.py, shared with `make demo`)."""

from serving.tools.launcher import (
    ALERTMANAGER,
    AMTOOL,
    PROMETHEUS,
    PROMTOOL,
    REPO,
    SECOND_TINY_MODEL_DIR,
    SECOND_TINY_MODEL_SEED,
    TINY_MODEL_DIR,
    VLLM_VENV,
    AlertmanagerServer,
    ManagedProcess,
    PrometheusServer,
    ServerUnavailable,
    SidecarServer,
    VllmServer,
    build_tiny_model,
    free_port,
    http_status,
    install_engine_stats_plugin,
    require_binary,
    start_alertmanager,
    start_prometheus,
    start_sidecar,
    start_vllm,
    vllm_python,
)

__all__ = [
    "ALERTMANAGER", "AMTOOL", "PROMETHEUS", "PROMTOOL", "REPO", "SECOND_TINY_MODEL_DIR", "SECOND_TINY_MODEL_SEED",
    "TINY_MODEL_DIR", "VLLM_VENV", "AlertmanagerServer",
    "ManagedProcess", "PrometheusServer", "ServerUnavailable", "SidecarServer", "VllmServer", "build_tiny_model",
    "free_port", "http_status", "install_engine_stats_plugin", "require_binary", "start_alertmanager",
    "start_prometheus", "start_sidecar",
    "start_vllm", "vllm_python",
]
