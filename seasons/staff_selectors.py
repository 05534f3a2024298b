"""Reads of the staff console. Database first: the console must keep working when Redis
(a disposable view) is lost, so anything read from Redis is optional and says so."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.db.models import Count, Q, QuerySet
from django.utils import timezone

from audit.models import AuditEntry
from leaderboard.core.buckets import BucketLayout
from leaderboard.core.lifecycle import ACCEPTING_STATES
from leaderboard.core.partitions import Watermark
from leaderboard.core.splits import SplitProposal
from leaderboard.ledger_databases import DEFAULT_ALIAS, ledger_alias_of_player
from leaderboard.ledger_reads import (
    ledger_databases_list,
    ledger_queryset_of_player,
    ledger_querysets_each,
    ledger_rows_count,
    ledger_rows_list,
    ledger_rows_merged,
)
from leaderboard.metrics import LAG_BOUNDS, season_backlog_seconds
from leaderboard.models import (
    ACTIVE_REBUILD_STATUSES,
    ApiClient,
    FriendList,
    LateResult,
    Manifest,
    PlayerProfile,
    PlayerProfileChange,
    PlayerScore,
    RebuildJob,
    ScoreChange,
    ScoreEvent,
    ScoreEventConflict,
    SeasonSample,
)
from leaderboard.redis_client import redis_get
from leaderboard.redis_errors import REDIS_ERRORS
from leaderboard.views import rankview
from seasons.models import Dispute, DisputeNote, FinalCandidate, FinalStanding, ScoreRevocation, Season
from seasons.staff_services import ROLES, late_result_alias_of

log = logging.getLogger(__name__)

# The overview's charts come from the samples Celery beat records every
# METRICS_SAMPLE_SECONDS (leaderboard/metrics.py), so they have a history whether or not
# anyone had the page open. The windows they can show, and at most how many points a
# chart draws (consecutive samples are merged, keeping the stretch's worst value).
CHART_WINDOWS = {900: "15 min", 3600: "1 h", 21_600: "6 h", 86_400: "24 h"}
DEFAULT_CHART_WINDOW = 3600
CHART_POINTS = 240
# The ingest rate in the table: events counted over about this long.
INGEST_RATE_SECONDS = 60
CHANGE_WINDOW_SECONDS = 600
CHANGE_SAMPLE = 200_000
# The hot-bucket scan reads up to CHANGE_SAMPLE recent changes: polled every few seconds by
# every open season page, it is computed at most this often per process and version.
HOT_CACHE_SECONDS = 15.0


# ------------------------------------------------------------------------- overview


@dataclass(frozen=True, slots=True)
class Series:
    """One chart's points, oldest first: (seconds since the window's start, value); None breaks the line."""

    points: list[tuple[float, float | None]]
    latest: float | None


@dataclass(frozen=True, slots=True)
class SeasonCharts:
    window_seconds: int
    samples: int
    # Seconds since the newest sample (None: no sample in the window; is Celery beat running?).
    newest_age_seconds: float | None
    publish_lag: Series
    backlog: Series
    ingest: Series
    epoch_ms: Series
    version_age: Series


@dataclass(frozen=True, slots=True)
class SeasonStats:
    season: Season
    version: int
    version_age_seconds: float | None
    players: int
    # Age of the oldest committed change no published version holds yet (0: none waiting).
    lag_seconds: float
    # Event-to-publish lag over the season so far, from the metrics histogram (Redis; None if unknown).
    lag_mean_seconds: float | None
    lag_p99_bound: str | None
    # Events per second over about the last INGEST_RATE_SECONDS of samples (None: no recent samples).
    ingest_per_second: float | None
    charts: SeasonCharts
    changed_per_version: list[int]
    players_per_version: list[int]
    open_disputes: int
    pending_late: int
    pending_revocations: int
    active_rebuild: RebuildJob | None


def seasons_overview(*, now: datetime | None = None, window_seconds: int = DEFAULT_CHART_WINDOW) -> list[SeasonStats]:
    now = now or timezone.now()
    lags = _lag_metrics()
    stats = []
    for season in Season.objects.order_by("-starts_at", "slug"):
        manifests = list(Manifest.objects.filter(season=season).order_by("-version")
                         .values_list("version", "published_at", "total_players", "changed_players",
                                      "watermark_txid", "watermark_id", "watermark_vector")[:60])
        latest = manifests[0] if manifests else None
        lag_mean, lag_p99 = lags.get(season.slug, (None, None))
        charts = season_charts(season=season, now=now, window_seconds=window_seconds)
        stats.append(SeasonStats(
            season=season,
            version=season.published_version,
            version_age_seconds=(now - latest[1]).total_seconds() if latest else None,
            players=latest[2] if latest else 0,
            lag_seconds=season_backlog_seconds(
                season=season, watermark=Watermark.from_columns(*latest[4:7]) if latest else Watermark(), now=now),
            lag_mean_seconds=lag_mean,
            lag_p99_bound=lag_p99,
            ingest_per_second=_ingest_rate(season=season, now=now),
            charts=charts,
            changed_per_version=[m[3] for m in reversed(manifests)],
            players_per_version=[m[2] for m in reversed(manifests)],
            open_disputes=Dispute.objects.filter(season=season, status__in=[Dispute.Status.OPEN,
                                                                            Dispute.Status.REVOCATION_PROPOSED]).count(),
            pending_late=ledger_rows_count(season=season, queryset=LateResult.objects.filter(
                season=season, status=LateResult.Status.PENDING)),
            pending_revocations=ScoreRevocation.objects.filter(season=season,
                                                               status=ScoreRevocation.Status.PROPOSED).count(),
            active_rebuild=RebuildJob.objects.filter(season=season, status__in=ACTIVE_REBUILD_STATUSES).first(),
        ))
    return stats


def _ingest_rate(*, season: Season, now: datetime) -> float | None:
    """Events per second between the newest recent sample and the one about INGEST_RATE_SECONDS before it."""
    stale = 3 * settings.METRICS_SAMPLE_SECONDS
    recent: list[tuple[datetime, int]] = [
        (at, total) for at, total in SeasonSample.objects.filter(
            season=season, sampled_at__gte=now - timedelta(seconds=INGEST_RATE_SECONDS + stale),
        ).order_by("-slot").values_list("sampled_at", "events_total") if total is not None
    ]
    if len(recent) < 2 or (now - recent[0][0]).total_seconds() > stale:
        return None
    newest = recent[0]
    oldest = next((r for r in recent if (newest[0] - r[0]).total_seconds() >= INGEST_RATE_SECONDS), recent[-1])
    seconds = (newest[0] - oldest[0]).total_seconds()
    if seconds <= 0 or newest[1] < oldest[1]:
        return None  # a counter that went back: Redis lost it
    return (newest[1] - oldest[1]) / seconds


_SAMPLE_FIELDS = ("slot", "sampled_at", "publish_lag_seconds", "backlog_seconds", "ingest_per_second", "epoch_ms",
                  "version_age_seconds")


def season_charts(*, season: Season, now: datetime, window_seconds: int = DEFAULT_CHART_WINDOW) -> SeasonCharts:
    """The overview's four charts of one season over the last `window_seconds`, from the samples.

    Recomputed once per new sample per process (the overview polls every 2 s; samples come
    every METRICS_SAMPLE_SECONDS).
    """
    since = now - timedelta(seconds=window_seconds)
    newest = (SeasonSample.objects.filter(season=season, sampled_at__gte=since).order_by("-slot")
              .values_list("slot", "sampled_at").first())
    key = f"staff:charts:{season.pk}:{window_seconds}:{newest[0] if newest else None}"
    cached: SeasonCharts | None = cache.get(key)
    if cached is None:
        rows = list(SeasonSample.objects.filter(season=season, sampled_at__gte=since).order_by("slot")
                    .values_list(*_SAMPLE_FIELDS))
        start = since.timestamp()
        gap = 3 * settings.METRICS_SAMPLE_SECONDS

        def series(index: int, merge: str) -> Series:
            points = [(row[1].timestamp() - start, row[index]) for row in rows]
            values = [v for _, v in points if v is not None]
            return Series(points=_thin(points, gap=gap, merge=merge), latest=values[-1] if values else None)

        cached = SeasonCharts(
            window_seconds=window_seconds, samples=len(rows), newest_age_seconds=None,
            publish_lag=series(2, "max"), backlog=series(3, "max"), ingest=series(4, "mean"),
            epoch_ms=series(5, "max"), version_age=series(6, "max"),
        )
        cache.set(key, cached, window_seconds)
    age = (now - newest[1]).total_seconds() if newest else None
    return replace(cached, newest_age_seconds=age)


def _thin(points: list[tuple[float, float | None]], *, gap: float, merge: str) -> list[tuple[float, float | None]]:
    """At most CHART_POINTS points: runs of consecutive samples merged (their max, or mean for a rate);
    a (t, None) wherever samples are missing for longer than `gap`, so the line breaks there."""
    per = max(1, -(-len(points) // CHART_POINTS))
    out: list[tuple[float, float | None]] = []
    run: list[tuple[float, float | None]] = []

    def flush() -> None:
        if run:
            values = [v for _, v in run if v is not None]
            value = None if not values else max(values) if merge == "max" else sum(values) / len(values)
            out.append((run[-1][0], value))
            run.clear()

    previous: float | None = None
    for t, v in points:
        if previous is not None and t - previous > gap:
            flush()
            out.append((t, None))
        run.append((t, v))
        if len(run) >= per:
            flush()
        previous = t
    flush()
    return out


def _lag_metrics() -> dict[str, tuple[float | None, str | None]]:
    """Per season: mean event-to-publish lag and the histogram bound holding its 99th percentile."""
    try:
        raw = redis_get().hgetall(f"{settings.REDIS_KEY_PREFIX}:metrics:lag")
    except REDIS_ERRORS:
        log.warning("lag metrics unavailable", exc_info=True)
        return {}
    parts: dict[str, dict[str, float]] = {}
    for key, value in raw.items():
        slug, _, part = (key.decode() if isinstance(key, bytes) else str(key)).partition("|")
        parts.setdefault(slug, {})[part] = float(value)
    out: dict[str, tuple[float | None, str | None]] = {}
    for slug, values in parts.items():
        count = values.get("count", 0.0)
        if not count:
            continue
        running, p99 = 0.0, "> 60"
        for bound in LAG_BOUNDS:
            running += values.get(str(bound), 0.0)
            if running >= 0.99 * count:
                p99 = f"≤ {bound:g}"
                break
        out[slug] = (values.get("sum", 0.0) / count, p99)
    return out


# -------------------------------------------------------------------- season detail


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
        counts[layout.bucket_of(score)] += 1
        read, oldest = read + 1, committed_at
    else:
        if read == CHANGE_SAMPLE:
            covered = min(covered, (now - oldest).total_seconds())
    return counts, max(covered, 1.0)


def manifests_recent(*, season: Season, limit: int = 50) -> list[Manifest]:
    return list(Manifest.objects.filter(season=season).order_by("-version")[:limit])


def rebuild_jobs_recent(*, season: Season, limit: int = 20) -> list[RebuildJob]:
    return list(RebuildJob.objects.filter(season=season).order_by("-id")[:limit])


# ----------------------------------------------------------------------- player view


@dataclass(frozen=True, slots=True)
class PlayerDetail:
    season: Season
    player_id: str
    events: list[ScoreEvent]
    score: PlayerScore | None
    # From the current published version (Redis): None when unranked or unavailable.
    rank: int | None
    position: int | None
    version: int | None
    total: int | None
    rank_error: str
    # The player's region in that version and their place on its board (a season with regions).
    region: str | None
    regional_rank: int | None
    regional_position: int | None
    regional_total: int | None
    final: FinalStanding | None
    # The event that set the current score: the latest applied event whose score_after is it.
    setter: ScoreEvent | None
    revocations: list[ScoreRevocation]
    disputes: list[Dispute]
    # Deliveries that reused one of this player's event ids, or named this player, with
    # another payload (outcome `conflict`): recorded, never applied.
    conflicts: list[ConflictRow]


def player_detail(*, season: Season, player_id: str) -> PlayerDetail:
    from leaderboard.views.selectors import leaderboard_reader

    events = _with_clients(ledger_queryset_of_player(
        season=season, player_id=player_id,
        queryset=ScoreEvent.objects.filter(season=season, player_id=player_id).order_by("id")))
    score = player_score_get(season=season, player_id=player_id)
    setter = None
    if score is not None:
        setter = next((e for e in reversed(events) if e.status == "applied" and e.score_after == score.score), None)
    rank = position = version = total = None
    region = regional_rank = regional_position = regional_total = None
    rank_error = ""
    try:
        view = leaderboard_reader(season_slug=season.slug).rank(player_id)
        version, total = view.manifest.version, view.total
        if view.entry is not None:
            rank, position = view.entry.rank, view.entry.position
        else:
            rank_error = f"not ranked in version {version}"
        if view.region is not None:
            # The same version's regional board: both places come from one version.
            regional = leaderboard_reader(season_slug=season.slug, region=view.region).rank(player_id, version)
            region, regional_total = view.region, regional.total
            if regional.entry is not None:
                regional_rank, regional_position = regional.entry.rank, regional.entry.position
    except (rankview.VersionExpired, rankview.UnknownRegion):
        rank_error = "the version moved while the page was read; reload"
    except rankview.Unavailable:
        rank_error = "no published version is available right now"
    except REDIS_ERRORS as exc:
        rank_error = f"the rank views are unreachable ({exc.__class__.__name__})"
    return PlayerDetail(
        season=season, player_id=player_id, events=events, score=score, rank=rank, position=position,
        version=version, total=total, rank_error=rank_error, region=region, regional_rank=regional_rank,
        regional_position=regional_position, regional_total=regional_total,
        final=FinalStanding.objects.filter(season=season, player_id=player_id).first(), setter=setter,
        revocations=list(ScoreRevocation.objects.filter(season=season, player_id=player_id).order_by("-id")),
        disputes=list(Dispute.objects.filter(season=season, player_id=player_id).order_by("-id")),
        conflicts=_conflict_rows(
            _conflicts_newest(season=season, limit=CONFLICTS_SHOWN, queryset=ScoreEventConflict.objects.filter(
                season=season).filter(Q(event_id__in=[e.event_id for e in events]) | Q(payload__player_id=player_id))),
            season=season, known={e.event_id: e for e in events},
        ),
    )


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


def dispute_notes(*, dispute: Dispute) -> list[DisputeNote]:
    return list(DisputeNote.objects.filter(dispute=dispute).order_by("id"))


def dispute_revocations(*, dispute: Dispute) -> list[ScoreRevocation]:
    return list(ScoreRevocation.objects.filter(dispute=dispute).order_by("-id"))


def player_score_get(*, season: Season, player_id: str) -> PlayerScore | None:
    return ledger_queryset_of_player(season=season, player_id=player_id,
                                     queryset=PlayerScore.objects.filter(season=season, player_id=player_id)).first()


# ---------------------------------------------------------------- regions and friends

# A season's region sizes are one GROUP BY over its current scores (no index holds the
# region; ~80 ms at 1M players, ~0.5 s at 5M: docs/benchmarks.md): counted at most every
# 15 s per process and season however many pages poll, and a slow count is kept longer,
# so that counting takes at most 1/REGION_SIZES_COST_SHARE of the time.
REGION_SIZES_CACHE_SECONDS = 15.0
REGION_SIZES_COST_SHARE = 20
# A player page lists the newest profile changes and the first friends; the counts are whole.
PROFILE_CHANGES_SHOWN = 100
FRIENDS_SHOWN = 50
# The event_id prefix of a region move in the change stream (leaderboard/ingest/ledger_store.py).
REGION_MOVE_PREFIX = "region:"


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


@dataclass(frozen=True, slots=True)
class RegionMove:
    """One change-stream row that moved the player between regions of a season."""

    old_region: str
    region: str
    # The profile write that moved them (event_id "region:<profile_version>").
    profile_version: int
    committed_at: datetime
    # Its place in the season's stream: the first version whose watermark passes it shows the move.
    txid: int
    change_id: int


@dataclass(frozen=True, slots=True)
class SeasonRegion:
    """A player's region in one season where they have a score, and its moves there, oldest first."""

    season: Season
    region: str
    moves: list[RegionMove]


@dataclass(frozen=True, slots=True)
class PlayerRegions:
    # The profile as it is now (None: the player has no profile, so no region anywhere).
    profile: PlayerProfile | None
    # The newest PROFILE_CHANGES_SHOWN profile writes, newest first, of changes_total.
    changes: list[PlayerProfileChange]
    changes_total: int
    # Every season where the player has a score, newest first.
    seasons: list[SeasonRegion]


def player_regions(*, player_id: str) -> PlayerRegions:
    """A player's region history: their profile writes, and their region in each season they
    play with its in-season moves (index score_change_region_moves: a few rows, whatever the
    size of the stream)."""
    changes = PlayerProfileChange.objects.filter(player_id=player_id)
    seasons = {s.pk: s for s in Season.objects.all()}
    # By (season, player): the unique constraint's index answers it; by player alone, nothing would.
    held = dict(PlayerScore.objects.filter(season_id__in=list(seasons), player_id=player_id)
                .values_list("season_id", "region"))
    region_moves = (ScoreChange.objects.filter(player_id=player_id, event_id__startswith=REGION_MOVE_PREFIX)
                    .order_by("season_id", "txid", "id")
                    .values_list("season_id", "old_region", "region", "event_id", "committed_at", "txid", "id"))
    rows = list(region_moves)
    # Seasons whose player's partition lives in another database: their rows from there.
    elsewhere = {pk: ledger_alias_of_player(season=s, player_id=player_id)
                 for pk, s in seasons.items() if s.ledger_databases}
    for pk, alias in elsewhere.items():
        if alias != DEFAULT_ALIAS:
            held.update(PlayerScore.objects.using(alias).filter(season_id=pk, player_id=player_id)
                        .values_list("season_id", "region"))
            rows += list(region_moves.using(alias).filter(season_id=pk))
    moves: dict[int, list[RegionMove]] = {}
    for season_id, old_region, region, event_id, committed_at, txid, change_id in sorted(
            rows, key=lambda row: (row[0], row[5], row[6])):
        moves.setdefault(season_id, []).append(RegionMove(
            old_region=old_region, region=region, profile_version=int(event_id.removeprefix(REGION_MOVE_PREFIX)),
            committed_at=committed_at, txid=txid, change_id=change_id))
    in_seasons = sorted((seasons[pk] for pk in held), key=lambda s: (s.starts_at, s.slug), reverse=True)
    return PlayerRegions(
        profile=PlayerProfile.objects.filter(player_id=player_id).first(),
        changes=list(changes.select_related("client").order_by("-id")[:PROFILE_CHANGES_SHOWN]),
        changes_total=changes.count(),
        seasons=[SeasonRegion(season=s, region=held[s.pk], moves=moves.get(s.pk, [])) for s in in_seasons],
    )


@dataclass(frozen=True, slots=True)
class PlayerFriends:
    # None: the social service never wrote a list for the player (graph_version 0 in the API).
    graph_version: int | None
    count: int
    # The first FRIENDS_SHOWN ids, in the order the list was written.
    shown: list[str]
    updated_at: datetime | None


def player_friends(*, player_id: str) -> PlayerFriends:
    row = FriendList.objects.filter(player_id=player_id).first()
    if row is None:
        return PlayerFriends(graph_version=None, count=0, shown=[], updated_at=None)
    return PlayerFriends(graph_version=row.graph_version, count=len(row.friends), shown=row.friends[:FRIENDS_SHOWN],
                         updated_at=row.updated_at)


# ------------------------------------------------------------------ queues and lists


def staff_users() -> QuerySet[Any]:
    """Accounts that can use the console: members of a role group."""
    return (get_user_model().objects.filter(is_active=True)
            .filter(groups__name__in=ROLES)
            .distinct().order_by("username"))


def disputes_filtered(*, season: str = "", status: str = "", assignee: str = "", player_id: str = "",
                      user_id: int | None = None) -> QuerySet[Dispute]:
    """`status` "active" means open or with a proposed revocation; `assignee` "me", "none" or a user id."""
    qs = Dispute.objects.select_related("season", "assignee").order_by("-id")
    if season:
        qs = qs.filter(season__slug=season)
    if status == "active":
        qs = qs.filter(status__in=[Dispute.Status.OPEN, Dispute.Status.REVOCATION_PROPOSED])
    elif status:
        qs = qs.filter(status=status)
    if assignee == "me" and user_id is not None:
        qs = qs.filter(assignee_id=user_id)
    elif assignee == "none":
        qs = qs.filter(assignee__isnull=True)
    elif assignee.isdigit():
        qs = qs.filter(assignee_id=int(assignee))
    if player_id:
        qs = qs.filter(player_id=player_id)
    return qs


def revocations_filtered(*, status: str = "", season: str = "") -> QuerySet[ScoreRevocation]:
    qs = ScoreRevocation.objects.select_related("season", "dispute").order_by("-id")
    if status:
        qs = qs.filter(status=status)
    if season:
        qs = qs.filter(season__slug=season)
    return qs


@dataclass(frozen=True, slots=True)
class LateResultListed:
    """A late result and the database holding it: each numbers its own, so (alias, id) names one."""

    late: LateResult
    alias: str

    @property
    def in_default(self) -> bool:
        return self.alias == DEFAULT_ALIAS


def late_results(*, season: Season, status: str = LateResult.Status.PENDING) -> list[LateResultListed]:
    """The first 500 in arrival order, from each ledger database (a late result lives
    with its ledger event)."""
    # Each database's rows in the merge's own order: ids follow commit order, not the
    # arrival time a batch took before its locks.
    qs = LateResult.objects.filter(season=season).select_related("ledger_event").order_by("received_at", "id")
    if status:
        qs = qs.filter(status=status)
    rows = ledger_rows_merged(season=season, queryset=qs, key=lambda late: (late.received_at, late.pk), limit=500)
    return [LateResultListed(late=late, alias=late_result_alias_of(late)) for late in rows]


def late_result_get(*, season: Season, alias: str, late_id: int) -> LateResult | None:
    """The season's late result `late_id` of the database `alias` (None: no such row, or
    a database not holding the season's partitions; LedgerDatabaseMissing, a 503, when this
    server has no settings for one that does)."""
    if alias not in ledger_databases_list(season=season):
        return None
    return (LateResult.objects.using(alias).select_related("ledger_event")
            .filter(pk=late_id, season_id=season.pk).first())


def final_candidates(*, season: Season) -> list[FinalCandidate]:
    return list(FinalCandidate.objects.filter(season=season).order_by("-id")[:20])


def audit_filtered(*, season: str = "", actor: str = "", action: str = "", date_from: Any = None,
                   date_to: Any = None) -> QuerySet[AuditEntry]:
    """Newest first. `action` matches a prefix ("dispute." finds every dispute action); dates are inclusive days."""
    qs = AuditEntry.objects.order_by("-seq")
    if season:
        qs = qs.filter(season_slug=season)
    if actor:
        qs = qs.filter(actor_label=actor)
    if action:
        qs = qs.filter(action__startswith=action)
    if date_from:
        qs = qs.filter(created_at__date__gte=date_from)
    if date_to:
        qs = qs.filter(created_at__date__lte=date_to)
    return qs
