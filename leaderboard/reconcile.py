"""Reconciliation of a published version against the ledger (docs/rules.md, FINAL candidate and approval).

The invariant checker proves a version is internally consistent; this proves it equals
the source of truth: player count, top 100, stratified sampled ranks recomputed on the
ledger as 1 + count(higher), and per-bucket checksums recomputed from the current-scores
table. Used for the FINAL candidate; it reads the whole season, so it is not per epoch.
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import redis
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Q
from django.utils import timezone

from leaderboard import rankview
from leaderboard.core.checksum import checksum_add
from leaderboard.core.manifest import Manifest
from leaderboard.core.reconciliation import Report, first_mismatch, stratified_positions
from leaderboard.core.tiebreak import FirstReached, IndexValue, value_score, value_token
from leaderboard.invariants import version_check
from leaderboard.models import PlayerScore, ReconciliationRun, ScoreChange
from leaderboard.redis_client import redis_get
from seasons.models import Season

_ORDER_PG = 'ORDER BY score DESC, player_id COLLATE "C"'
# SQLite compares text with BINARY collation by default: byte order, as docs/rules.md (Ranking) says.
_ORDER_SQLITE = "ORDER BY score DESC, player_id"
# First_reached seasons (docs/rules.md, Ties decided by who got there first); rows from
# before reached_at was recorded count as reached at the start (core.tiebreak).
_ORDER_REACHED_PG = 'ORDER BY score DESC, reached_at ASC NULLS FIRST, player_id COLLATE "C"'
# (SQLite sorts nulls first in ascending order.)
_ORDER_REACHED_SQLITE = "ORDER BY score DESC, reached_at ASC, player_id"

# What the reconciliation compares per player: the score, or (score, reached_ms).
Moved = dict[str, tuple[IndexValue | None, IndexValue | None]]


def display_order_sql(*, first_reached: bool = False) -> str:
    if connection.vendor == "postgresql":
        return _ORDER_REACHED_PG if first_reached else _ORDER_PG
    return _ORDER_REACHED_SQLITE if first_reached else _ORDER_SQLITE


def _rank_key(value: IndexValue) -> Any:
    """Larger is ahead: the score, or (score, -reached_ms) (earlier is ahead)."""
    return value if isinstance(value, int) else (value[0], -value[1])


class ScoreHistogram:
    """count(ahead of v) for any value v, from one GROUP BY over the ledger's current scores:
    players with a higher score, or on a first_reached board (`ties`) the same score
    reached earlier.

    `moved` maps players whose score changed after the version's watermark to their
    current value and their value at the watermark (None: not in the season then), so the
    histogram is the ledger's as of that watermark.
    """

    def __init__(self, season_id: int, moved: Moved | None = None, ties: FirstReached | None = None):
        counts: dict[Any, int] = {_rank_key(v): n for v, n in _histogram(season_id, ties)}
        for now, then in (moved or {}).values():
            if now is not None:
                counts[_rank_key(now)] -= 1
            if then is not None:
                counts[_rank_key(then)] = counts.get(_rank_key(then), 0) + 1
        rows = sorted((score, n) for score, n in counts.items() if n)
        self.scores = [score for score, _ in rows]
        self.at_or_below: list[int] = []
        running = 0
        for _, count in rows:
            running += count
            self.at_or_below.append(running)
        self.total = running

    def higher_than(self, score: IndexValue) -> int:
        index = bisect_right(self.scores, _rank_key(score))
        below = self.at_or_below[index - 1] if index else 0
        return self.total - below


def ledger_moved_since(*, season_id: int, watermark: tuple[int, int], ties: FirstReached | None = None) -> Moved:
    """Players changed after `watermark`: (current value, value at the watermark).

    The first change after the watermark carries the score before it (old_score, and
    old_reached_at), so the ledger as of any retained watermark is the current table plus
    these few rows.
    """
    moved: dict[str, IndexValue | None] = {}
    after = (
        ScoreChange.objects.filter(season_id=season_id)
        .filter(Q(txid__gt=watermark[0]) | Q(txid=watermark[0], id__gt=watermark[1]))
        .order_by("txid", "id")
        .values_list("player_id", "old_score", "old_reached_at")
    )
    for player_id, old_score, old_reached in after.iterator(chunk_size=20_000):
        if player_id not in moved:
            moved[player_id] = _value(ties, old_score, old_reached) if old_score is not None else None
    current = dict(_scores(season_id, ties, players=list(moved)))
    return {p: (current.get(p), then) for p, then in moved.items()}


def _value(ties: FirstReached | None, score: int, reached_at: datetime | None) -> IndexValue:
    return score if ties is None else (score, ties.reached_ms(reached_at))


def _histogram(season_id: int, ties: FirstReached | None = None) -> list[tuple[IndexValue, int]]:
    if ties is not None:
        rows = (PlayerScore.objects.filter(season_id=season_id).values("score", "reached_at")
                .annotate(n=Count("id")).order_by().values_list("score", "reached_at", "n"))
        return [(_value(ties, score, reached), int(n)) for score, reached, n in rows]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT score, count(*) FROM leaderboard_playerscore WHERE season_id = %s GROUP BY score ORDER BY score",
            [season_id],
        )
        return [(int(s), int(c)) for s, c in cursor.fetchall()]


def ledger_top(*, season_id: int, limit: int = 100, moved: Moved | None = None,
               ties: FirstReached | None = None) -> list[tuple[str, IndexValue]]:
    moved = moved or {}
    if ties is None:
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT player_id, score FROM leaderboard_playerscore WHERE season_id = %s {display_order_sql()} "
                "LIMIT %s",
                [season_id, limit + len(moved)],
            )
            rows: list[tuple[str, IndexValue]] = [(p, int(score)) for p, score in cursor.fetchall() if p not in moved]
    else:
        top = PlayerScore.objects.raw(
            f"SELECT id, player_id, score, reached_at FROM leaderboard_playerscore WHERE season_id = %s "
            f"{display_order_sql(first_reached=True)} LIMIT %s", [season_id, limit + len(moved)])
        rows = [(row.player_id, _value(ties, row.score, row.reached_at)) for row in top if row.player_id not in moved]
    rows += [(p, then) for p, (_, then) in moved.items() if then is not None]
    rows.sort(key=lambda row: (tuple(-x for x in _as_tuple(_rank_key(row[1]))), row[0].encode()))
    return rows[:limit]


def _as_tuple(key: Any) -> tuple[int, ...]:
    return key if isinstance(key, tuple) else (key,)


def ledger_bucket_checksums(
    *, season_id: int, manifest: Manifest, moved: Moved | None = None
) -> tuple[list[int], list[int]]:
    moved = moved or {}
    counts = [0] * manifest.layout.size
    checksums = [0] * manifest.layout.size

    def add(player_id: str, value: IndexValue) -> None:
        bucket = manifest.layout.bucket_of(value_score(value))
        counts[bucket] += 1
        checksums[bucket] = checksum_add(checksums[bucket], player_id, value_token(value))

    for player_id, value in _scores(season_id, manifest.ties):
        if player_id not in moved:
            add(player_id, value)
    for player_id, (_, then) in moved.items():
        if then is not None:
            add(player_id, then)
    return counts, checksums


def _scores(season_id: int, ties: FirstReached | None = None,
            players: list[str] | None = None) -> Iterator[tuple[str, IndexValue]]:
    """(player_id, value) of the season's current scores (of `players` only, when given)."""
    rows = PlayerScore.objects.filter(season_id=season_id)
    if players is not None:
        rows = rows.filter(player_id__in=players)
    if ties is None:
        yield from rows.values_list("player_id", "score").iterator(chunk_size=20_000)
        return
    for player_id, score, reached in rows.values_list("player_id", "score", "reached_at").iterator(chunk_size=20_000):
        yield player_id, _value(ties, score, reached)


def version_reconcile(
    *, r: redis.Redis, keys: rankview.Keys, season_id: int, version: int, sample: int = 1000, seed: int | None = None
) -> Report:
    """Every check of docs/rules.md (FINAL candidate and approval) on one version; each
    finding says what differs and by how much."""
    report = version_check(r=r, keys=keys, version=version, sample=sample, full=True, seed=seed)
    manifest = rankview.manifest_get(r, keys, version)
    unreadable = any(f.check in ("manifest", "copy", "published") for f in report.failures())
    if manifest is None or unreadable:
        return report

    outer = connection.in_atomic_block
    with transaction.atomic():
        if connection.vendor == "postgresql" and not outer:
            # One snapshot for every ledger read below: the table and the changes made
            # after the version's watermark then describe the same moment.
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        _ledger_checks(r=r, keys=keys, season_id=season_id, manifest=manifest, sample=sample, seed=seed,
                       report=report)
    return report


def _ledger_checks(*, r: redis.Redis, keys: rankview.Keys, season_id: int, manifest: Manifest, sample: int,
                   seed: int | None, report: Report) -> None:
    # The ledger keeps moving while a version stands still: compare with the ledger as of
    # the version's watermark (a recovery under sustained writes must still publish).
    ties = manifest.ties
    moved = ledger_moved_since(season_id=season_id, watermark=manifest.watermark, ties=ties)
    histogram = ScoreHistogram(season_id, moved, ties)
    report.add(
        "player_count",
        histogram.total == manifest.total,
        f"ledger {histogram.total}, version {manifest.total} (difference {manifest.total - histogram.total})",
    )
    report.add("bucket_count_sum", sum(manifest.counts) == manifest.total,
               f"sum of bucket counts {sum(manifest.counts)}, total {manifest.total}")

    expected_top = [
        {"position": i + 1, "rank": histogram.higher_than(value) + 1, "player_id": p, "score": value_score(value)}
        for i, (p, value) in enumerate(ledger_top(season_id=season_id, limit=100, moved=moved, ties=ties))
    ]
    report.add("top_100", manifest.top == expected_top, first_mismatch(expected_top, manifest.top))

    reader = rankview.RankReader(r, keys, deadline=3600)
    wrong: list[str] = []
    positions = stratified_positions(manifest.total, sample, seed=seed)
    sampled = []
    for position in positions:
        try:
            entries = reader.entries_at(manifest, position, 1)
        except rankview.Torn:
            wrong.append(f"position {position}: unreadable")
            continue
        sampled.extend(entries)
    ledger_scores: dict[str, IndexValue | None] = dict(
        _scores(season_id, ties, players=[e.player_id for e in sampled]))
    ledger_scores.update({p: then for p, (_, then) in moved.items()})
    for entry in sampled:
        ledger_score = ledger_scores.get(entry.player_id)
        if ledger_score is None or value_score(ledger_score) != entry.score:
            wrong.append(f"{entry.player_id}: version score {entry.score}, ledger {ledger_score}")
            continue
        # With the tie rule: 1 + the players with a higher score or the same one reached earlier.
        ledger_rank = histogram.higher_than(ledger_score) + 1
        if ledger_rank != entry.rank:
            wrong.append(f"{entry.player_id}: version rank {entry.rank}, ledger 1 + count(higher) = {ledger_rank}")
    report.add("ledger_sampled_ranks", not wrong, f"{len(sampled)} sampled; " + "; ".join(wrong[:10]))

    counts, checksums = ledger_bucket_checksums(season_id=season_id, manifest=manifest, moved=moved)
    bad = [
        f"bucket {b}: ledger {counts[b]} players/{checksums[b]:016x}, "
        f"version {manifest.counts[b]}/{manifest.checksums[b]:016x}"
        for b in range(manifest.layout.size)
        if counts[b] != manifest.counts[b] or checksums[b] != manifest.checksums[b]
    ]
    report.add("ledger_bucket_checksums", not bad, "; ".join(bad[:10]))


def reconciliation_run(*, season: Season, full: bool | None = None, sample: int | None = None) -> ReconciliationRun:
    """The continuous reconciliation: invariants of the current version, and its scores against the ledger.

    The ledger moves on while the version stands still, so a sampled player is compared
    only when the change stream has nothing newer for them than the version's watermark.
    """
    from leaderboard.materializer import season_keys
    from leaderboard.metrics import metrics_failure_count

    full = settings.RECONCILE_FULL if full is None else full
    sample = settings.RECONCILE_SAMPLE_SIZE if sample is None else sample
    started = time.monotonic()
    started_at = timezone.now()
    r = redis_get()
    keys = season_keys(season)
    report = version_check(r=r, keys=keys, sample=sample, full=full)
    manifest = rankview.manifest_get(r, keys, report.version) if report.version else None
    if manifest is not None and report.ok:
        _ledger_spot_check(r=r, keys=keys, season=season, manifest=manifest, sample=sample, report=report)
    run = ReconciliationRun.objects.create(
        season=season, version=report.version, mode="full" if full else "sampled", ok=report.ok,
        findings=report.as_dict()["findings"], started_at=started_at,
        duration_ms=(time.monotonic() - started) * 1000,
    )
    if not report.ok:
        metrics_failure_count(season_slug=season.slug, kind="reconciliation")
        if any(f.check.endswith("checksums") for f in report.failures()):
            metrics_failure_count(season_slug=season.slug, kind="checksum")
    return run


def _ledger_spot_check(*, r: redis.Redis, keys: rankview.Keys, season: Season, manifest: Manifest, sample: int,
                       report: Report) -> None:
    reader = rankview.RankReader(r, keys, deadline=3600)
    entries = []
    for position in stratified_positions(manifest.total, sample):
        entries.extend(reader.entries_at(manifest, position, 1))
    players = [e.player_id for e in entries]
    moved = set(
        ScoreChange.objects.filter(season_id=season.pk, player_id__in=players)
        .filter(Q(txid__gt=manifest.watermark[0]) | Q(txid=manifest.watermark[0], id__gt=manifest.watermark[1]))
        .values_list("player_id", flat=True)
    )
    ledger = dict(PlayerScore.objects.filter(season_id=season.pk, player_id__in=players).values_list("player_id",
                                                                                                     "score"))
    # On a first_reached board the reached_at of these players is checked by the rank and
    # checksum comparisons of version_reconcile; the spot check compares scores.
    wrong = [
        f"{e.player_id}: version {e.score}, ledger {ledger.get(e.player_id)}"
        for e in entries
        if e.player_id not in moved and ledger.get(e.player_id) != e.score
    ]
    checked = len([e for e in entries if e.player_id not in moved])
    report.add("ledger_scores", not wrong, f"{checked} players compared; " + "; ".join(wrong[:10]))
