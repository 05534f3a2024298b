#!/usr/bin/env python
"""One season of 50M players on one machine: load it (resumable), then measure it.

Loads a season (ledger events + current scores with COPY, both copies of the views,
version 1 published) and runs, against that one season, the steps asked for:

    memory    Redis bytes per player (used_memory, both copies) and MEMORY USAGE split
    epoch     publish time of epochs of 1k and 10k changed players
    reads     rank / top / neighbors requests/s and p99 over HTTP (wrk)
    fresh     commit -> published lag under sustained writes
    final     the FINAL standings' INSERT ... SELECT and hash (rolled back)
    recovery  Redis flushed -> first published version, then the epoch building copy 2

    SECRET_KEY=x .venv/bin/python bench/fifty_million.py --players 50M \\
        --database-url postgres://postgres@127.0.0.1:5432/h50m \\
        --redis-url redis://127.0.0.1:6391/0 --redis-db 0 --steps load
    ... --reuse last --steps memory,epoch,reads,fresh,final,recovery

A load takes long (the 50M COPY with events ~20+ min, each copy's build several
minutes), so it is never cleaned up: `--reuse SLUG` (or `last`, the newest season this
script made) measures a loaded season, and `--steps load` on a season whose COPY was cut
short resumes it (scores are deterministic for a seed; each COPY transaction of 1M
players commits both tables). The memory guard stops the run if Redis's used_memory
passes --redis-max-gb or the machine's available memory drops under --min-free-gb:
the machine is shared, and a Redis that makes it swap kills other people's work.
"""

from __future__ import annotations

import _thread
import argparse
import json
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchenv  # noqa: E402
import loader  # noqa: E402

KIND = "50m"
STEPS = ("load", "memory", "epoch", "reads", "fresh", "final", "recovery")
GIB = 1024**3


class MemoryGuard:
    """Interrupts the main thread when Redis or the machine runs out of room."""

    def __init__(self, r: Any, *, redis_max: float, min_free: float, interval: float = 2.0):
        self.r = r
        self.redis_max = redis_max
        self.min_free = min_free
        self.interval = interval
        self.peak_redis = 0
        self.min_available = float("inf")
        self.tripped = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-guard", daemon=True)

    def __enter__(self) -> MemoryGuard:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            used = int(self.r.info("memory")["used_memory"])
            available = mem_available()
            self.peak_redis = max(self.peak_redis, used)
            self.min_available = min(self.min_available, available)
            if used > self.redis_max or available < self.min_free:
                self.tripped = (f"Redis used_memory {used / GIB:.1f} GiB (limit {self.redis_max / GIB:.1f}), "
                                f"MemAvailable {available / GIB:.1f} GiB (floor {self.min_free / GIB:.1f})")
                print(f"# MEMORY GUARD: {self.tripped}; stopping", flush=True)
                _thread.interrupt_main()
                return


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


# ------------------------------------------------------------------------------ load


def season_find(reuse: str) -> Any:
    from seasons.models import Season

    if reuse == "last":
        season = Season.objects.filter(slug__startswith=f"bench-{KIND}-").order_by("-pk").first()
        if season is None:
            raise SystemExit("--reuse last: no season of this script in the database")
        return season
    return Season.objects.get(slug=reuse)


def version_published(season: Any) -> int:
    from leaderboard.redis_client import redis_get
    from leaderboard.views import rankview
    from leaderboard.views.season_index import season_keys

    return rankview.pointer_get(redis_get(), season_keys(season)) or 0


def step_load(args: argparse.Namespace, players: int, season: Any | None, out: dict[str, Any]) -> Any:
    """COPY (resumed where it stopped) and both copies built and published, unless done."""
    from seasons.models import Season

    started = time.perf_counter()
    scores = loader.scores_generate(players, seed=args.seed)
    print(f"# {players:,} scores generated in {time.perf_counter() - started:.1f}s "
          f"({loader.distribution_summary(scores)})", flush=True)
    if season is None:
        season = benchenv.season_new(KIND, layout=loader.layout_for(scores, "uniform"))
        season = Season.objects.get(pk=season.pk)
        print(f"# new season {season.slug} (measure it later with --reuse {season.slug})", flush=True)
    loaded = loader.ledger_loaded(season)
    if loaded < players:
        if loaded % loader.COPY_TRANSACTION:
            raise SystemExit(f"{loaded:,} players loaded: not a whole number of COPY transactions")
        print(f"# COPY from player {loaded:,} (with events: {args.with_events})", flush=True)
        out["copy_seconds"] = loader.ledger_copy(season, scores, with_events=args.with_events,
                                                 first_player=loaded, verbose=True)
        out["copy_players"] = players - loaded
        print(f"# COPY: {out['copy_seconds']:.0f}s", flush=True)
    if version_published(season):
        print(f"# season {season.slug} already published: build skipped", flush=True)
        return season
    result = loader.LoadResult(season=season, players=players, scores=scores, copy_seconds=0.0)
    del scores
    loader.views_build(result, verbose=True)
    out["build_seconds"] = result.build_seconds
    out["publish_seconds"] = result.publish_seconds
    out["used_memory_before"] = result.memory_before
    out["used_memory_after_copy"] = result.memory_after_copy
    out["python_max_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"# built: copies {', '.join(f'{s:.0f}s' for s in result.build_seconds)}, "
          f"publish {result.publish_seconds:.1f}s; Redis {result.memory_after_copy[-1] / GIB:.2f} GiB "
          f"({result.memory_per_player:.0f} bytes/player)", flush=True)
    return season


# ----------------------------------------------------------------------------- memory


def step_memory(args: argparse.Namespace, players: int, season: Any, out: dict[str, Any], env: dict[str, str]
                ) -> None:
    """used_memory and RSS per player (the whole server holds this season only), MEMORY USAGE
    of each copy's sorted sets and lookup shards, and the tables' size in PostgreSQL."""
    import memory
    from django.db import connection

    from leaderboard.redis_client import redis_get
    from leaderboard.views import rankview
    from leaderboard.views.epoch import COPIES
    from leaderboard.views.season_index import season_keys

    r = redis_get()
    info = r.info("memory")
    out["used_memory"] = used = loader.redis_used_memory(r)
    out["used_memory_rss"] = rss = int(info["used_memory_rss"])
    out["bytes_per_player"] = used / players
    out["rss_bytes_per_player"] = rss / players
    out["keys"] = int(r.dbsize())
    keys = season_keys(season)
    layout = season.bucket_layout
    started = time.perf_counter()
    # One index holds both copies: its keys are measured once, under its first copy's name.
    for copy in COPIES[:1]:
        meta = rankview.copy_meta_load(r, keys, copy)
        if meta is None:
            out[f"copy_{copy}"] = "absent"
            continue
        buckets = [keys.bucket(meta.index, layout.layout_id, b, groups=meta.groups) for b in range(layout.size)]
        # Every shard_stride-th lookup shard: players spread evenly over them (crc32 of the id).
        lookups = [keys.lookup(meta.index, k, groups=meta.groups)
                   for k in range(0, meta.lookup_shards, args.shard_stride)]
        out[f"zsets_{copy}_per_player"] = memory.keys_usage(r, buckets, args.samples) / players
        out[f"hashes_{copy}_per_player"] = (memory.keys_usage(r, lookups, args.samples) * meta.lookup_shards
                                            / len(lookups) / players)
        out[f"shards_{copy}"] = meta.lookup_shards
        out[f"listpacks_{copy}"] = f"{memory.keys_listpacks(r, lookups)} of {len(lookups)} sampled"
        print(f"#   copy {copy}: sorted sets {out[f'zsets_{copy}_per_player']:.1f} + lookup "
              f"{out[f'hashes_{copy}_per_player']:.1f} bytes/player (MEMORY USAGE), {meta.lookup_shards:,} shards, "
              f"listpacks: {out[f'listpacks_{copy}']}", flush=True)
    out["usage_seconds"] = time.perf_counter() - started
    with connection.cursor() as cursor:
        for table in ("leaderboard_playerscore", "leaderboard_scoreevent", "leaderboard_scorechange"):
            cursor.execute("SELECT pg_total_relation_size(%s)", [table])
            out[f"pg_{table}_bytes"] = int(cursor.fetchone()[0])
    print(f"# Redis used_memory {used / GIB:.2f} GiB ({used / players:.0f} bytes/player), RSS {rss / GIB:.2f} GiB "
          f"({rss / players:.0f}); PostgreSQL: scores {out['pg_leaderboard_playerscore_bytes'] / GIB:.1f} GiB, "
          f"ledger {out['pg_leaderboard_scoreevent_bytes'] / GIB:.1f} GiB", flush=True)


# ------------------------------------------------------------------------------ epoch


def change_maker(players: int, seed: int) -> Any:
    """bench/epoch.py's ChangeMaker, safe to run again on the same season: event ids and
    score versions start past those of any earlier run (a clock-based base), since a
    reused season already holds the earlier runs' events."""
    import epoch

    maker = epoch.ChangeMaker(loader.scores_generate(players, seed=seed), seed=seed + int(time.time()))
    maker.round = int(time.time())
    base = int(time.time()) - 1_700_000_000
    maker.versions = epoch.array("q", [base]) * players
    return maker


def step_epoch(args: argparse.Namespace, players: int, season: Any, out: dict[str, Any], env: dict[str, str]
               ) -> None:
    """bench/epoch.py's cells (real writes, every change crossing buckets, catch-up mode)."""
    import epoch

    from leaderboard.redis_client import redis_get

    maker = change_maker(players, args.seed)
    r = redis_get()
    cell_args = argparse.Namespace(warmup=1, repeats=args.epoch_repeats)
    for k in benchenv.parse_counts(args.changes):
        cell = epoch.run_cell(season, maker, r, epoch.Cell(players=players, changes=k, mode="catch-up"),
                              cell_args, None)
        out[f"{k}"] = {
            "publish_ms": cell.epoch_ms, "catch_up_ms": cell.catch_up_ms, "task_ms": cell.task_ms,
            "cpu_ms": cell.cpu_ms, "redis_cpu_ms": cell.redis_ms, "ingest_s": cell.ingest_s,
            "publish_median_ms": cell.median_ms, "publish_p90_ms": benchenv.percentile(cell.epoch_ms, 90),
        }


# ------------------------------------------------------------------------------ reads


def step_reads(args: argparse.Namespace, players: int, season: Any, out: dict[str, Any], env: dict[str, str]
               ) -> None:
    """bench/reads.py's closed-loop peak and paced p99 for rank, neighbors and top.

    Without its one-sorted-set baseline: 50M members in one more sorted set are ~6 GB of
    Redis (121 bytes a member at 10M), which this machine does not have beside the views."""
    import tempfile

    import reads

    server = benchenv.AppServer(workers=args.workers, port=args.port, env=env)
    endpoints = ("rank", "neighbors", "top")
    samples: dict[str, list[Any]] = {name: [] for name in endpoints}
    paced: list[Any] = []
    server.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            seed = args.seed
            for run in range(args.read_runs):
                for name in endpoints[run % 3:] + endpoints[: run % 3]:
                    path = reads.ENDPOINTS[name].format(season=season.slug)
                    seed += 1
                    reads.wrk_run(url=server.url, path=path, players=players, connections=args.connections,
                                  duration=2, rate=None, workdir=workdir, seed=seed)
                    sample = reads.measured(server, url=server.url, path=path, players=players,
                                            connections=args.connections, duration=args.read_seconds, rate=None,
                                            workdir=workdir, seed=seed)
                    if sample is None:
                        continue
                    samples[name].append(sample)
                    print(f"# run {run + 1} {name:>9}: {sample.rps:7,.0f} req/s, p50 {sample.p50:5.1f} ms, p99 "
                          f"{sample.p99:6.1f} ms, errors {sample.errors}; CPU/request: server "
                          f"{sample.server_cpu_us:,.0f} us, redis {sample.redis_cpu_us:,.0f} us; "
                          f"load {load_average():.1f}", flush=True)
            peak = benchenv.median([s.rps for s in samples["rank"]])
            rate = peak * 0.8
            for run in range(args.read_runs):
                seed += 1
                sample = reads.wrk_run(url=server.url, path=reads.ENDPOINTS["rank"].format(season=season.slug),
                                       players=players, connections=args.connections, duration=args.read_seconds,
                                       rate=rate, workdir=workdir, seed=seed)
                if sample is not None:
                    paced.append(sample)
                    print(f"# paced run {run + 1} rank at {rate:,.0f} req/s offered: {sample.rps:,.0f} req/s, "
                          f"p50 {sample.p50:.1f} ms, p99 {sample.p99:.1f} ms", flush=True)
    finally:
        server.stop()
    for name, cell in samples.items():
        out[name] = {"rps": benchenv.median([s.rps for s in cell]), "p50_ms": benchenv.median([s.p50 for s in cell]),
                     "p99_ms": benchenv.median([s.p99 for s in cell]),
                     "server_cpu_us": benchenv.median([s.server_cpu_us for s in cell]),
                     "redis_cpu_us": benchenv.median([s.redis_cpu_us for s in cell]),
                     "errors": sum(s.errors for s in cell), "runs": len(cell)}
    out["paced"] = {"offered": peak * 0.8, "rps": benchenv.median([s.rps for s in paced]),
                    "p50_ms": benchenv.median([s.p50 for s in paced]),
                    "p99_ms": benchenv.median([s.p99 for s in paced]),
                    "p99_worst_ms": max((s.p99 for s in paced), default=float("nan"))}


# -------------------------------------------------------------------------- freshness


def step_fresh(args: argparse.Namespace, players: int, season: Any, out: dict[str, Any], env: dict[str, str]
               ) -> None:
    """bench/freshness.py's writers and epoch loop against this season."""
    import freshness

    out.update(freshness.measure(season=season, players=players, rate=args.fresh_rate, writers=2,
                                 duration=args.fresh_seconds, warmup=5.0, drain=5.0, vacuum_seconds=5.0,
                                 epoch_seconds=1.0, seed=args.seed, env=env))


# ------------------------------------------------------------------------------ final


def step_final(args: argparse.Namespace, players: int, season: Any, out: dict[str, Any], env: dict[str, str]
               ) -> None:
    """The approval's INSERT ... SELECT and hash and page reads in a transaction rolled back
    (bench/final.py; FINAL rows refuse DELETE, so the season stays measurable), then, with
    --candidate, a FINAL candidate's reconciliation (every check and the full scans: what
    the lifecycle tick runs before a candidate can be proposed). Its full scan of the
    index keeps every player's value in Python (~190 bytes a player measured at 1M): ~9.5
    GB at 50M beside the views, more than this machine has, hence off by default."""
    import final

    from leaderboard.recovery.reconcile import version_reconcile
    from leaderboard.redis_client import redis_get
    from leaderboard.views import rankview
    from leaderboard.views.season_index import season_keys

    out.update(final.run_once(season, players, explain=False))
    print(f"# FINAL standings write {out['write_s']:.0f}s (hash alone {out['hash_s']:.0f}s), rolled back", flush=True)
    if not args.candidate:
        return
    r = redis_get()
    keys = season_keys(season)
    version = rankview.pointer_get(r, keys)
    assert version is not None
    started = time.perf_counter()
    report = version_reconcile(r=r, keys=keys, season_id=season.pk, version=version, sample=1000)
    out["candidate_reconcile_s"] = time.perf_counter() - started
    out["candidate_ok"] = report.ok
    out["candidate_failures"] = [f.check for f in report.failures()]
    out["python_max_rss_after_reconcile"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"# FINAL candidate reconciliation of v{version}: {out['candidate_reconcile_s']:.0f}s, "
          f"{'ok' if report.ok else report.failures()}", flush=True)


# --------------------------------------------------------------------------- recovery


def step_recovery(args: argparse.Namespace, players: int, season: Any, out: dict[str, Any], env: dict[str, str]
                  ) -> None:
    """bench/rebuild.py's recovery: Redis flushed, the epoch finds the views lost, the
    recovery builds one copy, reconciles and publishes it; then one write and the epoch
    that builds the second copy under the lease."""
    import rebuild

    total, lost, build, reconcile, second = rebuild.recovery_once(season, 1)
    out.update(flush_to_published_s=total, lost_s=lost, build_s=build, reconcile_publish_s=reconcile,
               second_copy_epoch_s=second)
    print(f"# recovery: flush -> published {total:.0f}s (build {build:.0f}s, reconcile+publish {reconcile:.1f}s); "
          f"the second copy's epoch {second:.0f}s", flush=True)


STEP_RUNNERS: dict[str, Any] = {
    "memory": step_memory, "epoch": step_epoch, "reads": step_reads, "fresh": step_fresh, "final": step_final,
    "recovery": step_recovery,
}


# ------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], epilog=(__doc__ or "").split("\n\n", 1)[-1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--players", default="50M")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-events", dest="with_events", action="store_false",
                        help="load the current scores only (default: one ledger event per player too)")
    parser.add_argument("--reuse", default=None, metavar="SLUG",
                        help="measure (or finish loading) this season; 'last': the newest this script made")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated, of {', '.join(STEPS)}")
    parser.add_argument("--redis-max-gb", type=float, default=16.0)
    parser.add_argument("--min-free-gb", type=float, default=2.0)
    parser.add_argument("--samples", type=int, default=5, help="MEMORY USAGE ... SAMPLES")
    parser.add_argument("--shard-stride", type=int, default=16,
                        help="MEMORY USAGE of every Nth lookup shard, scaled (memory step)")
    parser.add_argument("--candidate", action="store_true",
                        help="final step: also reconcile a FINAL candidate in full (needs ~190 bytes a player)")
    parser.add_argument("--changes", default="1k,10k", help="changed players per epoch (epoch step)")
    parser.add_argument("--epoch-repeats", type=int, default=5)
    parser.add_argument("--connections", type=int, default=32, help="wrk connections (reads step)")
    parser.add_argument("--read-runs", type=int, default=3)
    parser.add_argument("--read-seconds", type=float, default=8.0)
    parser.add_argument("--workers", type=int, default=2, help="uvicorn workers (reads step)")
    parser.add_argument("--port", type=int, default=8795)
    parser.add_argument("--fresh-rate", type=float, default=15_000, help="offered events/s (fresh step)")
    parser.add_argument("--fresh-seconds", type=float, default=30.0)
    parser.add_argument("--results", default="/tmp/fifty_million.json",
                        help="each step's figures are merged into this JSON file as it finishes")
    benchenv.add_common_args(parser)
    args = parser.parse_args(argv)
    (players,) = benchenv.parse_counts(args.players)
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    unknown = set(steps) - set(STEPS)
    if unknown:
        raise SystemExit(f"unknown steps: {', '.join(sorted(unknown))}")
    env = benchenv.environment_prepare(args)
    print(benchenv.machine_line(), flush=True)
    from leaderboard.redis_client import redis_get

    results_path = Path(args.results)
    results: dict[str, Any] = json.loads(results_path.read_text()) if results_path.exists() else {}
    season = season_find(args.reuse) if args.reuse else None
    with MemoryGuard(redis_get(), redis_max=args.redis_max_gb * GIB, min_free=args.min_free_gb * GIB) as guard:
        for step in steps:
            out: dict[str, Any] = {"load_average_before": load_average()}
            started = time.perf_counter()
            if step == "load":
                season = step_load(args, players, season, out)
            else:
                if season is None:
                    raise SystemExit(f"step {step} needs a loaded season: --reuse SLUG or --steps load first")
                STEP_RUNNERS[step](args, players, season, out, env)
            out["seconds"] = time.perf_counter() - started
            out["load_average_after"] = load_average()
            out["redis_peak_used_memory"] = guard.peak_redis
            out["min_mem_available"] = guard.min_available
            results.setdefault(season.slug, {})[step] = out
            results_path.write_text(json.dumps(results, indent=2, default=str) + "\n")
            print(f"# step {step}: {out['seconds']:.0f}s, load {out['load_average_before']:.1f} -> "
                  f"{out['load_average_after']:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
