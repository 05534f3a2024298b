"""The staff console's season page (seasons/staff_views/season.py: season_page, season_stats):
the bucket table's change rates over the time they really cover, the season's conflicting
deliveries, and the console's one number format."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from seasons.models import Season
from seasons.staff.season.selectors import season_detail
from tests.support import Events, materialize, post_ok

pytest_plugins = ["tests.support.staff_fixtures"]

Post = Callable[..., Any]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_changes_per_minute_are_over_the_seasons_age_when_it_is_younger_than_the_window(
    season_factory: Callable[..., Season], post_scores: Post, client_as: Any
) -> None:
    season = season_factory(slug="young")
    # Created two minutes ago: its 30 changes are 15 a minute, not 30 / 10 minutes.
    Season.objects.filter(pk=season.pk).update(created_at=timezone.now() - timedelta(minutes=2))
    season.refresh_from_db()
    events = Events("young", "2026-11-15T12:00:00Z")
    post_ok(post_scores, season, [events.result(f"p{i}", 12_345) for i in range(30)])
    materialize(season)

    detail = season_detail(season=season)
    assert detail.changes_window_seconds == pytest.approx(120, abs=5)
    (row,) = [b for b in detail.buckets if b.changes]
    assert row.changes == 30 and row.changes_per_minute == pytest.approx(15, rel=0.05)

    stats = client_as("viewer").get(f"/staff/seasons/{season.slug}/stats").content.decode()
    assert "<th>Changes (last 2.0 min)</th>" in stats
    assert re.search(r'<td>10,000..19,999</td><td class="num">30</td>\s*<td class="num">100.0%</td>'
                     r'<td class="num">30</td><td class="num">1[45]\.\d</td>', stats)

    # An old season keeps the full ten-minute window.
    old = season_factory(slug="old")
    Season.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=1))
    old.refresh_from_db()
    post_ok(post_scores, old, [events.result(f"o{i}", 5) for i in range(30)])
    materialize(old)
    assert season_detail(season=old).changes_window_seconds == 600


@pytest.mark.django_db
def test_the_season_page_counts_and_lists_conflicting_deliveries(
    season_factory: Callable[..., Season], post_scores: Post, client_as: Any
) -> None:
    season = season_factory(slug="sc")
    events = Events("sc", "2026-11-15T12:00:00Z")
    sent = [events.result("alice", 1_500), events.result("bob", 20)]
    post_ok(post_scores, season, sent)
    viewer = client_as("viewer")
    assert 'id="season-conflicts"' not in viewer.get(f"/staff/seasons/{season.slug}/").content.decode()

    post_ok(post_scores, season, [{**sent[0], "best_score": 1_501}, {**sent[1], "player_id": "mallory"}])
    page = viewer.get(f"/staff/seasons/{season.slug}/").content.decode()
    section = page.split('id="season-conflicts"')[1].split("</section>")[0]
    assert "Conflicting deliveries (2)" in section
    # Each links the player it named and, when it named another, the ledger's player.
    assert f'href="/staff/seasons/{season.slug}/players/alice/"' in section
    assert f'href="/staff/seasons/{season.slug}/players/mallory/"' in section
    assert f'ledger: <a href="/staff/seasons/{season.slug}/players/bob/">' in section
    assert "best 1,501" in section and "best 1,500" in section
