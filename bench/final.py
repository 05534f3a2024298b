#!/usr/bin/env python
"""FINAL standings with and without regions: what the regional places cost at approval and
what a region's page costs to read.

Two seasons get the same N players (bench/loader.py's scores, COPY into the current-scores
table, no Redis views): one without regions (the baseline) and one with three regions,
each player in one of them round robin (loader.region_of). Each run, alternating between
the two seasons, times in a transaction that is then rolled back (FINAL rows refuse DELETE):

1. `final_standings_write`: the INSERT ... SELECT with its window functions, then the hash;
2. `final_standings_hash` alone: the same hash taken again over the rows just written;
3. pages of 100 entries (after an ANALYZE) from the API's selectors at the first, middle and last position:
   the global standings, and one region's (`?region=`) in the season with regions.

Prints the medians over --runs and the ratios to the baseline, and the query plan of a
region's page (the partial index on (season, region, regional_position)). The machine is
shared with other work: compare the two seasons of one run, not runs of different days.

    SECRET_KEY=x .venv/bin/python bench/final.py --players 1M --runs 5
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchenv  # noqa: E402
import loader  # noqa: E402

REGIONS = ("na", "eu", "apac")
PAGE = 100
PAGE_READS = 50  # per place and run: a page read takes well under a millisecond


class _Rollback(Exception):
    """Raised to leave the run's transaction without keeping its FINAL rows."""


def _timed(action: Callable[[], Any]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def _page_ms(read: Callable[[int], list[Any]], first: int) -> float:
    """Median milliseconds of reading one page from `first`, over PAGE_READS reads."""
    times = []
    for _ in range(PAGE_READS):
        started = time.perf_counter()
        rows = read(first)
        times.append((time.perf_counter() - started) * 1000)
        assert rows, first
    return benchenv.median(times)


def run_once(season: Any, players: int, *, explain: bool) -> dict[str, float]:
    from django.db import connection, transaction

    from seasons.selectors import final_regional_window, final_standings_window
    from seasons.services import final_standings_hash, final_standings_write

    out: dict[str, float] = {}
    try:
        with transaction.atomic():
            out["write_s"] = _timed(lambda: final_standings_write(season=season))
            out["hash_s"] = _timed(lambda: final_standings_hash(season_id=season.pk))
            with connection.cursor() as cursor:
                # Statistics as the committed rows would soon have them: without, the planner
                # guesses at rows it has never seen and the page reads measure that guess.
                cursor.execute("ANALYZE seasons_finalstanding")
            for name, first in (("first", 1), ("middle", players // 2), ("last", players - PAGE + 1)):
                out[f"global_{name}_ms"] = _page_ms(
                    lambda k: final_standings_window(season=season, from_position=k, limit=PAGE), first)
            if season.regions:
                region_players = sum(1 for i in range(players) if loader.region_of(i, season.regions) == "na")
                for name, first in (("first", 1), ("middle", region_players // 2),
                                    ("last", region_players - PAGE + 1)):
                    out[f"region_{name}_ms"] = _page_ms(
                        lambda k: final_regional_window(season=season, region="na", from_position=k, limit=PAGE),
                        first)
                if explain:
                    _plan_print(season, region_players // 2)
            raise _Rollback
    except _Rollback:
        pass
    return out


def _plan_print(season: Any, first: int) -> None:
    from django.db import connection

    from seasons.models import FinalStanding

    query = (FinalStanding.objects.filter(season=season, region="na", regional_position__gte=first)
             .order_by("regional_position")[:PAGE])
    sql, params = query.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {sql}", params)
        print("# plan of a region's page:\n#   " + "\n#   ".join(row[0] for row in cursor.fetchall()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], epilog=(__doc__ or "").split("\n\n", 1)[-1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--players", default="1M", help="players per season (e.g. 100k, 1M)")
    parser.add_argument("--runs", type=int, default=5, help="runs per season (medians are reported)")
    parser.add_argument("--seed", type=int, default=1)
    benchenv.add_common_args(parser)
    args = parser.parse_args(argv)
    players = benchenv.parse_counts(args.players)[0]
    benchenv.environment_prepare(args)
    print(benchenv.machine_line())
    from seasons.models import Season

    scores = loader.scores_generate(players, seed=args.seed)
    seasons = []
    try:
        for kind, regions in (("final-plain", ()), ("final-regions", REGIONS)):
            season = Season.objects.get(pk=benchenv.season_new(kind, regions=regions).pk)
            seasons.append(season)
            seconds = loader.ledger_copy(season, scores)
            print(f"# {season.slug}: {players:,} players copied in {seconds:.1f}s", flush=True)
        results: dict[str, list[dict[str, float]]] = {s.slug: [] for s in seasons}
        for run in range(args.runs):
            for season in seasons if run % 2 == 0 else reversed(seasons):
                results[season.slug].append(run_once(season, players, explain=run == 0))
            print(f"# run {run + 1}/{args.runs} done", flush=True)
        plain, regional = ({k: benchenv.median([r[k] for r in results[s.slug]]) for k in results[s.slug][0]}
                           for s in seasons)
        rows = []
        for key, label in (("write_s", "final_standings_write (s)"), ("hash_s", "final_standings_hash (s)")):
            rows.append((label, plain[key], regional[key], regional[key] / plain[key]))
        for name in ("first", "middle", "last"):
            rows.append((f"page of {PAGE} at the {name} position (ms)", plain[f"global_{name}_ms"],
                         regional[f"global_{name}_ms"], regional[f"global_{name}_ms"] / plain[f"global_{name}_ms"]))
        for name in ("first", "middle", "last"):
            rows.append((f"region's page of {PAGE} at its {name} position (ms)", plain[f"global_{name}_ms"],
                         regional[f"region_{name}_ms"], regional[f"region_{name}_ms"] / plain[f"global_{name}_ms"]))
        print(f"\nFINAL standings of {players:,} players, medians of {args.runs} runs "
              f"(no regions = baseline; 3 regions, every player in one)\n")
        print(benchenv.table(["measure", "no regions", "3 regions", "ratio"], rows))
    finally:
        for season in seasons:
            benchenv.season_cleanup(season, keep=args.keep)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
