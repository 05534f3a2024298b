"""Reads of a season's pages: versions and buckets (with the hot-bucket split
recommendations), rebuilds, conflicting deliveries and players per region."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TypeVar

from django.core.cache import cache
from django.db.models import Count, QuerySet
from django.utils import timezone

from leaderboard.core.buckets import BucketLayout
from leaderboard.core.lifecycle import ACCEPTING_STATES
from leaderboard.core.splits import SplitProposal
from leaderboard.ledger_databases import DEFAULT_ALIAS
from leaderboard.ledger_reads import ledger_querysets_each, ledger_rows_count, ledger_rows_list, ledger_rows_merged
from leaderboard.models import ApiClient, Manifest, PlayerScore, RebuildJob, ScoreChange, ScoreEvent, ScoreEventConflict
from leaderboard.redis_errors import REDIS_ERRORS
from leaderboard.views import rankview
from seasons.models import Season

# The bucket table's change counts: over about this long, from at most CHANGE_SAMPLE changes.
CHANGE_WINDOW_SECONDS = 600
CHANGE_SAMPLE = 200_000
# The hot-bucket scan reads up to CHANGE_SAMPLE recent changes: polled every few seconds by
# every open season page, it is computed at most this often per process and version.
HOT_CACHE_SECONDS = 15.0


@dataclass(frozen=True, slots=True)
class BucketRow:
    bucket: int
    low: int
    high: int
    count: int
    share: float
    changes: int
    # Over SeasonDetail.changes_window_seconds (a young season's window is its age).
    changes_per_minute: float
    hot: bool
    split_points: tuple[int, ...] = ()
    why: str = ""


@dataclass(slots=True)
class SeasonDetail:
    season: Season
    manifest: Manifest | None
    buckets: list[BucketRow] = field(default_factory=list)
    proposals: list[SplitProposal] = field(default_factory=list)
    proposals_error: str = ""
    # What the bucket table's change counts cover: the window, or less when the season is
    # younger or the scan stopped at CHANGE_SAMPLE changes.
    changes_window_seconds: float = CHANGE_WINDOW_SECONDS


_RECOMMENDATIONS_UNAVAILABLE: tuple[type[Exception], ...] = (*REDIS_ERRORS, rankview.Unavailable)


def season_detail(*, season: Season, window_seconds: float = CHANGE_WINDOW_SECONDS) -> SeasonDetail:
    from leaderboard.recovery.rebuild import season_split_recommendations

    manifest = Manifest.objects.filter(season=season).order_by("-version").first()
    detail = SeasonDetail(season=season, manifest=manifest)
    if manifest is None:
        return detail
    layout = BucketLayout.from_dict(manifest.layout)
    key = f"staff:hot:{season.slug}:{manifest.pk}:{manifest.published_at.timestamp()}:{window_seconds:g}"
    cached = cache.get(key)
    if cached is None:
        try:
            proposals = season_split_recommendations(season=season, window_seconds=window_seconds)
            error = ""
        except _RECOMMENDATIONS_UNAVAILABLE as exc:
            proposals, error = [], f"hot-bucket recommendations need Redis: {exc.__class__.__name__}"
        cached = (proposals, error, _bucket_changes(season, layout, window_seconds))
        cache.set(key, cached, HOT_CACHE_SECONDS)
    detail.proposals, detail.proposals_error, (changes, covered) = cached
    detail.changes_window_seconds = covered
    hot = {p.bucket: p for p in detail.proposals}
    total = manifest.total_players or 1
    for row in manifest.buckets:
        b = int(row["bucket"])
        proposal = hot.get(b)
        detail.buckets.append(BucketRow(
            bucket=b, low=int(row["low"]), high=int(row["high"]), count=int(row["count"]),
            share=int(row["count"]) / total, changes=changes[b], changes_per_minute=changes[b] * 60 / covered,
            hot=proposal is not None, split_points=proposal.split_points if proposal else (),
            why=proposal.why if proposal else "",
        ))
    return detail


def _bucket_changes(season: Season, layout: BucketLayout, window_seconds: float) -> tuple[list[int], float]:
    """Score changes per bucket of `layout` in the last `window_seconds`, newest first off the
    cursor index, and the seconds those counts really cover: no more than the season's age,
    nor than the CHANGE_SAMPLE newest changes reach back (never under a second)."""
    now = timezone.now()
    since = now - timedelta(seconds=window_seconds)
    covered = min(window_seconds, (now - max(season.starts_at, season.created_at)).total_seconds())
    counts = [0] * layout.size
    rows = (ScoreChange.objects.filter(season=season).order_by("-txid", "-id")
            .values_list("new_score", "committed_at", "txid", "id"))
    read, oldest = 0, now
    # Each ledger database's newest, merged (a txid names its partition: one order for all).
    for score, committed_at, _, _ in ledger_rows_merged(season=season, queryset=rows,
                                                        key=lambda row: (-row[2], -row[3]), limit=CHANGE_SAMPLE):
        if committed_at < since:
            break
        counts[layout.bucket_of(season.board_kind.flipped(score))] += 1
        read, oldest = read + 1, committed_at
    else:
        if read == CHANGE_SAMPLE:
            covered = min(covered, (now - oldest).total_seconds())
    return counts, max(covered, 1.0)


def manifests_recent(*, season: Season, limit: int = 50) -> list[Manifest]:
    return list(Manifest.objects.filter(season=season).order_by("-version")[:limit])


def rebuild_jobs_recent(*, season: Season, limit: int = 20) -> list[RebuildJob]:
    return list(RebuildJob.objects.filter(season=season).order_by("-id")[:limit])


_Clients = TypeVar("_Clients", ScoreEvent, ScoreEventConflict)


def _with_clients(queryset: QuerySet[_Clients], *, limit: int | None = None) -> list[_Clients]:
    """The (first `limit`) rows with their API clients: joined in "default"; a ledger
    database holds no ApiClient rows, so there they are read from "default" in one query."""
    if queryset.db == DEFAULT_ALIAS:
        return list(queryset.select_related("client")[:limit])
    rows = list(queryset[:limit])
    clients = ApiClient.objects.in_bulk({row.client_id for row in rows if row.client_id is not None})
    field = queryset.model._meta.get_field("client")
    for row in rows:
        if row.client_id is not None:
            # Cached, not assigned: the router refuses a relation across databases.
            field.set_cached_value(row, clients[row.client_id])  # type: ignore[union-attr]
    return rows


def _conflicts_newest(*, season: Season, queryset: QuerySet[ScoreEventConflict], limit: int
                      ) -> list[ScoreEventConflict]:
    """The newest `limit` conflicts of `queryset` across the season's ledger databases (by
    arrival: ids are per database)."""
    querysets = ledger_querysets_each(season=season, queryset=queryset)
    if len(querysets) == 1:
        return _with_clients(querysets[0].order_by("-id"), limit=limit)
    # Each database's newest by the merge's own key: ids follow commit order, not arrival.
    parts = [_with_clients(qs.order_by("-received_at", "-id"), limit=limit) for qs in querysets]
    return sorted((c for part in parts for c in part), key=lambda c: (c.received_at, c.pk), reverse=True)[:limit]


# The conflicting deliveries a page lists (newest first); the season page counts them all.
CONFLICTS_SHOWN = 100
# The payload fields a conflict is compared on with the ledger row it collided with.
_PAYLOAD_FIELDS = ("match_id", "player_id", "best_score", "score_version", "completed_at", "kind", "reason")


@dataclass(frozen=True, slots=True)
class ConflictRow:
    conflict: ScoreEventConflict
    # The ledger row holding the event id first (None if it is not in this season's ledger).
    original: ScoreEvent | None
    # Payload fields whose value differs from the original's, e.g. ["best_score", "score_version"].
    differences: list[str]


def _conflict_rows(conflicts: Iterable[ScoreEventConflict], *, season: Season,
                   known: dict[str, ScoreEvent] | None = None) -> list[ConflictRow]:
    rows = list(conflicts)
    originals = dict(known or {})
    missing = {c.event_id for c in rows} - set(originals)
    if missing:
        originals.update((e.event_id, e) for e in ledger_rows_list(
            season=season, queryset=ScoreEvent.objects.filter(season=season, event_id__in=missing)))
    out = []
    for conflict in rows:
        original = originals.get(conflict.event_id)
        differences = []
        if original is not None:
            for name in _PAYLOAD_FIELDS:
                theirs = getattr(original, name)
                ours = conflict.payload.get(name)
                if name == "completed_at":
                    theirs, ours = theirs.isoformat(), (datetime.fromisoformat(ours).isoformat() if ours else ours)
                if ours != theirs:
                    differences.append(name)
        out.append(ConflictRow(conflict=conflict, original=original, differences=differences))
    return out


@dataclass(frozen=True, slots=True)
class SeasonConflicts:
    total: int
    recent: list[ConflictRow]


def season_conflicts(*, season: Season, limit: int = 20) -> SeasonConflicts:
    """How many conflicting deliveries the season has had, and the newest `limit` of them."""
    qs = ScoreEventConflict.objects.filter(season=season)
    return SeasonConflicts(total=ledger_rows_count(season=season, queryset=qs),
                           recent=_conflict_rows(_conflicts_newest(season=season, queryset=qs, limit=limit),
                                                 season=season))


# A season's region sizes are one GROUP BY over its current scores (no index holds the
# region; ~80 ms at 1M players, ~0.5 s at 5M: docs/benchmarks.md): counted at most every
# 15 s per process and season however many pages poll, and a slow count is kept longer,
# so that counting takes at most 1/REGION_SIZES_COST_SHARE of the time.
REGION_SIZES_CACHE_SECONDS = 15.0
REGION_SIZES_COST_SHARE = 20


@dataclass(frozen=True, slots=True)
class RegionSize:
    # "" for the players with no region in the season.
    region: str
    players: int
    share: float
    # False for a region held by players but no longer one of the season's (regions set
    # again while SCHEDULED): shown, so no player is left out of the sizes.
    listed: bool = True


@dataclass(frozen=True, slots=True)
class SeasonRegionSizes:
    # The season's regions in display order, then "" (no region); empty without regions.
    sizes: list[RegionSize]
    players: int
    counted_at: datetime
    # Whether the sizes can still change (the season takes scores and region moves): the
    # page polls them only then.
    changing: bool = False


def season_region_sizes(*, season: Season) -> SeasonRegionSizes:
    """Players with a score in each of the season's regions and in none, from the ledger's
    current scores (not a published version: it holds no regions yet). A season without
    regions counts nothing: all its players are in none."""
    if not season.regions:
        return SeasonRegionSizes(sizes=[], players=0, counted_at=timezone.now())
    changing = season.state in ACCEPTING_STATES
    key = f"staff:regions:{season.pk}:{','.join(season.regions)}"
    cached: SeasonRegionSizes | None = cache.get(key)
    if cached is None:
        started = time.monotonic()
        counts: dict[str, int] = {}
        for region, players in ledger_rows_list(season=season, queryset=PlayerScore.objects.filter(
                season=season).values("region").order_by().annotate(players=Count("id")).values_list(
                "region", "players")):
            counts[region] = counts.get(region, 0) + players
        total = sum(counts.values())
        unlisted = sorted(set(counts) - set(season.regions) - {""})
        cached = SeasonRegionSizes(
            sizes=[RegionSize(region=r, players=counts.get(r, 0), share=counts.get(r, 0) / (total or 1),
                              listed=r == "" or r in season.regions)
                   for r in [*season.regions, *unlisted, ""]],
            players=total, counted_at=timezone.now(),
        )
        took = time.monotonic() - started
        cache.set(key, cached, max(REGION_SIZES_CACHE_SECONDS, REGION_SIZES_COST_SHARE * took))
    return replace(cached, changing=changing)
