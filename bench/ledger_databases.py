#!/usr/bin/env python
"""Ingest of a season split over two ledger databases against the same season in one, same run.

Prints figures; it is not a test. Both seasons have 8 ledger partitions; the split one
keeps partitions 0-3 in the benchmark database ("default") and puts 4-7 in a second
database of the same PostgreSQL server (`<database>_b`, LEDGER_PARTITION_URLS), the one
season writes all 8 in "default". Each run applies the same pre-generated batches through
the write service in-process (events_parse -> score_events_apply: no HTTP), from
--writers threads that each own their players (so per-player order holds), once per
placement, ABBA-interleaved over the runs; each phase on a fresh season. Batches of
random players span both databases in the split season: it pays the event-id claims,
the season's session lock and one transaction per database.

    SECRET_KEY=x .venv/bin/python bench/ledger_databases.py --runs 4 --batches 30 --writers 2
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchenv  # noqa: E402

PLACEMENTS = ("one", "split")


def args_parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=4, help="runs; each applies the batches once per placement")
    parser.add_argument("--batches", type=int, default=30, help="batches per writer and phase")
    parser.add_argument("--batch-size", type=int, default=500, help="events per batch")
    parser.add_argument("--writers", type=int, default=2, help="concurrent writer threads")
    parser.add_argument("--players", type=int, default=20_000, help="distinct players")
    parser.add_argument("--seed", type=int, default=1)
    benchenv.add_common_args(parser)
    args = parser.parse_args(argv)
    if args.database_url is None:
        base = os.environ.get("DATABASE_URL") or benchenv.DEFAULT_DATABASE_URL
        args.database_url = urlunsplit(urlsplit(base)._replace(path="/bench_ledger"))
    return args


def ledger_url(database_url: str) -> str:
    parts = urlsplit(database_url)
    return urlunsplit(parts._replace(path=f"/{parts.path.lstrip('/')}_b"))


def batches_make(args: argparse.Namespace) -> list[list[list[dict[str, Any]]]]:
    """Per writer, its batches: events of random players of its own, each player's
    score_version rising in order of generation."""
    rng = random.Random(args.seed)
    per_writer = [[f"w{w}-p{i:06d}" for i in range(args.players // args.writers)] for w in range(args.writers)]
    version = 0
    out: list[list[list[dict[str, Any]]]] = []
    for players in per_writer:
        mine = []
        for b in range(args.batches):
            batch = []
            for player in rng.sample(players, args.batch_size):
                version += 1
                batch.append({"event_id": f"e{version}", "match_id": f"m{b}", "player_id": player,
                              "best_score": rng.randrange(1_000_000), "score_version": version,
                              "completed_at": "2026-11-15T12:00:00Z"})
            mine.append(batch)
        out.append(mine)
    return out


def phase(args: argparse.Namespace, *, run: int, placement: str,
          work: list[list[list[dict[str, Any]]]]) -> dict[str, Any]:
    from django.db import connections

    from audit.services import Actor
    from leaderboard.core.events import events_parse
    from leaderboard.ingest.services import score_events_apply
    from leaderboard.ledger_databases import ledger_aliases, ledger_placement_cache_clear
    from leaderboard.models import LedgerEventClaim
    from seasons.models import Season
    from seasons.services import season_create

    now = datetime.now(UTC)
    season = season_create(
        slug=f"bench-ledger-{os.getpid()}-r{run}-{placement}", name="bench ledger databases",
        starts_at=now - timedelta(days=20), cutoff=now + timedelta(days=30),
        actor=Actor(kind="system", id="", label="bench/ledger_databases.py"), partitions=8,
    )
    if placement == "one":
        Season.objects.filter(pk=season.pk).update(ledger_databases=[])
        season.refresh_from_db()
    ledger_placement_cache_clear()
    parsed = [[events_parse({"events": batch}) for batch in mine] for mine in work]
    latencies: list[float] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def write(mine: list[Any]) -> None:
        try:
            for events in mine:
                started = time.perf_counter()
                score_events_apply(season=season, events=events, client=None)
                with lock:
                    latencies.append(time.perf_counter() - started)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            for conn in connections.all(initialized_only=True):
                conn.close()

    load = os.getloadavg()[0]
    threads = [threading.Thread(target=write, args=(mine,)) for mine in parsed]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    if errors:
        raise errors[0]
    events = sum(len(b) for mine in work for b in mine)
    return {
        "run": run, "placement": placement, "events": events, "seconds": wall, "rate": events / wall,
        "p50_ms": 1000 * benchenv.percentile(latencies, 50), "p99_ms": 1000 * benchenv.percentile(latencies, 99),
        "databases": len(ledger_aliases(season=season)),
        "claims": LedgerEventClaim.objects.filter(season=season).count(), "load": load,
    }


def main(argv: list[str] | None = None) -> None:
    args = args_parse(argv)
    second = ledger_url(args.database_url)
    os.environ["LEDGER_PARTITION_URLS"] = f"4-7={second}"
    benchenv.database_create_if_missing(second)
    benchenv.environment_prepare(args)
    from django.core.management import call_command
    from django.db import connections

    from leaderboard.ledger_databases import ledger_aliases_configured

    for alias in ledger_aliases_configured()[1:]:
        call_command("migrate", database=alias, verbosity=0, interactive=False)
    print(benchenv.machine_line())
    print(f"# {args.writers} writers x {args.batches} batches x {args.batch_size} events of random players "
          f"({args.players:,}), 8 partitions; split: 0-3 in {urlsplit(args.database_url).path.lstrip('/')}, "
          f"4-7 in {urlsplit(second).path.lstrip('/')} (same server)")
    work = batches_make(args)
    rows = []
    for run in range(args.runs):
        order = PLACEMENTS if run % 2 == 0 else tuple(reversed(PLACEMENTS))
        for placement in order:
            result = phase(args, run=run, placement=placement, work=work)
            rows.append(result)
            print(f"# run {run} {placement}: {result['rate']:,.0f} events/s, p50 {result['p50_ms']:.0f} ms, "
                  f"load {result['load']:.2f}", flush=True)
    print(benchenv.table(
        ["run", "placement", "databases", "events/s", "batch p50 ms", "batch p99 ms", "claims", "load 1m"],
        [[r["run"], r["placement"], r["databases"], r["rate"], r["p50_ms"], r["p99_ms"], r["claims"], r["load"]]
         for r in rows]))
    medians = {p: statistics.median(r["rate"] for r in rows if r["placement"] == p) for p in PLACEMENTS}
    p50s = {p: statistics.median(r["p50_ms"] for r in rows if r["placement"] == p) for p in PLACEMENTS}
    print()
    for p in PLACEMENTS:
        print(f"median {p}: {medians[p]:,.0f} events/s, batch p50 {p50s[p]:.0f} ms")
    print(f"split / one: {medians['split'] / medians['one']:.2f}x events/s; load average now "
          f"{os.getloadavg()[0]:.2f}")
    for conn in connections.all(initialized_only=True):
        conn.close()


if __name__ == "__main__":
    main()
