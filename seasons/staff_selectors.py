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
from django.db.models import Q, QuerySet
from django.utils import timezone

from audit.models import AuditEntry
from leaderboard import rankview
from leaderboard.core.buckets import BucketLayout
from leaderboard.core.splits import SplitProposal
from leaderboard.metrics import LAG_BOUNDS
from leaderboard.models import LateResult, Manifest, PlayerScore, RebuildJob, ScoreChange, ScoreEvent
from leaderboard.redis_client import redis_get
from seasons.models import Dispute, DisputeNote, FinalCandidate, FinalStanding, ScoreRevocation, Season

log = logging.getLogger(__name__)

INGEST_WINDOW_SECONDS = 60
INGEST_BIN_SECONDS = 5
# The ingest rate is measured on the newest ledger rows only: a bounded read per refresh,
# whatever the ledger's size (at more than this many events a minute the window shrinks).
INGEST_SAMPLE = 5000
CHANGE_WINDOW_SECONDS = 600
CHANGE_SAMPLE = 200_000


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
    ingest_per_second: float
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
    stats = []
    for season in Season.objects.order_by("-starts_at", "slug"):
        manifests = list(Manifest.objects.filter(season=season).order_by("-version")
                         .values_list("version", "published_at", "total_players", "changed_players",
                                      "watermark_txid", "watermark_id")[:60])
        latest = manifests[0] if manifests else None
        rate, bins = _ingest(season, now)
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
            active_rebuild=RebuildJob.objects.filter(season=season, status__in=["queued", "building", "comparing"])
            .first(),
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


def _ingest(season: Season, now: datetime) -> tuple[float, list[int]]:
    """Events per second over the last minute, and per-5-second counts (oldest first)."""
    since = now - timedelta(seconds=INGEST_WINDOW_SECONDS)
    times = list(
        ScoreEvent.objects.filter(season=season).order_by("-id").values_list("received_at", flat=True)[:INGEST_SAMPLE]
    )
    recent = [t for t in times if t >= since]
    bins = [0] * (INGEST_WINDOW_SECONDS // INGEST_BIN_SECONDS)
    for t in recent:
        index = int((now - t).total_seconds() // INGEST_BIN_SECONDS)
        if 0 <= index < len(bins):
            bins[len(bins) - 1 - index] += 1
    if len(recent) == INGEST_SAMPLE:
        # The sample filled before the minute did: measure over the time it spans.
        span = max((now - recent[-1]).total_seconds(), 1e-3)
        return len(recent) / span, bins
    return len(recent) / INGEST_WINDOW_SECONDS, bins


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
    try:
        detail.proposals = season_split_recommendations(season=season, window_seconds=window_seconds)
    except (redis.RedisError, rankview.Unavailable) as exc:
        detail.proposals_error = f"hot-bucket recommendations need Redis: {exc.__class__.__name__}"
    hot = {p.bucket: p for p in detail.proposals}
    layout = BucketLayout.from_dict(manifest.layout)
    changes = _bucket_changes(season, layout, window_seconds)
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
