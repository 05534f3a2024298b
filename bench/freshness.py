#!/usr/bin/env python
"""Freshness benchmark: lag from a committed score change to the first published version holding it.

1. The loader (bench/loader.py) fills a fresh season (default 1M players), version 1.
2. An epoch process starts (this script, --role epoch-loop): a loop that calls
   leaderboard.views.epoch.season_epoch_run every EPOCH_SECONDS (default 1.0) on a
   fixed-rate schedule, like Celery beat's interval, running a late tick at once and
   skipping ticks it missed. (A loop rather than Celery beat + worker: epochs_dispatch
   would also run epochs for every other season left in the benchmark database.) Each
   call publishes, then catches the older copy up after its grace period
   (EPOCH_CATCH_UP, as configured in the environment; `catch-up ms` in the table).
3. W writer processes (--role writer) send `result` events through the real write path,
   leaderboard.ingest.services.score_events_apply, in batches of 1,000, paced together at
   --rate events/s; writer w owns the players with index % W == w, so each player's
   score_version only grows. Most events raise the player's score (a change), some do
   not (unchanged). After each batch returns (committed) the writer records the time.
4. After --warmup + --duration seconds the writers stop; epochs go on for --drain seconds.
   Each change row (leaderboard_scorechange: its (txid, id) and event id) is matched to
   its batch's commit time and to the first published version whose watermark covers
   it (leaderboard_manifest: watermark, published_at, recorded right after the pointer
   swap). lag = published_at - commit time, over the changes committed after the warm-up.

--workload matches sends the ingest benchmark's simulated matches (leaderboard.simulation)
to a season that starts empty instead. While the writers run, a thread VACUUMs the
current-scores table every --vacuum-seconds (autovacuum's stand-in: this machine's
PostgreSQL runs without it); PostgreSQL's buffer allocations and backend writes are
printed, since they set the writers' rate here.

--parts N runs the epoch loop with EPOCH_PARTS=N (docs/architecture.md, Parts) and starts
N - 1 Celery worker processes (--part-workers) to take the parts it sends; the season has
--partitions ledger partitions (default 8), which the parts divide.

Target (docs/rules.md, Publication): p99 < 5 s; this benchmark's goal: p99 < 2 s at 15,000 events/s.

    SECRET_KEY=x .venv/bin/python bench/freshness.py                      # 15k events/s, 30 s, 1M players
    SECRET_KEY=x .venv/bin/python bench/freshness.py --rate 20000 --duration 60 --players 10M
    SECRET_KEY=x .venv/bin/python bench/freshness.py --workload matches --players 200k --rate 18000
    SECRET_KEY=x .venv/bin/python bench/freshness.py --parts 2 --rate 9000      # 8 partitions, 2 parts
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchenv  # noqa: E402
import loader  # noqa: E402

BATCH = 1000
TARGET_P99_S = 2.0


# ------------------------------------------------------------------------ child roles


def role_epoch_loop(args: argparse.Namespace) -> int:
    from django.conf import settings

    from leaderboard.recovery.rebuild import season_epoch_advance
    from seasons.models import Season

    stop = False

    def on_term(signum: int, frame: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    season = Season.objects.get(pk=args.season_id)
    period = settings.EPOCH_SECONDS
    log = open(args.out, "w")  # noqa: SIM115 - closed below
    next_tick = time.monotonic()
    while not stop:
        now = time.monotonic()
        if now < next_tick:
            time.sleep(min(0.05, next_tick - now))
            continue
        started = time.time()
        try:
            result = season_epoch_advance(season=season)
            record = {"start": started, "end": time.time(), "status": result.status, "version": result.version,
                      "changed": result.changed_players, "ms": result.duration_ms,
                      "catch_up_ms": result.catch_up_ms}
        except Exception as exc:  # noqa: BLE001 - a failed epoch is a finding, the loop goes on
            record = {"start": started, "end": time.time(), "status": "error", "error": repr(exc)}
        log.write(json.dumps(record) + "\n")
        log.flush()
        next_tick += period
        if next_tick < time.monotonic():
            next_tick = time.monotonic()  # late: run now, skip the missed ticks
    log.close()
    return 0


def random_batches(args: argparse.Namespace) -> Callable[[int, datetime], tuple[list[Any], int]]:
    """Batch n of the random workload; its event ids are w<writer>-b<batch>-<index>."""
    from leaderboard.core.events import ScoreEvent

    scores = loader.scores_generate(args.players, seed=args.seed)
    # A range, not a list: at 50M players a list of a writer's share is ~1 GB per writer.
    mine = range(args.writer_index, args.players, args.writers)
    versions: dict[int, int] = {}
    rng = random.Random(args.seed * 1000 + args.writer_index)

    def batch(n: int, completed: datetime) -> tuple[list[Any], int]:
        events = []
        for j in range(BATCH):
            i = rng.choice(mine)
            version = versions.get(i, args.version_base) + 1
            versions[i] = version
            # 85% of results raise the best score; the rest repeat it (unchanged).
            if rng.random() < 0.85:
                scores[i] = min(loader.MAX_SCORE, scores[i] + rng.randint(10, 20_000))
            events.append(ScoreEvent(
                event_id=f"w{args.writer_index}-b{args.batch_base + n}-{j}", match_id=f"m{args.writer_index}-{n}-{j}",
                player_id=loader.player_id(i), best_score=scores[i], score_version=version,
                completed_at=completed,
            ))
        return events, 0

    return batch


def match_batches(args: argparse.Namespace) -> Callable[[int, datetime], tuple[list[Any], int]]:
    """The ingest benchmark's simulated matches; event ids are w<writer>-<sequence>, and a
    batch holds every new sequence number up to the one it returns."""
    from leaderboard.core.events import events_parse
    from leaderboard.simulation import MatchSimulator, player_ids

    simulator = MatchSimulator(players=player_ids(args.players)[args.writer_index :: args.writers],
                               seed=args.seed * 10_007 + args.writer_index, event_prefix=f"w{args.writer_index}-")

    def batch(n: int, completed: datetime) -> tuple[list[Any], int]:
        bodies = simulator.batch(BATCH, completed_at=completed)
        return events_parse({"events": bodies}), max(int(e["event_id"].rsplit("-", 1)[1]) for e in bodies)

    return batch


def role_writer(args: argparse.Namespace) -> int:
    from leaderboard.ingest.services import score_events_apply
    from seasons.models import Season

    season = Season.objects.get(pk=args.season_id)
    next_batch = random_batches(args) if args.workload == "random" else match_batches(args)
    interval = BATCH * args.writers / args.rate
    batches: list[list[float]] = []
    while time.time() < args.start_at:
        time.sleep(0.005)
    start = time.monotonic()
    end = start + args.seconds
    n = 0
    while True:
        slot = start + n * interval
        if slot >= end:
            break
        now = time.monotonic()
        if now < slot:
            time.sleep(slot - now)
        events, upto = next_batch(n, datetime.now(UTC))
        sent = time.time()
        result = score_events_apply(season=season, events=events, client=None)
        committed = time.time()
        applied = sum(1 for o in result.outcomes if o.status == "applied")
        batches.append([args.batch_base + n, sent, committed, applied, upto])
        n += 1
    Path(args.out).write_text(json.dumps({"writer": args.writer_index, "batches": batches}))
    return 0


# ------------------------------------------------------------------------------ parent


def child(role: str, extra: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--role", role, "--no-migrate", *extra]
    return subprocess.Popen(cmd, cwd=benchenv.ROOT, env={**os.environ, **env}, start_new_session=True)


def lags_compute(season_id: int, writers: list[dict[str, Any]], warmup_until: float
                 ) -> tuple[list[float], int, int]:
    """(lags in seconds of the changes committed after warm-up, changes counted, changes never published)."""
    from django.db import connection

    from leaderboard.core.partitions import TXID_PARTITION_SHIFT, Watermark

    commit_at: dict[tuple[int, int], float] = {}
    uptos: dict[int, list[int]] = {}  # matches workload: writer -> each batch's highest event sequence
    for w in writers:
        for n, _sent, committed, _applied, _upto in w["batches"]:
            commit_at[(w["writer"], n)] = committed
        uptos[w["writer"]] = list(itertools.accumulate((b[4] for b in w["batches"]), max))
    with connection.cursor() as cursor:
        cursor.execute("SELECT watermark_txid, watermark_id, watermark_vector, published_at, version "
                       "FROM leaderboard_manifest WHERE season_id = %s ORDER BY version", [season_id])
        versions = [(Watermark.from_columns(t, i, json.loads(vector) if isinstance(vector, str) else vector),
                     p.timestamp()) for t, i, vector, p, _v in cursor.fetchall()]
        cursor.execute("SELECT txid, id, event_id FROM leaderboard_scorechange WHERE season_id = %s", [season_id])
        changes = cursor.fetchall()
    # A change is published by the first version whose watermark covers it in its own
    # partition (each partition's cursor only moves forward from version to version).
    marks: dict[int, list[tuple[int, int]]] = {}
    lags: list[float] = []
    unpublished = 0
    for txid, ident, event_id in changes:
        parts = event_id.split("-")
        if len(parts) == 3:  # random workload: w<writer>-b<batch>-<index>
            key = (int(parts[0][1:]), int(parts[1][1:]))
        else:  # matches: w<writer>-<sequence>, in the first batch whose highest sequence reaches it
            writer = int(parts[0][1:]) if parts[0][1:].isdigit() else -1
            if writer not in uptos:
                continue  # another benchmark's change in a reused season
            key = (writer, bisect.bisect_left(uptos[writer], int(parts[1])))
        committed = commit_at.get(key)
        if committed is None or committed < warmup_until:
            continue
        partition = txid >> TXID_PARTITION_SHIFT
        if partition not in marks:
            marks[partition] = [version.cursor(partition) for version, _at in versions]
        k = bisect.bisect_left(marks[partition], (txid, ident))
        if k == len(versions):
            unpublished += 1
            continue
        lags.append(versions[k][1] - committed)
    return lags, len(lags) + unpublished, unpublished


class Vacuumer:
    """VACUUM ANALYZE of the current-scores table every `seconds`, on a thread of its own.

    Autovacuum's stand-in: this machine's PostgreSQL runs with it off, and without it
    every update of a player leaves a dead row version that each later lookup of that
    player walks past (active players are updated hundreds of times a minute here), so
    the writers measure the bloat instead of the write path. Production keeps autovacuum
    on (README, Deploying)."""

    def __init__(self, seconds: float):
        import threading

        self.seconds = seconds
        self.runs = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Vacuumer:
        if self.seconds > 0:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        import psycopg

        with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
            while not self._stop.wait(self.seconds):
                conn.execute("VACUUM (ANALYZE) leaderboard_playerscore")
                self.runs += 1


def pg_buffer_stats() -> tuple[int, int, int]:
    """(buffers allocated, buffers written by backends, checkpoints requested) so far, server-wide.

    A backend that must evict a dirty page to get a buffer writes it itself (and may first
    have to flush WAL up to it): with a working set larger than shared_buffers, random
    updates of current scores pay that inside the season's write lock."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT buffers_alloc, buffers_backend, checkpoints_req FROM pg_stat_bgwriter")
        alloc, backend, checkpoints = cursor.fetchone()
    return int(alloc), int(backend), int(checkpoints)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], epilog=(__doc__ or "").split("\n\n", 1)[-1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--players", default="1M",
                        help="players in the season (matches: the players the writers draw from)")
    parser.add_argument("--workload", choices=["random", "matches"], default="random",
                        help="random: every event raises or repeats the best score of a random one of --players "
                             "players loaded first; matches: the ingest benchmark's simulated matches "
                             "(leaderboard.simulation) over a season that starts empty, as in that benchmark")
    parser.add_argument("--rate", type=float, default=15_000, help="offered events/s, all writers together")
    parser.add_argument("--writers", type=int, default=2, help="writer processes")
    parser.add_argument("--duration", type=float, default=30.0, help="measured seconds of writing")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds of writing before measuring")
    parser.add_argument("--drain", type=float, default=5.0, help="seconds of epochs after the writers stop")
    parser.add_argument("--vacuum-seconds", type=float, default=5.0,
                        help="VACUUM ANALYZE the current-scores table this often while writing, as autovacuum "
                             "would (0: never; this machine's PostgreSQL has autovacuum off)")
    parser.add_argument("--epoch-seconds", type=float, default=1.0, help="EPOCH_SECONDS of the epoch loop")
    parser.add_argument("--partitions", type=int, default=8, help="the season's ledger partitions (default 8)")
    parser.add_argument("--parts", type=int, default=1,
                        help="EPOCH_PARTS of the epoch loop: parts an epoch's changes are applied in")
    parser.add_argument("--part-workers", type=int, default=None,
                        help="Celery worker processes (solo pool) taking the parts the epoch loop sends "
                             "(default: parts - 1; the loop runs one part itself)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--role", choices=["main", "epoch-loop", "writer"], default="main", help=argparse.SUPPRESS)
    parser.add_argument("--season-id", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--writer-index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--batch-base", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--version-base", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    benchenv.add_common_args(parser)
    args = parser.parse_args(argv)
    (args.players,) = benchenv.parse_counts(str(args.players))

    if args.role != "main":
        import django

        django.setup()
        return role_epoch_loop(args) if args.role == "epoch-loop" else role_writer(args)

    env = benchenv.environment_prepare(args)
    print(benchenv.machine_line())
    from django.conf import settings

    settings.SEASON_PARTITIONS = args.partitions
    part_workers = args.parts - 1 if args.part_workers is None else args.part_workers
    # The matches workload starts from one loaded player (the loader publishes version 1).
    result = loader.load_season(players=args.players if args.workload == "random" else 1, seed=args.seed,
                                kind="fresh", verbose=True)
    season = result.season
    del result
    try:
        figures = measure(season=season, players=args.players, rate=args.rate, writers=args.writers,
                          duration=args.duration, warmup=args.warmup, drain=args.drain,
                          vacuum_seconds=args.vacuum_seconds, epoch_seconds=args.epoch_seconds, seed=args.seed,
                          env=env, workload=args.workload, parts=args.parts, part_workers=part_workers)
    finally:
        benchenv.season_cleanup(season, keep=args.keep)

    print()
    print(f"## freshness: {args.workload} workload, {args.players:,} players, {args.writers} writers"
          f", offered {args.rate:,.0f} events/s, {args.partitions} ledger partitions, {args.parts} part(s) an epoch "
          f"({part_workers} part worker(s)), epoch loop every {args.epoch_seconds} s, {args.duration:.0f} s measured")
    print()
    print(report(figures))
    if figures["first_error"]:
        print(f"\nfirst epoch error: {figures['first_error']}")
    if figures["changes_measured"] > figures["never_published"]:
        p99 = figures["lag_p99_s"]
        print(f"\nlag p99 {p99:.2f} s at {figures['events_per_s']:,.0f} events/s (target < {TARGET_P99_S:.0f} s: "
              f"{'met' if p99 < TARGET_P99_S and not figures['never_published'] else 'MISSED'})")
    return 0


def measure(*, season: Any, players: int, rate: float, writers: int, duration: float, warmup: float, drain: float,
            vacuum_seconds: float, epoch_seconds: float, seed: int, env: dict[str, str],
            workload: str = "random", parts: int = 1, part_workers: int = 0) -> dict[str, Any]:
    """Writers at `rate` and an epoch loop against `season` (already loaded, version 1
    published), its epochs in `parts` parts with `part_workers` Celery workers taking
    them; the figures of the run. In a season written to before (a reused one), the
    event ids and score versions start past any earlier run's (clock-based bases)."""
    env = {**env, "EPOCH_SECONDS": str(epoch_seconds), "EPOCH_PARTS": str(parts)}
    workers = benchenv.CeleryWorkers(count=part_workers, env=env)
    batch_base = int(time.time()) * 100 if workload == "random" else 0
    version_base = int(time.time()) - 1_700_000_000 if workload == "random" else 1
    tmp = Path(tempfile.mkdtemp(prefix="bench-freshness-"))
    procs: list[subprocess.Popen[bytes]] = []
    epoch_loop: subprocess.Popen[bytes] | None = None
    vacuumer = Vacuumer(vacuum_seconds)
    try:
        if part_workers:
            workers.start()
        epoch_loop = child("epoch-loop", ["--season-id", str(season.pk), "--out", str(tmp / "epochs.jsonl")], env)
        # The writers' set-up first (score generation: ~12 s at 50M players).
        start_at = time.time() + 3.0 + 0.5 * writers + players / 4e6
        seconds = warmup + duration
        for w in range(writers):
            procs.append(child("writer", [
                "--season-id", str(season.pk), "--writer-index", str(w), "--writers", str(writers),
                "--rate", str(rate), "--players", str(players), "--seed", str(seed), "--workload", workload,
                "--batch-base", str(batch_base), "--version-base", str(version_base),
                "--start-at", repr(start_at), "--seconds", str(seconds), "--out", str(tmp / f"writer-{w}.json"),
            ], env))
        pg_before = pg_buffer_stats()
        vacuumer.start()
        print(f"# {writers} writers at {rate:,.0f} events/s for {seconds:.0f} s "
              f"(first {warmup:.0f} s not measured); epochs every {epoch_seconds} s", flush=True)
        for proc in procs:
            proc.wait(timeout=seconds + 600)
            if proc.returncode != 0:
                raise SystemExit(f"a writer failed ({proc.returncode})")
        pg_after = pg_buffer_stats()
        vacuumer.stop()
        time.sleep(drain)
    finally:
        vacuumer.stop()
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        if epoch_loop is not None and epoch_loop.poll() is None:
            os.killpg(epoch_loop.pid, signal.SIGTERM)
            try:
                epoch_loop.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(epoch_loop.pid, signal.SIGKILL)
        workers.stop()

    try:
        runs = [json.loads((tmp / f"writer-{w}.json").read_text()) for w in range(writers)]
        epochs = [json.loads(line) for line in (tmp / "epochs.jsonl").read_text().splitlines() if line]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    warmup_until = start_at + warmup
    measured = [b for w in runs for b in w["batches"] if b[2] >= warmup_until]
    span = max(b[2] for b in measured) - min(b[1] for b in measured) if measured else float("nan")
    commit_ms = [(b[2] - b[1]) * 1000 for b in measured]
    lags, counted, unpublished = lags_compute(season.pk, runs, warmup_until)
    published = [e for e in epochs if e["status"] == "published" and e["start"] >= warmup_until]
    errors = [e for e in epochs if e["status"] == "error"]
    return {
        "events_per_s": len(measured) * BATCH / span,
        "changes_per_s": sum(b[3] for b in measured) / span,
        "commit_ms_p50": benchenv.percentile(commit_ms, 50),
        "commit_ms_p99": benchenv.percentile(commit_ms, 99),
        "versions_published": len(published),
        "epoch_ms_p50": benchenv.percentile([e["ms"] for e in published], 50),
        "epoch_ms_p99": benchenv.percentile([e["ms"] for e in published], 99),
        "catch_up_ms_p50": benchenv.percentile([e["catch_up_ms"] for e in published
                                                if e.get("catch_up_ms") is not None], 50),
        "changed_per_version_p50": benchenv.percentile([e["changed"] for e in published], 50),
        "epoch_errors": len(errors),
        "first_error": errors[0]["error"] if errors else "",
        "changes_measured": counted,
        "never_published": unpublished,
        "lag_p50_s": benchenv.percentile(lags, 50),
        "lag_p90_s": benchenv.percentile(lags, 90),
        "lag_p99_s": benchenv.percentile(lags, 99),
        "lag_max_s": max(lags) if lags else float("nan"),
        "pg_buffers_alloc": pg_after[0] - pg_before[0],
        "pg_buffers_backend": pg_after[1] - pg_before[1],
        "pg_checkpoints_req": pg_after[2] - pg_before[2],
        "vacuums": vacuumer.runs,
    }


def report(figures: dict[str, Any]) -> str:
    f = figures
    return benchenv.table(["figure", "value"], [
        ("events/s achieved", f["events_per_s"]),
        ("changes/s (score raised)", f["changes_per_s"]),
        ("batch commit ms p50 / p99", f"{f['commit_ms_p50']:.0f} / {f['commit_ms_p99']:.0f}"),
        ("versions published (measured window)", f["versions_published"]),
        ("epoch ms p50 / p99", f"{f['epoch_ms_p50']:.0f} / {f['epoch_ms_p99']:.0f}"),
        ("catch-up ms p50 (after the swap)", f["catch_up_ms_p50"]),
        ("changed players per version p50", f["changed_per_version_p50"]),
        ("epoch errors", f["epoch_errors"]),
        ("changes measured", f["changes_measured"]),
        ("never published", f["never_published"]),
        ("lag p50 s", f["lag_p50_s"]),
        ("lag p90 s", f["lag_p90_s"]),
        ("lag p99 s", f["lag_p99_s"]),
        ("lag max s", f["lag_max_s"]),
        ("PostgreSQL buffers allocated / written by backends",
         f"{f['pg_buffers_alloc']:,} / {f['pg_buffers_backend']:,}"),
        ("PostgreSQL checkpoints requested (WAL full)", f["pg_checkpoints_req"]),
        ("VACUUMs of the current scores while writing", f["vacuums"]),
    ])

if __name__ == "__main__":
    raise SystemExit(main())
