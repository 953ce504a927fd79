"""Stopping the log pipeline's worker threads (the archive writer, the OTLP sender) the same way."""

from __future__ import annotations

import contextlib
import queue
import threading
from typing import Any


def stop_worker(work: queue.Queue[Any], thread: threading.Thread, stop: object, timeout_s: float) -> bool:
    """Queue ``stop`` behind what is waiting and wait for ``thread`` to finish it all, within ``timeout_s``.

    Returns False when the thread is still running then (the caller counts what was left queued).
    """
    with contextlib.suppress(queue.Full):
        work.put(stop, timeout=timeout_s)
    thread.join(timeout_s)
    return not thread.is_alive()
