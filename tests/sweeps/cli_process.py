"""Helpers for tests that drive ``python -m sweeps.run`` in a subprocess."""

from __future__ import annotations

import subprocess
import time


def wait_for(predicate, proc: subprocess.Popen, timeout: float, what: str):
    """``predicate()``'s first truthy value, polled every 0.2 s; fails if the sweep's process exits first or
    ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc.poll() is not None:
            raise AssertionError(f"the sweep exited (rc {proc.returncode}) before {what}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")
