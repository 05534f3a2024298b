#!/usr/bin/env python
"""What a read costs on a regional board, and that a season without regions pays nothing for them.

Two fresh seasons of N players each (bench/loader.py): one without regions (the
baseline) and one with three (each player in one, round robin). In this process, the very
functions the fast read path runs in its thread pool (leaderboard/api/reads.py) answer,
for random players:

- `rank`: the global rank read of the season without regions (the baseline), the global
  rank read of the season with regions (which also names the player's region), and the
  regional rank read on the player's own region's board;
- `neighbors` (radius 10) and `top` (100) the same three ways.

Each case runs --reads reads per run, the cases interleaved (order rotated) over --runs
runs; printed: the median microseconds per read of wall time and of this thread's CPU
time, the CPU ratio to the baseline of the same run, and the Redis round trips per read
(counted where redis-py writes to the socket). The round trips say what the Redis work
is; the CPU time is the server's Python work per read; wall time adds the waits for Redis
and is the noisiest, taken on a shared machine (other test runs on the same Redis and
PostgreSQL): compare a case with its baseline of the same run, not across runs.

    SECRET_KEY=x .venv/bin/python bench/regional_reads.py --players 100k
    SECRET_KEY=x .venv/bin/python bench/regional_reads.py --players 1M --runs 7 --reads 5000
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchenv  # noqa: E402
import loader  # noqa: E402

REGIONS = ("na", "eu", "apac")


class RoundTrips:
    """Counts the packed commands this process sends Redis (one per round trip)."""

    def __init__(self) -> None:
        from redis.connection import AbstractConnection

        self.count = 0
        original = AbstractConnection.send_packed_command

        def counted(conn: Any, command: Any, check_health: bool = True) -> None:
            self.count += 1
            original(conn, command, check_health)

        AbstractConnection.send_packed_command = counted  # type: ignore[method-assign]


Read = Callable[[str], Any]


def cases(plain: str, regional: str) -> dict[str, tuple[str, Read]]:
    """name -> (what it is compared with, one read of player i's id)."""
    from leaderboard.api import reads

    def region(player_id: str) -> str:
        return loader.region_of(int(player_id[1:]), REGIONS)

    radius = {"radius": "10"}
    return {
        "rank, no regions": ("rank, no regions",
                             lambda p: reads.rank_answer(season_id=plain, player_id=p, query={})),
        "rank, with regions": ("rank, no regions",
                               lambda p: reads.rank_answer(season_id=regional, player_id=p, query={})),
        "regional rank": ("rank, no regions",
                          lambda p: reads.rank_answer(season_id=regional, player_id=p, query={}, region=region(p))),
        "neighbors, no regions": ("neighbors, no regions",
                                  lambda p: reads.neighbors_answer(season_id=plain, player_id=p, query=radius)),
        "neighbors, with regions": ("neighbors, no regions",
                                    lambda p: reads.neighbors_answer(season_id=regional, player_id=p, query=radius)),
        "regional neighbors": ("neighbors, no regions",
                               lambda p: reads.neighbors_answer(season_id=regional, player_id=p, query=radius,
                                                                region=region(p))),
        "top, no regions": ("top, no regions", lambda p: reads.top_answer(season_id=plain, query={})),
        "regional top": ("top, no regions",
                         lambda p: reads.top_answer(season_id=regional, query={}, region=region(p))),
    }


def measure(read: Read, ids: list[str], trips: RoundTrips) -> tuple[float, float, float]:
    """(wall and CPU microseconds per read, round trips per read); every read must answer 200."""
    before = trips.count
    started, cpu_started = time.perf_counter(), time.thread_time()
    for player_id in ids:
        answer = read(player_id)
        if answer.status != 200:
            raise SystemExit(f"a read answered {answer.status}: {answer.body}")
    cpu, elapsed = time.thread_time() - cpu_started, time.perf_counter() - started
    return elapsed / len(ids) * 1e6, cpu / len(ids) * 1e6, (trips.count - before) / len(ids)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], epilog=(__doc__ or "").split("\n\n", 1)[-1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--players", default="100k", help="players in each season (e.g. 100k, 1M)")
    parser.add_argument("--runs", type=int, default=5, help="runs; each case once per run, order rotated")
    parser.add_argument("--reads", type=int, default=2000, help="reads per case per run")
    benchenv.add_common_args(parser)
    args = parser.parse_args(argv)
    players = benchenv.parse_counts(args.players)[0]
    benchenv.environment_prepare(args)
    print(benchenv.machine_line())

    plain = loader.load_season(players=players, kind="regread-plain", verbose=False)
    regional = loader.load_season(players=players, kind="regread-regions", verbose=False, regions=REGIONS)
    try:
        trips = RoundTrips()
        table = cases(plain.season.slug, regional.season.slug)
        rnd = random.Random(5)
        names = list(table)
        for name in names:  # warm: manifests cached, each season's regions learned
            measure(table[name][1], [loader.player_id(rnd.randrange(players)) for _ in range(50)], trips)
        walls: dict[str, list[float]] = {name: [] for name in names}
        cpus: dict[str, list[float]] = {name: [] for name in names}
        ratios: dict[str, list[float]] = {name: [] for name in names}
        per_read: dict[str, float] = {}
        for run in range(args.runs):
            ids = [loader.player_id(rnd.randrange(players)) for _ in range(args.reads)]
            order = names[run % len(names):] + names[: run % len(names)]
            wall, cpu = {}, {}
            for name in order:
                wall[name], cpu[name], per_read[name] = measure(table[name][1], ids, trips)
            for name in names:
                walls[name].append(wall[name])
                cpus[name].append(cpu[name])
                ratios[name].append(cpu[name] / cpu[table[name][0]])
        rows = [(name, f"{benchenv.median(walls[name]):.0f}", f"{benchenv.median(cpus[name]):.0f}",
                 f"{benchenv.median(ratios[name]):.2f}", table[name][0], f"{per_read[name]:.2f}") for name in names]
        print(f"\n{benchenv.human(players)} players per season, median of {args.runs} runs x {args.reads} reads:")
        print(benchenv.table(["read", "wall us/read", "CPU us/read", "CPU x baseline", "baseline",
                              "round trips/read"], rows))
    finally:
        benchenv.season_cleanup(plain.season, keep=args.keep)
        benchenv.season_cleanup(regional.season, keep=args.keep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
