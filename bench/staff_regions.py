#!/usr/bin/env python
"""The staff console's region reads: a season's players per region and a player's region moves.

For each size N, a fresh season with 4 regions: N players COPYed into its current scores
(90% in a region, 10% in none) and a change stream of N score changes plus one region
move for every 1,000th player (event_id "region:2"). Medians of --runs runs, each against
a baseline measured in the same run:

- players per region (seasons.staff.season.selectors.season_region_sizes, its cache cleared
  before each run: the GROUP BY over the season's current scores that the season page runs
  at most every 15 s per process), against `count(*)` of the same rows: the least a count
  of the season's players costs without a summary kept elsewhere;
- a player's region history (seasons.staff.players.selectors.player_regions: profile, profile
  changes, score in every season and the moves through the partial index
  score_change_region_moves), against the moves query alone without that index
  (event_id LIKE '%region:%', which no index serves: the scan the player page would run
  without it). The scan grows with the whole change stream, which keeps every score
  change of every season: here it holds only N + N/1,000 rows.

    SECRET_KEY=x .venv/bin/python bench/staff_regions.py --players 100k,1M

Figures are taken on a shared machine (other test runs on the same PostgreSQL): compare a
measurement with its baseline of the same run, not with another run.
"""

from __future__ import annotations

import argparse
import io
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchenv  # noqa: E402

REGIONS = ["na", "eu", "apac", "latam"]
MOVE_EVERY = 1_000
COPY_CHUNK = 100_000


def region_of(i: int) -> str:
    return "" if i % 10 == 9 else REGIONS[i % len(REGIONS)]


def season_load(season: Any, players: int) -> float:
    """COPY the current scores and the change stream of `players` players; seconds taken."""
    from datetime import UTC, datetime

    from django.db import connection, transaction

    started = time.perf_counter()
    ts = datetime.now(UTC).isoformat()
    sid = season.pk
    rng = random.Random(1)
    scores = [rng.randrange(0, 1_000_000) for _ in range(players)]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL synchronous_commit = off")
        raw = cursor.cursor
        with raw.copy("COPY leaderboard_playerscore (season_id, player_id, score, score_version, region, updated_at) "
                      "FROM STDIN") as copy:
            for start in range(0, players, COPY_CHUNK):
                copy.write("".join(f"{sid}\tp{i:08d}\t{scores[i]}\t1\t{region_of(i)}\t{ts}\n"
                                   for i in range(start, min(players, start + COPY_CHUNK))))
        with raw.copy("COPY leaderboard_scorechange (season_id, player_id, old_score, new_score, score_version, "
                      "event_id, committed_at, txid, region, old_region) FROM STDIN") as copy:
            for start in range(0, players, COPY_CHUNK):
                buf = io.StringIO()
                for i in range(start, min(players, start + COPY_CHUNK)):
                    pid, region = f"p{i:08d}", region_of(i)
                    buf.write(f"{sid}\t{pid}\t\\N\t{scores[i]}\t1\tload-{pid}\t{ts}\t{i // 1000 + 1}\t{region}\t"
                              f"{region}\n")
                    if i % MOVE_EVERY == 0:
                        buf.write(f"{sid}\t{pid}\t{scores[i]}\t{scores[i]}\t1\tregion:2\t{ts}\t{i // 1000 + 1}\t"
                                  f"{region}\teu\n")
                copy.write(buf.getvalue())
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE leaderboard_playerscore")
        cursor.execute("ANALYZE leaderboard_scorechange")
    return time.perf_counter() - started


def timed(fn: Callable[[], Any], runs: int) -> tuple[list[float], Any]:
    out, result = [], None
    for _ in range(runs):
        started = time.perf_counter()
        result = fn()
        out.append((time.perf_counter() - started) * 1000)
    return out, result


def measure(players: int, args: argparse.Namespace) -> dict[str, Any]:
    from django.core.cache import cache
    from django.db import connection

    from leaderboard.models import ScoreChange
    from seasons.models import Season
    from seasons.staff.players.selectors import player_regions
    from seasons.staff.season.selectors import season_region_sizes

    season = benchenv.season_new("regions")
    Season.objects.filter(pk=season.pk).update(regions=REGIONS)
    season.refresh_from_db()
    try:
        load_seconds = season_load(season, players)
        print(f"# {players:,} players and {players + players // MOVE_EVERY:,} stream rows loaded in "
              f"{load_seconds:.1f}s", flush=True)

        def sizes() -> Any:
            cache.clear()
            return season_region_sizes(season=season)

        def count_all() -> int:
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM leaderboard_playerscore WHERE season_id = %s", [season.pk])
                return int(cursor.fetchone()[0])

        movers = [f"p{i:08d}" for i in random.Random(2).sample(range(0, players, MOVE_EVERY), args.runs)]
        turn = iter(movers * 2)

        def history() -> Any:
            return player_regions(player_id=next(turn))

        turn_scan = iter(movers * 2)

        def scan() -> Any:
            return list(ScoreChange.objects.filter(player_id=next(turn_scan), event_id__contains="region:")
                        .values_list("season_id", "old_region", "region", "event_id", "txid", "id"))

        sizes_ms, result = timed(sizes, args.runs)
        assert result.players == players and sum(r.players for r in result.sizes) == players
        count_ms, counted = timed(count_all, args.runs)
        assert counted == players
        history_ms, regions = timed(history, args.runs)
        assert [len(s.moves) for s in regions.seasons] == [1]
        scan_ms, moves = timed(scan, args.runs)
        assert len(moves) == 1
        return {"players": players, "sizes": sizes_ms, "count": count_ms, "history": history_ms, "scan": scan_ms}
    finally:
        benchenv.season_cleanup(season, keep=args.keep)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], epilog=(__doc__ or "").split("\n\n", 1)[-1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--players", default="100k,1M", help="season sizes, comma-separated (e.g. 100k,1M)")
    parser.add_argument("--runs", type=int, default=7, help="runs of each read (medians)")
    benchenv.add_common_args(parser)
    args = parser.parse_args(argv)
    benchenv.environment_prepare(args)
    print(benchenv.machine_line())
    results = [measure(n, args) for n in benchenv.parse_counts(args.players)]
    median = benchenv.median
    print()
    print("## Staff console region reads (ms, medians)")
    print()
    print(benchenv.table(
        ["players", "players per region", "count(*) baseline", "ratio", "player's region history",
         "moves by scan (no index)", "scan / history"],
        [(benchenv.human(m["players"]), median(m["sizes"]), median(m["count"]), median(m["sizes"]) / median(m["count"]),
          median(m["history"]), median(m["scan"]), median(m["scan"]) / median(m["history"])) for m in results],
    ))
    print()
    print("players per region: the GROUP BY, uncached; count(*): the season's players counted, no grouping.")
    print("region history: the whole selector (5 queries); scan: the moves query alone, without the partial index.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
