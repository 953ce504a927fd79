"""Waiting in a real-server test for something to become true, with a deadline and what it looked like."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest


def wait_for(check: Callable[[], bool], what: str, state: Callable[[], object], deadline_s: float = 60.0,
             every_s: float = 0.25) -> None:
    """Poll ``check`` every ``every_s`` until it is true; past ``deadline_s`` fail naming ``what`` and ``state()``."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(every_s)
    pytest.fail(f"timed out after {deadline_s:g} s waiting for {what}; state: {state()}")
