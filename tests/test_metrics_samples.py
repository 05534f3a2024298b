"""The server-side samples behind the console's overview charts (leaderboard/metrics/samples.py:
metrics_seasons_sample, run by Celery beat as leaderboard.tasks.metrics_sample): recorded
whether or not anyone has a page open, rates from the Redis counters' differences, one
sample per season and tick, a bounded history, and database figures when Redis is gone."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from leaderboard import tasks
from leaderboard.metrics import samples as metrics_samples
from leaderboard.models import SeasonSample
from seasons.models import Season
from tests.support import Events, post_ok, publish

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]

Post = Callable[..., Any]


def samples(season: Season) -> list[SeasonSample]:
    return list(SeasonSample.objects.filter(season=season).order_by("slot"))


def test_beat_samples_every_live_season_without_anyone_viewing_a_page(
    season_factory: Callable[..., Season], post_scores: Post
) -> None:
    entry = settings.CELERY_BEAT_SCHEDULE["leaderboard-metrics-samples"]
    assert entry["task"] == tasks.metrics_sample.name and entry["schedule"] == settings.METRICS_SAMPLE_SECONDS
    live = season_factory(slug="live")
    final = season_factory(slug="done")
    Season.objects.filter(pk=final.pk).update(state="FINAL")
    events = Events("live", "2026-11-15T12:00:00Z")
    post_ok(post_scores, live, [events.result(f"p{i}", i) for i in range(300)])

    # What the beat's worker runs; nobody requests any page.
    assert tasks.metrics_sample() == 1
    first = samples(live)
    assert len(first) == 1 and first[0].events_total == 300
    assert first[0].ingest_per_second is None  # a rate needs a previous sample
    assert first[0].backlog_seconds > 0 and first[0].version == 0  # written, not yet published
    assert samples(final) == []

    post_ok(post_scores, live, [events.result(f"p{i}", 1_000 + i) for i in range(100)])
    later = first[0].sampled_at + timedelta(seconds=10)
    metrics_samples.metrics_seasons_sample(now=later)
    second = samples(live)[-1]
    assert second.events_total == 400 and second.ingest_per_second == pytest.approx(100 / 10)


def test_publication_lag_and_epoch_duration_are_the_means_over_the_interval(
    season_factory: Callable[..., Season], post_scores: Post
) -> None:
    season = season_factory(slug="lag")
    events = Events("lag", "2026-11-15T12:00:00Z")
    now = timezone.now()
    metrics_samples.metrics_seasons_sample(now=now)
    assert samples(season)[0].publish_lag_seconds is None  # nothing published yet
    post_ok(post_scores, season, [events.result(f"p{i}", i) for i in range(50)])
    published = publish(season)
    counters = metrics_samples.metrics_counters_read()[season.slug]
    metrics_samples.metrics_seasons_sample(now=now + timedelta(seconds=10))
    sample = samples(season)[-1]
    assert counters.lag_count == 50 and counters.epoch_count >= 1
    assert sample.publish_lag_seconds == pytest.approx(counters.lag_sum / counters.lag_count)
    assert sample.epoch_ms == pytest.approx(counters.epoch_ms_sum / counters.epoch_count)
    assert sample.version == published and sample.backlog_seconds == 0.0
    assert sample.version_age_seconds is not None and sample.version_age_seconds >= 0

    # An interval without a publication has no lag or epoch figure (a gap, not a zero).
    metrics_samples.metrics_seasons_sample(now=now + timedelta(seconds=20))
    quiet = samples(season)[-1]
    assert quiet.publish_lag_seconds is None and quiet.epoch_ms is None and quiet.ingest_per_second == 0.0


def test_a_repeated_tick_writes_nothing_and_samples_older_than_the_history_go(
    season_factory: Callable[..., Season], settings: Any
) -> None:
    season = season_factory(slug="keep")
    settings.METRICS_HISTORY_SECONDS = 3600.0
    now = timezone.now()
    old = now - timedelta(seconds=3700)
    metrics_samples.metrics_seasons_sample(now=old)
    metrics_samples.metrics_seasons_sample(now=now)
    metrics_samples.metrics_seasons_sample(now=now + timedelta(seconds=0.001))  # a second delivery of the tick
    assert [s.sampled_at for s in samples(season)] == [now]


def test_without_redis_a_sample_keeps_the_database_figures(
    season_factory: Callable[..., Season], monkeypatch: pytest.MonkeyPatch
) -> None:
    season = season_factory(slug="noredis")
    # Redis unreachable: a real client on a port nothing listens on.
    monkeypatch.setattr(metrics_samples, "redis_get", lambda: redis.Redis(port=1, socket_connect_timeout=0.2))
    metrics_samples.metrics_seasons_sample()
    (sample,) = samples(season)
    assert sample.events_total is None and sample.ingest_per_second is None
    assert sample.backlog_seconds == 0.0 and sample.version == 0
