"""Failure helpers: a materializer in a child process that can be killed, the environment
such a child needs to share this test's database and Redis, and the recovery jobs it leaves."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import pkgutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings
from django.db import OperationalError, connection, connections

from leaderboard.models import RebuildJob
from leaderboard.redis_client import redis_get
from leaderboard.views import rankview
from seasons.models import Season
from tests.support.publication import keys_of

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def audit_action_failing(action: str) -> Iterator[None]:
    """Inside: the staff services' audit writes of `action` raise, as when the audit chain's
    head cannot be locked; every other audit row is written."""
    modules = staff_services_modules()
    real = modules[0].audit_log

    def failing(**kwargs: Any) -> Any:
        if kwargs.get("action") == action:
            raise OperationalError("the audit chain's head could not be locked")
        return real(**kwargs)

    for module in modules:
        module.audit_log = failing  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for module in modules:
            module.audit_log = real  # type: ignore[attr-defined]


def staff_services_modules() -> list[ModuleType]:
    """The staff services' modules (seasons/staff/<area>/services.py) that write audit rows:
    each imports audit_log by name, so a replacement goes into each."""
    import seasons.staff

    modules = []
    for area in pkgutil.iter_modules(seasons.staff.__path__):
        if area.ispkg and importlib.util.find_spec(f"seasons.staff.{area.name}.services") is not None:
            module = importlib.import_module(f"seasons.staff.{area.name}.services")
            if hasattr(module, "audit_log"):
                modules.append(module)
    return modules


def recovery_jobs(season: Season) -> list[RebuildJob]:
    return list(RebuildJob.objects.filter(season=season, kind=RebuildJob.Kind.RECOVERY).order_by("id"))


def child_database_url() -> str:
    """A URL of the test database this process uses, for a child process."""
    name = connection.settings_dict["NAME"]
    if connection.vendor == "sqlite":
        return f"sqlite:///{name}"
    parts = urlsplit(str(settings.DATABASE_URL))
    return str(urlunsplit(parts._replace(path=f"/{name}")))


# The test databases of the ledger aliases LEDGER_PARTITION_URLS names, for a child: an
# alias is named after its database (Season.ledger_databases stores it), so the child keeps
# the setting and CHILD_SETUP points each alias at its test database.
CHILD_LEDGER_NAMES = "TEST_CHILD_LEDGER_DATABASE_NAMES"

# The start of a child's script: Django set up on this test's databases.
CHILD_SETUP = f"""
import os
import django

django.setup()
from django.db import connections

for _entry in filter(None, os.environ.get("{CHILD_LEDGER_NAMES}", "").split(",")):
    _alias, _name = _entry.split("=")
    connections.settings[_alias]["NAME"] = _name
"""


def child_env(**extra: str) -> dict[str, str]:
    ledger = sorted(set(settings.LEDGER_PARTITION_ALIASES.values()))
    env = {
        **os.environ,
        CHILD_LEDGER_NAMES: ",".join(f"{alias}={connections[alias].settings_dict['NAME']}" for alias in ledger),
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": child_database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "REDIS_KEY_PREFIX": settings.REDIS_KEY_PREFIX,
        "VAR_DIR": str(settings.VAR_DIR),
        "SECRET_KEY": settings.SECRET_KEY,
        "DEBUG": "false",
        "DB_POOL_SIZE": "0",
        "PYTHONPATH": str(ROOT),
    }
    env.update(extra)
    return env


# One epoch in a child process, as a Celery worker would run it. The epoch's internals are
# not touched: only its writes are sent a few at a time (rankview.apply), so a big epoch
# takes long enough to be killed in the middle of them.
EPOCH_CHILD = CHILD_SETUP + """
import sys
from leaderboard.views import rankview
from leaderboard.recovery.rebuild import season_epoch_advance
from seasons.models import Season

rankview.apply.CHUNK_PLAYERS = int(sys.argv[2])
rankview.apply.PIECES_PER_SEND = 1
season = Season.objects.get(slug=sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
result = season_epoch_advance(season=season)
print(result.status, result.version, flush=True)
"""


def epoch_child(season: Season, *, apply_chunk: int, **env: str) -> subprocess.Popen[str]:
    """A child process that runs one epoch of `season` once a line arrives on its stdin."""
    child = subprocess.Popen(
        [sys.executable, "-c", EPOCH_CHILD, season.slug, str(apply_chunk)],
        cwd=ROOT, env=child_env(**env), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    if line.strip() != "ready":
        child.kill()
        raise AssertionError(f"epoch child did not start: {line!r} {child.stderr.read() if child.stderr else ''}")
    return child


def epoch_child_killed_inside_apply(season: Season, copy: str, rnd: Any, **env: str) -> bool:
    """Run one epoch in a child sending two players' writes a script, a script a round trip (a
    hundred round trips, each a moment to die in) and SIGKILL it once it writes `copy`'s
    side. True when the kill landed there: the child died and left the copy applying,
    some of its writes landed (False: the child finished first)."""
    r = redis_get()
    keys = keys_of(season)
    meta = rankview.copy_meta_load(r, keys, copy)
    assert meta is not None
    fences = [keys.fence(meta.index, group) for group in range(meta.groups)]
    field = rankview.gen_field(meta.side)

    def written() -> bool:
        # Each group write stamps the mutation's generation (the meta's, moved by one when
        # the mutation began) into its group's fence for the side.
        gen = int(r.hget(keys.copy_meta(copy), "gen") or 0)
        return gen > meta.gen and any(int(g or 0) == gen for g in (r.hget(fence, field) for fence in fences))

    child = epoch_child(season, apply_chunk=2, EPOCH_LEASE_SECONDS="2", COPY_GRACE_SECONDS="0.02",
                        READ_DEADLINE_SECONDS="0.01", **env)
    assert child.stdin is not None
    child.stdin.write("go\n")
    child.stdin.flush()
    deadline = time.monotonic() + 60
    killed_writing = False
    while time.monotonic() < deadline and child.poll() is None:
        if written():
            time.sleep(rnd.uniform(0, 0.01))  # somewhere inside the writes
            killed_writing = r.hget(keys.copy_meta(copy), "state") == b"applying"
            os.kill(child.pid, signal.SIGKILL)
            break
    child.wait(timeout=30)
    return (child.returncode == -signal.SIGKILL and killed_writing
            and r.hget(keys.copy_meta(copy), "state") == b"applying")


# A Celery worker (the solo pool: one task at a time) that runs an epoch's parts as
# production's do, but sends its writes a few players a script and pauses after each
# round trip, saying so on stdout ("wrote <epoch> <part>"): a part takes seconds, long
# enough to kill or stop the worker inside it.
PART_WORKER = CHILD_SETUP + """
import os
import sys
import time
from config.celery import app
from leaderboard.views import parts
from leaderboard.views.rankview import apply

apply.CHUNK_PLAYERS = int(sys.argv[1])
apply.PIECES_PER_SEND = 1
pause = float(sys.argv[2])
real_send = apply.groups_send
real_part_apply = parts._part_apply
running = {}

# The worker redirects print() to its log: the marks go to the pipe itself.
out = os.dup(1)

def slow_send(r, calls):
    replies = real_send(r, calls)
    os.write(out, f"wrote {running.get('epoch')} {running.get('part')}\\n".encode())
    time.sleep(pause)
    return replies

def part_apply(season, r, keys, spec, **kwargs):
    running.update(epoch=spec.epoch, part=spec.part)
    return real_part_apply(season, r, keys, spec, **kwargs)

apply.groups_send = slow_send
parts._part_apply = part_apply
print("ready", flush=True)
app.worker_main(["worker", "--pool", "solo", "--without-mingle", "--without-gossip", "--without-heartbeat",
                 "--loglevel", "WARNING"])
"""


class PartWorker:
    """A PART_WORKER process; `lines` collects its stdout, `errors` its stderr."""

    def __init__(self, proc: subprocess.Popen[str]):
        self.proc = proc
        self.lines: list[str] = []
        self.errors: list[str] = []
        self._readers = [threading.Thread(target=self._read, args=(stream, out), daemon=True)
                         for stream, out in ((proc.stdout, self.lines), (proc.stderr, self.errors))]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream: Any, out: list[str]) -> None:
        for line in stream:
            out.append(line.rstrip("\n"))

    def wait_for(self, predicate: Callable[[str], bool], *, timeout: float = 60.0, stream: str = "lines") -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = next((line for line in list(getattr(self, stream)) if predicate(line)), None)
            if found is not None:
                return found
            if self.proc.poll() is not None and stream == "lines":
                break
            time.sleep(0.01)
        raise AssertionError(f"the part worker never printed it; out {self.lines[-5:]}, err {self.errors[-5:]}")

    def signal(self, signum: int) -> None:
        os.kill(self.proc.pid, signum)


@contextlib.contextmanager
def part_worker(*, env: dict[str, str], chunk_players: int = 2, pause: float = 0.05) -> Iterator[PartWorker]:
    """A real Celery worker for an epoch's parts (PART_WORKER), ready to take tasks from this
    test's broker; killed at the end, whatever state it is in."""
    from config.celery import app

    proc = subprocess.Popen(
        [sys.executable, "-c", PART_WORKER, str(chunk_players), str(pause)], cwd=ROOT, env=child_env(**env),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    worker = PartWorker(proc)
    try:
        worker.wait_for(lambda line: line == "ready")
        deadline = time.monotonic() + 60
        while not app.control.ping(timeout=0.5):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the part worker did not start: {worker.errors[-10:]}")
        yield worker
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGCONT)
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


# A shadow build (rebuild_run of a queued job) in a child process, as a Celery worker runs
# it, once a line arrives on its stdin. Only its build is slowed: `batch` players a round
# trip and a pause after each, said on stdout ("sent <batches>"), so it takes seconds,
# long enough to kill a Redis node under it. It ends saying the job's status ("job ...").
REBUILD_CHILD = CHILD_SETUP + """
import os
import sys
import time
from leaderboard.recovery.rebuild import rebuild_run
from leaderboard.views import build

build.BUILD_BATCH = int(sys.argv[2])
build.BUILD_SHARD_FILL = 0
pause = float(sys.argv[3])
real_send = build._send_build_batch
sent = [0]

def slow_send(*args, **kwargs):
    real_send(*args, **kwargs)
    sent[0] += 1
    os.write(1, f"sent {sent[0]}\\n".encode())
    time.sleep(pause)

build._send_build_batch = slow_send
print("ready", flush=True)
sys.stdin.readline()
job = rebuild_run(job_id=int(sys.argv[1]))
print("job", job.status, job.error, flush=True)
"""


@contextlib.contextmanager
def rebuild_child(job_id: int, *, env: dict[str, str], batch: int = 10, pause: float = 0.01
                  ) -> Iterator[PartWorker]:
    """A REBUILD_CHILD of the job, ready (its stdout and stderr collected as a part worker's
    are); write a line to its stdin to start it. Killed at the end if still running."""
    proc = subprocess.Popen(
        [sys.executable, "-c", REBUILD_CHILD, str(job_id), str(batch), str(pause)], cwd=ROOT, env=child_env(**env),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    child = PartWorker(proc)
    try:
        child.wait_for(lambda line: line == "ready")
        yield child
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


@contextlib.contextmanager
def redis_answering_errors(error: str) -> Iterator[str]:
    """A server on a free local port that speaks RESP and answers every command with the
    error line `error` ("CLUSTERDOWN The cluster is down", "TRYAGAIN ...", "READONLY ...",
    "LOADING ..."): what a Redis node says during a failover, at the network edge, so the
    client raises the class it raises in production. Yields its redis:// URL."""
    import socket

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    stop = threading.Event()
    reply = f"-{error}\r\n".encode()

    def serve(conn: socket.socket) -> None:
        # Each command of the request is one RESP array: count its '*' headers and answer
        # each (a pipeline sends several at once).
        with conn:
            buffer = b""
            while not stop.is_set():
                try:
                    chunk = conn.recv(65536)
                except OSError:
                    return
                if not chunk:
                    return
                buffer += chunk
                commands, buffer = _resp_commands(buffer)
                if commands:
                    conn.sendall(reply * commands)

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()


def _resp_commands(buffer: bytes) -> tuple[int, bytes]:
    """(the whole RESP arrays at the start of `buffer`, what is left after them)."""
    count = 0
    while buffer.startswith(b"*"):
        end = buffer.find(b"\r\n")
        if end < 0:
            break
        items, at = int(buffer[1:end]), end + 2
        for _ in range(items):
            header_end = buffer.find(b"\r\n", at)
            if header_end < 0 or buffer[at:at + 1] != b"$":
                return count, buffer
            size = int(buffer[at + 1:header_end])
            at = header_end + 2 + size + 2
            if at > len(buffer):
                return count, buffer
        count, buffer = count + 1, buffer[at:]
    return count, buffer
