"""The overview of every season: its figures and charts, from the samples Celery beat
records, and the event-to-publish lag from the metrics in Redis (optional)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from django.conf import settings
from django.core.cache import cache
from django.utils import timezone

from leaderboard.core.partitions import Watermark
from leaderboard.ledger_reads import ledger_rows_count
from leaderboard.metrics.counters import LAG_BOUNDS
from leaderboard.metrics.samples import season_backlog_seconds
from leaderboard.models import ACTIVE_REBUILD_STATUSES, LateResult, Manifest, RebuildJob, SeasonSample
from leaderboard.redis_client import redis_get
from leaderboard.redis_errors import REDIS_ERRORS
from seasons.models import Dispute, ScoreRevocation, Season

log = logging.getLogger(__name__)

# The overview's charts come from the samples Celery beat records every
# METRICS_SAMPLE_SECONDS (leaderboard/metrics/samples.py), so they have a history whether or not
# anyone had the page open. The windows they can show, and at most how many points a
# chart draws (consecutive samples are merged, keeping the stretch's worst value).
CHART_WINDOWS = {900: "15 min", 3600: "1 h", 21_600: "6 h", 86_400: "24 h"}
DEFAULT_CHART_WINDOW = 3600
CHART_POINTS = 240
# The ingest rate in the table: events counted over about this long.
INGEST_RATE_SECONDS = 60


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
