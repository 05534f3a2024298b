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
# The build's batch is at least BUILD_SHARD_FILL players per lookup shard; at 50M players
# (2,097,152 shards) that is 8.4M rows a batch, two in flight: gigabytes of Python beside
# a 14 GB Redis. The 10M size's batch (1,048,576) is kept.
BUILD_BATCH_MAX = 1 << 20
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
    from leaderboard.views.materializer import season_keys

    return rankview.pointer_get(redis_get(), season_keys(season)) or 0


def step_load(args: argparse.Namespace, players: int, season: Any | None, out: dict[str, Any]) -> Any:
    """COPY (resumed where it stopped) and both copies built and published, unless done."""
    from leaderboard.views import materializer
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
    materializer.BUILD_BATCH = min(max(materializer.BUILD_BATCH,
                                       materializer.BUILD_SHARD_FILL * _shards(players)), BUILD_BATCH_MAX)
    materializer.BUILD_SHARD_FILL = 0
    result = loader.LoadResult(season=season, players=players, scores=scores, copy_seconds=0.0)
    del scores
    loader.views_build(result, verbose=True)
    out["build_seconds"] = result.build_seconds
    out["publish_seconds"] = result.publish_seconds
    out["used_memory_before"] = result.memory_before
    out["used_memory_after_copy"] = result.memory_after_copy
    print(f"# built: copies {', '.join(f'{s:.0f}s' for s in result.build_seconds)}, "
          f"publish {result.publish_seconds:.1f}s; Redis {result.memory_after_copy[-1] / GIB:.2f} GiB "
          f"({result.memory_per_player:.0f} bytes/player)", flush=True)
    return season


def _shards(players: int) -> int:
    from leaderboard.core.manifest import lookup_shards_for

    return lookup_shards_for(players=players)


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


STEP_RUNNERS: dict[str, Any] = {}


if __name__ == "__main__":
    raise SystemExit(main())
