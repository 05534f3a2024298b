"""The friends board (docs/api.md, Friends board): the player and their friends ranked among
themselves from one published version, each with their season rank, against the brute-force
`Standings` reference; version pinning, 410/503/404, unranked friends counted, both read
front ends answering alike and sharing the read rate limit. Real PostgreSQL and Redis."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from leaderboard.core.ranking import Standings, ranked_among
from leaderboard.models import FriendList
from leaderboard.views import rankview
from seasons.models import Season
from tests.support import NARROW, Events, apply_events, db_scores, fast_get, post_ok, publish
from tests.support.reference import answer_entry

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]

Post = Callable[..., Any]
SEASONS = itertools.count(1)
ID_ALPHABET = "-.0123456789:ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz"


def friends_url(season: str, player_id: str) -> str:
    return f"/v1/seasons/{season}/players/{player_id}/friends"


def friends_set(player_id: str, friends: Iterable[str], graph_version: int = 1) -> None:
    """What the social service's write leaves behind: one row per player."""
    FriendList.objects.update_or_create(player_id=player_id, defaults={
        "friends": list(friends), "graph_version": graph_version, "updated_at": datetime.now(UTC)})


def expected_board(scores: dict[str, int], player_id: str, friends: list[str]) -> tuple[list[dict[str, Any]], int]:
    """(entries, unranked_friends) from the brute-force reference of the whole season."""
    season_board = Standings(scores)
    among = {p: scores[p] for p in [player_id, *friends] if p in scores}
    entries = [{**answer_entry(entry), "global_rank": season_board.rank_of_score(entry.score)}
               for entry in Standings(among).top(len(among))]
    return entries, sum(1 for f in friends if f not in scores)


def friends_ok(season: str, player_id: str, **params: Any) -> dict[str, Any]:
    response = APIClient().get(friends_url(season, player_id), params)
    assert response.status_code == 200, response.content
    body: dict[str, Any] = response.json()
    return body


# --- the pure part ----------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(scores=st.dictionaries(st.text(alphabet=ID_ALPHABET, min_size=1, max_size=4), st.integers(0, 6), max_size=40))
def test_ranked_among_matches_the_reference_standings_of_the_same_players(scores: dict[str, int]) -> None:
    expected = [(e.player_id, e.score, e.rank) for e in Standings(scores).top(len(scores))]
    assert ranked_among(scores) == expected


# --- over HTTP, against the reference ----------------------------------------------------------


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(data=st.data())
def test_the_board_matches_the_brute_force_reference(data: st.DataObject, season_factory: Callable[..., Season]
                                                     ) -> None:
    rankview.manifest_cache_clear()
    season = season_factory(slug=f"friends-{next(SEASONS)}", layout=NARROW)
    names = [f"p{i:02d}" for i in range(data.draw(st.integers(1, 40)))] + ["A", "a", "B", "_"]
    # Few distinct scores: ties among the friends and across the season, in one bucket and across them.
    scores = data.draw(st.dictionaries(st.sampled_from(names), st.sampled_from([0, 5, 99, 100, 350, 350, 999, 1000]),
                                       min_size=1))
    ev = Events(tag=season.slug)
    apply_events(season, [ev.result(p, s) for p, s in scores.items()])
    publish(season)
    assert db_scores(season) == scores
    player_id = data.draw(st.sampled_from([*names, "nobody"]))
    friends = data.draw(st.lists(st.sampled_from([*names, "ghost1", "ghost2"]), unique=True, max_size=30)
                        .map(lambda fs: [f for f in fs if f != player_id]))
    friends_set(player_id, friends, graph_version=data.draw(st.integers(1, 10**12)))
    entries, unranked = expected_board(scores, player_id, friends)

    body = friends_ok(season.slug, player_id)
    assert body["entries"] == entries
    assert body["unranked_friends"] == unranked
    assert body["player_id"] == player_id
    assert body["leaderboard_version"] == 1
    assert body["graph_version"] == FriendList.objects.get(player_id=player_id).graph_version


# --- what a player without friends or without a score sees ------------------------------------


@pytest.fixture
def small(season_factory: Callable[..., Season], post_scores: Post) -> Season:
    season = season_factory(slug="small", layout=NARROW)
    ev = Events(tag="small")
    post_ok(post_scores, season, [ev.result("me", 500), ev.result("top", 900), ev.result("tie", 500),
                                  ev.result("low", 100), ev.result("other", 700)])
    assert publish(season) == 1
    return season


def test_a_player_without_a_friend_list_sees_themselves_alone_at_graph_version_0(small: Season) -> None:
    body = friends_ok(small.slug, "me")
    assert body["graph_version"] == 0
    assert body["unranked_friends"] == 0
    assert body["entries"] == [
        {**answer_entry({"position": 1, "rank": 1, "player_id": "me", "score": 500}), "global_rank": 3}]


def test_an_unranked_player_is_absent_and_unranked_friends_are_only_counted(small: Season) -> None:
    friends_set("newcomer", ["low", "tie", "never-played", "me"], graph_version=7)
    body = friends_ok(small.slug, "newcomer")
    assert body["graph_version"] == 7
    assert body["unranked_friends"] == 1
    assert body["entries"] == [
        {**answer_entry({"position": 1, "rank": 1, "player_id": "me", "score": 500}), "global_rank": 3},
        {**answer_entry({"position": 2, "rank": 1, "player_id": "tie", "score": 500}), "global_rank": 3},
        {**answer_entry({"position": 3, "rank": 3, "player_id": "low", "score": 100}), "global_rank": 5},
    ]


def test_a_player_unknown_everywhere_gets_an_empty_board_not_a_404(small: Season) -> None:
    body = friends_ok(small.slug, "nobody")
    assert (body["entries"], body["unranked_friends"], body["graph_version"]) == ([], 0, 0)


# --- one version per answer ------------------------------------------------------------------


@pytest.mark.usefixtures("without_catch_up")
def test_a_pinned_version_answers_the_scores_and_ranks_of_that_version(small: Season, post_scores: Post) -> None:
    friends_set("me", ["top", "low"])
    v1 = friends_ok(small.slug, "me")
    assert [(e["player_id"], e["score"], e["global_rank"]) for e in v1["entries"]] == [
        ("top", 900, 1), ("me", 500, 3), ("low", 100, 5)]
    # A friend passes everyone; someone who is no friend moves the global ranks only.
    post_ok(post_scores, small, [Events(tag="v2").result("low", 950), Events(tag="v2b").result("other", 999)])
    assert publish(small) == 2
    v2 = friends_ok(small.slug, "me")
    assert v2["leaderboard_version"] == 2
    assert [(e["player_id"], e["score"], e["rank"], e["global_rank"]) for e in v2["entries"]] == [
        ("low", 950, 1, 2), ("top", 900, 2, 3), ("me", 500, 3, 4)]
    assert friends_ok(small.slug, "me", version=1) == v1
    assert friends_ok(small.slug, "me", version=2) == v2
    # Two versions later the copy that held version 1 has been brought forward: 410.
    post_ok(post_scores, small, [Events(tag="v3").result("tie", 10_000)])
    assert publish(small) == 3
    response = APIClient().get(friends_url(small.slug, "me"), {"version": 1})
    assert response.status_code == 410
    assert response.json()["error"] == "version_expired" and response.json()["current_version"] == 3


def test_a_version_in_the_future_is_410(small: Season) -> None:
    for version in (2, 10**9):
        response = APIClient().get(friends_url(small.slug, "me"), {"version": version})
        assert response.status_code == 410
        assert response.json()["current_version"] == 1


def test_a_read_that_outlives_its_deadline_is_never_answered_from_it(small: Season, settings: Any) -> None:
    """The copy's generation and the deadline are checked after the reads: a read that may
    have overlapped a copy mutation is retried, then refused with 503, pinned or not (the
    current version has not expired: 410 would send the client elsewhere for nothing)."""
    friends_set("me", ["top"])
    settings.READ_DEADLINE_SECONDS = 1e-9
    for pinned in ({}, {"version": 1}):
        response = APIClient().get(friends_url(small.slug, "me"), pinned)
        assert response.status_code == 503 and response.json()["error"] == "unavailable", pinned


# --- refusals ---------------------------------------------------------------------------------


def test_no_published_version_is_503_with_retry_after(season: Season, post_scores: Post) -> None:
    post_ok(post_scores, season, [Events().result("me", 10)])
    for params in ({}, {"version": 1}):
        response = APIClient().get(friends_url(season.slug, "me"), params)
        assert response.status_code == 503
        assert response.json()["error"] == "unavailable"
        assert response["Retry-After"] == str(response.json()["retry_after"])


@pytest.mark.parametrize(("url", "status", "error"), [
    ("/v1/seasons/no-such-season/players/me/friends", 404, "season_not_found"),
    ("/v1/seasons/bad%00season/players/me/friends", 404, "season_not_found"),
    ("/v1/seasons/small/players/bad%20id/friends", 404, "player_not_found"),
    (f"/v1/seasons/small/players/{'x' * 65}/friends", 404, "player_not_found"),
    ("/v1/seasons/small/players/me/friends?version=0", 400, "validation_error"),
    ("/v1/seasons/small/players/me/friends?version=x", 400, "validation_error"),
])
def test_bad_ids_and_parameters_are_refused_with_a_reason(small: Season, url: str, status: int, error: str) -> None:
    for response in (APIClient().get(url), fast_get(url)):
        assert response.status_code == status, (url, response.content)
        assert response.json()["error"] == error


# --- both front ends --------------------------------------------------------------------------


@pytest.mark.parametrize("url", [
    "/v1/seasons/small/players/me/friends",
    "/v1/seasons/small/players/me/friends?version=1",
    "/v1/seasons/small/players/me/friends?version=5",
    "/v1/seasons/small/players/loner/friends",
    "/v1/seasons/small/players/bad%20id/friends",
    "/v1/seasons/unknown/players/me/friends",
])
def test_the_fast_path_answers_exactly_as_the_drf_view_does(small: Season, url: str) -> None:
    friends_set("me", ["top", "tie", "gone"])
    fast = fast_get(url)
    slow = APIClient().get(url)
    assert (fast.status_code, fast.json()) == (slow.status_code, slow.json())
    assert fast.headers["content-type"] == "application/json"


def test_both_front_ends_take_from_the_one_read_rate_limit(small: Season, settings: Any) -> None:
    settings.READ_RATE_LIMIT = (1.0, 2)
    assert fast_get(friends_url(small.slug, "me")).status_code == 200
    assert APIClient().get(friends_url(small.slug, "me")).status_code == 200
    for response in (fast_get(friends_url(small.slug, "me")), APIClient().get(friends_url(small.slug, "me"))):
        assert response.status_code == 429
        assert response.json()["error"] == "rate_limited"
