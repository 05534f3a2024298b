"""The staff console's overview (seasons/staff_views/console.py): one row per season and,
for each live season, the charts an operator looks at first (publication lag, ingest rate,
epoch duration, version age), drawn from the samples the server records on its own."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from leaderboard.metrics.samples import metrics_seasons_sample
from leaderboard.models import SeasonSample
from seasons.models import Season
from tests.support import Events, post_ok

pytest_plugins = ["tests.support.staff_fixtures"]

Post = Callable[..., Any]


def charts_of(html: str, slug: str) -> str:
    return html.split(f'data-season-charts="{slug}"')[1].split("</section>")[0]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("redis_flushed")
def test_the_overview_draws_the_servers_samples_and_viewing_it_records_none(
    season_factory: Callable[..., Season], post_scores: Post, client_as: Any
) -> None:
    season = season_factory(slug="ov")
    events = Events("ov", "2026-11-15T12:00:00Z")
    now = timezone.now()
    # Three samples 10 s apart, as beat takes them, with 200 events between each: 20 events/s.
    for i in range(3):
        if i:
            post_ok(post_scores, season, [events.result(f"p{i}-{n}", n) for n in range(200)])
        metrics_seasons_sample(now=now - timedelta(seconds=25 - 10 * i))
    viewer = client_as("viewer")
    before = SeasonSample.objects.count()

    page = viewer.get("/staff/").content.decode()
    charts = charts_of(page, season.slug)
    for name in ("publish-lag", "ingest", "epoch", "version-age"):
        assert f'data-chart="{name}"' in charts
    assert "3 samples over the last 1 h" in charts
    ingest = charts.split('data-chart="ingest"')[1].split("</figure>")[0]
    assert '<span class="latest">20.0/s</span>' in ingest and "<polyline" in ingest
    assert re.search(r'class="axis" text-anchor="end">20.0/s<', ingest)  # the y axis ends at a round number
    # The table's rate: events over the last minute of samples (400 in 20 s).
    assert re.search(r'data-field="ingest">20\.0/s', page)
    # Viewing (the page, its polled partial, another window) samples nothing: beat does.
    partial = viewer.get("/staff/overview/stats", {"window": "900"}).content.decode()
    assert partial.startswith('<div id="overview-stats"') and "over the last 15 min" in charts_of(partial, season.slug)
    assert viewer.get("/staff/", {"window": "nonsense"}).status_code == 200
    assert SeasonSample.objects.count() == before


@pytest.mark.django_db
def test_a_live_season_without_recent_samples_says_beat_may_be_down(
    season_factory: Callable[..., Season], client_as: Any
) -> None:
    quiet = season_factory(slug="quiet")
    final = season_factory(slug="over")
    Season.objects.filter(pk=final.pk).update(state="FINAL")
    page = client_as("viewer").get("/staff/").content.decode()
    charts = charts_of(page, quiet.slug)
    assert "no recent sample: is Celery beat running?" in charts
    assert "no samples in this window" in charts  # drawn empty, not missing
    assert 'data-season-charts="over"' not in page  # a FINAL season is not sampled
    assert '<a href="?window=900">15 min</a>' in page and '<strong class="window-current">1 h</strong>' in page
