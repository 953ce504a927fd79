"""Health of the upstream vLLM process: resident and GPU memory, restarts, out-of-memory events.

:class:`ProcessHealth` finds the API server by pid or by a command-line pattern, sums the memory of
it and its descendants (engine core, workers) with psutil, and counts restarts (the watched pid is
replaced, or readiness is lost and regained) and out-of-memory events (an upstream error body that
reports one, or a watched child that ended with SIGKILL / status 137). ``note_*`` methods are
cheap and thread-safe, for the proxy and the readiness probe; :meth:`poll` is meant for a thread.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psutil

OOM_PATTERN = re.compile(
    r"out of memory|outofmemoryerror|\bOOM\b|cuda error: out of memory|cannot allocate memory"
    r"|failed to allocate|insufficient memory|memoryerror",
    re.IGNORECASE,
)
"""What an upstream error body says when the server ran out of (GPU or host) memory."""

KILLED_STATUSES = frozenset({137, -9})
"""Exit statuses of a process killed by SIGKILL (the kernel OOM killer's signal)."""


@dataclass(frozen=True, slots=True)
class ProcessSnapshot:
    """The upstream's processes at one poll, and the counters so far."""

    found: bool
    pids: tuple[int, ...] = ()
    rss_bytes: int | None = None
    restarts: tuple[tuple[str, int], ...] = (("pid_change", 0), ("readiness", 0))
    oom_events: tuple[tuple[str, int], ...] = (("response_body", 0), ("exit_status", 0))


def is_oom_message(text: str) -> bool:
    """True when an error body reports an out-of-memory error."""
    return bool(OOM_PATTERN.search(text))


def gpu_memory_of(pids: Iterable[int], processes: Iterable[tuple[int, int | None]]) -> int | None:
    """Sum of GPU memory of the given pids among ``(pid, bytes)`` process entries; None when none is listed."""
    wanted = set(pids)
    found = [used for pid, used in processes if pid in wanted and used is not None]
    return sum(found) if found else None


class ProcessHealth:
    """Watches the upstream process; see the module docstring."""

    def __init__(self, pid: int = 0, name_pattern: str = "", ps: Any = psutil) -> None:
        self._ps = ps
        self._pid = pid
        self._pattern = re.compile(name_pattern) if name_pattern else None
        self._lock = threading.Lock()
        self._root: Any = None
        self._last_pid: int | None = None
        self._restarts = {"pid_change": 0, "readiness": 0}
        self._oom = {"response_body": 0, "exit_status": 0}
        self._ready: bool | None = None
        self._was_ready = False

    @property
    def enabled(self) -> bool:
        """Whether a pid or a pattern was configured."""
        return bool(self._pid or self._pattern)

    # ---- notes from the request path -----------------------------------------------------------
    def note_upstream_error_body(self, text: str) -> bool:
        """Count an OOM event when an upstream error body reports one; returns whether it did."""
        if not text or not is_oom_message(text[:65536]):
            return False
        with self._lock:
            self._oom["response_body"] += 1
        return True

    def note_readiness(self, ready: bool) -> None:
        """Record a readiness probe; readiness lost and regained counts one restart."""
        with self._lock:
            if ready and self._ready is False and self._was_ready:
                self._restarts["readiness"] += 1
            self._was_ready = self._was_ready or ready
            self._ready = ready

    def note_exit_status(self, status: int | None) -> bool:
        """Count an OOM event when a watched process ended killed (137 / -9); returns whether it did."""
        if status not in KILLED_STATUSES:
            return False
        with self._lock:
            self._oom["exit_status"] += 1
        return True

    # ---- polling -------------------------------------------------------------------------------
    def _find_root(self) -> Any:
        ps = self._ps
        if self._pid:
            try:
                return ps.Process(self._pid)
            except (ps.NoSuchProcess, ps.AccessDenied):
                return None
        if self._pattern is None:
            return None
        if self._root is not None:
            try:
                if self._root.is_running():
                    return self._root
            except ps.Error:
                pass
        candidates = []
        for proc in ps.process_iter(["pid", "cmdline"]):
            cmdline = " ".join(proc.info.get("cmdline") or [])
            if cmdline and self._pattern.search(cmdline):
                candidates.append(proc)
        if not candidates:
            return None
        pids = {p.pid for p in candidates}
        roots = [p for p in candidates if _parent_pid(p, ps) not in pids]
        return min(roots or candidates, key=lambda p: p.pid)

    def _root_ended(self) -> None:
        """The watched root is gone: read its exit status when it is our child."""
        ps = self._ps
        try:
            status = self._root.wait(timeout=0)
        except (ps.Error, ps.TimeoutExpired, ChildProcessError, OSError):
            return
        self.note_exit_status(status)

    def poll(self) -> ProcessSnapshot:
        """Find the upstream's processes and read their memory; never raises for a vanished process."""
        ps = self._ps
        root = self._find_root()
        if self._root is not None and (root is None or root.pid != self._root.pid):
            self._root_ended()
        with self._lock:
            if root is not None and self._last_pid is not None and root.pid != self._last_pid:
                self._restarts["pid_change"] += 1
            if root is not None:
                self._last_pid = root.pid
        self._root = root
        if root is None:
            return self._snapshot(False, (), None)
        procs = [root]
        with contextlib.suppress(ps.Error):
            procs += root.children(recursive=True)
        pids, rss = [], 0
        for proc in procs:
            try:
                rss += int(proc.memory_info().rss)
                pids.append(proc.pid)
            except ps.Error:
                continue
        return self._snapshot(bool(pids), tuple(pids), rss if pids else None)

    def counters(self) -> ProcessSnapshot:
        """The restart and OOM counters alone (no process lookup): for when no process is watched."""
        return self._snapshot(False, (), None)

    def _snapshot(self, found: bool, pids: tuple[int, ...], rss: int | None) -> ProcessSnapshot:
        with self._lock:
            return ProcessSnapshot(
                found, pids, rss, tuple(sorted(self._restarts.items())), tuple(sorted(self._oom.items()))
            )


def _parent_pid(proc: Any, ps: Any) -> int | None:
    try:
        return int(proc.ppid())
    except ps.Error:
        return None
