#!/usr/bin/env python
"""Live-board fan-out benchmark: publish -> every websocket client, at N concurrent clients.

1. A fresh season of --players players is loaded (bench/loader.py: PostgreSQL COPY, both
   copies built, version 1 published).
2. uvicorn serves config.asgi:application with --workers 2 (uvicorn[standard]: httptools
   and the sans-I/O `websockets` protocol, as leaderboard.live.protocol configures it when
   the checkout has that module), on a free port, with LIVE_SOCKETS_PER_ADDRESS
   raised to --clients (every client comes from one address).
3. --client-procs client processes (this script in --client-worker mode, the `websockets`
   client library) open --clients sockets in all to /ws/v1/seasons/{season}/live, a
   --subscribed share of them with ?player_id= (random players of the season), and wait
   for each socket's snapshot.
4. --versions rounds: --changes random players change score through the real write path
   (bench/epoch.py's ChangeMaker and ingest), then leaderboard.views.epoch.season_epoch_run
   publishes the version (its on-commit hook does the one group_send). The pointer swap is
   timestamped (rankview.pointer_publish, wrapped in this process) and every client
   timestamps the arrival of that version's message (same machine, same clock). The next
   round starts when every client has it, or after --round-timeout.
5. All of it --runs times. With --baseline-root (another checkout, e.g. the commit before
   a change: `git worktree add /tmp/ws-before COMMIT`) the server is started from that
   checkout too, interleaved run by run with this one, against the same season, clients
   and epochs: the baseline of the same run.

Printed per run and version: clients that received it, and the time from the pointer
swap to the median, 99th percentile and last client. Then per server, medians over the
runs: p50/p99 over every (client, version), the median and the worst of each version's
p99, the median time to the last client, and the CPU the server's workers and the
client processes spent per version; and current/baseline ratios. Client-side
parsing competes for the same two cores as the server, Redis and PostgreSQL: on this
machine the figures are an upper bound of the server's own latency.

    SECRET_KEY=x .venv/bin/python bench/websockets.py                        # 2,000 clients, 10 versions
    SECRET_KEY=x .venv/bin/python bench/websockets.py --clients 10000 --versions 8 --runs 3 \
        --baseline-root /tmp/ws-before

The whole run is bounded by --max-seconds (default 600): past it every child is stopped
and what was measured so far is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

# This file is bench/websockets.py: with bench/ first on sys.path (as it is when the file
# is run), `import websockets` would import this script instead of the library.
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
import websockets.client  # noqa: E402, F401  (the library, imported before bench/ is on the path)

sys.path.insert(0, str(HERE))
import benchenv  # noqa: E402
import epoch as epoch_bench  # noqa: E402
import loader  # noqa: E402

# ------------------------------------------------------------------------------ clients


def client_worker(args: argparse.Namespace) -> int:
    """One client process: args.count sockets, arrival times per version on stdout at the end.

    Each socket is an asyncio.Protocol driving the `websockets` library's sans-I/O client
    protocol: a frame is parsed and timestamped in the callback that reads it, with no
    task or queue per socket and message (the library's asyncio client wakes two tasks per
    message, and on these two shared cores the clients' own cost is part of every figure).
    Per-process client CPU per version is reported with the results.
    """
    import asyncio

    import orjson
    from websockets.client import ClientProtocol
    from websockets.extensions.permessage_deflate import ClientPerMessageDeflateFactory
    from websockets.frames import Frame, Opcode
    from websockets.http11 import Response
    from websockets.typing import Origin
    from websockets.uri import parse_uri

    players = [p for p in args.worker_players.split(",") if p] if args.worker_players else []
    receipts: dict[int, list[float]] = {}
    stats = {"connected": 0, "failed": 0, "closed": 0, "gaps": 0, "snapshots": 0, "unavailable": 0}
    complete: set[int] = set()
    errors: list[str] = []
    stopping = False

    def emit(payload: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(payload) + "\n")
        sys.stdout.flush()

    class Client(asyncio.Protocol):
        def __init__(self, url: str, opened: asyncio.Future[None]):
            # As browsers do with --deflate: offer permessage-deflate (the server then
            # compresses every frame it sends this socket).
            extensions = [ClientPerMessageDeflateFactory(client_max_window_bits=True)] if args.deflate else None
            self.conn = ClientProtocol(parse_uri(url), origin=Origin(args.origin), max_size=2**22,
                                       extensions=extensions)
            self.opened = opened
            self.transport: asyncio.Transport | None = None
            self.held: int | None = None
            self.first = True

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
            self.transport = cast(asyncio.Transport, transport)
            self.conn.send_request(self.conn.connect())
            self.flush()

        def data_received(self, data: bytes) -> None:
            now = time.time()
            self.conn.receive_data(data)
            for event in self.conn.events_received():
                if isinstance(event, Response):
                    if self.conn.handshake_exc is not None and not self.opened.done():
                        self.opened.set_exception(self.conn.handshake_exc)
                elif isinstance(event, Frame) and event.opcode is Opcode.TEXT:
                    self.message(orjson.loads(event.data), now)
            self.flush()

        def message(self, message: dict[str, Any], now: float) -> None:
            kind = message.get("type")
            if self.first:
                self.first = False
                self.held = message.get("leaderboard_version")
                if kind == "unavailable":
                    stats["unavailable"] += 1
                if not self.opened.done():
                    self.opened.set_result(None)
                return
            if kind == "version":
                version = message["leaderboard_version"]
                arrivals = receipts.setdefault(version, [])
                arrivals.append(now)
                if message.get("previous_version") != self.held:
                    stats["gaps"] += 1  # what a real client answers with a snapshot request
                    self.conn.send_text(b'{"type": "snapshot"}')
                self.held = version
                if len(arrivals) == stats["connected"] and version not in complete:
                    complete.add(version)
                    emit({"event": "version", "version": version, "count": len(arrivals)})
            elif kind == "snapshot":
                stats["snapshots"] += 1
                self.held = message["leaderboard_version"]

        def flush(self) -> None:
            assert self.transport is not None
            for data in self.conn.data_to_send():
                if data:
                    self.transport.write(data)
                else:
                    self.transport.write_eof()

        def connection_lost(self, exc: Exception | None) -> None:
            if not self.opened.done():
                self.opened.set_exception(exc or ConnectionError("closed during the handshake"))
            elif not stopping:
                stats["closed"] += 1

    async def one(index: int, gate: asyncio.Semaphore) -> asyncio.Transport | None:
        query = f"?player_id={players[index]}" if index < len(players) else ""
        url = f"{args.url}{query}"
        uri = parse_uri(url)
        loop = asyncio.get_running_loop()
        try:
            async with gate:
                opened: asyncio.Future[None] = loop.create_future()
                transport, _ = await asyncio.wait_for(
                    loop.create_connection(lambda: Client(url, opened), uri.host, uri.port), 60)
                await asyncio.wait_for(opened, 60)
        except Exception as exc:  # a refused or timed-out connection is counted, not fatal
            stats["failed"] += 1
            if len(errors) < 5:
                errors.append(f"{type(exc).__name__}: {exc}")
            return None
        stats["connected"] += 1
        return transport

    async def main() -> None:
        nonlocal stopping
        gate = asyncio.Semaphore(args.connect_concurrency)
        transports = await asyncio.gather(*(one(i, gate) for i in range(args.count)))
        emit({"event": "ready", **stats, "errors": errors})
        cpu_started = time.process_time()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, sys.stdin.readline)  # "stop"
        stopping = True
        emit({"event": "result", **stats, "errors": errors, "cpu_seconds": time.process_time() - cpu_started,
              "receipts": {str(v): times for v, times in receipts.items()}})
        for transport in transports:
            if transport is not None:
                transport.abort()

    if args.client_loop == "uvloop":
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())
    return 0


@dataclass
class Worker:
    process: subprocess.Popen[str]
    count: int
    lines: queue.Queue[dict[str, Any]] = field(default_factory=queue.Queue)

    def start_reader(self) -> None:
        def read() -> None:
            assert self.process.stdout is not None
            for line in self.process.stdout:
                try:
                    self.lines.put(json.loads(line))
                except ValueError:
                    sys.stderr.write(line)

        threading.Thread(target=read, daemon=True).start()

    def expect(self, event: str, deadline: float, **match: Any) -> dict[str, Any] | None:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                line = self.lines.get(timeout=min(left, 0.5))
            except queue.Empty:
                if self.process.poll() is not None:
                    return None
                continue
            if line.get("event") == event and all(line.get(k) == v for k, v in match.items()):
                return line


# ------------------------------------------------------------------------------ server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def websocket_protocol(root: Path) -> str:
    """The checkout's own websocket protocol for uvicorn when it has one (permessage-deflate
    without server context takeover, so the live hub compresses a message once for every
    socket), else uvicorn's sans-I/O implementation, which checkouts before it ran on."""
    if (root / "leaderboard" / "live" / "protocol.py").is_file():
        return "leaderboard.live.protocol:LiveWebSocketProtocol"
    return "websockets-sansio"


def server_start(env: dict[str, str], port: int, workers: int, root: Path = ROOT,
                 kind: str = "uvicorn") -> subprocess.Popen[bytes]:
    options = (["--lifespan", "off", "--backlog", "4096", "--ws", websocket_protocol(root)] if kind == "uvicorn"
               else ["--backlog", "4096"])
    server = benchenv.AppServer(workers=workers, port=port, env=env, root=root, kind=kind, options=options)
    process = subprocess.Popen(server.command(), cwd=root, env={**os.environ, **env}, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{kind} exited during start-up")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return process
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{kind} did not start listening in 60 s")


def stop(process: subprocess.Popen[Any] | None) -> None:
    if process is None or process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def fd_limit_raise(wanted: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(wanted, soft)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# ------------------------------------------------------------------------------- rounds


@dataclass
class Round:
    version: int
    changed: int
    epoch_ms: float
    swap_at: float
    complete: bool
    latencies_ms: list[float] = field(default_factory=list)


@dataclass
class Measured:
    """One run of one server checkout: every round, and the sockets' counters."""

    label: str
    rounds: list[Round]
    totals: dict[str, int]
    connect_seconds: float
    # CPU of the server's worker processes and of the client processes over the versions,
    # per version (milliseconds).
    server_cpu_ms: float = float("nan")
    client_cpu_ms: float = float("nan")

    def everything(self) -> list[float]:
        return [ms for rnd in self.rounds for ms in rnd.latencies_ms]

    def version_p99s(self) -> list[float]:
        return [benchenv.percentile(rnd.latencies_ms, 99) for rnd in self.rounds]

    def lasts(self) -> list[float]:
        return [max(rnd.latencies_ms) if rnd.latencies_ms else float("nan") for rnd in self.rounds]


def measure(args: argparse.Namespace, *, label: str, root: Path, env: dict[str, str], season: Any,
            maker: epoch_bench.ChangeMaker, player_ids: list[str], deadline: float, kind: str = "uvicorn") -> Measured:
    """Start the server (`kind`) from `root`, open the clients, publish --versions versions,
    stop everything."""
    from django.conf import settings

    from leaderboard.recovery.rebuild import season_epoch_advance
    from leaderboard.redis_client import redis_get
    from leaderboard.views import rankview

    server: subprocess.Popen[bytes] | None = None
    workers: list[Worker] = []
    rounds: list[Round] = []
    final: list[dict[str, Any]] = []
    swaps: list[float] = []
    real_publish = rankview.pointer_publish

    def timed_publish(*a: Any, **k: Any) -> None:
        real_publish(*a, **k)
        swaps.append(time.time())

    rankview.pointer_publish = timed_publish  # type: ignore[assignment]
    connect_seconds = float("nan")
    try:
        port = free_port()
        server = server_start(env, port, args.workers, root, kind)
        url = f"ws://127.0.0.1:{port}/ws/v1/seasons/{season.slug}/live"
        print(f"# [{label}] {kind} --workers {args.workers} from {root} on port {port}; opening "
              f"{args.clients:,} sockets ({len(player_ids):,} with player_id) from {args.client_procs} client "
              f"processes ({args.client_loop}{', permessage-deflate' if args.deflate else ''})", flush=True)
        share = [args.clients // args.client_procs + (1 if i < args.clients % args.client_procs else 0)
                 for i in range(args.client_procs)]
        offset = 0
        for count in share:
            # The first sockets of each process carry a player id, in proportion.
            take = round(count * args.subscribed)
            mine = player_ids[offset : offset + take]
            offset += take
            process = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--client-worker", "--url", url,
                 "--origin", f"http://127.0.0.1:{port}", "--count", str(count),
                 "--worker-players", ",".join(mine), "--connect-concurrency", str(args.connect_concurrency),
                 "--client-loop", args.client_loop, *(["--deflate"] if args.deflate else [])],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True,
            )
            worker = Worker(process=process, count=count)
            worker.start_reader()
            workers.append(worker)
        connect_started = time.monotonic()
        connected = failed = 0
        for worker in workers:
            ready = worker.expect("ready", min(deadline, time.monotonic() + args.connect_timeout))
            if ready is None:
                raise SystemExit("a client process did not get all its sockets connected in time")
            connected += ready["connected"]
            failed += ready["failed"]
            if ready["errors"]:
                print(f"#   connect errors, e.g. {ready['errors'][0]}")
        connect_seconds = time.monotonic() - connect_started
        print(f"# [{label}] {connected:,} sockets connected and holding a snapshot ({failed} failed) in "
              f"{connect_seconds:.1f}s", flush=True)

        r = redis_get()
        server_pids = benchenv.children_of(server.pid)
        server_cpu_started = cpu_seconds(server_pids)
        grace = settings.COPY_GRACE_SECONDS + 0.05
        last_epoch_end = time.monotonic()
        for _ in range(args.versions):
            if time.monotonic() > deadline - args.round_timeout:
                print("# --max-seconds reached: stopping early")
                break
            events = maker.events(args.changes)
            epoch_bench.ingest(season, events)
            wait = last_epoch_end + grace - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            before = len(swaps)
            t0 = time.perf_counter()
            outcome = season_epoch_advance(season=season, r=r)
            epoch_ms = (time.perf_counter() - t0) * 1000
            last_epoch_end = time.monotonic()
            if outcome.status != "published" or len(swaps) != before + 1 or outcome.version is None:
                raise SystemExit(f"the epoch did not publish: {outcome}")
            round_deadline = min(deadline, time.monotonic() + args.round_timeout)
            complete = all(w.expect("version", round_deadline, version=outcome.version) is not None
                           for w in workers)
            rounds.append(Round(version=outcome.version, changed=outcome.changed_players, epoch_ms=epoch_ms,
                                swap_at=swaps[-1], complete=complete))
            if not complete:
                print(f"# version {outcome.version}: not every client had it after {args.round_timeout:.0f}s")
            time.sleep(args.pause)
        server_cpu = cpu_seconds(server_pids) - server_cpu_started

        for worker in workers:
            assert worker.process.stdin is not None
            worker.process.stdin.write("stop\n")
            worker.process.stdin.flush()
        for worker in workers:
            got = worker.expect("result", time.monotonic() + 60)
            if got is not None:
                final.append(got)
    finally:
        rankview.pointer_publish = real_publish  # type: ignore[assignment]
        for worker in workers:
            stop(worker.process)
        stop(server)

    by_version: dict[int, list[float]] = {}
    for got in final:
        for version, times in got["receipts"].items():
            by_version.setdefault(int(version), []).extend(times)
    for rnd in rounds:
        rnd.latencies_ms = [(t - rnd.swap_at) * 1000 for t in by_version.get(rnd.version, [])]
    totals = {k: sum(g.get(k, 0) for g in final) for k in ("connected", "failed", "closed", "gaps", "snapshots")}
    per_version = 1000 / max(len(rounds), 1)
    return Measured(label=label, rounds=rounds, totals=totals, connect_seconds=connect_seconds,
                    server_cpu_ms=server_cpu * per_version,
                    client_cpu_ms=sum(g.get("cpu_seconds", 0.0) for g in final) * per_version)


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of the processes so far (/proc/PID/stat), in seconds."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / ticks


def run_print(measured: Measured, run: int) -> None:
    rows = [(rnd.version, rnd.changed, rnd.epoch_ms, len(rnd.latencies_ms),
             benchenv.percentile(rnd.latencies_ms, 50), benchenv.percentile(rnd.latencies_ms, 99),
             max(rnd.latencies_ms) if rnd.latencies_ms else float("nan")) for rnd in measured.rounds]
    print()
    print(f"[{measured.label}] run {run}")
    print(benchenv.table(["version", "changed players", "epoch ms", "clients", "p50 ms", "p99 ms", "last ms"], rows))
    t = measured.totals
    print(f"# sockets: {t['connected']:,} connected, {t['failed']} failed, {t['closed']} closed by the server, "
          f"{t['gaps']} gaps seen; CPU per version: server {measured.server_cpu_ms:.0f} ms, clients "
          f"{measured.client_cpu_ms:.0f} ms; load average now {os.getloadavg()[0]:.2f}", flush=True)


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    deadline = started + args.max_seconds

    def overdue(signum: int, frame: Any) -> None:
        raise SystemExit(f"--max-seconds {args.max_seconds:.0f} passed long ago: stopping (children are stopped)")

    # A hard bound on top of the per-phase deadlines (loading a large season has none):
    # SystemExit unwinds through the `finally` that stops uvicorn and the clients.
    signal.signal(signal.SIGALRM, overdue)
    signal.alarm(int(args.max_seconds) + 120)
    limit = fd_limit_raise(args.clients + 1024)
    if limit < args.clients + 256:
        raise SystemExit(f"the open-file limit is {limit}: too low for {args.clients} sockets")
    env = benchenv.environment_prepare(args)
    # Every client of the benchmark comes from one address: the per-address socket limit
    # (LIVE_SOCKETS_PER_ADDRESS, 100 per process) would refuse all but the first few hundred.
    env["LIVE_SOCKETS_PER_ADDRESS"] = str(args.clients)
    print(benchenv.machine_line())
    print(f"# open-file limit {limit:,}")

    kinds = [k.strip() for k in args.servers.split(",") if k.strip()]
    if not kinds or set(kinds) - set(benchenv.SERVERS):
        raise SystemExit(f"--servers takes names of {','.join(benchenv.SERVERS)}")
    # (label, checkout, server): the first server's runs are "current" (and "baseline"),
    # each further server's "current@server".
    variants = [("current", ROOT, kinds[0]), *((f"current@{k}", ROOT, k) for k in kinds[1:])]
    if args.baseline_root:
        baseline = Path(args.baseline_root).resolve()
        if not (baseline / "config" / "asgi.py").is_file():
            raise SystemExit(f"--baseline-root {baseline} is not a checkout of this project")
        variants.insert(0, ("baseline", baseline, kinds[0]))

    result = loader.load_season(players=args.players, seed=args.seed, kind="ws", verbose=False)
    season = result.season
    print(f"# season {season.slug}: {args.players:,} players, version 1 published; "
          f"{loader.names_load(args.players):,} of them named", flush=True)
    maker = epoch_bench.ChangeMaker(result.scores, seed=args.seed)
    rng = random.Random(args.seed)
    subscribed = int(args.clients * args.subscribed)
    player_ids = [loader.player_id(rng.randrange(args.players)) for _ in range(subscribed)]

    measured: dict[str, list[Measured]] = {label: [] for label, _, _ in variants}
    try:
        for run_index in range(1, args.runs + 1):
            # Interleaved (baseline, current, baseline, ...): a change in the machine's load
            # falls on both alike.
            for label, root, kind in variants:
                if time.monotonic() > deadline - args.round_timeout:
                    break
                got = measure(args, label=label, root=root, env=env, season=season, maker=maker,
                              player_ids=player_ids, deadline=deadline, kind=kind)
                measured[label].append(got)
                run_print(got, run_index)
    finally:
        benchenv.season_cleanup(season, keep=args.keep, quiet=True)
    signal.alarm(0)

    print()
    print(f"{args.clients:,} clients ({subscribed:,} with player_id), {args.players:,} players, "
          f"{args.changes:,} changes per version, {args.versions} versions per run, {args.servers} --workers "
          f"{args.workers}, {args.client_procs} client processes ({args.client_loop} loop"
          f"{', permessage-deflate' if args.deflate else ''}); medians over {args.runs} run(s)")
    print()
    rows = []
    summary: dict[str, dict[str, float]] = {}
    for label, runs in measured.items():
        figures = {
            "p50": benchenv.median([benchenv.percentile(m.everything(), 50) for m in runs]),
            "p99": benchenv.median([benchenv.percentile(m.everything(), 99) for m in runs]),
            "version_p99": benchenv.median([benchenv.median(m.version_p99s()) for m in runs]),
            "worst_version_p99": benchenv.median([max(m.version_p99s(), default=float("nan")) for m in runs]),
            "last": benchenv.median([benchenv.median(m.lasts()) for m in runs]),
            "server_cpu": benchenv.median([m.server_cpu_ms for m in runs]),
            "client_cpu": benchenv.median([m.client_cpu_ms for m in runs]),
        }
        summary[label] = figures
        rows.append((label, len(runs), figures["p50"], figures["p99"], figures["version_p99"],
                     figures["worst_version_p99"], figures["last"], figures["server_cpu"], figures["client_cpu"],
                     sum(m.totals["failed"] + m.totals["closed"] for m in runs),
                     sum(m.totals["gaps"] for m in runs)))
    print(benchenv.table(["server", "runs", "p50 ms", "p99 ms", "a version's p99 ms (median)",
                          "worst version's p99 ms", "last client ms (median)", "server CPU ms per version",
                          "clients' CPU ms per version", "failed or closed", "gaps"], rows))
    if "baseline" in summary and summary["current"]["p99"] > 0:
        base, cur = summary["baseline"], summary["current"]
        print()
        print(f"current / baseline: p50 {cur['p50'] / base['p50']:.2f}x, p99 {cur['p99'] / base['p99']:.2f}x, "
              f"last client {cur['last'] / base['last']:.2f}x, server CPU per version "
              f"{cur['server_cpu'] / base['server_cpu']:.2f}x")
    print()
    print(f"# run took {time.monotonic() - started:.0f}s; load average now {os.getloadavg()[0]:.2f}")
    complete = all(rnd.complete for runs in measured.values() for m in runs for rnd in m.rounds)
    return 0 if measured["current"] and complete else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=2000)
    parser.add_argument("--subscribed", type=float, default=0.25, help="share of clients with ?player_id=")
    parser.add_argument("--players", type=int, default=100_000, help="players in the season")
    parser.add_argument("--versions", type=int, default=10)
    parser.add_argument("--changes", type=int, default=1000, help="players changed per version")
    parser.add_argument("--workers", type=int, default=2, help="server worker processes")
    parser.add_argument("--servers", default="uvicorn",
                        help=f"ASGI servers, comma-separated, of {','.join(benchenv.SERVERS)}: each further one's "
                             "runs are labelled current@server, interleaved with the first's")
    parser.add_argument("--client-procs", type=int, default=2)
    parser.add_argument("--connect-concurrency", type=int, default=100, help="handshakes in flight per client process")
    parser.add_argument("--client-loop", choices=["uvloop", "asyncio"], default="uvloop",
                        help="the client processes' event loop (uvloop: less of the shared cores taken by the "
                             "clients; asyncio: the clients of the figures before 2026-12-01)")
    parser.add_argument("--deflate", action="store_true",
                        help="clients offer permessage-deflate, as browsers do (frames compressed per socket)")
    parser.add_argument("--connect-timeout", type=float, default=180.0)
    parser.add_argument("--round-timeout", type=float, default=30.0)
    parser.add_argument("--pause", type=float, default=0.3, help="seconds between versions")
    parser.add_argument("--runs", type=int, default=1, help="runs per server checkout (medians over them)")
    parser.add_argument("--baseline-root", default="",
                        help="another checkout of this project (e.g. `git worktree add /tmp/ws-before COMMIT`): its "
                             "server is measured too, interleaved run by run with this one's, as the baseline")
    parser.add_argument("--max-seconds", type=float, default=600.0, help="bound on the whole run")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--client-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--origin", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--worker-players", default="", help=argparse.SUPPRESS)
    benchenv.add_common_args(parser)
    args = parser.parse_args(argv)
    if args.client_worker:
        fd_limit_raise(args.count + 256)
        return client_worker(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
