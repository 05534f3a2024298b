#!/usr/bin/env python
"""Ingest benchmark: score events through the real HTTP stack vs. the service in-process.

Prints figures; it is not a test. Against PostgreSQL (DATABASE_URL, a dedicated database
named by --database, created if missing) and Redis (REDIS_URL):

1. migrates the benchmark database, creates an API client with scope scores:write;
2. pre-generates every request body (leaderboard.simulation: realistic matches, a few
   percent exact retries and corrections) as orjson bytes, so the client side is cheap;
3. starts the real ASGI server (uvicorn[standard]: httptools + uvloop) as a child process;
4. R times, interleaved (ABBA order), on a fresh season each time:
   - http:    C concurrent keep-alive clients POST /internal/v1/seasons/{s}/scores:apply;
   - service: the same bodies in-process: orjson.loads -> events_parse ->
              score_events_apply -> orjson.dumps(result), no HTTP, no DRF;
5. prints a table, medians, HTTP/service ratio and where the CPU went.

Players are sharded across clients (client k sends only its own players' events), so
per-player order is the order of generation, as from a real match service, and both
phases must produce exactly the same outcomes (checked).

    SECRET_KEY=x .venv/bin/python bench/ingest.py --workers 2 --clients 8 --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from leaderboard.simulation import MatchSimulator, SimConfig, player_ids  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchenv import AppServer, add_figures_arg, figures_record  # noqa: E402

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/test"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
TARGET_EVENTS_PER_S = 15_000
TARGET_RATIO = 0.6
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- setup


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--workers", type=int, default=2, help="uvicorn worker processes")
    parser.add_argument("--clients", type=int, default=8, help="concurrent HTTP clients (connections)")
    parser.add_argument("--batches", type=int, default=200, help="batches per phase and run")
    parser.add_argument("--batch-size", type=int, default=1000, help="events per batch (max 1000)")
    parser.add_argument("--runs", type=int, default=3, help="repetitions of both phases")
    parser.add_argument("--players", type=int, default=200_000, help="distinct players")
    parser.add_argument("--port", type=int, default=8765, help="port of the benchmark server")
    parser.add_argument("--seed", type=int, default=1, help="seed of the event generator")
    parser.add_argument("--duplicate-rate", type=float, default=0.03, help="share of exact retries")
    parser.add_argument("--correction-rate", type=float, default=0.01, help="share of corrections")
    parser.add_argument(
        "--database", default="bench_ingest", help="name of the dedicated PostgreSQL database to use"
    )
    parser.add_argument(
        "--reset-db", action="store_true", help="drop and recreate the benchmark database first"
    )
    parser.add_argument(
        "--phases", default="http,service", help="comma-separated subset of: http,service"
    )
    parser.add_argument(
        "--partitions", default="1",
        help="comma-separated ledger partition counts: each phase runs once per count in every run, "
             "each on a season of its own (e.g. 1,2,4,8)",
    )
    parser.add_argument(
        "--align-partitions", type=int, default=0,
        help="client k sends only players of ledger partition k %% N of N (0: players spread evenly, each batch "
             "touching every partition)",
    )
    parser.add_argument(
        "--service-partitions", default=None,
        help="partition counts the in-process service phase runs at (default: those of --partitions)",
    )
    parser.add_argument(
        "--season-modes", default="best",
        help="comma-separated season kinds (best, latest, sum, asc): each phase runs once per kind in every run, "
             "each on a season of its own, so the kinds' costs compare within a run (a sum season gets the same "
             "events as points: sum_bodies; asc is a best season of order asc, its scores 1,000,000 - score)",
    )
    parser.add_argument(
        "--server-env", action="append", default=[], metavar="KEY=VALUE",
        help="extra environment for the server only (e.g. DB_CONN_MAX_AGE=0); repeatable",
    )
    add_figures_arg(parser)
    args = parser.parse_args(argv)
    if not 1 <= args.batch_size <= 1000:
        parser.error("--batch-size must be 1..1000")
    if args.clients < 1 or args.workers < 1 or args.runs < 1 or args.batches < 1:
        parser.error("--clients, --workers, --runs and --batches must be >= 1")
    if args.players < args.clients:
        parser.error("--players must be >= --clients")
    args.phase_list = [p.strip() for p in args.phases.split(",") if p.strip()]
    args.partition_list = [int(p) for p in args.partitions.split(",") if p.strip()]
    args.mode_list = [m.strip() for m in args.season_modes.split(",") if m.strip()]
    if not args.mode_list or set(args.mode_list) - {"best", "latest", "sum", "asc"}:
        parser.error("--season-modes takes best, latest, sum and/or asc")
    args.service_partition_list = ([int(p) for p in args.service_partitions.split(",") if p.strip()]
                                   if args.service_partitions else args.partition_list)
    if not args.phase_list or set(args.phase_list) - {"http", "service"}:
        parser.error("--phases takes http and/or service")
    return args


def bench_database_url(base_url: str, name: str) -> tuple[str, str]:
    """(URL of the benchmark database, URL of the maintenance database to create it from)."""
    parts = urlsplit(base_url)
    if parts.scheme not in ("postgres", "postgresql", "pgsql"):
        raise SystemExit(f"bench/ingest.py needs PostgreSQL; DATABASE_URL is {base_url!r}")
    bench = urlunsplit(parts._replace(path=f"/{name}"))
    maintenance_db = parts.path.lstrip("/") or "postgres"
    if maintenance_db == name:
        maintenance_db = "postgres"
    maintenance = urlunsplit(parts._replace(path=f"/{maintenance_db}"))
    return bench, maintenance


def database_prepare(maintenance_url: str, name: str, *, reset: bool) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(maintenance_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if exists and reset:
            print(f"dropping database {name}")
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
            exists = None
        if not exists:
            print(f"creating database {name}")
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def environment_prepare(args: argparse.Namespace) -> str:
    """Set the environment every process of the benchmark shares; return the DB URL."""
    base = os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL
    bench_url, maintenance_url = bench_database_url(base, args.database)
    database_prepare(maintenance_url, args.database, reset=args.reset_db)
    os.environ["DATABASE_URL"] = bench_url
    os.environ.setdefault("REDIS_URL", DEFAULT_REDIS_URL)
    if not os.environ.get("REDIS_URL"):
        os.environ["REDIS_URL"] = DEFAULT_REDIS_URL
    os.environ.setdefault("SECRET_KEY", "bench-only-not-secret")
    if not os.environ.get("SECRET_KEY"):
        os.environ["SECRET_KEY"] = "bench-only-not-secret"
    # DEBUG records every query; a benchmark measures the production configuration.
    os.environ["DEBUG"] = "false"
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    return bench_url


def migrate() -> None:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, check=True
    )
    print(f"migrations applied ({time.perf_counter() - started:.1f}s)")


# --------------------------------------------------------------------------- server


# --------------------------------------------------------------------------- CPU accounting


def process_cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


class PostgresBackends:
    """CPU of the PostgreSQL backends serving the benchmark database, and of the whole server.

    The machine may be shared: the backends of this database (found in pg_stat_activity)
    are what the benchmark costs PostgreSQL; all postgres processes (plus exited
    backends, via the postmaster's cutime) include other users' work.
    """

    def __init__(self, url: str):
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)
        self.dbname = self.conn.info.dbname

    def pids(self) -> set[int]:
        rows = self.conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            [self.dbname],
        ).fetchall()
        return {row[0] for row in rows}

    def close(self) -> None:
        self.conn.close()


class LockWaits:
    """Time the benchmark database's backends spend waiting for advisory locks (the
    partition write locks): pg_stat_activity sampled every INTERVAL seconds on a
    connection of its own; each backend seen waiting counts for one interval."""

    INTERVAL = 0.005

    def __init__(self, url: str):
        import threading

        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)
        self.stop_event = threading.Event()
        self.waited = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        query = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                 "AND wait_event_type = 'Lock' AND wait_event = 'advisory'")
        while not self.stop_event.is_set():
            started = time.perf_counter()
            row = self.conn.execute(query).fetchone()
            self.waited += (row[0] if row else 0) * self.INTERVAL
            time.sleep(max(0.0, self.INTERVAL - (time.perf_counter() - started)))

    def __enter__(self) -> LockWaits:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        self.thread.join()
        self.conn.close()


def postgres_cpu_seconds() -> float:
    """All PostgreSQL CPU on this machine: live processes plus exited backends."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name, _, rest = stat.partition(" (")[2].rpartition(")")
        if not name.startswith("postgres"):
            continue
        fields = rest.split()
        total += (int(fields[11]) + int(fields[12])) / CLK_TCK
        if _comm(int(fields[1])) != "postgres":  # the postmaster: add its reaped children
            total += (int(fields[13]) + int(fields[14])) / CLK_TCK
    return total


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def machine_busy_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, all cores."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]
    total = sum(values[:8])
    return (total - idle) / CLK_TCK, total / CLK_TCK


@dataclass
class CpuMeter:
    server_pids: list[int]
    backends: PostgresBackends
    start: dict[str, float] = field(default_factory=dict)
    backend_start: dict[int, float] = field(default_factory=dict)

    def _sample(self) -> dict[str, float]:
        busy, total = machine_busy_seconds()
        workers = {f"pid{pid}": process_cpu_seconds(pid) for pid in self.server_pids}
        return {
            **workers,
            "client": time.process_time(),
            "server": sum(workers.values()),
            "postgres": postgres_cpu_seconds(),
            "busy": busy,
            "total": total,
        }

    def __enter__(self) -> CpuMeter:
        self.backend_start = {pid: process_cpu_seconds(pid) for pid in self.backends.pids()}
        self.start = self._sample()
        return self

    def stop(self, wall: float) -> dict[str, Any]:
        end = self._sample()
        delta = {key: end[key] - self.start[key] for key in end}
        # Backends that exited during the phase are lost (the server's pool keeps them).
        ours_pg = sum(
            process_cpu_seconds(pid) - self.backend_start.get(pid, 0.0)
            for pid in self.backends.pids() | set(self.backend_start)
            if Path(f"/proc/{pid}").exists()
        )
        cores = os.cpu_count() or 1
        busy_cores_pct = 100 * cores * delta["busy"] / delta["total"] if delta["total"] else 0.0
        ours = delta["client"] + delta["server"] + delta["postgres"]
        return {
            "workers_pct": [100 * delta[f"pid{pid}"] / wall for pid in self.server_pids[1:]],
            "other_pct": max(0.0, busy_cores_pct - 100 * ours / wall),
            "client_pct": 100 * delta["client"] / wall,
            "server_pct": 100 * delta["server"] / wall,
            "postgres_pct": 100 * delta["postgres"] / wall,
            "our_pg_pct": 100 * ours_pg / wall,
            "machine_pct": 100 * delta["busy"] / delta["total"] if delta["total"] else 0.0,
            "cores": cores,
        }

    def __exit__(self, *exc: object) -> None:
        return None


# --------------------------------------------------------------------------- workload


def workload_generate(args: argparse.Namespace) -> list[list[bytes]]:
    """One list of request bodies per client; clients own disjoint sets of players.

    --align-partitions N: client k owns the players of ledger partition k % N (of N
    partitions), as a producer that groups its batches by partition would send them: each
    batch then takes one partition's lock, and with P partitions dividing N, one of P's."""
    from leaderboard.core.partitions import partition_of

    started = time.perf_counter()
    everyone = player_ids(args.players)
    config = SimConfig(duplicate_rate=args.duplicate_rate, correction_rate=args.correction_rate)
    base = datetime.now(UTC) - timedelta(hours=6)
    shards: list[list[bytes]] = []
    owned: list[list[str]] = [everyone[shard :: args.clients] for shard in range(args.clients)]
    if args.align_partitions:
        groups: list[list[str]] = [[] for _ in range(args.align_partitions)]
        for player in everyone:
            groups[partition_of(player, args.align_partitions)].append(player)
        owned = [groups[shard % args.align_partitions][shard // args.align_partitions::
                                                         -(-args.clients // args.align_partitions)]
                 for shard in range(args.clients)]
    for shard in range(args.clients):
        simulator = MatchSimulator(
            players=owned[shard],
            seed=args.seed * 10_007 + shard,
            config=config,
            event_prefix=f"c{shard}-",
        )
        count = args.batches // args.clients + (1 if shard < args.batches % args.clients else 0)
        bodies = []
        for index in range(count):
            when = base + timedelta(seconds=index)  # each match ends within 30 s before it
            events = simulator.batch(args.batch_size, completed_at=when)
            bodies.append(orjson.dumps({"events": events}))
        shards.append(bodies)
    total = sum(len(b) for b in shards)
    size = sum(len(body) for bodies in shards for body in bodies)
    print(
        f"generated {total} batches x {args.batch_size} events for {args.players} players "
        f"({size / total / 1024:.0f} KiB per body) in {time.perf_counter() - started:.1f}s"
    )
    return shards


def sum_bodies(shards: list[list[bytes]]) -> list[list[bytes]]:
    """The same workload for a sum season: each result's points are its best_score's last two
    digits, each correction amends the player's previous result (its points again, a
    version per amendment), so batches, players, duplicates and corrections keep their
    counts and order."""
    out: list[list[bytes]] = []
    for bodies in shards:
        last: dict[str, str] = {}
        amended: dict[str, int] = {}
        converted: list[bytes] = []
        for body in bodies:
            events = []
            for event in orjson.loads(body)["events"]:
                summed = {k: v for k, v in event.items() if k not in ("best_score", "score_version")}
                summed["points"] = event["best_score"] % 100
                if event.get("kind") == "correction":
                    target = last.get(event["player_id"], "none")
                    amended[target] = amended.get(target, 0) + 1
                    summed.update(corrects=target, score_version=amended[target])
                else:
                    last[event["player_id"]] = event["event_id"]
                events.append(summed)
            converted.append(orjson.dumps({"events": events}))
        out.append(converted)
    return out


def asc_bodies(shards: list[list[bytes]]) -> list[list[bytes]]:
    """The same workload for an asc season: every best_score s as 1,000,000 - s, so each
    result that raised a best lowers it, and the outcomes are the same."""
    return [[orjson.dumps({"events": [{**e, "best_score": 1_000_000 - e["best_score"]}
                                      for e in orjson.loads(body)["events"]]}) for body in bodies]
            for bodies in shards]


def interleaved(shards: list[list[bytes]]) -> list[bytes]:
    out: list[bytes] = []
    for index in range(max(len(s) for s in shards)):
        out.extend(s[index] for s in shards if index < len(s))
    return out


# --------------------------------------------------------------------------- calibration


def cpu_calibration() -> float:
    """ms for validating and planning one 1,000-event batch in pure Python (best of 15).

    A yardstick for the machine's speed right now: on a shared or throttled VM the same
    code can run several times slower from one hour to the next, and every rate printed
    here moves with it. About 15 ms on the idle 2-core development machine.
    """
    from leaderboard.core.events import events_parse
    from leaderboard.core.ledger import batch_plan

    simulator = MatchSimulator(players=player_ids(5000, prefix="k"), seed=7, event_prefix="k-")
    body = orjson.dumps({"events": simulator.batch(1000, completed_at=datetime.now(UTC))})
    best = float("inf")
    for _ in range(15):
        started = time.perf_counter()
        events = events_parse(orjson.loads(body))
        batch_plan(events=events, recorded={}, current={}, rejection=lambda e: None, pending_version=1)
        best = min(best, time.perf_counter() - started)
    return 1000 * best


# --------------------------------------------------------------------------- phases


@dataclass
class PhaseResult:
    run: int
    phase: str
    events: int
    seconds: float
    latencies: list[float]
    outcomes: Counter[str]
    errors: Counter[str]
    cpu: dict[str, Any]
    partitions: int = 1
    mode: str = "best"
    # Seconds batches spent waiting for the season's partition locks, summed over batches
    # (LockWaits: sampled from pg_stat_activity).
    lock_wait: float = 0.0
    batches: int = 0

    @property
    def lock_wait_ms_per_batch(self) -> float:
        return 1000 * self.lock_wait / self.batches if self.batches else 0.0

    @property
    def rate(self) -> float:
        return self.events / self.seconds

    def percentile(self, q: float) -> float:
        return percentile(self.latencies, q)

    def _ms_per_k(self, pct: float) -> float:
        return pct / 100 * self.seconds * 1000 / (self.events / 1000) if self.events else 0.0

    @property
    def python_ms_per_k(self) -> float:
        """CPU of the Python side that serves the events, per 1,000 events."""
        return self._ms_per_k(self.cpu["server_pct" if self.phase == "http" else "client_pct"])

    @property
    def pg_ms_per_k(self) -> float:
        return self._ms_per_k(self.cpu["our_pg_pct"])


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


async def http_post_all(
    *, url: str, token: str, slug: str, shards: list[list[bytes]]
) -> tuple[float, list[float], Counter[str], Counter[str], int]:
    import httpx

    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    path = f"/internal/v1/seasons/{slug}/scores:apply"
    latencies: list[float] = []
    outcomes: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    events = 0
    # One client (one keep-alive connection) per sender, like independent match-service
    # instances. Connections are opened one at a time before the clock starts: opened all
    # at once, one uvicorn worker tends to accept every one of them and the others idle.
    async with contextlib.AsyncExitStack() as stack:
        clients = []
        for _ in shards:
            client = await stack.enter_async_context(
                httpx.AsyncClient(
                    base_url=url, headers=headers, timeout=120.0,
                    limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
                )
            )
            await client.get("/healthz")
            await asyncio.sleep(0.02)
            clients.append(client)

        async def run_client(client: httpx.AsyncClient, bodies: list[bytes]) -> None:
            nonlocal events
            for body in bodies:
                started = time.perf_counter()
                try:
                    response = await client.post(path, content=body)
                except httpx.HTTPError as exc:
                    errors[type(exc).__name__] += 1
                    continue
                latencies.append(time.perf_counter() - started)
                if response.status_code != 200:
                    errors[f"HTTP {response.status_code}"] += 1
                    if errors[f"HTTP {response.status_code}"] == 1:
                        print(f"  HTTP {response.status_code}: {response.text[:300]}", file=sys.stderr)
                    continue
                results = orjson.loads(response.content)["results"]
                events += len(results)
                outcomes.update(r["status"] for r in results)

        started = time.perf_counter()
        await asyncio.gather(*(run_client(c, bodies) for c, bodies in zip(clients, shards, strict=True)))
        wall = time.perf_counter() - started
    return wall, latencies, outcomes, errors, events


def asyncio_run(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


@dataclass
class Bench:
    args: argparse.Namespace
    server: AppServer | None
    token: str
    client_obj: Any
    shards: list[list[bytes]]
    tag: str
    backends: PostgresBackends
    # The shards as a sum or asc season's events, made on first use (shards_of).
    converted: dict[str, list[list[bytes]]] = field(default_factory=dict)

    def season_new(self, run: int, phase: str, partitions: int, mode: str) -> Any:
        from audit.services import Actor
        from seasons.services import season_create

        now = datetime.now(UTC)
        return season_create(
            slug=f"bench-{self.tag}-r{run}-{phase}-p{partitions}-{mode}",
            name=f"bench {self.tag} run {run} {phase} {partitions} partitions, mode {mode}",
            starts_at=now - timedelta(days=1),
            cutoff=now + timedelta(days=30),
            actor=Actor(kind="system", id="", label="bench/ingest.py"),
            partitions=partitions,
            # "asc": a best season of order asc.
            mode="best" if mode == "asc" else mode,
            order="asc" if mode == "asc" else "desc",
        )

    def phase_http(self, run: int, partitions: int = 1, mode: str = "best") -> PhaseResult:
        assert self.server is not None
        season = self.season_new(run, "http", partitions, mode)
        with CpuMeter(self.server.pids(), self.backends) as meter, LockWaits(os.environ["DATABASE_URL"]) as waits:
            wall, latencies, outcomes, errors, events = asyncio_run(
                http_post_all(url=self.server.url, token=self.token, slug=season.slug, shards=self.shards_of(mode))
            )
            cpu = meter.stop(wall)
        result = PhaseResult(run, "http", events, wall, latencies, outcomes, errors, cpu, partitions=partitions,
                             mode=mode, lock_wait=waits.waited, batches=len(latencies))
        self.ledger_check(season, result)
        return result

    def phase_service(self, run: int, partitions: int = 1, mode: str = "best") -> PhaseResult:
        from leaderboard.core.events import events_parse
        from leaderboard.ingest.services import score_events_apply

        season = self.season_new(run, "service", partitions, mode)
        bodies = interleaved(self.shards_of(mode))
        latencies: list[float] = []
        outcomes: Counter[str] = Counter()
        events = 0
        with CpuMeter(self.server.pids() if self.server else [], self.backends) as meter:
            started = time.perf_counter()
            for body in bodies:
                t0 = time.perf_counter()
                parsed = events_parse(orjson.loads(body), mode="best" if mode == "asc" else mode)
                result = score_events_apply(season=season, events=parsed, client=self.client_obj)
                orjson.dumps(result.as_dict())
                latencies.append(time.perf_counter() - t0)
                events += len(result.outcomes)
                outcomes.update(o.status for o in result.outcomes)
            wall = time.perf_counter() - started
            cpu = meter.stop(wall)
        phase = PhaseResult(run, "service", events, wall, latencies, outcomes, Counter(), cpu, partitions=partitions,
                            mode=mode,
                            batches=len(latencies))
        self.ledger_check(season, phase)
        return phase

    def shards_of(self, mode: str) -> list[list[bytes]]:
        """The workload's bodies in the shape of a season of `mode` (converted once)."""
        if mode not in ("sum", "asc"):
            return self.shards
        if mode not in self.converted:
            self.converted[mode] = sum_bodies(self.shards) if mode == "sum" else asc_bodies(self.shards)
        return self.converted[mode]

    def ledger_check(self, season: Any, result: PhaseResult) -> None:
        from leaderboard.models import ScoreEvent

        recorded = ScoreEvent.objects.filter(season_id=season.pk).count()
        expected = sum(n for status, n in result.outcomes.items() if status not in ("duplicate", "conflict"))
        if recorded != expected:
            print(f"  WARNING: {season.slug}: {recorded} ledger rows, expected {expected}", file=sys.stderr)


def warm_up(server: AppServer, token: str, args: argparse.Namespace, tag: str) -> None:
    """Import everything and open DB connections in every worker before measuring."""
    from audit.services import Actor
    from seasons.services import season_create

    now = datetime.now(UTC)
    season = season_create(
        slug=f"bench-{tag}-warmup", name="bench warm-up", starts_at=now - timedelta(days=1),
        cutoff=now + timedelta(days=30), actor=Actor(kind="system", id="", label="bench/ingest.py"),
    )
    simulator = MatchSimulator(players=player_ids(5000, prefix="w"), seed=0, event_prefix="w-")
    shards = [
        [orjson.dumps({"events": simulator.batch(200, completed_at=now - timedelta(minutes=1))})
         for _ in range(4)]
        for _ in range(max(args.clients, 2 * server.workers))
    ]
    _, _, _, errors, _ = asyncio_run(
        http_post_all(url=server.url, token=token, slug=season.slug, shards=shards)
    )
    if errors:
        raise SystemExit(f"warm-up requests failed: {dict(errors)}")


# --------------------------------------------------------------------------- report


def report(args: argparse.Namespace, results: list[PhaseResult], calibration: list[float]) -> None:
    header = (
        f"{'run':>3}  {'phase':<7}  {'events':>7}  {'seconds':>7}  {'events/s':>9}  "
        f"{'p50 ms':>7}  {'p99 ms':>7}  {'client%':>7}  {'server%':>7}  {'pg%':>5}  {'pg all%':>7}  {'other%':>6}  "
        f"{'machine%':>8}  {'py ms/1k':>8}  {'pg ms/1k':>8}  per-process server%"
    )
    print()
    print(
        "per run. latency: one batch request (http) or service call. CPU in % of one core:\n"
        "  client = this process (the HTTP clients, or the in-process service), server = uvicorn,\n"
        "  pg = backends of the benchmark database, pg all = every PostgreSQL process (other\n"
        "  users too), other = busy CPU that is neither ours nor PostgreSQL's: a shared machine.\n"
        "  machine = % of all cores busy. py/pg ms/1k = CPU ms per 1,000 events in Python\n"
        "  (server workers for http, this process for service) and in our PostgreSQL backends."
    )
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r.run:>3}  {r.phase + '/' + str(r.partitions):<7}  {r.events:>7}  {r.seconds:>7.2f}  {r.rate:>9,.0f}  "
            f"{1000 * r.percentile(50):>7.1f}  {1000 * r.percentile(99):>7.1f}  "
            f"{r.cpu['client_pct']:>7.0f}  {r.cpu['server_pct']:>7.0f}  "
            f"{r.cpu['our_pg_pct']:>5.0f}  {r.cpu['postgres_pct']:>7.0f}  {r.cpu['other_pct']:>6.0f}  "
            f"{r.cpu['machine_pct']:>8.0f}  "
            f"{r.python_ms_per_k:>8.1f}  {r.pg_ms_per_k:>8.1f}  "
            + "/".join(f"{x:.0f}" for x in r.cpu["workers_pct"] if x >= 0.5)
        )
    errors = Counter[str]()
    for r in results:
        errors.update(r.errors)
    if errors:
        print(f"\nERRORS: {dict(errors)}")

    by_phase = {p: [r for r in results if r.phase == p] for p in ("http", "service")}
    # Per season kind: a sum season's events are other events, with other outcomes.
    outcome_sets = {(p, r.mode): {tuple(sorted(x.outcomes.items())) for x in rs if x.mode == r.mode}
                    for p, rs in by_phase.items() for r in rs}
    first = next(r for r in results)
    mix = ", ".join(f"{k} {v / first.events:.1%}" for k, v in first.outcomes.most_common())
    print(f"\noutcome mix per run: {mix}")
    if by_phase["http"] and by_phase["service"]:
        same = all(len(outcome_sets.get(("http", mode), set()) | outcome_sets.get(("service", mode), set())) == 1
                   for mode in args.mode_list)
        print(f"http and service outcomes identical in every run: {'yes' if same else 'NO'}")

    print()
    print(f"summary: {args.runs} run(s), {args.batches} batches x {args.batch_size} events per phase, "
          f"{args.players} players, uvicorn --workers {args.workers}, {args.clients} clients")
    http_rate = service_rate = None
    if by_phase["http"]:
        rs = by_phase["http"]
        http_rate = statistics.median(r.rate for r in rs)
        all_lat = [x for r in rs for x in r.latencies]
        print(
            f"  http     median {http_rate:>9,.0f} events/s   "
            f"requests p50 {1000 * percentile(all_lat, 50):.1f} ms  p99 {1000 * percentile(all_lat, 99):.1f} ms "
            f"(all runs, {len(all_lat)} requests)   "
            f"client CPU median {statistics.median(r.cpu['client_pct'] for r in rs):.0f}% of a core"
        )
    if by_phase["service"]:
        rs = by_phase["service"]
        service_rate = statistics.median(r.rate for r in rs)
        all_lat = [x for r in rs for x in r.latencies]
        print(
            f"  service  median {service_rate:>9,.0f} events/s   "
            f"batches  p50 {1000 * percentile(all_lat, 50):.1f} ms  p99 {1000 * percentile(all_lat, 99):.1f} ms"
        )
    if http_rate is not None:
        ok = http_rate >= TARGET_EVENTS_PER_S
        print(f"  target http >= {TARGET_EVENTS_PER_S:,} events/s: {'PASS' if ok else 'FAIL'}")
    if calibration:
        print(
            f"  CPU yardstick (parse + plan one batch, pure Python): {min(calibration):.1f} ms best, "
            f"{max(calibration):.1f} ms worst of before/after; ~15 ms when the machine is idle"
        )
    other = statistics.median(r.cpu["other_pct"] for r in results)
    if other > 25:
        print(
            f"  WARNING: other processes kept {other:.0f}% of a core busy (median) during the "
            "phases: this machine is shared right now, the rates above are not representative "
            "(the CPU ms per 1,000 events are less affected)."
        )
    if http_rate is not None and service_rate:
        ratio = http_rate / service_rate
        ok = ratio >= TARGET_RATIO
        print(f"  ratio http/service = {ratio:.2f} (target >= {TARGET_RATIO}): {'PASS' if ok else 'FAIL'}")
    partitions_report(results)
    modes_report(results)


def modes_report(results: list[PhaseResult]) -> None:
    """Per phase, each season mode against `best` in the same run and partition count:
    events/s, the CPU per 1,000 events on each side, and the share of events that changed
    a score (a `latest` season takes a lower newer result, so more of them do)."""
    modes = sorted({r.mode for r in results})
    if len(modes) < 2:
        return
    print("\nby season mode (medians over runs; x best: events/s over the same run's best season, same phase and "
          "partitions)")
    print(f"  {'phase':<7} {'mode':<6} {'events/s':>9} {'x best':>7} {'applied':>8} {'py ms/1k':>8} {'pg ms/1k':>8}")
    best = {(r.run, r.phase, r.partitions): r.rate for r in results if r.mode == "best"}
    for phase in ("http", "service"):
        for mode in modes:
            rs = [r for r in results if r.phase == phase and r.mode == mode]
            if not rs:
                continue
            ratios = [r.rate / best[(r.run, r.phase, r.partitions)] for r in rs
                      if (r.run, r.phase, r.partitions) in best]
            applied = statistics.median(r.outcomes["applied"] / max(1, r.events) for r in rs)
            print(f"  {phase:<7} {mode:<6} {statistics.median(r.rate for r in rs):>9,.0f} "
                  f"{statistics.median(ratios) if ratios else float('nan'):>7.2f} {applied:>8.0%} "
                  f"{statistics.median(r.python_ms_per_k for r in rs):>8.1f} "
                  f"{statistics.median(r.pg_ms_per_k for r in rs):>8.1f}")


def partitions_report(results: list[PhaseResult]) -> None:
    """Medians per phase and partition count, each against the same run's 1-partition
    (or smallest) http phase: events/s, the time a batch waited for partition locks, and
    the CPU per 1,000 events on each side."""
    counts = sorted({r.partitions for r in results})
    if len(counts) < 2:
        return
    print("\nby ledger partitions (medians over runs; x base: events/s over the same run's "
          f"{counts[0]}-partition http phase)")
    print(f"  {'phase':<7} {'P':>3} {'events/s':>9} {'x base':>7} {'lock wait ms/batch':>18} {'batch p50 ms':>12} "
          f"{'py ms/1k':>8} {'pg ms/1k':>8}")
    base = {r.run: r.rate for r in results if r.phase == "http" and r.partitions == counts[0]}
    for phase in ("http", "service"):
        for p in counts:
            rs = [r for r in results if r.phase == phase and r.partitions == p]
            if not rs:
                continue
            ratios = [r.rate / base[r.run] for r in rs if r.run in base]
            print(f"  {phase:<7} {p:>3} {statistics.median(r.rate for r in rs):>9,.0f} "
                  f"{statistics.median(ratios) if ratios else float('nan'):>7.2f} "
                  f"{statistics.median(r.lock_wait_ms_per_batch for r in rs):>18.1f} "
                  f"{1000 * statistics.median(r.percentile(50) for r in rs):>12.1f} "
                  f"{statistics.median(r.python_ms_per_k for r in rs):>8.1f} "
                  f"{statistics.median(r.pg_ms_per_k for r in rs):>8.1f}")


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def terminate(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminate)

    environment_prepare(args)
    print(f"database {urlsplit(os.environ['DATABASE_URL'])._replace(netloc='…').geturl()}, "
          f"redis {os.environ['REDIS_URL']}, {os.cpu_count()} CPU cores")
    migrate()

    import django

    django.setup()
    import logging

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request
    from audit.services import Actor
    from leaderboard.api_clients import api_client_create

    tag = datetime.now(UTC).strftime("%m%d%H%M%S") + "-" + secrets.token_hex(2)
    client_obj, token = api_client_create(
        name=f"bench-{tag}", scopes=["scores:write"],
        actor=Actor(kind="system", id="", label="bench/ingest.py"),
    )
    shards = workload_generate(args)
    calibration = [cpu_calibration()]
    print(f"CPU yardstick: {calibration[0]:.1f} ms to parse and plan one batch (~15 ms when idle)")

    server_env = dict(item.split("=", 1) for item in args.server_env)
    server = AppServer(workers=args.workers, port=args.port, env=server_env) if "http" in args.phase_list else None
    results: list[PhaseResult] = []
    backends = PostgresBackends(os.environ["DATABASE_URL"])
    try:
        if server is not None:
            server.start()
            print(f"server up: uvicorn --workers {args.workers} (pids {server.pids()})"
                  + (f" env {server_env}" if server_env else ""))
            warm_up(server, token, args, tag)
        bench = Bench(
            args=args, server=server, token=token, client_obj=client_obj, shards=shards, tag=tag,
            backends=backends,
        )
        for run in range(1, args.runs + 1):
            order = list(args.phase_list)
            if run % 2 == 0:
                order.reverse()  # ABBA: drift (table growth, caches) hits both phases alike
            for phase in order:
                counts = args.partition_list if phase == "http" else args.service_partition_list
                modes = args.mode_list if run % 2 else list(reversed(args.mode_list))
                for partitions, mode in [(p, m) for p in (counts if run % 2 else list(reversed(counts)))
                                         for m in modes]:
                    result = (bench.phase_http(run, partitions, mode) if phase == "http"
                              else bench.phase_service(run, partitions, mode))
                    results.append(result)
                    print(f"run {run} {phase:<7} P={partitions:<2} {mode:<6} {result.rate:>9,.0f} events/s "
                          f"({result.events} events in {result.seconds:.2f}s, lock wait "
                          f"{result.lock_wait_ms_per_batch:.1f} ms/batch, load {os.getloadavg()[0]:.1f})", flush=True)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        if results:
            report(args, results, calibration)
        return 130
    finally:
        if server is not None:
            server.stop()
        backends.close()
    calibration.append(cpu_calibration())
    report(args, results, calibration)
    figures_write(args, results)
    return 0


def figures_write(args: argparse.Namespace, results: list[PhaseResult]) -> None:
    """A web worker's events/s from its CPU per event (on this shared machine the clients
    and PostgreSQL compete for the same cores: the rate / workers understates a worker
    that owns a core), PostgreSQL's CPU per 1,000 events, and the ledger's bytes per event
    on disk (heap, indexes and TOAST of every row in the benchmark's own database)."""
    from django.db import connection

    # The yardstick is a best season's: other kinds are compared with it (modes_report).
    http = [r for r in results if r.phase == "http" and r.mode == "best"]
    size = (f"{args.runs} run(s) x {args.batches} batches of {args.batch_size} events, {args.players:,} players, "
            f"uvicorn --workers {args.workers}, {args.clients} clients")
    if http:
        rate = statistics.median(r.rate for r in http)
        figures_record("ingest_events_per_s_per_web_worker", 1e6 / statistics.median(r.python_ms_per_k for r in http),
                       "events/s", path=args.figures,
                       note=f"{size}; 1e6 / server CPU ms per 1,000 events (measured {rate:,.0f} events/s in all)")
        figures_record("ingest_postgres_cpu_ms_per_1k_events", statistics.median(r.pg_ms_per_k for r in http), "ms",
                       note=f"{size}; CPU of the benchmark database's backends", path=args.figures)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_total_relation_size('leaderboard_scoreevent'), count(*) "
                       "FROM leaderboard_scoreevent")
        total_bytes, rows = cursor.fetchone()
    if rows:
        figures_record("ledger_bytes_per_event", total_bytes / rows, "bytes", path=args.figures,
                       note=f"{rows:,} ledger rows in database {args.database}: table, indexes and TOAST / rows")


if __name__ == "__main__":
    sys.exit(main())
