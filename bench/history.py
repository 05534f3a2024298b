#!/usr/bin/env python
"""Hourly snapshots and players' histories at N players: what a snapshot costs to take and
store, and what a 30-day history and a rank_24h_ago miss cost to read.

1. A season of N players (bench/loader.py's scores and one ledger event each, COPY; no
   Redis views: snapshots and histories are database reads) and --days versions, one
   a day, published a minute before each midnight (UTC) of the last --days days.
2. --sampled players get a ledger event per version, their score climbing to their loaded
   one, so each midnight finds them at another score (another chunk of the histogram).
3. The last --taken midnights' snapshots are taken by the service itself (timed: the GROUP
   BY over the current scores and the chunks' write); the older ones are copies of those
   rows (INSERT ... SELECT), so the history has a snapshot every day without N x days of
   GROUP BY.
4. --runs rounds, each of --reads reads of each kind over random sampled players,
   interleaved: the baseline (the player's current score, one indexed row), a history of
   --days days (player_history_get: the player's events, one chunk a day), the answer of
   GET .../history through Django and DRF (in process, no socket), and one snapshot's place
   (what a rank read's rank_24h_ago costs when its rank is not kept yet).

Prints p50 and p99 per kind (medians over the rounds) and the ratios to the baseline, the
snapshot's time and bytes. The machine is shared with other work: compare the kinds of one
run, not runs of different days.

    SECRET_KEY=x .venv/bin/python bench/history.py --players 10M --figures none
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchenv  # noqa: E402
import loader  # noqa: E402


def _versions(season: Any, days: int) -> list[datetime]:
    """One Manifest row a day (versions 1..days), published a minute before each of the
    last `days` midnights; the midnights, oldest first. Their watermark is the stream's
    start: the loader writes no change stream, so each is the current table."""
    from leaderboard.core.history import midnights
    from leaderboard.models import Manifest

    nights = midnights(today=datetime.now(UTC).date(), days=days)
    Manifest.objects.bulk_create([
        Manifest(season=season, version=v, as_of=night - timedelta(minutes=1), watermark_txid=0, watermark_id=0,
                 copy="a", layout=season.layout, buckets=[], total_players=0,
                 published_at=night - timedelta(minutes=1)) for v, night in enumerate(nights, start=1)])
    return nights


def _sampled_events(season: Any, scores: Any, players: list[int], days: int) -> None:
    """A ledger event per version for each sampled player: at version v, v/days of their
    loaded score (the last one their score)."""
    import io

    from django.db import connection, transaction

    ts = datetime.now(UTC).isoformat()
    buf = io.StringIO()
    for i in players:
        pid = f"p{i:08d}"
        for v in range(1, days + 1):
            score = scores[i] * v // days
            buf.write(f"{season.pk}\th-{pid}-{v}\th\t{pid}\t{score}\t{v + 1}\t{ts}\tresult\t\t-\tapplied\t\t"
                      f"{score}\t{v + 1}\t{v}\t{ts}\n")
    with transaction.atomic(), connection.cursor() as cursor:
        with cursor.cursor.copy(
                "COPY leaderboard_scoreevent (season_id, event_id, match_id, player_id, best_score, score_version, "
                "completed_at, kind, reason, payload_hash, status, status_reason, score_after, version_after, "
                "pending_version, received_at) FROM STDIN") as copy:
            copy.write(buf.getvalue())
        cursor.execute("ANALYZE leaderboard_scoreevent")


def _snapshots(season: Any, nights: list[datetime], taken: int) -> list[float]:
    """The last `taken` midnights' snapshots by the service (seconds each); the older ones
    copied from the first of those."""
    from django.db import connection

    from leaderboard.history.services import season_snapshot_take
    from leaderboard.models import SeasonSnapshot

    seconds = []
    for night in nights[-taken:]:
        started = time.perf_counter()
        snapshot = season_snapshot_take(season=season, taken_for=night)
        seconds.append(time.perf_counter() - started)
        assert snapshot is not None
        print(f"# snapshot of {night:%Y-%m-%d}: version {snapshot.version}, {snapshot.total_players:,} players, "
              f"{snapshot.distinct_values:,} values, {seconds[-1]:.2f}s ({snapshot.took_ms / 1000:.2f}s counting)",
              flush=True)
    source = SeasonSnapshot.objects.get(season=season, taken_for=nights[-taken])
    for version, night in enumerate(nights[:-taken], start=1):
        copy = SeasonSnapshot.objects.create(
            season=season, taken_for=night, version=version, total_players=source.total_players,
            distinct_values=source.distinct_values, taken_at=source.taken_at, took_ms=source.took_ms)
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO leaderboard_snapshotchunk (snapshot_id, low, above, chunk_values, chunk_counts) "
                "SELECT %s, low, above, chunk_values, chunk_counts FROM leaderboard_snapshotchunk "
                "WHERE snapshot_id = %s", [copy.pk, source.pk])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE leaderboard_snapshotchunk")
    return seconds


def _storage(season: Any) -> tuple[int, int, int]:
    """(chunks, bytes of chunk data, table bytes incl. indexes and TOAST) per snapshot."""
    from django.db import connection

    from leaderboard.models import SeasonSnapshot

    snapshots = SeasonSnapshot.objects.filter(season=season).count()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*), sum(octet_length(chunk_values) + octet_length(chunk_counts)) "
                       "FROM leaderboard_snapshotchunk c JOIN leaderboard_seasonsnapshot s ON s.id = c.snapshot_id "
                       "WHERE s.season_id = %s", [season.pk])
        chunks, data = cursor.fetchone()
        cursor.execute("SELECT pg_total_relation_size('leaderboard_snapshotchunk')")
        (table,) = cursor.fetchone()
    return chunks // snapshots, int(data) // snapshots, int(table) // snapshots


WARM_UP = 20


def run_round(season: Any, sampled: list[int], *, reads: int, days: int, rnd: random.Random) -> dict[str, list[float]]:
    from rest_framework.test import APIClient

    from leaderboard.history.selectors import SNAPSHOT_FIELDS, player_history_get, snapshot_places
    from leaderboard.models import PlayerScore, SeasonSnapshot

    today = datetime.now(UTC).date()
    newest = SeasonSnapshot.objects.filter(season=season).order_by("-taken_for").values_list(
        *SNAPSHOT_FIELDS).first()
    assert newest is not None
    client = APIClient()

    def baseline(pid: str) -> None:
        PlayerScore.objects.filter(season=season, player_id=pid).values_list("score", flat=True).first()

    def history(pid: str) -> None:
        places = player_history_get(season=season, player_id=pid, days=days, today=today)
        assert len(places) == days, (pid, len(places))

    def history_http(pid: str) -> None:
        response = client.get(f"/v1/seasons/{season.slug}/players/{pid}/history?days={days}")
        assert response.status_code == 200 and len(response.json()["entries"]) == days, response.content[:200]

    def one_snapshot(pid: str) -> None:
        snapshot_places(season=season, player_id=pid, snapshots=[newest])

    kinds: dict[str, Callable[[str], None]] = {"baseline": baseline, "history": history,
                                               "history_http": history_http, "one_snapshot": one_snapshot}
    out: dict[str, list[float]] = {kind: [] for kind in kinds}
    for read in kinds.values():  # warm-up, not timed: the first reads of a process set up its caches
        for i in sampled[:WARM_UP]:
            read(f"p{i:08d}")
    for _ in range(reads):
        pid = f"p{rnd.choice(sampled):08d}"
        order = list(kinds)
        rnd.shuffle(order)
        for kind in order:
            started = time.perf_counter()
            kinds[kind](pid)
            out[kind].append((time.perf_counter() - started) * 1000)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], epilog=(__doc__ or "").split("\n\n", 1)[-1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--players", default="10M", help="players in the season (e.g. 1M, 10M)")
    parser.add_argument("--days", type=int, default=30, help="versions and midnights, one a day (history?days=)")
    parser.add_argument("--taken", type=int, default=3, help="snapshots taken by the service (timed)")
    parser.add_argument("--sampled", type=int, default=2000, help="players with an event per version")
    parser.add_argument("--reads", type=int, default=1000, help="reads of each kind per round")
    parser.add_argument("--runs", type=int, default=3, help="rounds (medians are reported)")
    parser.add_argument("--seed", type=int, default=1)
    benchenv.add_common_args(parser)
    args = parser.parse_args(argv)
    players = benchenv.parse_counts(args.players)[0]
    benchenv.environment_prepare(args)
    print(benchenv.machine_line())
    from django.conf import settings as django_settings

    from seasons.models import Season

    # Reads are limited per address like any read; the benchmark is one address.
    django_settings.READ_RATE_LIMIT = None
    rnd = random.Random(args.seed)
    scores = loader.scores_generate(players, seed=args.seed)
    season = Season.objects.get(pk=benchenv.season_new("history", layout=loader.layout_for(scores, "uniform")).pk)
    try:
        seconds = loader.ledger_copy(season, scores, with_events=True)
        print(f"# {season.slug}: {players:,} players and their events copied in {seconds:.1f}s", flush=True)
        nights = _versions(season, args.days)
        sampled = rnd.sample(range(players), min(args.sampled, players))
        _sampled_events(season, scores, sampled, args.days)
        taken = _snapshots(season, nights, args.taken)
        chunks, data, table = _storage(season)
        rounds = [run_round(season, sampled, reads=args.reads, days=args.days, rnd=rnd) for _ in range(args.runs)]
        rows = []
        base_p50 = benchenv.median([benchenv.percentile(r["baseline"], 50) for r in rounds])
        base_p99 = benchenv.median([benchenv.percentile(r["baseline"], 99) for r in rounds])
        for kind, label in (("baseline", "the player's current score (1 indexed row): baseline"),
                            ("history", f"history of {args.days} days (player_history_get)"),
                            ("history_http", f"GET .../history?days={args.days} through Django and DRF"),
                            ("one_snapshot", "one snapshot's place (a rank_24h_ago not kept yet)")):
            p50 = benchenv.median([benchenv.percentile(r[kind], 50) for r in rounds])
            p99 = benchenv.median([benchenv.percentile(r[kind], 99) for r in rounds])
            rows.append((label, p50, p99, p50 / base_p50, p99 / base_p99))
        print(f"\nReads at {players:,} players, {args.sampled:,} sampled players, medians of {args.runs} rounds of "
              f"{args.reads:,} reads of each kind (ms)\n")
        print(benchenv.table(["read", "p50", "p99", "p50 x baseline", "p99 x baseline"], rows))
        print(f"\nSnapshot: {benchenv.median(taken):.2f}s to take (median of {len(taken)}), {chunks:,} chunks, "
              f"{data / 1e6:.2f} MB of histogram, {table / 1e6:.2f} MB of table with its index a snapshot")
        benchenv.figures_record("history_read_p99_ms", benchenv.median([benchenv.percentile(r["history"], 99)
                                                                        for r in rounds]), "ms",
                                note=f"{players:,} players, {args.days} days", path=args.figures)
        benchenv.figures_record("snapshot_seconds", benchenv.median(taken), "s", note=f"{players:,} players",
                                path=args.figures)
    finally:
        benchenv.season_cleanup(season, keep=args.keep)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
