"""Tests of exporters.process_health: memory, restarts and OOM counting."""

from __future__ import annotations

import os
from typing import ClassVar

import psutil
import pytest

from exporters.process_health import ProcessHealth, gpu_memory_of, is_oom_message


@pytest.mark.parametrize(
    ("body", "oom"),
    [
        pytest.param('{"error": "CUDA out of memory. Tried to allocate 2.00 GiB"}', True, id="CUDA OOM"),
        pytest.param("torch.OutOfMemoryError: ...", True, id="torch exception name"),
        pytest.param('{"object":"error","message":"OOM while allocating KV cache"}', True, id="OOM word"),
        pytest.param('{"error": "model not found"}', False, id="other error"),
        pytest.param("the room is zoomed", False, id="oom inside words"),
    ],
)
def test_oom_messages_are_recognised(body: str, oom: bool) -> None:
    """Out-of-memory error bodies are recognised and other errors are not."""
    assert is_oom_message(body) is oom


def test_oom_bodies_and_killed_exits_are_counted_by_source() -> None:
    """An OOM body counts under response_body and an exit status 137 under exit_status."""
    health = ProcessHealth(pid=os.getpid())
    assert health.note_upstream_error_body("CUDA out of memory")
    assert not health.note_upstream_error_body("bad request")
    assert health.note_exit_status(137)
    assert not health.note_exit_status(0)
    assert dict(health.poll().oom_events) == {"response_body": 1, "exit_status": 1}


def test_readiness_lost_and_regained_counts_one_restart() -> None:
    """Ready, not ready, ready again is one restart; starting not-ready is not."""
    health = ProcessHealth(pid=os.getpid())
    for ready in (False, True, True, False, False, True):
        health.note_readiness(ready)
    assert dict(health.poll().restarts)["readiness"] == 1


def test_own_process_is_found_with_its_memory() -> None:
    """Watching this test's own pid finds it with a positive resident size."""
    snap = ProcessHealth(pid=os.getpid()).poll()
    assert snap.found
    assert os.getpid() in snap.pids
    assert (snap.rss_bytes or 0) > 0


def test_a_missing_pid_is_reported_not_found() -> None:
    """A pid that does not exist gives found=False and no memory, without raising."""
    snap = ProcessHealth(pid=2**22 + 12345).poll()
    assert not snap.found
    assert snap.rss_bytes is None


def test_gpu_memory_of_sums_only_the_upstream_pids() -> None:
    """GPU memory sums the listed pids' usage and skips unknown (None) values."""
    assert gpu_memory_of([1, 2], [(1, 100), (2, None), (3, 50), (2, 20)]) == 120
    assert gpu_memory_of([9], [(1, 100)]) is None


class _FakeProc:
    def __init__(self, pid: int, cmdline: list[str], rss: int = 100) -> None:
        self.pid, self.info, self._rss = pid, {"pid": pid, "cmdline": cmdline}, rss

    def is_running(self) -> bool:
        return _FakePs.alive.get(self.pid, False)

    def ppid(self) -> int:
        return 1

    def children(self, recursive: bool = False) -> list[_FakeProc]:
        return []

    def memory_info(self) -> object:
        return type("M", (), {"rss": self._rss})()

    def wait(self, timeout: float | None = None) -> int:
        return _FakePs.exit_codes.get(self.pid, 0)


class _FakePs:
    """A psutil stand-in with a process table the test edits."""

    Error = psutil.Error
    NoSuchProcess = psutil.NoSuchProcess
    AccessDenied = psutil.AccessDenied
    TimeoutExpired = psutil.TimeoutExpired

    alive: ClassVar[dict[int, bool]] = {}
    exit_codes: ClassVar[dict[int, int]] = {}
    table: ClassVar[list[_FakeProc]] = []

    @classmethod
    def process_iter(cls, _attrs: list[str]) -> list[_FakeProc]:
        return [p for p in cls.table if cls.alive.get(p.pid)]


def test_pid_change_counts_a_restart_and_a_killed_child_an_oom() -> None:
    """When the matched server is replaced by a new pid it counts one restart; exit 137 counts one OOM."""
    _FakePs.table = [_FakeProc(100, ["python", "-m", "vllm.entrypoints.openai.api_server"], rss=5)]
    _FakePs.alive = {100: True}
    _FakePs.exit_codes = {100: 137}
    health = ProcessHealth(name_pattern=r"vllm\.entrypoints", ps=_FakePs)
    first = health.poll()
    assert first.pids == (100,)
    assert first.rss_bytes == 5
    _FakePs.alive = {100: False, 200: True}
    _FakePs.table.append(_FakeProc(200, ["python", "-m", "vllm.entrypoints.openai.api_server"]))
    second = health.poll()
    assert second.pids == (200,)
    assert dict(second.restarts)["pid_change"] == 1
    assert dict(second.oom_events)["exit_status"] == 1
