"""Child processes of the tests ended politely: SIGTERM, then SIGKILL if it lingers."""

from __future__ import annotations

import subprocess
from typing import Any


def process_stop(process: subprocess.Popen[Any], *, timeout: float = 10) -> None:
    """SIGTERM to `process`, and SIGKILL if it has not exited `timeout` seconds later; returns
    once it has exited (reaped: no zombie left behind)."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
