#!/usr/bin/env python
"""Bulk loader: N synthetic players into a fresh season's ledger, then both copies of its views.

1. PostgreSQL COPY (psycopg 3 `cursor.copy`) of N rows into leaderboard_playerscore
   (score_version 1), in player-id order. With --with-events, the matching ledger rows
   (leaderboard_scoreevent: one `result` event per player, status applied, with its real
   payload hash) are copied too; off by default because it doubles the load time and
   the views are built from the current-scores table alone.
2. The bucketed index, both copies its sides, is built with leaderboard.views.build.season_copies_build
   (one REPEATABLE READ snapshot each, under a fenced lease taken for the build), then
   season_epoch_run publishes version 1.
3. Prints the load time, build time and rates, Redis memory before/after each copy, and
   the shape of the score distribution.

Scores: skewed like a real season. 4% of players never scored (0); the rest follow a
Pareto law (alpha 1.1, scale 1,000), rounded to multiples of 10 and capped at 1,000,000:
median ~1,900, ~93% below 10,000 (the first bucket of the default 101 x 10,000 layout),
a long tail to 1,000,000 and many ties everywhere (including at the cap).

    SECRET_KEY=x .venv/bin/python bench/loader.py --players 1M
    SECRET_KEY=x .venv/bin/python bench/loader.py --players 10M       # ~3.5 GB of Redis

Importable: `load_season(players=..., ...)` returns a LoadResult (bench/epoch.py,
bench/memory.py, bench/reads.py and bench/freshness.py use it). Player ids are
`p%08d` (9 bytes), 0-based.
"""

from __future__ import annotations

import argparse
import io
import random
import sys
import time
from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchenv  # noqa: E402

MAX_SCORE = 1_000_000
COPY_CHUNK = 100_000
COPY_TRANSACTION = 1_000_000
BUILD_LEASE_MS = 6 * 3600 * 1000


def player_id(i: int) -> str:
    return f"p{i:08d}"


def scores_generate(n: int, *, seed: int = 1, distribution: str = "pareto") -> array:
    """N scores (array of int32), deterministic for a seed."""
    rng = random.Random(seed)
    out = array("i", bytes(4 * n))
    if distribution == "uniform":
        for i in range(n):
            out[i] = rng.randint(0, MAX_SCORE)
        return out
    if distribution != "pareto":
        raise ValueError(f"unknown distribution {distribution!r}")
    pareto = rng.paretovariate
    rand = rng.random
    for i in range(n):
        if rand() < 0.04:
            continue  # never scored: 0
        score = int(1000 * pareto(1.1)) // 10 * 10
        out[i] = score if score < MAX_SCORE else MAX_SCORE
    return out


def distribution_summary(scores: array, bucket_width: int = 10_000) -> str:
    n = len(scores)
    if n == 0:
        return "empty"
    step = max(1, n // 200_000)
    sample = sorted(scores[::step])
    buckets = Counter(s // bucket_width for s in scores[::step])
    biggest = buckets.most_common(1)[0][1] / len(sample)
    at_cap = sum(1 for s in scores if s == MAX_SCORE)
    return (f"median {sample[len(sample) // 2]:,}, p99 {sample[int(len(sample) * 0.99)]:,}, "
            f"max {sample[-1]:,}; largest bucket holds {biggest:.0%}; {at_cap:,} players tied at {MAX_SCORE:,}; "
            f"~{len(set(sample)):,} distinct scores in a {len(sample):,} sample")


def layout_for(scores: array, kind: str, *, max_share: float = 1 / 64, max_score: int = MAX_SCORE) -> Any:
    """The season's bucket layout over 0..max_score: `uniform` (the default 101 x 10,000
    points; over a wider range, about 100 buckets) or `split`.

    `split` adds boundaries at score quantiles to the uniform ones, so that no bucket
    holds more than ~max_share of the players unless a single score value does (a
    boundary is a score, ties are never split): what the hot-bucket split of a crowded
    score range produces.
    """
    from leaderboard.core.buckets import BucketLayout

    uniform = BucketLayout.uniform(max_score=max_score)
    if kind == "uniform":
        return uniform
    if kind != "split":
        raise ValueError(f"unknown layout {kind!r}")
    step = max(1, len(scores) // 500_000)
    sample = sorted(scores[::step])
    size = max(1, int(len(sample) * max_share))
    points = {sample[j] for j in range(size, len(sample), size) if sample[j] > 0}
    return uniform.split(at=sorted(points - set(uniform.lower_bounds)), layout_id=2)


def layout_summary(scores: array, layout: Any) -> str:
    from collections import Counter

    step = max(1, len(scores) // 500_000)
    sample = scores[::step]
    counts = Counter(layout.bucket_of(s) for s in sample)
    biggest = max(counts.values()) / len(sample)
    return f"{layout.size} buckets, the largest holds {biggest:.1%} of the players"


# ------------------------------------------------------------------------------ ledger


def region_of(i: int, regions: Sequence[str]) -> str:
    """The region the loader gives player i in a season with `regions` (round robin)."""
    return regions[i % len(regions)] if regions else ""


def ledger_copy(season: Any, scores: array, *, with_events: bool = False, first_player: int = 0,
                verbose: bool = False) -> float:
    """COPY the players (and optionally their ledger events) into PostgreSQL; seconds taken.
    In a season with regions each player gets one (region_of).

    `first_player`: resume a load cut short; players below it are in already (each
    transaction of COPY_TRANSACTION players commits both tables, so `ledger_loaded`
    tells where to resume)."""
    from datetime import UTC, datetime

    from django.db import connection, transaction

    from leaderboard.core.events import ScoreEvent

    started = time.perf_counter()
    now = datetime.now(UTC)
    ts = now.isoformat()
    sid = season.pk
    regions = list(season.regions)
    n = len(scores)
    # One transaction per COPY_TRANSACTION players: progress is committed as it goes, and a
    # failure part-way costs at most one transaction's rows.
    for first in range(first_player, n, COPY_TRANSACTION):
        if verbose and first > first_player:
            elapsed = time.perf_counter() - started
            print(f"#   COPY: {first:,}/{n:,} players ({(first - first_player) / elapsed:,.0f} players/s)",
                  flush=True)
        last = min(n, first + COPY_TRANSACTION)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit = off")
            raw = cursor.cursor  # the psycopg 3 cursor under Django's wrapper
            with raw.copy("COPY leaderboard_playerscore (season_id, player_id, score, score_version, updated_at, "
                          "region) FROM STDIN") as copy:
                for start in range(first, last, COPY_CHUNK):
                    stop = min(last, start + COPY_CHUNK)
                    buf = io.StringIO()
                    write = buf.write
                    for i in range(start, stop):
                        write(f"{sid}\tp{i:08d}\t{scores[i]}\t1\t{ts}\t{region_of(i, regions)}\n")
                    copy.write(buf.getvalue())
            if not with_events:
                continue
            with raw.copy(
                "COPY leaderboard_scoreevent (season_id, event_id, match_id, player_id, best_score, score_version, "
                "completed_at, kind, reason, payload_hash, status, status_reason, score_after, version_after, "
                "pending_version, received_at) FROM STDIN"
            ) as copy:
                for start in range(first, last, COPY_CHUNK):
                    stop = min(last, start + COPY_CHUNK)
                    buf = io.StringIO()
                    write = buf.write
                    for i in range(start, stop):
                        pid = f"p{i:08d}"
                        digest = ScoreEvent(event_id=f"load-{pid}", match_id="load", player_id=pid,
                                            best_score=scores[i], score_version=1, completed_at=now).payload_hash()
                        write(f"{sid}\tload-{pid}\tload\t{pid}\t{scores[i]}\t1\t{ts}\tresult\t\t{digest}\t"
                              f"applied\t\t{scores[i]}\t1\t1\t{ts}\n")
                    copy.write(buf.getvalue())
    with connection.cursor() as cursor:
        # ANALYZE reads a sample of fixed size: seconds at 50M rows, not a scan.
        cursor.execute("ANALYZE leaderboard_playerscore")
        if with_events:
            cursor.execute("ANALYZE leaderboard_scoreevent")
    return time.perf_counter() - started


def ledger_loaded(season: Any) -> int:
    """Players of the season already in the current-scores table (where a cut-short COPY resumes)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM leaderboard_playerscore WHERE season_id = %s", [season.pk])
        return int(cursor.fetchone()[0])


# ------------------------------------------------------------------------------- views


def redis_used_memory(r: Any) -> int:
    """used_memory once the lazy-free thread is idle (an UNLINKed season would still be shrinking it)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        info = r.info("memory")
        if int(info.get("lazyfree_pending_objects", 0)) == 0:
            return int(info["used_memory"])
        time.sleep(0.2)
    return int(r.info("memory")["used_memory"])


@dataclass
class LoadResult:
    season: Any
    players: int
    scores: array
    copy_seconds: float
    build_seconds: list[float] = field(default_factory=list)
    publish_seconds: float = 0.0
    memory_before: int = 0
    memory_after_copy: list[int] = field(default_factory=list)

    @property
    def memory_per_player(self) -> float:
        return (self.memory_after_copy[-1] - self.memory_before) / max(1, self.players)


def views_build(result: LoadResult, *, verbose: bool = True) -> None:
    """Build both copies from the current-scores table, then publish version 1."""
    from leaderboard.recovery.rebuild import season_epoch_advance
    from leaderboard.redis_client import redis_get
    from leaderboard.views import rankview
    from leaderboard.views.build import season_copies_build
    from leaderboard.views.epoch import COPIES, season_lease_acquire
    from leaderboard.views.season_index import season_keys

    season = result.season
    r = redis_get()
    keys = season_keys(season)
    result.memory_before = redis_used_memory(r)
    # A build of millions of players outlasts the epoch lease (EPOCH_LEASE_SECONDS); the
    # loader takes its own fenced lease long enough for the whole build.
    token = season_lease_acquire(season=season, r=r, ttl_ms=BUILD_LEASE_MS)
    if token is None:
        raise SystemExit(f"season {season.slug} is leased by someone else")
    try:
        started = time.perf_counter()
        progress = _Progress("index") if verbose else None
        season_copies_build(season=season, copies=list(COPIES), layout=season.bucket_layout, r=r, token=token,
                            progress=progress)
        result.build_seconds.append(time.perf_counter() - started)
        result.memory_after_copy.append(redis_used_memory(r))
        if progress is not None:
            progress.done()
    finally:
        rankview.lease_release(r, keys, token)
    started = time.perf_counter()
    outcome = season_epoch_advance(season=season, r=r)
    result.publish_seconds = time.perf_counter() - started
    if outcome.status != "published" or outcome.version != 1:
        raise SystemExit(f"publishing version 1 failed: {outcome}")


class _Progress:
    def __init__(self, label: str):
        self.label = label
        self.total = 0
        self.started = time.perf_counter()
        self.last = 0.0

    def start(self, total: int) -> None:
        self.total = total

    def advance(self, done: int) -> None:
        now = time.perf_counter()
        if now - self.last >= 10 and self.total:
            self.last = now
            elapsed = now - self.started
            print(f"#   {self.label}: {done:,}/{self.total:,} ({done / elapsed:,.0f} players/s)", flush=True)

    def done(self) -> None:
        pass


def load_season(*, players: int, seed: int = 1, distribution: str = "pareto", with_events: bool = False,
                kind: str = "load", layout: str = "uniform", verbose: bool = True,
                regions: Sequence[str] = (), mode: str = "best", scale: int = 1, order: str = "desc") -> LoadResult:
    """A fresh season with `players` players in the ledger and both copies built; version 1
    published. `regions`: the season's regions, each player in one (region_of); `mode`:
    the season's, `order` too; `scale`: every score times it, over a range of 0..MAX_SCORE * scale
    (the same distribution on a wider range: `--max-score`)."""
    from seasons.models import Season

    started = time.perf_counter()
    scores = scores_generate(players, seed=seed, distribution=distribution)
    if scale != 1:
        scores = array("q", (s * scale for s in scores))
    gen_seconds = time.perf_counter() - started
    bucket_layout = layout_for(scores, layout, max_score=MAX_SCORE * scale)
    season = benchenv.season_new(kind, layout=bucket_layout, regions=regions, mode=mode, order=order)
    season = Season.objects.get(pk=season.pk)
    if verbose:
        print(f"# season {season.slug}: {players:,} players generated in {gen_seconds:.1f}s "
              f"({distribution_summary(scores)}); {layout} layout: {layout_summary(scores, bucket_layout)}",
              flush=True)
    try:
        copy_seconds = ledger_copy(season, scores, with_events=with_events)
        if verbose:
            print(f"# COPY into PostgreSQL: {copy_seconds:.1f}s ({players / copy_seconds:,.0f} players/s"
                  f"{', with ledger events' if with_events else ''})", flush=True)
        result = LoadResult(season=season, players=players, scores=scores, copy_seconds=copy_seconds)
        views_build(result, verbose=verbose)
    except BaseException:
        benchenv.season_cleanup(season, keep=False, quiet=not verbose)
        raise
    return result


def report(result: LoadResult) -> str:
    n = result.players
    mb = 1024 * 1024
    rows = [("COPY into PostgreSQL", result.copy_seconds, n / result.copy_seconds, "-")]
    previous = result.memory_before
    for copy, (seconds, mem) in enumerate(zip(result.build_seconds, result.memory_after_copy, strict=True)):
        rows.append((f"build copy {copy}", seconds, n / seconds, f"{(mem - previous) / n:.0f}"))
        previous = mem
    rows.append(("publish version 1", result.publish_seconds, float("nan"), "-"))
    total = result.copy_seconds + sum(result.build_seconds) + result.publish_seconds
    rows.append(("total", total, n / total, f"{result.memory_per_player:.0f}"))
    out = benchenv.table(["step", "seconds", "players/s", "Redis bytes/player"], rows)
    return (out + f"\n\nRedis used_memory: {result.memory_before / mb:,.0f} MB before, "
            f"{result.memory_after_copy[-1] / mb:,.0f} MB after both copies")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], epilog=(__doc__ or "").split("\n\n", 1)[-1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--players", default="1M", help="players to load (e.g. 100k, 1M, 10M)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the score generator")
    parser.add_argument("--distribution", choices=["pareto", "uniform"], default="pareto",
                        help="score distribution (pareto: skewed, see above)")
    parser.add_argument("--layout", choices=["uniform", "split"], default="uniform",
                        help="bucket layout: uniform (default 101 x 10,000) or split (hot ranges split at "
                             "score quantiles, no bucket over ~1/64 of the players)")
    parser.add_argument("--with-events", action="store_true",
                        help="also COPY one ledger event per player (append-only: never deleted afterwards)")
    parser.add_argument("--check", action="store_true",
                        help="run the invariant checker (sampled ranks) on version 1 afterwards")
    benchenv.add_common_args(parser)
    args = parser.parse_args(argv)
    (players,) = benchenv.parse_counts(args.players)
    benchenv.environment_prepare(args)
    print(benchenv.machine_line())
    result = load_season(players=players, seed=args.seed, distribution=args.distribution,
                         with_events=args.with_events, layout=args.layout)
    try:
        print()
        print(f"## loader: {players:,} players, season {result.season.slug}")
        print()
        print(report(result))
        if args.check:
            from leaderboard.redis_client import redis_get
            from leaderboard.views.invariants import version_check
            from leaderboard.views.season_index import season_keys

            started = time.perf_counter()
            check = version_check(r=redis_get(), keys=season_keys(result.season), sample=200, seed=1)
            print(f"\ninvariants on version 1 ({time.perf_counter() - started:.1f}s): "
                  f"{'ok' if check.ok else 'FAILED'} ({len(check.findings)} checks) {check.failures() or ''}")
    finally:
        benchenv.season_cleanup(result.season, keep=args.keep)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


# Countries the benchmark's players come from, and the share of players with a name.
NAME_COUNTRIES = ("US", "DE", "BR", "JP", "KR", "FR", "PL", "SE", "IN", "MX")


def names_load(players: int) -> int:
    """Names and countries for 9 players of 10 (the rest have none), as the profile service
    would have written them: every read then fetches real names (views.names)."""
    from django.conf import settings

    from leaderboard.redis_client import redis_get
    from leaderboard.views.names import names_store

    r = redis_get()
    named = 0
    batch = 20_000
    for start in range(0, players, batch):
        rows = [(player_id(i), f"Player {i:,}", NAME_COUNTRIES[i % len(NAME_COUNTRIES)])
                for i in range(start, min(players, start + batch)) if i % 10]
        names_store(r, prefix=settings.REDIS_KEY_PREFIX, names=rows)
        named += len(rows)
    return named


def movement_load(season: str, scores: array) -> int:
    """rank_24h_ago's snapshot named (a made-up id) and every player's rank in it kept, as
    a season's players leave them after their first rank read of the hour: every rank read
    then takes the kept rank from its first round trip (leaderboard.history.selectors)."""
    from bisect import bisect_right

    from django.conf import settings

    from leaderboard.redis_client import redis_get
    from leaderboard.views.rankview.keys import Keys

    r = redis_get()
    key = Keys(settings.REDIS_KEY_PREFIX, season).moved
    ordered = sorted(scores)
    n = len(scores)
    r.unlink(key)
    r.hset(key, "", "1")
    batch = 20_000
    for start in range(0, n, batch):
        r.hset(key, mapping={player_id(i): f"1:{n - bisect_right(ordered, scores[i]) + 1}"
                             for i in range(start, min(n, start + batch))})
    return n
