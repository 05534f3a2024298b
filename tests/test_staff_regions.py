"""The staff console's regions and friends (seasons/staff_views/season.py: season_page,
season_region_sizes, player_page): a season's players per region, a player's region history
across seasons (profile writes and the change stream's in-season moves) and friend list."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from leaderboard.core.profiles import ProfileWrite
from leaderboard.profiles import player_friends_put, player_profiles_apply
from seasons.models import Season
from seasons.services import season_seal_ingest
from seasons.staff.players.selectors import player_regions
from seasons.staff.season.selectors import season_region_sizes
from tests.support import TEST_ACTOR, Events, apply_events, closing_season, in_season

pytest_plugins = ["tests.support.staff_fixtures"]
pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_region_counts() -> None:
    # Region sizes are cached per process and season id; ids come back between tests.
    cache.clear()


def profiles(*items: tuple[str, str | None, int]) -> None:
    player_profiles_apply(profiles=[ProfileWrite(player_id=p, region=r, profile_version=v) for p, r, v in items],
                          client=None)


def scores(season: Season, *players: str, completed_at: str | None = None) -> None:
    events = Events(season.slug, completed_at) if completed_at else Events(season.slug)
    apply_events(season, [events.result(p, 100 + i) for i, p in enumerate(players)])


def region_rows(html: str) -> list[tuple[str, str, str]]:
    """(region, players, share) of the season page's region table."""
    table = html.split('id="region-table"')[1].split("</tbody>")[0]
    return [(re.sub(r"<[^>]+>", "", name), players, share) for name, players, share in re.findall(
        r'<tr[^>]*><td>(.*?)</td><td class="num">([^<]*)</td><td class="num">([^<]*)</td></tr>', table)]


# --- the season page: players per region ----------------------------------------------------


def test_the_season_page_lists_each_region_with_its_players_and_those_in_none(
    season_factory: Callable[..., Season], client_as: Any
) -> None:
    season = season_factory(slug="world", regions=["na", "eu", "apac"])
    # oc is no region of this season, and zed has no profile: both are in none.
    profiles(("ann", "eu", 1), ("bob", "eu", 1), ("cat", "na", 1), ("dan", "oc", 1))
    scores(season, "ann", "bob", "cat", "dan", "zed")
    viewer = client_as("viewer")

    page = viewer.get(f"/staff/seasons/{season.slug}/").content.decode()
    assert region_rows(page) == [("na", "1", "20.0%"), ("eu", "2", "40.0%"), ("apac", "0", "0.0%"),
                                 ("no region", "2", "40.0%")]
    assert re.search(r'<tfoot><tr><th>All players</th><td class="num">5</td>', page)
    # The chart: one bar per region and one for none, each with its exact count.
    chart = page.split('id="region-chart"')[1].split("</svg>")[0]
    assert re.findall(r"<title>([^<]*)</title></rect>", chart) == ["na: 1", "eu: 2", "apac: 0", "no region: 2"]
    # An open season's sizes move: the section polls its partial, which answers the same rows.
    assert f'hx-get="/staff/seasons/{season.slug}/regions/sizes"' in page
    partial = viewer.get(f"/staff/seasons/{season.slug}/regions/sizes")
    assert partial.status_code == 200 and region_rows(partial.content.decode()) == region_rows(page)

    # A region move shows once the counts are taken again.
    profiles(("bob", "apac", 2))
    cache.clear()
    moved = viewer.get(f"/staff/seasons/{season.slug}/regions/sizes").content.decode()
    assert region_rows(moved) == [("na", "1", "20.0%"), ("eu", "1", "20.0%"), ("apac", "1", "20.0%"),
                                  ("no region", "2", "40.0%")]


def test_region_sizes_are_one_cached_count_and_a_region_left_behind_still_shows(
    season_factory: Callable[..., Season]
) -> None:
    season = season_factory(slug="counted", regions=["na", "eu"])
    profiles(("ann", "na", 1), ("bob", "eu", 1))
    scores(season, "ann", "bob")
    # A player left in a region the season no longer lists (its regions set again by hand):
    # counted under that region, flagged, not dropped.
    Season.objects.filter(pk=season.pk).update(regions=["na"])
    season.refresh_from_db()
    with CaptureQueriesContext(connection) as first:
        sizes = season_region_sizes(season=season)
    assert [(r.region, r.players, r.listed) for r in sizes.sizes] == [("na", 1, True), ("eu", 1, False),
                                                                      ("", 0, True)]
    assert sizes.players == 2 and sizes.changing
    assert len(first) == 1
    with CaptureQueriesContext(connection) as again:
        assert season_region_sizes(season=season).sizes == sizes.sizes
    assert len(again) == 0


def test_a_season_without_regions_says_so_and_a_scheduled_one_keeps_its_regions_form(
    season_factory: Callable[..., Season], client_as: Any
) -> None:
    plain = season_factory(slug="plain")
    scores(plain, "ann")
    approver = client_as("approver")
    page = approver.get(f"/staff/seasons/{plain.slug}/").content.decode()
    assert "This season has no regions: every player is in none." in page
    assert 'id="region-table"' not in page and 'id="regions-form"' not in page

    later = timezone.now() + timedelta(days=3)
    scheduled = season_factory(slug="later", regions=["na", "eu"], starts_at=later, cutoff=later + timedelta(days=30))
    assert scheduled.state == "SCHEDULED"
    page = approver.get(f"/staff/seasons/{scheduled.slug}/").content.decode()
    assert region_rows(page) == [("na", "0", "0.0%"), ("eu", "0", "0.0%"), ("no region", "0", "0.0%")]
    # Nothing moves before the season opens: no polling; the regions are still editable.
    assert "regions/sizes" not in page
    assert 'id="regions-form"' in page and 'value="na, eu"' in page
    response = approver.post(f"/staff/seasons/{scheduled.slug}/regions", {"regions": "na, eu, apac", "reason": "x"})
    assert response.status_code == 302
    page = approver.get(f"/staff/seasons/{scheduled.slug}/").content.decode()
    assert [r[0] for r in region_rows(page)] == ["na", "eu", "apac", "no region"]


# --- the player page: region history and friends ---------------------------------------------


def test_the_player_page_shows_the_region_history_in_every_season_and_the_friends(
    season_factory: Callable[..., Season], client_as: Any
) -> None:
    world = season_factory(slug="world", regions=["na", "eu"])
    other = season_factory(slug="other", regions=["eu", "apac"])
    plain = season_factory(slug="plain")
    sealed = closing_season(season_factory, "sealed")
    Season.objects.filter(pk=sealed.pk).update(regions=["na", "eu"])
    sealed.refresh_from_db()
    profiles(("ann", "eu", 1))
    for season in (world, other, plain):
        scores(season, "ann")
    scores(sealed, "ann", completed_at=in_season(sealed))
    season_seal_ingest(season=sealed, actor=TEST_ACTOR)
    profiles(("ann", "na", 2))  # moves ann in world (eu -> na) and other (eu -> none), not in sealed
    profiles(("ann", "na", 3))  # unchanged: a history row, no move
    friends = [f"f{i:03d}" for i in range(60)]
    player_friends_put(player_id="ann", friends=friends, graph_version=7)

    page = client_as("viewer").get(f"/staff/seasons/{world.slug}/players/ann/").content.decode()
    summary = page.split('id="player-summary"')[1].split("</dl>")[0]
    assert re.search(r'id="player-region"><code>na</code>', summary)
    assert re.search(r'id="player-friends-count">60 <small>graph_version 7</small>', summary)

    assert re.search(r'id="player-profile">Profile: region <code>na</code>, version 3,', page)
    changes = page.split('id="player-profile-changes"')[1].split("</table>")[0]
    rows = re.findall(r'<tr><td class="num">(\d+)</td><td>(.*?)</td>', changes)
    assert [(v, re.sub(r"<[^>]+>", "", text)) for v, text in rows] == [
        ("3", "na unchanged"), ("2", "eu → na"), ("1", "none → eu")]
    assert "Profile changes (3)" in page

    seasons = page.split('id="player-season-regions"')[1].split("</table>")[0]
    cells = {slug: [re.sub(r"<[^>]+>", "", c).strip() for c in rest] for slug, *rest in re.findall(
        r'<td><a href="/staff/seasons/([^/]+)/players/ann/">[^<]*</a></td><td>([^<]*)</td>\s*<td>(.*?)</td>\s*'
        r"<td>(.*?)</td></tr>", seasons, re.S)}
    assert set(cells) == {"world", "other", "plain", "sealed"}
    assert cells["world"][1] == "na"
    assert re.fullmatch(r"eu → na profile version 2, .*, stream \d+:\d+", cells["world"][2])
    assert cells["other"][1] == "none" and cells["other"][2].startswith("eu → none profile version 2")
    assert cells["plain"][1:] == ["none no regions", "–"]
    assert cells["sealed"][0] == "FINALIZING" and cells["sealed"][1:] == ["eu", "–"]
    assert '<tr class="current"><td><a href="/staff/seasons/world/players/ann/">' in seasons

    listed = page.split('id="player-friend-list"')[1].split("</ul>")[0]
    assert re.findall(r"<code>([^<]+)</code>", listed) == friends[:50]
    assert 'href="/staff/seasons/world/players/f000/"' in listed
    assert "the first 50 of 60" in page
    assert 'href="/v1/seasons/world/players/ann/friends"' in page


def test_a_player_without_profile_or_friends_says_so(
    season_factory: Callable[..., Season], client_as: Any
) -> None:
    season = season_factory(slug="world", regions=["na"])
    scores(season, "bob")
    page = client_as("viewer").get(f"/staff/seasons/{season.slug}/players/bob/").content.decode()
    assert "Profile: none: the player has no region in any season" in page
    assert "Profile changes (0)" in page and "the profile service has written no profile" in page
    assert re.search(r'id="player-region"><span class="none">none</span>', page)
    assert re.search(r'id="player-friends-count">none <small>no friend list', page)
    assert "Friends (0)" in page and 'id="player-friend-list"' not in page
    # An empty list written by the social service is a list: its version shows.
    player_friends_put(player_id="bob", friends=[], graph_version=2)
    page = client_as("viewer").get(f"/staff/seasons/{season.slug}/players/bob/").content.decode()
    assert "graph_version 2" in page and "The list is empty." in page

    nobody = client_as("viewer").get(f"/staff/seasons/{season.slug}/players/nobody/").content.decode()
    assert "No score in any season." in nobody and "no score in this season" in nobody


def test_the_region_moves_are_read_through_their_partial_index(season_factory: Callable[..., Season]) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the plan is PostgreSQL's")
    season = season_factory(slug="world", regions=["na", "eu"])
    profiles(("ann", "eu", 1))
    scores(season, "ann")
    profiles(("ann", "na", 2))
    with CaptureQueriesContext(connection) as queries:
        regions = player_regions(player_id="ann")
    assert [(m.old_region, m.region, m.profile_version) for m in regions.seasons[0].moves] == [("eu", "na", 2)]
    (sql,) = [q["sql"] for q in queries.captured_queries if "leaderboard_scorechange" in q["sql"]]
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # a tiny table: show the index can serve it
        cursor.execute(f"EXPLAIN {sql}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "score_change_region_moves" in plan, plan


# --- who may see them --------------------------------------------------------------------------


def test_the_region_pages_need_a_signed_in_console_role(
    season_factory: Callable[..., Season], client_as: Any
) -> None:
    season = season_factory(slug="world", regions=["na"])
    urls = [f"/staff/seasons/{season.slug}/", f"/staff/seasons/{season.slug}/regions/sizes",
            f"/staff/seasons/{season.slug}/players/ann/"]
    for url in urls:
        response = Client().get(url)
        assert response.status_code == 302 and response["Location"].startswith("/staff/login/?next="), url
    nobody = Client()
    nobody.force_login(get_user_model().objects.create_user(username="no-role", password="x"))
    for url in urls:
        response = nobody.get(url)
        assert response.status_code == 403 and b"console_view" in response.content, url
    for role in ("viewer", "reviewer", "approver"):
        client = client_as(role)
        for url in urls:
            assert client.get(url).status_code == 200, (role, url)
        # The sizes are read-only: no method but GET.
        assert client.post(urls[1]).status_code == 405


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_the_player_page_shows_the_regional_rank_from_the_same_version_as_the_global_one(
    season_factory: Callable[..., Season], client_as: Any
) -> None:
    from tests.support.publication import publish

    world = season_factory(slug="world", regions=["na", "eu"])
    profiles(("ann", "na", 1), ("bob", "eu", 1), ("cat", "na", 1), ("dan", None, 1))
    events = Events(world.slug)
    apply_events(world, [events.result("bob", 900), events.result("cat", 800), events.result("ann", 700),
                         events.result("dan", 999)])
    version = publish(world)

    def summary(player_id: str) -> str:
        page = client_as("viewer").get(f"/staff/seasons/{world.slug}/players/{player_id}/").content.decode()
        return re.sub(r"<[^>]+>", "", page.split('id="player-summary"')[1].split("</dl>")[0])

    ann = summary("ann")
    assert "Rank (published)4 position 4 of 4" in ann
    assert f"Regional rank (published)2 position 2 of 2 in na, board version {version}" in ann
    assert "Regional rank" not in summary("dan")  # no region: no regional board
