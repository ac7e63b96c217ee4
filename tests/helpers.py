"""Small helpers the tests share (fixtures live in conftest.py)."""

from __future__ import annotations

import time


def wait_for(cond, timeout: float = 5.0, step: float = 0.005) -> None:
    """Polls `cond()` until true; fails the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(step)
