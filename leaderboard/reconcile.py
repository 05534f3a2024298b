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

import redis
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from leaderboard import rankview
from leaderboard.core.checksum import checksum_add
from leaderboard.core.manifest import Manifest
from leaderboard.core.reconciliation import Report, first_mismatch, stratified_positions
from leaderboard.invariants import version_check
from leaderboard.models import PlayerScore, ReconciliationRun, ScoreChange
from leaderboard.redis_client import redis_get
from seasons.models import Season

_ORDER_PG = 'ORDER BY score DESC, player_id COLLATE "C"'
# SQLite compares text with BINARY collation by default: byte order, as docs/rules.md (Ranking) says.
_ORDER_SQLITE = "ORDER BY score DESC, player_id"


def display_order_sql() -> str:
    return _ORDER_PG if connection.vendor == "postgresql" else _ORDER_SQLITE


class ScoreHistogram:
    """count(score > s) for any s, from one GROUP BY over the ledger's current scores.

    `moved` maps players whose score changed after the version's watermark to their
    current score and their score at the watermark (None: not in the season then), so the
    histogram is the ledger's as of that watermark.
    """

    def __init__(self, season_id: int, moved: dict[str, tuple[int | None, int | None]] | None = None):
        counts = dict(_histogram(season_id))
        for now, then in (moved or {}).values():
            if now is not None:
                counts[now] -= 1
            if then is not None:
                counts[then] = counts.get(then, 0) + 1
        rows = sorted((score, n) for score, n in counts.items() if n)
        self.scores = [score for score, _ in rows]
        self.at_or_below: list[int] = []
        running = 0
        for _, count in rows:
            running += count
            self.at_or_below.append(running)
        self.total = running

    def higher_than(self, score: int) -> int:
        index = bisect_right(self.scores, score)
        below = self.at_or_below[index - 1] if index else 0
        return self.total - below


def ledger_moved_since(*, season_id: int, watermark: tuple[int, int]) -> dict[str, tuple[int | None, int | None]]:
    """Players changed after `watermark`: (current score, score at the watermark).

    The first change after the watermark carries the score before it (old_score), so
    the ledger as of any retained watermark is the current table plus these few rows.
    """
    moved: dict[str, int | None] = {}
    after = (
        ScoreChange.objects.filter(season_id=season_id)
        .filter(Q(txid__gt=watermark[0]) | Q(txid=watermark[0], id__gt=watermark[1]))
        .order_by("txid", "id")
        .values_list("player_id", "old_score")
    )
    for player_id, old_score in after.iterator(chunk_size=20_000):
        moved.setdefault(player_id, old_score)
    current = dict(
        PlayerScore.objects.filter(season_id=season_id, player_id__in=list(moved)).values_list("player_id", "score")
    )
    return {p: (current.get(p), then) for p, then in moved.items()}


def _histogram(season_id: int) -> list[tuple[int, int]]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT score, count(*) FROM leaderboard_playerscore WHERE season_id = %s GROUP BY score ORDER BY score",
            [season_id],
        )
        return [(int(s), int(c)) for s, c in cursor.fetchall()]


def ledger_top(*, season_id: int, limit: int = 100,
               moved: dict[str, tuple[int | None, int | None]] | None = None) -> list[tuple[str, int]]:
    moved = moved or {}
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT player_id, score FROM leaderboard_playerscore WHERE season_id = %s {display_order_sql()} LIMIT %s",
            [season_id, limit + len(moved)],
        )
        rows = [(p, int(score)) for p, score in cursor.fetchall() if p not in moved]
    rows += [(p, then) for p, (_, then) in moved.items() if then is not None]
    rows.sort(key=lambda row: (-row[1], row[0].encode()))
    return rows[:limit]


def ledger_bucket_checksums(
    *, season_id: int, manifest: Manifest, moved: dict[str, tuple[int | None, int | None]] | None = None
) -> tuple[list[int], list[int]]:
    moved = moved or {}
    counts = [0] * manifest.layout.size
    checksums = [0] * manifest.layout.size

    def add(player_id: str, score: int) -> None:
        bucket = manifest.layout.bucket_of(score)
        counts[bucket] += 1
        checksums[bucket] = checksum_add(checksums[bucket], player_id, score)

    for player_id, score in _scores(season_id):
        if player_id not in moved:
            add(player_id, score)
    for player_id, (_, then) in moved.items():
        if then is not None:
            add(player_id, then)
    return counts, checksums


def _scores(season_id: int) -> Iterator[tuple[str, int]]:
    yield from PlayerScore.objects.filter(season_id=season_id).values_list("player_id", "score").iterator(
        chunk_size=20_000
    )


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
    moved = ledger_moved_since(season_id=season_id, watermark=manifest.watermark)
    histogram = ScoreHistogram(season_id, moved)
    report.add(
        "player_count",
        histogram.total == manifest.total,
        f"ledger {histogram.total}, version {manifest.total} (difference {manifest.total - histogram.total})",
    )
    report.add("bucket_count_sum", sum(manifest.counts) == manifest.total,
               f"sum of bucket counts {sum(manifest.counts)}, total {manifest.total}")

    expected_top = [
        {"position": i + 1, "rank": histogram.higher_than(score) + 1, "player_id": p, "score": score}
        for i, (p, score) in enumerate(ledger_top(season_id=season_id, limit=100, moved=moved))
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
    ledger_scores: dict[str, int | None] = dict(
        PlayerScore.objects.filter(season_id=season_id, player_id__in=[e.player_id for e in sampled]).values_list(
            "player_id", "score"
        )
    )
    ledger_scores.update({p: then for p, (_, then) in moved.items()})
    for entry in sampled:
        ledger_score = ledger_scores.get(entry.player_id)
        if ledger_score != entry.score:
            wrong.append(f"{entry.player_id}: version score {entry.score}, ledger {ledger_score}")
            continue
        ledger_rank = histogram.higher_than(entry.score) + 1
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
    wrong = [
        f"{e.player_id}: version {e.score}, ledger {ledger.get(e.player_id)}"
        for e in entries
        if e.player_id not in moved and ledger.get(e.player_id) != e.score
    ]
    checked = len([e for e in entries if e.player_id not in moved])
    report.add("ledger_scores", not wrong, f"{checked} players compared; " + "; ".join(wrong[:10]))
