"""Regional boards in the rank views: each region of a season is its own bucketed board in
the same copies, epochs and manifests as the global one, so every version holds each
player on exactly the board of their region in that version, and every read of a regional
board answers as the ledger's standings of that region's players."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from leaderboard.core.ranking import Standings
from leaderboard.core.season_options import TIE_BREAK_FIRST_REACHED
from leaderboard.models import PlayerScore
from leaderboard.redis_client import redis_get
from leaderboard.views import rankview
from seasons.models import Season
from tests.support import Events, Profiles, apply_events, ledger_rows
from tests.support.publication import NARROW, assert_board_equals, board_read, current_manifest, keys_of, publish

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]

REGIONS = ["na", "eu", "apac"]


def reader(season: Season, region: str | None = None) -> rankview.RankReader:
    return rankview.RankReader(redis_get(), keys_of(season), deadline=3600, region=region)


def ledger_regions(season: Season) -> dict[str, tuple[int, str]]:
    """Each player's current score and region, from every database holding the season's partitions."""
    return {p: (s, g) for p, s, g in ledger_rows(PlayerScore, season, "player_id", "score", "region")}


def assert_boards_match_ledger(season: Season, regions: list[str] = REGIONS) -> None:
    """Every board of the current version against the ledger: the global one, each region's
    (every read), and each player's region named by the global rank read."""
    ledger = ledger_regions(season)
    version = current_manifest(season).version
    for region in regions:
        expected = Standings({p: s for p, (s, g) in ledger.items() if g == region})
        others = [p for p, (_, g) in ledger.items() if g != region]
        assert assert_board_equals(reader(season, region), expected, version=version, absent=others[:20],
                                   window_limits=(3,)) == version
    view = reader(season)
    for player_id, (_, region) in ledger.items():
        assert view.rank(player_id, version).region == (region or None), player_id


@pytest.fixture
def regional(season_factory: Callable[..., Season]) -> Season:
    return season_factory(slug="reg", regions=REGIONS, layout=NARROW)


def test_each_regional_board_holds_exactly_its_regions_players(regional: Season) -> None:
    profiles = Profiles()
    profiles.set(a1="na", a2="na", b1="eu", b2="eu", c1="apac", x1="mars", n1=None)
    events = Events("reg")
    apply_events(regional, [events.result(p, s) for p, s in
                            [("a1", 500), ("a2", 500), ("b1", 900), ("b2", 120), ("c1", 300), ("x1", 800), ("n1", 50)]])
    publish(regional)
    manifest = current_manifest(regional)
    assert {name: sum(b.counts) for name, b in manifest.regions.items()} == {"na": 2, "eu": 2, "apac": 1}
    assert manifest.total == 7  # the global board holds every player, with or without a region
    assert_boards_match_ledger(regional)
    na = reader(regional, "na")
    assert [e["player_id"] for e in na.top(100)[1]] == ["a1", "a2"]
    a2 = na.rank("a2").entry
    assert a2 is not None and a2.rank == 1  # a shared rank on the board
    assert na.rank("b1").entry is None and na.rank("b1").region == "eu"  # on another board: not ranked here


def test_an_unknown_region_is_refused_and_a_season_without_regions_has_no_boards(
        regional: Season, season_factory: Callable[..., Season]) -> None:
    apply_events(regional, [Events("reg").result("a", 10)])
    publish(regional)
    with pytest.raises(rankview.UnknownRegion):
        reader(regional, "mars").rank("a")
    plain = season_factory(slug="plain")
    apply_events(plain, [Events("plain").result("a", 10)])
    publish(plain)
    assert current_manifest(plain).regions == {}
    assert "regions" not in current_manifest(plain).to_dict()
    with pytest.raises(rankview.UnknownRegion):
        reader(plain, "na").top(10)
    assert reader(plain).rank("a").region is None


@pytest.mark.parametrize("catch_up", [True, False], ids=["catch-up", "no-catch-up"])
def test_region_moves_and_score_changes_publish_every_board_exactly(
        regional: Season, settings: pytest.FixtureRequest, catch_up: bool) -> None:
    settings.EPOCH_CATCH_UP = catch_up  # type: ignore[attr-defined]
    rnd = random.Random(14)
    profiles = Profiles()
    players = [f"p{i:02d}" for i in range(40)]
    events = Events("reg")
    profiles.set(**{p: rnd.choice([*REGIONS, None, "mars"]) for p in players})
    for _ in range(6):
        batch = [events.result(p, rnd.randrange(0, 1200)) for p in rnd.sample(players, 15)]
        batch += [events.correction(p, rnd.randrange(0, 300)) for p in rnd.sample(players, 2)]
        apply_events(regional, batch)
        profiles.set(**{p: rnd.choice([*REGIONS, None]) for p in rnd.sample(players, 8)})
        publish(regional)
        assert_boards_match_ledger(regional)


def test_a_version_never_holds_a_player_on_two_boards(regional: Season) -> None:
    profiles = Profiles()
    players = [f"q{i:02d}" for i in range(30)]
    profiles.set(**{p: REGIONS[i % 3] for i, p in enumerate(players)})
    events = Events("reg")
    apply_events(regional, [events.result(p, 10 * i) for i, p in enumerate(players)])
    publish(regional)
    for round_ in range(3):
        profiles.set(**{p: REGIONS[(i + round_ + 1) % 3] for i, p in enumerate(players) if i % 2})
        version = publish(regional)
        seen: dict[str, str] = {}
        for region in REGIONS:
            pinned, entries = board_read(reader(regional, region), version)
            assert pinned == version
            for entry in entries:
                assert entry.player_id not in seen, f"{entry.player_id} on {seen.get(entry.player_id)} and {region}"
                seen[entry.player_id] = region
        assert seen == {p: g for p, (_, g) in ledger_regions(regional).items()}


def test_a_copy_built_from_the_scores_holds_the_regional_boards(regional: Season) -> None:
    """Version 1 of a season with scores is built from the current-scores table, regions included."""
    profiles = Profiles()
    profiles.set(**{f"r{i}": REGIONS[i % 3] for i in range(12)})
    events = Events("reg")
    apply_events(regional, [events.result(f"r{i}", 37 * i) for i in range(12)])
    redis_get().flushdb()
    publish(regional)
    assert_boards_match_ledger(regional)


def test_a_first_reached_season_orders_each_regional_board_by_who_got_there_first(
        season_factory: Callable[..., Season]) -> None:
    season = season_factory(slug="fr", regions=["na", "eu"], layout=NARROW, tie_break=TIE_BREAK_FIRST_REACHED)
    profiles = Profiles()
    profiles.set(late="na", early="na", other="eu")
    events = Events("fr")
    apply_events(season, [events.result("late", 500, reached_at="2026-11-05T00:00:00Z"),
                          events.result("early", 500, reached_at="2026-11-02T00:00:00Z"),
                          events.result("other", 500, reached_at="2026-11-01T12:00:00Z")])
    publish(season)
    na = reader(season, "na")
    top = na.top(10)[1]
    assert [(e["player_id"], e["rank"]) for e in top] == [("early", 1), ("late", 2)]
    profiles.set(other="na")
    publish(season)
    assert [(e["player_id"], e["rank"]) for e in reader(season, "na").top(10)[1]] == [
        ("other", 1), ("early", 2), ("late", 3)]
    assert reader(season, "eu").top(10)[1] == []
