"""Shared set-up of the view benchmarks (loader, epoch, memory, freshness, reads).

Not a benchmark itself. `environment_prepare` must run before Django is imported: it
points DATABASE_URL at a dedicated PostgreSQL database (created if missing), REDIS_URL
at a separate Redis logical database (default /1, so test runs on /0 are not disturbed),
sets SECRET_KEY if unset and DEBUG=false, then sets Django up and migrates.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/bench"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_REDIS_DB = 1
# Per-operation costs the benchmarks measured (`make figures`), read by `manage.py capacity_plan`.
FIGURES_PATH = ROOT / "bench" / "figures.json"


def add_common_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("environment")
    group.add_argument(
        "--database-url", default=None,
        help=f"PostgreSQL URL (default: $DATABASE_URL or {DEFAULT_DATABASE_URL}); the database is created if missing",
    )
    group.add_argument(
        "--redis-url", default=None, help=f"Redis server (default: $REDIS_URL or {DEFAULT_REDIS_URL})",
    )
    group.add_argument(
        "--redis-db", type=int, default=DEFAULT_REDIS_DB,
        help="Redis logical database the benchmark uses (replaces the URL's), so tests on /0 are not disturbed",
    )
    group.add_argument("--keep", action="store_true",
                       help="keep the season's Redis keys and PostgreSQL rows afterwards (default: delete them)")
    group.add_argument("--no-migrate", action="store_true", help="skip `manage.py migrate`")
    add_figures_arg(parser)


def add_figures_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--figures", default=str(FIGURES_PATH), metavar="PATH",
        help="merge the headline medians into this JSON file (default bench/figures.json, read by "
             "`manage.py capacity_plan`); 'none' records nothing",
    )


def _with_db(url: str, db: int) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{db}"))


def environment_prepare(args: argparse.Namespace, *, quiet: bool = False) -> dict[str, str]:
    """Set the environment every process of a benchmark shares, set Django up, migrate.

    Returns the environment variables a child process (uvicorn, an epoch loop) needs.
    """
    db_url = args.database_url or os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL
    parts = urlsplit(db_url)
    if parts.scheme not in ("postgres", "postgresql", "pgsql"):
        raise SystemExit(f"these benchmarks need PostgreSQL; DATABASE_URL is {db_url!r}")
    database_create_if_missing(db_url, quiet=quiet)
    redis_url = _with_db(args.redis_url or os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL, args.redis_db)
    env = {
        "DATABASE_URL": db_url,
        "REDIS_URL": redis_url,
        "SECRET_KEY": os.environ.get("SECRET_KEY") or "bench-only-not-secret",
        # DEBUG records every query; a benchmark measures the production configuration.
        "DEBUG": "false",
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "LOG_LEVEL": os.environ.get("LOG_LEVEL") or "WARNING",
        # Every load generator runs from one address: a bucket no load empties, so each
        # read pays the read limit's work as in production without being refused. Set
        # READ_RATE_LIMIT=off to measure without it.
        "READ_RATE_LIMIT": os.environ.get("READ_RATE_LIMIT") or "100000000/s",
    }
    os.environ.update(env)
    import django

    django.setup()
    if not getattr(args, "no_migrate", False):
        started = time.perf_counter()
        subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, check=True,
                       env={**os.environ})
        if not quiet:
            print(f"# migrations checked ({time.perf_counter() - started:.1f}s)")
    if not quiet:
        print(f"# database {urlsplit(db_url).path.lstrip('/')} on {parts.hostname}:{parts.port or 5432}, "
              f"redis {redis_url}")
    return env


def database_create_if_missing(url: str, *, quiet: bool = False) -> None:
    import psycopg
    from psycopg import sql

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    maintenance = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(maintenance, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is None:
            if not quiet:
                print(f"# creating database {name}")
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


# ------------------------------------------------------------------------------ server


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def children_of(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
        return [int(p) for p in text.split()]
    except OSError:
        return []


# The ASGI servers a benchmark can run the service under (docs/operations.md, Deploying).
SERVERS = ("uvicorn", "granian")


class AppServer:
    """The real ASGI server as a child in its own process group, started from `root`
    (another checkout to compare with); stop() cleans it up. `kind`: uvicorn (httptools,
    uvloop) or granian (Rust HTTP, uvloop), both with `workers` worker processes."""

    def __init__(self, *, workers: int, port: int, env: dict[str, str], root: Path = ROOT, kind: str = "uvicorn",
                 options: Sequence[str] = ()):
        if kind not in SERVERS:
            raise SystemExit(f"unknown server {kind!r}: one of {', '.join(SERVERS)}")
        if kind == "granian" and not Path(sys.executable).with_name("granian").exists():
            raise SystemExit("granian is not installed in this environment: make install (the dev extra has it)")
        self.options = list(options)  # the server's own, after the common ones
        self.workers = workers
        self.port = port
        self.env = env
        self.root = root
        self.kind = kind
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        if self.kind == "granian":
            return [str(Path(sys.executable).with_name("granian")), "--interface", "asgi",
                    "--workers", str(self.workers), "--host", "127.0.0.1", "--port", str(self.port),
                    "--loop", "uvloop", "--log-level", "warning", "--no-access-log", *self.options,
                    "config.asgi:application"]
        return [sys.executable, "-m", "uvicorn", "config.asgi:application",
                "--workers", str(self.workers), "--host", "127.0.0.1", "--port", str(self.port),
                "--no-access-log", "--log-level", "warning", "--http", "httptools", "--loop", "uvloop", *self.options]

    def start(self) -> None:
        if not port_free(self.port):
            raise SystemExit(f"port {self.port} is in use; pass --port")
        self.proc = subprocess.Popen(self.command(), cwd=self.root, env={**os.environ, **self.env},
                                     start_new_session=True)
        self._wait_healthy()

    def _wait_healthy(self, timeout: float = 60.0) -> None:
        import httpx

        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the server exited with status {self.proc.returncode}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise SystemExit(f"the server did not answer /healthz within {timeout:.0f}s")

    def pids(self) -> list[int]:
        if self.proc is None:
            return []
        return [self.proc.pid, *children_of(self.proc.pid)]

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            processes_stop([proc])


def processes_stop(procs: Sequence[subprocess.Popen[Any]]) -> None:
    """SIGTERM each child still running, then SIGKILL the process group of any not gone
    within 15 s."""
    running = [proc for proc in procs if proc.poll() is None]
    for proc in running:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
    for proc in running:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


class CeleryWorkers:
    """`count` Celery worker processes (one task at a time each: the solo pool) on the
    benchmark's broker, in their own process groups; they run an epoch's parts
    (tasks.season_epoch_part). stop() ends them."""

    def __init__(self, *, count: int, env: dict[str, str], root: Path = ROOT):
        self.count = count
        self.env = env
        self.root = root
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, timeout: float = 60.0) -> None:
        from config.celery import app

        # Tasks left on the benchmark's broker by an earlier, interrupted run would run first.
        app.control.purge()
        for i in range(self.count):
            cmd = [sys.executable, "-m", "celery", "-A", "config", "--quiet", "worker", "--pool", "solo",
                   "-n", f"bench{i}-{os.getpid()}@%h", "--without-mingle", "--without-gossip",
                   "--loglevel", "WARNING"]
            self.procs.append(subprocess.Popen(cmd, cwd=self.root, env={**os.environ, **self.env},
                                               start_new_session=True, stdout=subprocess.DEVNULL))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                raise SystemExit("a Celery worker exited at start")
            if len(app.control.ping(timeout=1.0)) >= self.count:
                return
        raise SystemExit(f"{self.count} Celery workers did not answer within {timeout:.0f}s")

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def stop(self) -> None:
        procs, self.procs = self.procs, []
        processes_stop(procs)


# ----------------------------------------------------------------------------- seasons


def season_slug(kind: str) -> str:
    return f"bench-{kind}-{time.strftime('%m%d%H%M%S')}-{secrets.token_hex(3)}"


def season_new(kind: str, layout: Any = None, regions: Sequence[str] = (), mode: str = "best",
               order: str = "desc") -> Any:
    """A fresh OPEN season (started a day ago, cutoff in 30 days) with a unique slug."""
    from datetime import UTC, datetime, timedelta

    from audit.services import Actor
    from seasons.services import season_create

    now = datetime.now(UTC)
    return season_create(
        slug=season_slug(kind), name=f"benchmark ({kind})", starts_at=now - timedelta(days=1),
        cutoff=now + timedelta(days=30), actor=Actor(kind="system", id="", label="bench"), layout=layout,
        regions=regions, mode=mode, order=order,
    )


def season_redis_keys(r: Any, prefix: str, slug: str) -> list[bytes]:
    """Every Redis key of a season: control keys `{P}:{slug}:*` and data keys `{P}:{slug:*}:*`."""
    found: set[bytes] = set()
    for pattern in (f"{prefix}:{{{slug}}}:*", f"{prefix}:{{{slug}:*"):
        found.update(r.scan_iter(match=pattern, count=10_000))
    return sorted(found)


def season_cleanup(season: Any, *, keep: bool, extra_keys: Iterable[str] = (), quiet: bool = False) -> None:
    """Delete the season's Redis keys (UNLINK: freed in the background) and its rows.

    The ledger (ScoreEvent) is append-only by a database trigger, so its rows stay; the
    current scores, change stream and manifests of the season are deleted and vacuumed.
    """
    if keep:
        if not quiet:
            print(f"# --keep: season {season.slug} left in Redis and PostgreSQL")
        return
    from django.conf import settings
    from django.db import connection

    from leaderboard.redis_client import redis_get
    from leaderboard.views import rankview

    started = time.perf_counter()
    r = redis_get()
    doomed = season_redis_keys(r, settings.REDIS_KEY_PREFIX, season.slug) + [k.encode() for k in extra_keys]
    for start in range(0, len(doomed), 500):
        r.unlink(*doomed[start : start + 500])
    rankview.manifest_cache_clear()
    tables = ("leaderboard_manifest", "leaderboard_scorechange", "leaderboard_playerscore")
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM leaderboard_snapshotchunk WHERE snapshot_id IN "
                       "(SELECT id FROM leaderboard_seasonsnapshot WHERE season_id = %s)", [season.pk])
        cursor.execute("DELETE FROM leaderboard_seasonsnapshot WHERE season_id = %s", [season.pk])
        for table in tables:
            cursor.execute(f"DELETE FROM {table} WHERE season_id = %s", [season.pk])
        # Without this, a PostgreSQL whose autovacuum is off (as on the development machine)
        # keeps every deleted row of every run: after a few 10M-player runs the tables held
        # 111M dead rows and later runs measured the bloat (ingest ~15% slower, disks busy).
        cursor.execute(f"VACUUM {', '.join(tables)}")
    if not quiet:
        print(f"# cleaned up season {season.slug}: {len(doomed)} Redis keys unlinked, rows deleted "
              f"({time.perf_counter() - started:.1f}s)")


# ------------------------------------------------------------------------------ figures


def figures_record(name: str, value: float, unit: str, *, note: str, path: str | Path | None,
                   command: str | None = None) -> None:
    """Merge one measured median into the figures file (bench/figures.json): its value and
    unit, when, on what machine, by which command, and `note` (the size it was measured
    at). Other figures in the file are kept. `path` None or 'none' records nothing."""
    import json
    from datetime import UTC, datetime

    if path is None or str(path).lower() == "none":
        return
    if value != value or value in (float("inf"), float("-inf")):
        print(f"# figure {name} not recorded: no finite value")
        return
    target = Path(path)
    data: dict[str, Any] = json.loads(target.read_text()) if target.exists() else {}
    figures = data.setdefault("figures", {})
    script = Path(sys.argv[0])
    figures[name] = {
        "value": round(float(value), 3),
        "unit": unit,
        "note": note,
        "measured_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command or " ".join([f"bench/{script.name}", *sys.argv[1:]]),
        "machine": machine_line().removeprefix("# machine: "),
    }
    data["figures"] = dict(sorted(figures.items()))
    data.setdefault("about", "Per-operation costs measured by the benchmarks (medians); regenerate with "
                             "`make figures` (docs/benchmarks.md). Read by `manage.py capacity_plan`.")
    # Written aside and renamed: a reader never sees half a file.
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(target)
    print(f"# figure {name} = {value:,.3f} {unit} recorded in {target}")


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of unsorted values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table (right-aligned numbers)."""
    cells = [[str(h) for h in headers]] + [[_fmt(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.rjust(w) for c, w in zip(cells[0], widths, strict=True)) + " |",
             "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"]
    for row in cells[1:]:
        lines.append("| " + " | ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) + " |")
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def parse_counts(text: str) -> list[int]:
    """'100k,1M,10M' -> [100000, 1000000, 10000000]."""
    out = []
    for item in text.split(","):
        item = item.strip().lower().replace("_", "")
        if not item:
            continue
        scale = 1
        if item.endswith("k"):
            scale, item = 1_000, item[:-1]
        elif item.endswith("m"):
            scale, item = 1_000_000, item[:-1]
        out.append(int(float(item) * scale))
    return out


def human(n: int) -> str:
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1_000 and n % 1_000 == 0:
        return f"{n // 1_000}k"
    return str(n)


def machine_line() -> str:
    import platform

    try:
        with open("/proc/meminfo") as f:
            total_kb = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
    except (OSError, StopIteration, ValueError):
        total_kb = 0
    return (f"# machine: {os.cpu_count()} cores, {total_kb / 2**20:.1f} GiB, Python {platform.python_version()}, "
            f"load average {os.getloadavg()[0]:.2f}")
