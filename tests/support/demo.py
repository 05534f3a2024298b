"""The demo of `make run` (manage.py rundemo) as a newcomer starts it: a fresh VAR_DIR and
none of the server variables (SQLite and the embedded Redis), stopped with what Ctrl-C
sends, as the tests of the first commands and the demo's walkthrough run it."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
BANNER_END = "Ctrl-C stops everything"


def fresh_env(var_dir: Path, **extra: str) -> dict[str, str]:
    """This process's environment without the server variables and with its own VAR_DIR."""
    env = {k: v for k, v in os.environ.items()
           if k not in {"SECRET_KEY", "DEBUG", "DATABASE_URL", "REDIS_URL", "REDIS_CLUSTER", "CELERY_BROKER_URL",
                        "CHANNEL_LAYER_URL", "DJANGO_SETTINGS_MODULE", "REDIS_EMBEDDED"}}
    return {**env, "VAR_DIR": str(var_dir), **extra}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RunningDemo:
    process: subprocess.Popen[bytes]
    base: str
    port: int
    log: Path
    # What it printed up to its banner's last line.
    banner: str

    @property
    def passwords(self) -> dict[str, str]:
        """The staff logins the banner prints: user -> password."""
        return dict(re.findall(r"^\s+(viewer|reviewer|approver2?)\s+(\S+)\s+role", self.banner, re.M))


@contextmanager
def demo_running(var_dir: Path, *args: str, stop_seconds: float = 20, **env: str) -> Iterator[RunningDemo]:
    """`manage.py rundemo --port P *args` until its banner is printed; at the end, what
    Ctrl-C sends to its process group (SIGKILL after `stop_seconds`)."""
    port = free_port()
    log = var_dir.parent / f"{var_dir.name}-run.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "rundemo", "--port", str(port), *args],
            cwd=ROOT, env=fresh_env(var_dir, **env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 90
        while BANNER_END not in log.read_text():
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield RunningDemo(process=process, base=f"http://127.0.0.1:{port}", port=port, log=log,
                          banner=log.read_text())
    finally:
        os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C in the terminal sends
        try:
            process.wait(timeout=stop_seconds)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
