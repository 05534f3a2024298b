"""The console's per-season samples: one row per live season and tick (Celery beat), from
the counters in Redis (counters.py), the published manifests and the change stream.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import redis
from django.conf import settings
from django.utils import timezone

from leaderboard.core.lifecycle import MATERIALIZED_STATES, SeasonState
from leaderboard.core.partitions import Watermark
from leaderboard.metrics.counters import metrics_key
from leaderboard.redis_client import redis_get
from leaderboard.redis_errors import REDIS_ERRORS

if TYPE_CHECKING:
    from leaderboard.models import SeasonSample
    from seasons.models import Season

log = logging.getLogger(__name__)


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
        pipe.hgetall(metrics_key("events"))
        pipe.hgetall(metrics_key("lag"))
        pipe.hgetall(metrics_key("epoch_ms"))
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
