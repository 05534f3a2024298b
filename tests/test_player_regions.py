"""A player's region in each season: taken from the profile with the first score, moved by
profile changes while the season is open (one change-stream row per move, the score
unchanged), frozen once the season is sealed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from leaderboard.core.profiles import ProfileWrite
from leaderboard.models import PlayerScore, ScoreChange
from leaderboard.profiles import player_profiles_apply
from seasons.models import Season
from seasons.services import season_seal_ingest
from tests.support import TEST_ACTOR, Events, apply_events, closing_season, in_season, ledger_rows, materialize

pytestmark = pytest.mark.django_db(transaction=True)


def profiles(*items: tuple[str, str | None, int]) -> None:
    player_profiles_apply(profiles=[ProfileWrite(player_id=p, region=r, profile_version=v) for p, r, v in items],
                          client=None)


def regions_of(season: Season) -> dict[str, str]:
    return dict(ledger_rows(PlayerScore, season, "player_id", "region"))


def changes_of(season: Season, *fields: str) -> list[tuple[Any, ...]]:
    """`fields` of the season's changes from every database holding its partitions, in
    (txid, id) order: commit order within a partition (a txid names its partition)."""
    return [row[2:] for row in sorted(ledger_rows(ScoreChange, season, "txid", "id", *fields))]


def moves_of(season: Season) -> list[tuple[Any, ...]]:
    rows = changes_of(season, "event_id", "player_id", "old_region", "region", "old_score", "new_score")
    return [row[1:] for row in rows if row[0].startswith("region:")]


@pytest.fixture
def regional(season_factory: Callable[..., Season]) -> Season:
    return season_factory(slug="reg", regions=["na", "eu"])


def test_a_first_score_takes_the_profiles_region_when_the_season_has_it(
    regional: Season, season_factory: Callable[..., Season]
) -> None:
    plain = season_factory(slug="plain")
    profiles(("ann", "eu", 1), ("bob", "apac", 1))
    for season in (regional, plain):
        events = Events(season.slug)
        apply_events(season, [events.result("ann", 10), events.result("bob", 20), events.result("cat", 30)])
    assert regions_of(regional) == {"ann": "eu", "bob": "", "cat": ""}
    assert regions_of(plain) == {"ann": "", "bob": "", "cat": ""}
    # Score changes carry the region, unchanged.
    assert set(changes_of(regional, "player_id", "old_region", "region")) == {
        ("ann", "eu", "eu"), ("bob", "", ""), ("cat", "", "")}


def test_a_region_change_moves_the_player_in_each_open_season_once_with_the_score_kept(regional: Season) -> None:
    profiles(("ann", "eu", 1))
    events = Events("reg")
    apply_events(regional, [events.result("ann", 500)])
    profiles(("ann", "na", 2), ("nobody", "na", 1))  # nobody has no score: nothing to move
    assert regions_of(regional) == {"ann": "na"}
    assert moves_of(regional) == [("ann", "eu", "na", 500, 500)]
    # Same region again, and a region the season does not have (none): one more move only.
    profiles(("ann", "na", 3))
    profiles(("ann", "apac", 4))
    assert moves_of(regional) == [("ann", "eu", "na", 500, 500), ("ann", "na", "", 500, 500)]
    # A later score keeps the player's region in the season.
    apply_events(regional, [events.result("ann", 700)])
    assert regions_of(regional) == {"ann": ""}


def test_the_moves_are_numbered_in_the_seasons_commit_order_and_publish_nothing_wrong(regional: Season) -> None:
    profiles(("ann", "eu", 1), ("bob", "eu", 1))
    events = Events("reg")
    apply_events(regional, [events.result("ann", 100), events.result("bob", 200)])
    profiles(("bob", "na", 2))
    apply_events(regional, [events.result("ann", 300)])
    seen = [(p, e.split(":")[0] == "region", s) for p, e, s in changes_of(regional, "player_id", "event_id",
                                                                          "new_score")]
    expected = [("ann", False, 100), ("bob", False, 200), ("bob", True, 200), ("ann", False, 300)]
    if regional.partitions == 1:
        assert seen == expected
    # With partitions, commit order holds within each; a player's changes all lie in one.
    for player in ("ann", "bob"):
        assert [row for row in seen if row[0] == player] == [row for row in expected if row[0] == player]


@pytest.mark.usefixtures("rank_views")
def test_an_epoch_over_region_moves_publishes_the_scores_unchanged(season_factory: Callable[..., Season]) -> None:
    season = closing_season(season_factory, "movers")
    Season.objects.filter(pk=season.pk).update(regions=["na", "eu"])
    season.refresh_from_db()
    profiles(("ann", "eu", 1))
    events = Events("movers", in_season(season))
    apply_events(season, [events.result("ann", 100), events.result("bob", 50)])
    first = materialize(season)
    profiles(("ann", "na", 2))
    second = materialize(season)
    assert second.version > first.version
    assert (second.total, second.counts) == (first.total, first.counts)


def test_a_sealed_season_keeps_the_regions_it_was_sealed_with(season_factory: Callable[..., Season]) -> None:
    season = closing_season(season_factory, "sealed-reg")
    Season.objects.filter(pk=season.pk).update(regions=["na", "eu"])
    profiles(("ann", "eu", 1))
    events = Events("sealed-reg", in_season(season))
    apply_events(season, [events.result("ann", 100)])
    season_seal_ingest(season=season, actor=TEST_ACTOR)
    profiles(("ann", "na", 2))
    assert regions_of(season) == {"ann": "eu"}
    assert moves_of(season) == []


def test_profile_writes_touch_no_season_without_regions(season_factory: Callable[..., Season]) -> None:
    season = season_factory(slug="noreg")
    events = Events("noreg")
    apply_events(season, [events.result("ann", 100)])
    profiles(("ann", "eu", 1))
    assert regions_of(season) == {"ann": ""} and moves_of(season) == []
