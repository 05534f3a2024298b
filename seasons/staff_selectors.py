"""Reads of the staff console. Database first: the console must keep working when Redis
(a disposable view) is lost, so anything read from Redis is optional and says so."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.db.models import Q, QuerySet
from django.utils import timezone

from audit.models import AuditEntry
from leaderboard import rankview
from leaderboard.core.buckets import BucketLayout
from leaderboard.core.splits import SplitProposal
from leaderboard.metrics import LAG_BOUNDS
from leaderboard.models import (
    ACTIVE_REBUILD_STATUSES,
    LateResult,
    Manifest,
    PlayerScore,
    RebuildJob,
    ScoreChange,
    ScoreEvent,
)
from leaderboard.redis_client import redis_get
from seasons.models import Dispute, DisputeNote, FinalCandidate, FinalStanding, ScoreRevocation, Season

log = logging.getLogger(__name__)

INGEST_WINDOW_SECONDS = 60
INGEST_BIN_SECONDS = 5
# Ingest rates come from the ingest counters (leaderboard/metrics.py, in Redis), sampled
# at each refresh of the overview into a short per-season series: O(1) per refresh
# whatever the ledger's size (counting recent ledger rows would scan other seasons' rows).
INGEST_HISTORY_SECONDS = 600
CHANGE_WINDOW_SECONDS = 600
CHANGE_SAMPLE = 200_000
# The hot-bucket scan reads up to CHANGE_SAMPLE recent changes: polled every few seconds by
# every open season page, it is computed at most this often per process and version.
HOT_CACHE_SECONDS = 15.0


# ------------------------------------------------------------------------- overview


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
    # Events per second over the last minute (None until two samples a second apart exist).
    ingest_per_second: float | None
    ingest_bins: list[int]
    changed_per_version: list[int]
    players_per_version: list[int]
    open_disputes: int
    pending_late: int
    pending_revocations: int
    active_rebuild: RebuildJob | None


def seasons_overview(*, now: datetime | None = None) -> list[SeasonStats]:
    now = now or timezone.now()
    lags = _lag_metrics()
    ingest = _ingest_rates(slugs=list(Season.objects.values_list("slug", flat=True)), now=now.timestamp())
    stats = []
    for season in Season.objects.order_by("-starts_at", "slug"):
        manifests = list(Manifest.objects.filter(season=season).order_by("-version")
                         .values_list("version", "published_at", "total_players", "changed_players",
                                      "watermark_txid", "watermark_id")[:60])
        latest = manifests[0] if manifests else None
        rate, bins = ingest.get(season.slug, (None, []))
        lag_mean, lag_p99 = lags.get(season.slug, (None, None))
        stats.append(SeasonStats(
            season=season,
            version=season.published_version,
            version_age_seconds=(now - latest[1]).total_seconds() if latest else None,
            players=latest[2] if latest else 0,
            lag_seconds=_unpublished_age(season, latest[4:6] if latest else (0, 0), now),
            lag_mean_seconds=lag_mean,
            lag_p99_bound=lag_p99,
            ingest_per_second=rate,
            ingest_bins=bins,
            changed_per_version=[m[3] for m in reversed(manifests)],
            players_per_version=[m[2] for m in reversed(manifests)],
            open_disputes=Dispute.objects.filter(season=season, status__in=[Dispute.Status.OPEN,
                                                                            Dispute.Status.REVOCATION_PROPOSED]).count(),
            pending_late=LateResult.objects.filter(season=season, status=LateResult.Status.PENDING).count(),
            pending_revocations=ScoreRevocation.objects.filter(season=season,
                                                               status=ScoreRevocation.Status.PROPOSED).count(),
            active_rebuild=RebuildJob.objects.filter(season=season, status__in=ACTIVE_REBUILD_STATUSES).first(),
        ))
    return stats


def _unpublished_age(season: Season, watermark: tuple[int, int], now: datetime) -> float:
    # The change stream's cursor index answers this with one short index scan.
    oldest = (
        ScoreChange.objects.filter(season=season)
        .filter(Q(txid__gt=watermark[0]) | Q(txid=watermark[0], id__gt=watermark[1]))
        .order_by("txid", "id").values_list("committed_at", flat=True).first()
    )
    return max((now - oldest).total_seconds(), 0.0) if oldest is not None else 0.0


def _ingest_rates(*, slugs: list[str], now: float) -> dict[str, tuple[float | None, list[int]]]:
    """Per season: events per second over the last minute, and events per 5 s (oldest first).

    Each call records (now, events counted so far) per season, then differences the
    samples of the last minute; Redis trouble leaves the numbers unknown, not the page broken.
    """
    prefix = settings.REDIS_KEY_PREFIX
    try:
        r = redis_get()
        totals: dict[str, int] = {}
        for key, value in r.hgetall(f"{prefix}:metrics:events").items():
            slug = (key.decode() if isinstance(key, bytes) else str(key)).partition("|")[0]
            totals[slug] = totals.get(slug, 0) + int(value)
        with r.pipeline(transaction=False) as pipe:
            for slug in slugs:
                key = f"{prefix}:staff:ingest:{slug}"
                pipe.zadd(key, {f"{now:.3f}:{totals.get(slug, 0)}": now})
                pipe.zremrangebyscore(key, "-inf", now - INGEST_HISTORY_SECONDS)
                pipe.expire(key, INGEST_HISTORY_SECONDS)
                pipe.zrangebyscore(key, now - INGEST_WINDOW_SECONDS - INGEST_BIN_SECONDS, "+inf")
            replies = pipe.execute()
    except redis.RedisError:
        log.warning("ingest counters unavailable", exc_info=True)
        return {}
    out: dict[str, tuple[float | None, list[int]]] = {}
    for i, slug in enumerate(slugs):
        samples = sorted(
            (float(t), int(n)) for t, _, n in ((m.decode() if isinstance(m, bytes) else str(m)).partition(":")
                                             for m in replies[4 * i + 3])
        )
        out[slug] = _ingest_from_samples(samples, now)
    return out


def _ingest_from_samples(samples: list[tuple[float, int]], now: float) -> tuple[float | None, list[int]]:
    bins = [0] * (INGEST_WINDOW_SECONDS // INGEST_BIN_SECONDS)
    for (_, before), (t, after) in zip(samples, samples[1:], strict=False):
        index = int((now - t) // INGEST_BIN_SECONDS)
        if 0 <= index < len(bins):
            bins[len(bins) - 1 - index] += max(after - before, 0)
    if len(samples) < 2 or samples[-1][0] - samples[0][0] < 1.0:
        return None, bins
    (t0, n0), (t1, n1) = samples[0], samples[-1]
    return max(n1 - n0, 0) / (t1 - t0), bins


def _lag_metrics() -> dict[str, tuple[float | None, str | None]]:
    """Per season: mean event-to-publish lag and the histogram bound holding its 99th percentile."""
    try:
        raw = redis_get().hgetall(f"{settings.REDIS_KEY_PREFIX}:metrics:lag")
    except redis.RedisError:
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


def season_detail(*, season: Season, window_seconds: float = CHANGE_WINDOW_SECONDS) -> SeasonDetail:
    from leaderboard.rebuild import season_split_recommendations

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
        except (redis.RedisError, rankview.Unavailable) as exc:
            proposals, error = [], f"hot-bucket recommendations need Redis: {exc.__class__.__name__}"
        cached = (proposals, error, _bucket_changes(season, layout, window_seconds))
        cache.set(key, cached, HOT_CACHE_SECONDS)
    detail.proposals, detail.proposals_error, changes = cached
    hot = {p.bucket: p for p in detail.proposals}
    total = manifest.total_players or 1
    for row in manifest.buckets:
        b = int(row["bucket"])
        proposal = hot.get(b)
        detail.buckets.append(BucketRow(
            bucket=b, low=int(row["low"]), high=int(row["high"]), count=int(row["count"]),
            share=int(row["count"]) / total, changes=changes[b], changes_per_minute=changes[b] * 60 / window_seconds,
            hot=proposal is not None, split_points=proposal.split_points if proposal else (),
            why=proposal.why if proposal else "",
        ))
    return detail


def _bucket_changes(season: Season, layout: BucketLayout, window_seconds: float) -> list[int]:
    """Score changes per bucket of `layout` in the last `window_seconds`, newest first off the cursor index."""
    since = timezone.now() - timedelta(seconds=window_seconds)
    counts = [0] * layout.size
    rows = (ScoreChange.objects.filter(season=season).order_by("-txid", "-id")
            .values_list("new_score", "committed_at")[:CHANGE_SAMPLE])
    for score, committed_at in rows.iterator(chunk_size=20_000):
        if committed_at < since:
            break
        counts[layout.bucket_of(score)] += 1
    return counts


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
    final: FinalStanding | None
    # The event that set the current score: the latest applied event whose score_after is it.
    setter: ScoreEvent | None
    revocations: list[ScoreRevocation]
    disputes: list[Dispute]


def player_detail(*, season: Season, player_id: str) -> PlayerDetail:
    from leaderboard.selectors import leaderboard_reader

    events = list(ScoreEvent.objects.filter(season=season, player_id=player_id).select_related("client")
                  .order_by("id"))
    score = PlayerScore.objects.filter(season=season, player_id=player_id).first()
    setter = None
    if score is not None:
        setter = next((e for e in reversed(events) if e.status == "applied" and e.score_after == score.score), None)
    rank = position = version = total = None
    rank_error = ""
    try:
        view = leaderboard_reader(season_slug=season.slug).rank(player_id)
        version, total = view.manifest.version, view.total
        if view.entry is not None:
            rank, position = view.entry.rank, view.entry.position
        else:
            rank_error = f"not ranked in version {version}"
    except rankview.Unavailable:
        rank_error = "no published version is available right now"
    except redis.RedisError as exc:
        rank_error = f"the rank views are unreachable ({exc.__class__.__name__})"
    return PlayerDetail(
        season=season, player_id=player_id, events=events, score=score, rank=rank, position=position,
        version=version, total=total, rank_error=rank_error,
        final=FinalStanding.objects.filter(season=season, player_id=player_id).first(), setter=setter,
        revocations=list(ScoreRevocation.objects.filter(season=season, player_id=player_id).order_by("-id")),
        disputes=list(Dispute.objects.filter(season=season, player_id=player_id).order_by("-id")),
    )


def dispute_notes(*, dispute: Dispute) -> list[DisputeNote]:
    return list(DisputeNote.objects.filter(dispute=dispute).order_by("id"))


def dispute_revocations(*, dispute: Dispute) -> list[ScoreRevocation]:
    return list(ScoreRevocation.objects.filter(dispute=dispute).order_by("-id"))


def player_score_get(*, season: Season, player_id: str) -> PlayerScore | None:
    return PlayerScore.objects.filter(season=season, player_id=player_id).first()


# ------------------------------------------------------------------ queues and lists


def staff_users() -> QuerySet[Any]:
    """Accounts that can use the console: members of a role group, or superusers."""
    return (get_user_model().objects.filter(is_active=True)
            .filter(Q(groups__name__in=["viewer", "reviewer", "approver"]) | Q(is_superuser=True))
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


def late_results(*, season: Season, status: str = LateResult.Status.PENDING) -> list[LateResult]:
    qs = LateResult.objects.filter(season=season).select_related("ledger_event").order_by("id")
    if status:
        qs = qs.filter(status=status)
    return list(qs[:500])


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
