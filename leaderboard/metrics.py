"""Prometheus metrics (text exposition at /metrics), shared by every process through Redis.

Web workers, Celery workers and beat are separate processes, so in-process counters
would each see a slice. Writers increment small Redis hashes (one pipelined round trip
per batch or epoch, after commit); the scrape renders them together with gauges read
from the current manifests and the database.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import redis
from django.conf import settings
from django.db.models import Count
from django.utils import timezone

from leaderboard.core.lifecycle import MATERIALIZED_STATES, SeasonState
from leaderboard.core.partitions import Watermark
from leaderboard.redis_client import redis_get
from leaderboard.redis_errors import REDIS_ERRORS
from leaderboard.views import rankview

if TYPE_CHECKING:
    from leaderboard.models import SeasonSample
    from seasons.models import Season

log = logging.getLogger(__name__)

LAG_BOUNDS = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)
EPOCH_BOUNDS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)


def _key(name: str) -> str:
    return f"{settings.REDIS_KEY_PREFIX}:metrics:{name}"


def metrics_outcomes_count(
    *, season_slug: str, statuses: Iterable[tuple[str, str]], r: redis.Redis | None = None
) -> None:
    """Count ingest outcomes: (status, reason) pairs of one batch."""
    by_status: dict[str, int] = {}
    by_reason: dict[str, int] = {}
    for status, reason in statuses:
        by_status[status] = by_status.get(status, 0) + 1
        if status == "rejected":
            by_reason[reason] = by_reason.get(reason, 0) + 1
    r = r or redis_get()
    with r.pipeline(transaction=False) as pipe:
        for status, n in by_status.items():
            pipe.hincrby(_key("events"), f"{season_slug}|{status}", n)
        for reason, n in by_reason.items():
            pipe.hincrby(_key("rejected"), f"{season_slug}|{reason}", n)
        pipe.execute()


def _observe(pipe: redis.client.Pipeline, name: str, season_slug: str, bounds: tuple[float, ...], value: float,
             weight: int = 1) -> None:
    bound = next((b for b in bounds if value <= b), None)
    field = f"{season_slug}|{'+Inf' if bound is None else bound}"
    pipe.hincrby(_key(name), field, weight)
    pipe.hincrbyfloat(_key(name), f"{season_slug}|sum", value * weight)
    pipe.hincrby(_key(name), f"{season_slug}|count", weight)


def metrics_epoch_observe(
    *, season_slug: str, duration_ms: float, lags: Iterable[tuple[float, int]], r: redis.Redis | None = None
) -> None:
    """An epoch's duration, and the event-to-publish lag of each batch it published (seconds, events)."""
    r = r or redis_get()
    with r.pipeline(transaction=False) as pipe:
        _observe(pipe, "epoch_ms", season_slug, EPOCH_BOUNDS_MS, duration_ms)
        for lag, weight in lags:
            _observe(pipe, "lag", season_slug, LAG_BOUNDS, max(lag, 0.0), weight)
        pipe.execute()


def metrics_failure_count(*, season_slug: str, kind: str, r: redis.Redis | None = None) -> None:
    """kind: epoch_verification | checksum | reconciliation."""
    (r or redis_get()).hincrby(_key("failures"), f"{season_slug}|{kind}", 1)


def _histogram_lines(name: str, help_text: str, raw: dict[Any, Any], bounds: tuple[float, ...]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
    seasons: dict[str, dict[str, float]] = {}
    for field, value in raw.items():
        season, _, part = field.decode().partition("|")
        seasons.setdefault(season, {})[part] = float(value)
    for season, parts in sorted(seasons.items()):
        running = 0.0
        for bound in bounds:
            running += parts.get(str(bound), 0.0)
            lines.append(f'{name}_bucket{{season="{season}",le="{bound}"}} {running:g}')
        running += parts.get("+Inf", 0.0)
        lines.append(f'{name}_bucket{{season="{season}",le="+Inf"}} {running:g}')
        lines.append(f'{name}_sum{{season="{season}"}} {parts.get("sum", 0.0):g}')
        lines.append(f'{name}_count{{season="{season}"}} {parts.get("count", 0.0):g}')
    return lines


def _counter_lines(name: str, help_text: str, raw: dict[Any, Any], label: str) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
    for field, value in sorted(raw.items()):
        season, _, part = field.decode().partition("|")
        lines.append(f'{name}{{season="{season}",{label}="{part}"}} {int(value)}')
    return lines


def metrics_render() -> str:
    from leaderboard.models import ACTIVE_REBUILD_STATUSES, RebuildJob, ReconciliationRun
    from seasons.models import Season

    r = redis_get()
    lines: list[str] = []
    lines += _histogram_lines("leaderboard_event_to_publish_seconds",
                              "Time from a change's commit to the first published version holding it.",
                              r.hgetall(_key("lag")), LAG_BOUNDS)
    lines += _histogram_lines("leaderboard_epoch_duration_milliseconds", "Duration of epochs that published.",
                              r.hgetall(_key("epoch_ms")), EPOCH_BOUNDS_MS)  # the bounds _observe counted by
    lines += _counter_lines("leaderboard_events_total", "Ingested events by outcome.", r.hgetall(_key("events")),
                            "status")
    lines += _counter_lines("leaderboard_rejected_events_total", "Rejected events by reason.",
                            r.hgetall(_key("rejected")), "reason")
    lines += _counter_lines("leaderboard_failures_total",
                            "Epoch verification, checksum and reconciliation failures.",
                            r.hgetall(_key("failures")), "kind")

    now = time.time()
    age = ["# HELP leaderboard_version_age_seconds Age of the current published version.",
           "# TYPE leaderboard_version_age_seconds gauge"]
    current = ["# HELP leaderboard_version Current published version.", "# TYPE leaderboard_version gauge"]
    sizes = ["# HELP leaderboard_bucket_players Players per score bucket in the current version.",
             "# TYPE leaderboard_bucket_players gauge"]
    skew = ["# HELP leaderboard_bucket_skew Largest bucket over the mean non-empty bucket.",
            "# TYPE leaderboard_bucket_skew gauge"]
    for slug in Season.objects.values_list("slug", flat=True):
        keys = rankview.Keys(settings.REDIS_KEY_PREFIX, slug)
        version = rankview.pointer_get(r, keys)
        manifest = rankview.manifest_get(r, keys, version) if version else None
        if manifest is None:
            continue
        current.append(f'leaderboard_version{{season="{slug}"}} {manifest.version}')
        age.append(f'leaderboard_version_age_seconds{{season="{slug}"}} '
                   f'{now - datetime.fromisoformat(manifest.as_of).timestamp():.3f}')
        for bucket, count in enumerate(manifest.counts):
            if count:
                sizes.append(f'leaderboard_bucket_players{{season="{slug}",bucket="{bucket}"}} {count}')
        filled = [c for c in manifest.counts if c]
        if filled:
            skew.append(f'leaderboard_bucket_skew{{season="{slug}"}} {max(filled) / (sum(filled) / len(filled)):.3f}')
    lines += current + age + sizes + skew

    lines += ["# HELP leaderboard_rebuild_progress_ratio Progress of shadow builds in flight (0..1).",
              "# TYPE leaderboard_rebuild_progress_ratio gauge"]
    for job in RebuildJob.objects.filter(status__in=ACTIVE_REBUILD_STATUSES).select_related("season"):
        lines.append(f'leaderboard_rebuild_progress_ratio{{season="{job.season.slug}",job="{job.pk}",'
                     f'kind="{job.kind}"}} {job.percent / 100:.4f}')
    lines += ["# HELP leaderboard_reconciliation_runs_total Reconciliation runs by result.",
              "# TYPE leaderboard_reconciliation_runs_total counter"]
    for row in ReconciliationRun.objects.values("season__slug", "ok").annotate(n=Count("id")).order_by():
        lines.append(f'leaderboard_reconciliation_runs_total{{season="{row["season__slug"]}",'
                     f'ok="{str(row["ok"]).lower()}"}} {row["n"]}')
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ server-side samples


@dataclass(frozen=True, slots=True)
class SeasonCounters:
    """A season's cumulative counters in Redis (zero until its first batch or epoch)."""

    events: int = 0
    lag_sum: float = 0.0
    lag_count: int = 0
    epoch_ms_sum: float = 0.0
    epoch_count: int = 0


def metrics_counters_read(*, r: redis.Redis | None = None) -> dict[str, SeasonCounters]:
    """Every season's ingest, lag and epoch counters, in one round trip."""
    r = r or redis_get()
    with r.pipeline(transaction=False) as pipe:
        pipe.hgetall(_key("events"))
        pipe.hgetall(_key("lag"))
        pipe.hgetall(_key("epoch_ms"))
        events, lag, epoch = pipe.execute()
    parts: dict[str, dict[str, float]] = {}
    for field, value in events.items():
        slug = field.decode().partition("|")[0]
        season = parts.setdefault(slug, {})
        season["events"] = season.get("events", 0.0) + float(value)
    for prefix, raw in (("lag_", lag), ("epoch_", epoch)):
        for field, value in raw.items():
            slug, _, part = field.decode().partition("|")
            if part in ("sum", "count"):
                parts.setdefault(slug, {})[prefix + part] = float(value)
    return {
        slug: SeasonCounters(events=int(p.get("events", 0)), lag_sum=p.get("lag_sum", 0.0),
                             lag_count=int(p.get("lag_count", 0)), epoch_ms_sum=p.get("epoch_sum", 0.0),
                             epoch_count=int(p.get("epoch_count", 0)))
        for slug, p in parts.items()
    }


def season_backlog_seconds(*, season: Season, watermark: Watermark, now: datetime) -> float:
    """Age of the oldest committed change after `watermark` (the published version's): 0 when none waits."""
    from leaderboard.ingest.selectors import stream_oldest_after

    oldest = stream_oldest_after(season_id=season.pk, watermark=watermark)
    return max((now - oldest).total_seconds(), 0.0) if oldest is not None else 0.0


def _per(after: float | None, before: float | None, over: float | None) -> float | None:
    """(after - before) / over; None when unknown, when the counter went back (Redis lost it) or over <= 0."""
    if after is None or before is None or over is None or over <= 0 or after < before:
        return None
    return (after - before) / over


# States whose samples are worth keeping: a FINAL season's board only moves by a rare correction.
SAMPLED_STATES = MATERIALIZED_STATES - {SeasonState.FINAL}


def metrics_seasons_sample(*, now: datetime | None = None) -> int:
    """Record one sample per live season for this tick (Celery beat, every METRICS_SAMPLE_SECONDS),
    so the console's charts have a history whether or not anyone had them open, and drop
    samples older than METRICS_HISTORY_SECONDS. Returns the number of seasons sampled.

    Safe to run twice for a tick: the second finds the tick's rows (unique per season and
    slot) and writes nothing. Redis trouble leaves the counter-based figures unknown.
    """
    from leaderboard.models import Manifest, SeasonSample
    from seasons.models import Season

    now = now or timezone.now()
    slot = int(now.timestamp() // settings.METRICS_SAMPLE_SECONDS)
    try:
        counters: dict[str, SeasonCounters] | None = metrics_counters_read()
    except REDIS_ERRORS:
        log.warning("metrics counters unavailable: samples without ingest, lag and epoch figures", exc_info=True)
        counters = None
    rows = []
    for season in Season.objects.filter(state__in=SAMPLED_STATES).order_by("pk"):
        latest = (Manifest.objects.filter(season=season).order_by("-version")
                  .values_list("version", "published_at", "watermark_txid", "watermark_id", "watermark_vector").first())
        before: SeasonSample | None = (SeasonSample.objects.filter(season=season, slot__lt=slot)
                                       .order_by("-slot").first())
        c = counters.get(season.slug, SeasonCounters()) if counters is not None else None
        elapsed = (now - before.sampled_at).total_seconds() if before is not None else None
        rows.append(SeasonSample(
            season=season, slot=slot, sampled_at=now,
            events_total=c.events if c else None, lag_sum=c.lag_sum if c else None,
            lag_count=c.lag_count if c else None, epoch_ms_sum=c.epoch_ms_sum if c else None,
            epoch_count=c.epoch_count if c else None,
            ingest_per_second=_per(c.events if c else None, before.events_total if before else None, elapsed),
            publish_lag_seconds=_per(c.lag_sum if c else None, before.lag_sum if before else None,
                                     _per(c.lag_count if c else None, before.lag_count if before else None, 1.0)),
            epoch_ms=_per(c.epoch_ms_sum if c else None, before.epoch_ms_sum if before else None,
                          _per(c.epoch_count if c else None, before.epoch_count if before else None, 1.0)),
            backlog_seconds=season_backlog_seconds(
                season=season, watermark=Watermark.from_columns(*latest[2:5]) if latest else Watermark(), now=now),
            version=latest[0] if latest else 0,
            version_age_seconds=(now - latest[1]).total_seconds() if latest else None,
        ))
    SeasonSample.objects.bulk_create(rows, ignore_conflicts=True)
    SeasonSample.objects.filter(sampled_at__lt=now - timedelta(seconds=settings.METRICS_HISTORY_SECONDS)).delete()
    return len(rows)
