"""Run the ``inferwatch`` CLI with the fake NVML installed as ``pynvml`` (for real-server tests).

``python -m tests.harness.sidecar_fake_nvml serve --upstream ... --listen ...`` (cwd = the repo).
The fake (tests/fakes/nvml.py) is driven by wall-clock time here: a daemon thread advances it
every half second (power integrates into the energy counter), its event wait blocks for the
requested timeout like the real one instead of returning at once, and one XID error is queued on
GPU 0 after ``INFERWATCH_FAKE_XID_AFTER_S`` seconds (default 3; negative = none).
``INFERWATCH_FAKE_GPUS`` sets the number of GPUs (default 2). When the command line names
``--upstream-process-pid PID``, GPU 0 also lists that pid as a compute process (3 GiB), as if the
upstream ran on it, so the upstream's GPU memory is attributed.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

from tests.fakes.nvml import FakeNvml


class PacedFakeNvml(FakeNvml):
    """The fake, with an event wait that blocks up to its timeout when no event is queued."""

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:  # noqa: N802 (pynvml's name)
        """Wait for a queued XID like NVML does, then answer as the fake does."""
        deadline = time.monotonic() + timeout_ms / 1000
        while not self.events and time.monotonic() < deadline:
            time.sleep(0.05)
        return super().nvmlEventSetWait_v2(event_set, timeout_ms)


def _drive(fake: FakeNvml, stop: threading.Event) -> None:
    last = time.monotonic()
    while not stop.wait(0.5):
        now = time.monotonic()
        fake.advance(now - last)
        last = now


def install(gpus: int, xid_after_s: float, upstream_pid: int | None = None) -> PacedFakeNvml:
    """Put a paced fake into ``sys.modules['pynvml']`` and start its clock."""
    fake = PacedFakeNvml(count=gpus)
    if upstream_pid is not None:
        fake.gpus[0].processes = [*fake.gpus[0].processes, (upstream_pid, 3 * 1024**3)]
    sys.modules["pynvml"] = fake  # type: ignore[assignment]
    threading.Thread(target=_drive, args=(fake, threading.Event()), daemon=True, name="fake-nvml-clock").start()
    if xid_after_s >= 0:
        timer = threading.Timer(xid_after_s, fake.inject_xid, args=(0, 13))
        timer.daemon = True
        timer.start()
    return fake


def main(argv: list[str]) -> int:
    """Install the fake, then run the real CLI."""
    pid = None
    if "--upstream-process-pid" in argv[:-1]:
        pid = int(argv[argv.index("--upstream-process-pid") + 1])
    install(int(os.environ.get("INFERWATCH_FAKE_GPUS", "2")),
            float(os.environ.get("INFERWATCH_FAKE_XID_AFTER_S", "3")), pid)
    from serving.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
