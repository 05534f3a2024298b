#!/usr/bin/env python
"""Rebuild benchmark: a season's views rebuilt from the ledger, and recovery after a flush.

For each season size the loader (bench/loader.py: COPY into PostgreSQL, both live copies
built, version 1 published) fills a fresh season. Then:

1. Rebuilds (--runs per size): leaderboard.recovery.rebuild.season_rebuild_start + rebuild_run, as
   `manage.py rebuild_views` runs them: both shadow copies filled from the current-scores
   table off the lease (`build`), then under the season's lease the catch-up, the
   comparison with the live version (watermark, player count, per-bucket counts and
   checksums, the shadow's bucket sizes, top 100, REBUILD_SAMPLE_SIZE sampled ranks and
   neighbour windows) and the pointer swap (`compare+publish`: publication is held back
   for this long). `players/s` = players / total time; `copies/s` = players written into
   the two shadows per second of the build. Each run publishes a new version and drops
   the copies it replaced, so Redis holds 4 copies at the peak of a run (`Redis +MB`: the
   growth of used_memory during the run, i.e. the two shadows).
2. Recovery (sizes <= --recovery-max, --recovery-runs each): the bench Redis database is
   flushed; an epoch finds the views lost and starts one recovery job (`lost`); the job
   (rebuild_run) builds both copies, catches up and reconciles the candidate against the
   ledger before publishing (reconcile.recovery_reconcile: each board's player count,
   bucket counts, top 100 and sampled ranks against one GROUP BY of the ledger, every
   player the catch-up replayed one by one, the invariant checker's bucket sizes and
   sampled ranks; no full scan of Redis or of the ledger's rows). `flush->published` is
   the time from the flush to the first published version (reads answer 503 meanwhile).
   A recovery publishes from the one copy it built; then one score is written and the
   next epoch builds the second copy from the scores under the season's lease (`2nd
   copy epoch`: its time to the pointer swap, publication held back while reads are
   answered from the recovered version).

Each run's line and the tables give the 1-minute load average when the run ended: on a
shared machine it says how much else was running. Medians over the runs; at 10M one or
two runs are the practical limit here (each run writes 20M members; say so when
quoting). Memory: 10M players in 2 live + 2 shadow copies is ~4-7 GB of Redis (the
`Redis +MB` figure is the growth of the whole server's used_memory: other databases'
work moves it too).

Uses its own PostgreSQL database (default `rebuildbench`, created if missing, dropped at
the end unless --keep) and Redis logical database (default /3, flushed at the end unless
--keep). On a Redis server shared with other work, a stall of theirs longer than the
client's 2 s socket timeout fails the run: point --redis-url at a private server then.

    SECRET_KEY=x .venv/bin/python bench/rebuild.py                          # 1M x 3 runs + recovery (~6 min)
    SECRET_KEY=x .venv/bin/python bench/rebuild.py --players 1M,10M --runs 3 --runs-10m 1
    SECRET_KEY=x .venv/bin/python bench/rebuild.py --players 10M --runs-10m 1 --recovery-max 10M --recovery-runs 1
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchenv  # noqa: E402
import loader  # noqa: E402

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/rebuildbench"
DEFAULT_REDIS_DB = 3


@dataclass
class Size:
    players: int
    load_seconds: float = 0.0
    total: list[float] = field(default_factory=list)
    build: list[float] = field(default_factory=list)
    compare: list[float] = field(default_factory=list)
    peak_mb: list[float] = field(default_factory=list)
    lost: list[float] = field(default_factory=list)
    recovery: list[float] = field(default_factory=list)
    recovery_build: list[float] = field(default_factory=list)
    recovery_reconcile: list[float] = field(default_factory=list)
    second_copy: list[float] = field(default_factory=list)
    load: list[float] = field(default_factory=list)  # 1-minute load average after each rebuild
    recovery_load: list[float] = field(default_factory=list)


class Phases:
    """on_progress of rebuild_run: when the build ended, progress lines every 10 s, peak memory."""

    def __init__(self, r: Any, label: str):
        self.r = r
        self.label = label
        self.started = time.perf_counter()
        self.build_done: float | None = None
        self.last = self.started
        # used_memory is the whole server's (other logical databases too): the figure is
        # the growth over the start of the run, i.e. the two shadow copies.
        self.baseline = loader.redis_used_memory(r)
        self.peak = self.baseline

    def __call__(self, job: Any) -> None:
        now = time.perf_counter()
        if job.status == "comparing" and self.build_done is None:
            self.build_done = now
            self.peak = max(self.peak, loader.redis_used_memory(self.r))
        elif now - self.last >= 10:
            self.last = now
            self.peak = max(self.peak, loader.redis_used_memory(self.r))
            print(f"#   {self.label}: {job.done:,}/{job.total:,} ({job.rate:,.0f} players/s, eta "
                  f"{job.eta_seconds or 0:.0f}s)", flush=True)


def rebuild_once(season: Any, players: int, run: int) -> tuple[float, float, float, float]:
    from audit.services import Actor
    from leaderboard.recovery.rebuild import rebuild_run, season_rebuild_start
    from leaderboard.redis_client import redis_get

    r = redis_get()
    job = season_rebuild_start(season=season, actor=Actor(kind="system", id="", label="bench"), enqueue=False,
                               reason="bench/rebuild.py")
    phases = Phases(r, f"rebuild {run}")
    job = rebuild_run(job_id=job.pk, on_progress=phases)
    finished = time.perf_counter()
    if job.status != "published":
        raise SystemExit(f"rebuild {job.pk} ended {job.status}: {job.error} {job.report}")
    assert phases.build_done is not None
    total = finished - phases.started
    build = phases.build_done - phases.started
    return total, build, total - build, (phases.peak - phases.baseline) / 2**20


def recovery_once(season: Any, run: int) -> tuple[float, float, float, float, float]:
    from datetime import UTC, datetime

    from leaderboard.core.events import KIND_RESULT, ScoreEvent
    from leaderboard.ingest.services import score_events_apply
    from leaderboard.models import RebuildJob
    from leaderboard.recovery.rebuild import rebuild_run, season_epoch_advance
    from leaderboard.redis_client import redis_get
    from leaderboard.views import rankview
    from leaderboard.views.season_index import season_keys

    r = redis_get()
    keys = season_keys(season)
    # The bench's own logical database: Redis lost the views, PostgreSQL did not. (ASYNC:
    # freeing millions of members synchronously outlasts the client's socket timeout.)
    r.flushdb(asynchronous=True)
    rankview.manifest_cache_clear()
    flushed = time.perf_counter()
    outcome = season_epoch_advance(season=season, r=r)
    lost = time.perf_counter() - flushed
    if outcome.status != "lost":
        raise SystemExit(f"the epoch after the flush answered {outcome}")
    job = RebuildJob.objects.filter(season=season, kind="recovery", status="queued").get()
    phases = Phases(r, f"recovery {run}")
    job = rebuild_run(job_id=job.pk, on_progress=phases)
    published = time.perf_counter()
    if job.status != "published" or rankview.pointer_get(r, keys) != job.published_version:
        raise SystemExit(f"recovery {job.pk} ended {job.status}: {job.error} {job.report}")
    assert phases.build_done is not None
    # One change, and the epoch that publishes it builds the second copy under the lease.
    player = f"after-recovery-{run}-{job.pk}"
    score_events_apply(season=season, client=None, events=[ScoreEvent(
        event_id=player, match_id=player, player_id=player, best_score=1, score_version=1,
        completed_at=datetime.now(UTC), kind=KIND_RESULT, reason="")])
    epoch = season_epoch_advance(season=season, r=r)
    if epoch.status != "published" or epoch.version != (job.published_version or 0) + 1:
        raise SystemExit(f"the epoch after recovery {job.pk} answered {epoch}")
    return (published - flushed, lost, phases.build_done - phases.started, published - phases.build_done,
            epoch.duration_ms / 1000)


def run_size(players: int, args: argparse.Namespace) -> Size:
    from leaderboard.redis_client import redis_get
    from leaderboard.views.invariants import version_check
    from leaderboard.views.season_index import season_keys

    size = Size(players=players)
    started = time.perf_counter()
    result = loader.load_season(players=players, seed=args.seed, kind="rebuild")
    size.load_seconds = time.perf_counter() - started
    season = result.season
    print(f"# loaded {players:,} players in {size.load_seconds:.0f}s (version 1 published)", flush=True)
    runs = args.runs_10m if players >= 10_000_000 else args.runs
    try:
        for run in range(1, runs + 1):
            total, build, compare, peak = rebuild_once(season, players, run)
            size.total.append(total)
            size.build.append(build)
            size.compare.append(compare)
            size.peak_mb.append(peak)
            size.load.append(os.getloadavg()[0])
            print(f"# rebuild {run}/{runs} of {players:,}: {total:.1f}s (build {build:.1f}s, compare+publish "
                  f"{compare:.2f}s), Redis +{peak:,.0f} MB at the peak, load {size.load[-1]:.1f}", flush=True)
        if players <= args.recovery_max:
            for run in range(1, args.recovery_runs + 1):
                total, lost, build, reconcile, second = recovery_once(season, run)
                size.recovery.append(total)
                size.second_copy.append(second)
                size.lost.append(lost)
                size.recovery_build.append(build)
                size.recovery_reconcile.append(reconcile)
                size.recovery_load.append(os.getloadavg()[0])
                print(f"# recovery {run}/{args.recovery_runs} of {players:,}: flush -> published {total:.1f}s "
                      f"(epoch says lost in {lost * 1000:.0f} ms, build {build:.1f}s, reconcile+publish "
                      f"{reconcile:.1f}s; then the second copy's epoch {second:.1f}s), "
                      f"load {size.recovery_load[-1]:.1f}", flush=True)
        report = version_check(r=redis_get(), keys=season_keys(season), sample=200, seed=1)
        print(f"# invariants of the last version: {'ok' if report.ok else report.failures()}", flush=True)
    finally:
        benchenv.season_cleanup(season, keep=args.keep)
    return size


def _loads(loads: list[float]) -> str:
    return f"{min(loads):.1f}-{max(loads):.1f}" if loads else "-"


def database_drop(url: str) -> None:
    import psycopg
    from django.db import connections
    from psycopg import sql

    connections.close_all()
    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    with psycopg.connect(urlunsplit(parts._replace(path="/postgres")), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    print(f"# dropped database {name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], epilog=(__doc__ or "").split("\n\n", 1)[-1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--players", default="1M", help="season sizes, comma-separated (e.g. 1M,10M)")
    parser.add_argument("--runs", type=int, default=3, help="timed rebuilds per size below 10M")
    parser.add_argument("--runs-10m", type=int, default=1, help="timed rebuilds per size of 10M and more")
    parser.add_argument("--recovery-max", default="1M", help="measure recovery for sizes up to this")
    parser.add_argument("--recovery-runs", type=int, default=3, help="timed recoveries per size")
    parser.add_argument("--seed", type=int, default=1)
    benchenv.add_common_args(parser)
    parser.set_defaults(database_url=DEFAULT_DATABASE_URL, redis_db=DEFAULT_REDIS_DB)
    args = parser.parse_args(argv)
    sizes = benchenv.parse_counts(args.players)
    (args.recovery_max,) = benchenv.parse_counts(args.recovery_max)
    if args.runs < 1 or args.runs_10m < 1 or args.recovery_runs < 0:
        parser.error("--runs and --runs-10m >= 1, --recovery-runs >= 0")
    benchenv.environment_prepare(args)
    print(benchenv.machine_line())
    from django.conf import settings

    print(f"# REBUILD_SAMPLE_SIZE={settings.REBUILD_SAMPLE_SIZE}, EPOCH_LEASE_SECONDS={settings.EPOCH_LEASE_SECONDS}")
    results: list[Size] = []
    try:
        for players in sizes:
            results.append(run_size(players, args))
    finally:
        if not args.keep:
            from leaderboard.redis_client import redis_get

            redis_get().flushdb(asynchronous=True)
            database_drop(args.database_url)

    print()
    print("## rebuild from the ledger (medians; runs per size in the first column)")
    print()
    rows = []
    for s in results:
        total = benchenv.median(s.total)
        rows.append((f"{benchenv.human(s.players)} x{len(s.total)}", total, benchenv.median(s.build),
                     benchenv.median(s.compare), s.players / total, 2 * s.players / benchenv.median(s.build),
                     benchenv.median(s.peak_mb), min(s.total), max(s.total), _loads(s.load)))
    print(benchenv.table(["players", "total s", "build s", "compare+publish s", "players/s", "copies/s",
                          "Redis +MB (shadows)", "min s", "max s", "load"], rows))
    recovered = [s for s in results if s.recovery]
    if recovered:
        print()
        print("## recovery after a flush: flush -> first published version (medians)")
        print()
        print(benchenv.table(
            ["players", "runs", "flush->published s", "epoch 'lost' ms", "build s", "reconcile+publish s",
             "min s", "max s", "2nd copy epoch s", "load"],
            [(benchenv.human(s.players), len(s.recovery), benchenv.median(s.recovery),
              benchenv.median(s.lost) * 1000, benchenv.median(s.recovery_build),
              benchenv.median(s.recovery_reconcile), min(s.recovery), max(s.recovery),
              benchenv.median(s.second_copy), _loads(s.recovery_load))
             for s in recovered]))
    biggest = max(results, key=lambda s: s.players)
    benchenv.figures_record(
        "rebuild_players_per_s", biggest.players / benchenv.median(biggest.total), "players/s",
        note=(f"{biggest.players:,} players, median of {len(biggest.total)} rebuilds from the ledger "
              "(both shadow copies built, compared and published)"),
        path=args.figures,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
