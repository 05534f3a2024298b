"""Place hints (leaderboard/views/rankview/reads.py): a player who reads again while their
score and the current version are unchanged has their place read in the first round trip,
beside the lookup that confirms it; any other read is answered as before, in two. Every
answer stays the ledger's at its version, whatever the hint said."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from leaderboard.views import rankview
from leaderboard.views.rankview import manifests
from seasons.models import Season
from tests.support import Events, apply_events, db_standings, players
from tests.support.publication import RoundTrips, fast_get, publish, reader_of

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]


def _rank(season: Season, player_id: str) -> dict[str, Any]:
    answer = fast_get(f"/v1/seasons/{season.slug}/players/{player_id}/rank")
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def _assert_ledgers(season: Season, player_id: str, answer: dict[str, Any]) -> None:
    entry = db_standings(season).entry(player_id)
    assert entry is not None
    assert (answer["rank"], answer["position"], answer["score"]) == (entry.rank, entry.position, entry.score)


@pytest.fixture
def board(season_factory: Callable[..., Season]) -> Season:
    season = season_factory(slug="hints")
    ev = Events(tag="hints")
    # Ties on purpose: shared ranks come from the bucket's count ahead, read in the hint too.
    apply_events(season, [ev.result(p, 100 + (i % 7) * 10) for i, p in enumerate(players("h", 40))])
    publish(season)
    return season


def test_a_player_reading_again_unchanged_is_answered_in_one_round_trip(
        board: Season, monkeypatch: pytest.MonkeyPatch) -> None:
    spied = RoundTrips(monkeypatch, board)
    reader = reader_of(board)
    first = spied.during(lambda: reader.rank("h00005"))
    assert len(first) == 2, first  # no hint yet: the lookup, then the place
    again = spied.during(lambda: reader_of(board).rank("h00005"))
    assert len(again) == 1, again
    assert first[0] in again[0] and first[1] in again[0]  # the same reads, in one trip
    # Neighbours use the same hint for the player's own place: one round trip fewer.
    cold = spied.during(lambda: reader_of(board).neighbors("h00021", 2))
    warm = spied.during(lambda: reader_of(board).neighbors("h00021", 2))
    assert len(warm) == len(cold) - 1, (cold, warm)
    _assert_ledgers(board, "h00005", _rank(board, "h00005"))


def test_a_new_score_and_version_make_the_hint_miss_and_the_answer_follows_the_ledger(
        board: Season, monkeypatch: pytest.MonkeyPatch) -> None:
    _rank(board, "h00003")
    apply_events(board, [Events(tag="hints2").result("h00003", 5_000)])
    publish(board)
    reader_of(board).rank("h00010")  # the process learns the new version's copy
    spied = RoundTrips(monkeypatch, board)
    # The hint names the old version's copy and bucket: sent, refused, then read in two.
    trips = spied.during(lambda: reader_of(board).rank("h00003"))
    assert len(trips) == 2, trips
    answer = _rank(board, "h00003")
    assert answer["rank"] == 1
    _assert_ledgers(board, "h00003", answer)
    assert len(spied.during(lambda: reader_of(board).rank("h00003"))) == 1


def test_a_hint_from_an_older_version_of_the_same_score_still_answers_the_new_rank(
        board: Season, monkeypatch: pytest.MonkeyPatch) -> None:
    before = _rank(board, "h00000")
    # Others overtake the player; the player's own score is unchanged.
    apply_events(board, [Events(tag="hints3").result(p, 900) for p in list(players("h", 40))[30:]])
    publish(board)
    after = _rank(board, "h00000")
    assert after["rank"] > before["rank"]
    _assert_ledgers(board, "h00000", after)
    spied = RoundTrips(monkeypatch, board)
    assert len(spied.during(lambda: reader_of(board).rank("h00000"))) == 1


def test_hints_are_bounded_and_can_be_turned_off(board: Season, settings: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    settings.READ_PLACE_HINTS = 5
    for p in list(players("h", 40))[:12]:
        _rank(board, p)
    assert 2 <= len(manifests._place_hints) <= 5
    # The newest are kept: the last player read is answered in one round trip.
    spied = RoundTrips(monkeypatch, board)
    assert len(spied.during(lambda: reader_of(board).rank("h00011"))) == 1
    assert len(spied.during(lambda: reader_of(board).rank("h00000"))) == 2
    settings.READ_PLACE_HINTS = 0
    rankview.manifest_cache_clear()
    _rank(board, "h00001")
    assert not manifests._place_hints
    assert len(spied.during(lambda: reader_of(board).rank("h00001"))) == 2


def test_reads_with_hints_answer_as_the_ledger_across_many_versions(board: Season) -> None:
    rnd = random.Random(7)
    everyone = list(players("h", 40))
    for round_ in range(6):
        ev = Events(tag=f"hints-r{round_}")
        apply_events(board, [ev.result(p, rnd.randrange(100, 400)) for p in rnd.sample(everyone, 6)])
        publish(board)
        standings = db_standings(board)
        for p in rnd.sample(everyone, 15) * 2:  # each read twice: the second on its hint
            view = reader_of(board).rank(p)
            assert view.entry == standings.entry(p), (round_, p)
        for p in rnd.sample(everyone, 4):
            _, me, around = reader_of(board).neighbors(p, 3)
            assert me == standings.entry(p)
            assert around == standings.neighbors(p, 3)
