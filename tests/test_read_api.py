"""The public read API (docs/api.md, Reads) over HTTP: top, window, rank, neighbours, version
pinning, 410/503/404 answers and include_pending, on a real database and Redis."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from leaderboard.core.buckets import BucketLayout
from leaderboard.core.ranking import Standings
from seasons.models import Season
from tests.support import DEFAULT_KIND, Events, db_standings, epoch, post_ok, publish
from tests.support.reference import answer_entry

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]

Post = Callable[..., Any]
RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})")


def top_url(season: str) -> str:
    return f"/v1/seasons/{season}/leaderboard/top"


def window_url(season: str) -> str:
    return f"/v1/seasons/{season}/leaderboard"


def rank_url(season: str, player_id: str) -> str:
    return f"/v1/seasons/{season}/players/{player_id}/rank"


def neighbors_url(season: str, player_id: str) -> str:
    return f"/v1/seasons/{season}/players/{player_id}/neighbors"


@pytest.fixture
def client() -> APIClient:
    """A player's browser: no credentials at all."""
    return APIClient()


def get(client: APIClient, url: str, **params: Any) -> Any:
    response = client.get(url, params)
    assert response.status_code != 500, response.content
    assert response["Content-Type"].startswith("application/json")
    return response


def ok(client: APIClient, url: str, **params: Any) -> dict[str, Any]:
    response = get(client, url, **params)
    assert response.status_code == 200, (url, params, response.content)
    body: dict[str, Any] = response.json()
    assert isinstance(body["leaderboard_version"], int) and body["leaderboard_version"] >= 1
    assert RFC3339.fullmatch(body["as_of"]), body["as_of"]
    return body


def entries(board: Standings, first: int, limit: int) -> list[dict[str, object]]:
    return [answer_entry(e) for e in board.window(from_position=first, limit=limit)]


@pytest.fixture
def board(season: Season, post_scores: Post) -> Standings:
    """130 players: 40 distinct scores above a tie of 80 that straddles positions 100/101,
    ids that differ only by case, and a tail."""
    ev = Events()
    events = [ev.result(f"hi{i:02d}", 900_000 - 1000 * i) for i in range(40)]
    events += [ev.result(f"tie{i:02d}", 500_000) for i in range(76)]
    events += [ev.result(pid, 500_000) for pid in ("B", "a", "Z", "_")]
    events += [ev.result(f"lo{i:02d}", i) for i in range(10)]
    post_ok(post_scores, season, events)
    assert publish(season) == 1
    standings = db_standings(season)
    assert len(standings) == 130
    return standings


# --- top --------------------------------------------------------------------------------------------


def test_top_defaults_to_100_entries(client: APIClient, season: Season, board: Standings,
                                     django_assert_num_queries: Any) -> None:
    with django_assert_num_queries(0):  # reads are served from Redis alone
        body = ok(client, top_url(season.slug))
    assert body["leaderboard_version"] == 1
    assert body["total_players"] == 130
    assert body["entries"] == entries(board, 1, 100)
    assert len(body["entries"]) == 100
    # The tie straddles positions 100/101 and keeps its shared rank on both sides.
    assert body["entries"][40]["rank"] == 41
    assert body["entries"][99] == answer_entry({"position": 100, "rank": 41, "player_id": "tie55", "score": 500_000})
    # UTF-8 byte order inside the tie: "B" < "Z" < "_" < "a" < "tie..".
    assert [e["player_id"] for e in body["entries"][40:44]] == ["B", "Z", "_", "a"]


def test_top_limit(client: APIClient, season: Season, board: Standings) -> None:
    for limit in (1, 2, 41, 99, 100):
        body = ok(client, top_url(season.slug), limit=limit)
        assert body["entries"] == entries(board, 1, limit), limit


def test_top_limit_out_of_range_is_400(client: APIClient, season: Season, board: Standings) -> None:
    for limit in ("0", "101", "-1", "abc", "1.5"):
        response = get(client, top_url(season.slug), limit=limit)
        assert response.status_code == 400, limit
        body = response.json()
        assert body["error"] == "validation_error"
        assert list(body["fields"]) == ["limit"]


def test_integer_parameters_take_ascii_digits_only(client: APIClient, season: Season, board: Standings) -> None:
    # The fuzzer's find: "08\n" read as version 8. int() also takes spaces, "1_0" and other
    # scripts' digits, none of them an integer to the schema.
    for limit in ("5\n", " 5", "1_0", "\u0665"):
        response = get(client, top_url(season.slug), limit=limit)
        assert response.status_code == 400, repr(limit)
        assert list(response.json()["fields"]) == ["limit"]


def test_top_of_a_small_board_has_every_player(client: APIClient, season: Season, post_scores: Post) -> None:
    ev = Events()
    post_ok(post_scores, season, [ev.result("x", 5), ev.result("y", 5), ev.result("z", 7)])
    publish(season)
    body = ok(client, top_url(season.slug))
    assert body["entries"] == [
        answer_entry({"position": 1, "rank": 1, "player_id": "z", "score": 7}),
        answer_entry({"position": 2, "rank": 2, "player_id": "x", "score": 5}),
        answer_entry({"position": 3, "rank": 2, "player_id": "y", "score": 5}),
    ]
    assert body["total_players"] == 3


# --- rank ---------------------------------------------------------------------------------------------


def test_rank_of_every_player(client: APIClient, season: Season, board: Standings,
                              django_assert_num_queries: Any) -> None:
    everyone = board.window(from_position=1, limit=200)
    for entry in everyone:
        with django_assert_num_queries(0):
            body = ok(client, rank_url(season.slug, entry.player_id))
        # 100 x the players with a strictly lower score / all, rounded down to two decimals.
        worse = sum(1 for other in everyone if other.score < entry.score)
        assert body == {
            "leaderboard_version": 1, "as_of": body["as_of"], "kind": DEFAULT_KIND, "player_id": entry.player_id,
            "display_name": None, "country": None,
            "score": entry.score, "rank": entry.rank, "position": entry.position, "region": None,
            "total_players": 130, "percentile": int(worse * 10_000 / 130) / 100, "tier": None,
            "rank_24h_ago": None,  # no snapshot yet: and no query for it
        }
    assert ok(client, rank_url(season.slug, "tie75"))["rank"] == 41
    assert ok(client, rank_url(season.slug, "lo00"))["position"] == 130


def test_rank_of_an_unranked_player_is_404_with_the_version(client: APIClient, season: Season,
                                                            board: Standings) -> None:
    response = get(client, rank_url(season.slug, "nobody"))
    assert response.status_code == 404
    body = response.json()
    assert body["error"] == "not_ranked"
    assert body["leaderboard_version"] == 1
    assert RFC3339.fullmatch(body["as_of"])
    assert body["player_id"] == "nobody"


def test_rank_of_a_player_id_outside_the_id_rule_is_404(client: APIClient, season: Season, board: Standings) -> None:
    for player_id in ("bad!id", "a%20b", "x" * 65, "caf%C3%A9", "%00"):
        for url in (rank_url(season.slug, player_id), neighbors_url(season.slug, player_id)):
            response = get(client, url)
            assert response.status_code == 404, url
            assert response.json()["error"] == "player_not_found"


def test_rank_ids_are_case_sensitive(client: APIClient, season: Season, board: Standings) -> None:
    assert ok(client, rank_url(season.slug, "B"))["position"] == 41
    assert ok(client, rank_url(season.slug, "a"))["position"] == 44
    assert get(client, rank_url(season.slug, "b")).status_code == 404
    assert get(client, rank_url(season.slug, "A")).status_code == 404


# --- neighbours ---------------------------------------------------------------------------------------


def test_neighbors_are_contiguous_with_the_player_in_the_middle(client: APIClient, season: Season,
                                                                board: Standings) -> None:
    for player_id in ("hi00", "hi01", "hi35", "B", "tie00", "tie55", "tie75", "lo05", "lo00"):
        for radius in (0, 1, 5, 10):
            body = ok(client, neighbors_url(season.slug, player_id), radius=radius)
            me = board.entry(player_id)
            assert me is not None
            assert body["player"] == answer_entry(me)
            assert body["radius"] == radius
            assert body["total_players"] == 130
            got = body["entries"]
            assert got == [answer_entry(e) for e in board.neighbors(player_id, radius)], (player_id, radius)
            positions = [e["position"] for e in got]
            assert positions == list(range(max(1, me.position - radius), min(130, me.position + radius) + 1))
            assert got[me.position - positions[0]] == answer_entry(me)


def test_neighbors_radius_defaults_to_10(client: APIClient, season: Season, board: Standings) -> None:
    body = ok(client, neighbors_url(season.slug, "tie10"))
    assert body["radius"] == 10
    assert len(body["entries"]) == 21
    assert body["entries"][10]["player_id"] == "tie10"


def test_neighbors_radius_out_of_range_is_400(client: APIClient, season: Season, board: Standings) -> None:
    for radius in ("11", "-1", "x"):
        response = get(client, neighbors_url(season.slug, "tie10"), radius=radius)
        assert response.status_code == 400, radius
        assert list(response.json()["fields"]) == ["radius"]


def test_neighbors_of_an_unranked_player_is_404(client: APIClient, season: Season, board: Standings) -> None:
    response = get(client, neighbors_url(season.slug, "nobody"))
    assert response.status_code == 404
    assert response.json()["error"] == "not_ranked"
    assert response.json()["leaderboard_version"] == 1


# --- windows ---------------------------------------------------------------------------------------------


def test_window(client: APIClient, season: Season, board: Standings, django_assert_num_queries: Any) -> None:
    for first, limit in ((1, 100), (1, 1), (41, 80), (95, 10), (100, 2), (101, 30), (121, 100), (130, 5),
                         (2, 100)):
        with django_assert_num_queries(0):
            body = ok(client, window_url(season.slug), from_position=first, limit=limit)
        assert body["from_position"] == first
        assert body["total_players"] == 130
        assert body["entries"] == entries(board, first, limit), (first, limit)
        assert [e["position"] for e in body["entries"]] == list(range(first, min(130, first + limit - 1) + 1))


def test_window_defaults_and_every_position(client: APIClient, season: Season, board: Standings) -> None:
    body = ok(client, window_url(season.slug))
    assert body["from_position"] == 1 and body["entries"] == entries(board, 1, 100)
    for first in range(1, 131):
        assert ok(client, window_url(season.slug), from_position=first, limit=3)["entries"] == entries(board, first, 3)


def test_window_past_the_end_is_empty(client: APIClient, season: Season, board: Standings) -> None:
    for first in (131, 500, 10**12):
        body = ok(client, window_url(season.slug), from_position=first, limit=10)
        assert body["entries"] == []
        assert body["total_players"] == 130


def test_window_invalid_parameters_are_400(client: APIClient, season: Season, board: Standings) -> None:
    cases = [({"from_position": "0"}, "from_position"), ({"from_position": "-3"}, "from_position"),
             ({"from_position": "a"}, "from_position"), ({"limit": "0"}, "limit"), ({"limit": "101"}, "limit"),
             ({"version": "0"}, "version"), ({"version": "v1"}, "version")]
    for params, field in cases:
        response = get(client, window_url(season.slug), **params)
        assert response.status_code == 400, params
        assert response.json()["error"] == "validation_error"
        assert list(response.json()["fields"]) == [field]


# --- versions -------------------------------------------------------------------------------------------


def _pinned_reads(client: APIClient, slug: str, version: int | None) -> dict[str, Any]:
    extra = {} if version is None else {"version": version}
    return {
        "window": get(client, window_url(slug), from_position=35, limit=20, **extra),
        "window_tail": get(client, window_url(slug), from_position=101, limit=100, **extra),
        "rank": get(client, rank_url(slug, "hi03"), **extra),
        "rank_tie": get(client, rank_url(slug, "tie70"), **extra),
        "neighbors": get(client, neighbors_url(slug, "hi39"), radius=10, **extra),
    }


@pytest.mark.usefixtures("without_catch_up")
def test_version_pinning_and_expiry(client: APIClient, season: Season, board: Standings,
                                    post_scores: Post) -> None:
    slug = season.slug
    v1 = {k: r.json() for k, r in _pinned_reads(client, slug, None).items()}
    v1_top = ok(client, top_url(slug))
    assert {body["leaderboard_version"] for body in v1.values()} == {1}

    ev = Events(tag="later")
    # hi03 climbs to the top, a tie player drops out of the tie, a new player arrives.
    post_ok(post_scores, season, [ev.result("hi03", 999_999), ev.result("tie70", 700_000),
                                  ev.result("newbie", 500_000)])
    assert publish(season) == 2
    # Idle epochs publish nothing and retire nothing.
    assert epoch(season).status == "idle"
    current = {k: r.json() for k, r in _pinned_reads(client, slug, None).items()}
    assert {body["leaderboard_version"] for body in current.values()} == {2}
    assert current["rank"]["rank"] == 1 and v1["rank"]["rank"] == 4
    # Version 1 is still retained: pinned requests answer exactly as before.
    pinned = _pinned_reads(client, slug, 1)
    assert {k: r.status_code for k, r in pinned.items()} == dict.fromkeys(pinned, 200)
    assert {k: r.json() for k, r in pinned.items()} == v1
    assert ok(client, top_url(slug), version=1) == v1_top
    # Pinning the current version answers like not pinning.
    assert {k: r.json() for k, r in _pinned_reads(client, slug, 2).items()} == current

    post_ok(post_scores, season, [ev.result("lo09", 1_000_000)])
    assert publish(season) == 3
    # Two versions later the copy that held version 1 was brought up to date: gone.
    for name, response in _pinned_reads(client, slug, 1).items():
        assert response.status_code == 410, name
        assert response.json()["error"] == "version_expired"
        assert response.json()["current_version"] == 3
    # The top of a version lives in its immutable manifest, so it still answers exactly.
    assert ok(client, top_url(slug), version=1) == v1_top
    # Version 2 is retained.
    assert {k: r.json() for k, r in _pinned_reads(client, slug, 2).items()} == current


def test_a_version_in_the_future_is_410(client: APIClient, season: Season, board: Standings) -> None:
    for target in (top_url(season.slug), window_url(season.slug), rank_url(season.slug, "hi00"),
                   neighbors_url(season.slug, "hi00")):
        for version in (2, 10**9):
            response = get(client, target, version=version)
            assert response.status_code == 410, (target, version)
            assert response.json()["error"] == "version_expired"
            assert response.json()["current_version"] == 1


def _all_urls(slug: str) -> list[str]:
    return [top_url(slug), window_url(slug), rank_url(slug, "p1"), neighbors_url(slug, "p1")]


def test_no_published_version_is_503_with_retry_after(client: APIClient, season: Season, post_scores: Post) -> None:
    post_ok(post_scores, season, [Events().result("p1", 10)])  # scores exist, no version yet
    for url in _all_urls(season.slug):
        for params in ({}, {"version": 1}):
            response = get(client, url, **params)
            assert response.status_code == 503, url
            body = response.json()
            assert body["error"] == "unavailable"
            assert isinstance(body["retry_after"], int) and body["retry_after"] >= 1
            assert response["Retry-After"] == str(body["retry_after"])
            assert "leaderboard_version" not in body
    publish(season)
    for url in _all_urls(season.slug):
        ok(client, url)


def test_unknown_season_is_404(client: APIClient, season: Season) -> None:
    for url in _all_urls("no-such-season"):
        response = get(client, url)
        assert response.status_code == 404, url
        assert response.json()["error"] == "season_not_found"


def test_every_endpoint_serves_the_same_version(client: APIClient, season: Season, board: Standings,
                                                post_scores: Post) -> None:
    post_ok(post_scores, season, [Events(tag="x").result("hi10", 950_000)])
    assert publish(season) == 2
    versions = {ok(client, url)["leaderboard_version"] for url in _all_urls(season.slug)[:2]}
    versions |= {ok(client, rank_url(season.slug, "hi10"))["leaderboard_version"],
                 ok(client, neighbors_url(season.slug, "hi10"))["leaderboard_version"]}
    assert versions == {2}
    as_of = {ok(client, url)["as_of"] for url in (top_url(season.slug), window_url(season.slug))}
    assert len(as_of) == 1


# --- include_pending ----------------------------------------------------------------------------------


def test_include_pending_shows_the_ledger_score_until_it_is_published(client: APIClient, season: Season,
                                                                      post_scores: Post) -> None:
    ev = Events()
    post_ok(post_scores, season, [ev.result("alice", 100), ev.result("carol", 300)])
    assert publish(season) == 1

    written = post_ok(post_scores, season, [ev.result("alice", 500), ev.result("bob", 50)])
    assert [w["pending_version"] for w in written] == [2, 2]

    body = ok(client, rank_url(season.slug, "alice"), include_pending="true")
    assert (body["leaderboard_version"], body["score"], body["rank"], body["position"]) == (1, 100, 2, 2)
    assert body["pending"] == {"score": 500, "score_version": written[0]["score_version"], "pending_version": 2}
    # Not asked: no pending field.
    assert "pending" not in ok(client, rank_url(season.slug, "alice"))
    assert "pending" not in ok(client, rank_url(season.slug, "alice"), include_pending="false")

    # A player only in the ledger so far: no rank yet, but the pending score.
    body = ok(client, rank_url(season.slug, "bob"), include_pending="1")
    assert (body["score"], body["rank"], body["position"]) == (None, None, None)
    assert body["pending"] == {"score": 50, "score_version": written[1]["score_version"], "pending_version": 2}
    assert get(client, rank_url(season.slug, "bob")).status_code == 404
    # Up to date: pending is null.
    assert ok(client, rank_url(season.slug, "carol"), include_pending="true")["pending"] is None
    # Unknown everywhere: still 404.
    response = get(client, rank_url(season.slug, "nobody"), include_pending="true")
    assert response.status_code == 404 and response.json()["error"] == "not_ranked"

    assert publish(season) == 2
    body = ok(client, rank_url(season.slug, "alice"), include_pending="true")
    assert (body["leaderboard_version"], body["score"], body["rank"], body["pending"]) == (2, 500, 1, None)
    body = ok(client, rank_url(season.slug, "bob"), include_pending="true")
    assert (body["score"], body["rank"], body["position"], body["pending"]) == (50, 3, 3, None)


def test_include_pending_rejects_a_non_boolean(client: APIClient, season: Season, board: Standings) -> None:
    response = get(client, rank_url(season.slug, "hi00"), include_pending="maybe")
    assert response.status_code == 400
    assert list(response.json()["fields"]) == ["include_pending"]


def test_reads_of_a_single_bucket_season(client: APIClient, season_factory: Callable[..., Season],
                                         post_scores: Post) -> None:
    season = season_factory(slug="single", layout=BucketLayout.single())
    ev = Events()
    post_ok(post_scores, season, [ev.result(f"p{i:03d}", (i * 7) % 50) for i in range(150)])
    publish(season)
    board = db_standings(season)
    assert ok(client, top_url(season.slug))["entries"] == entries(board, 1, 100)
    assert ok(client, window_url(season.slug), from_position=90, limit=30)["entries"] == entries(board, 90, 30)
    body = ok(client, neighbors_url(season.slug, "p077"), radius=10)
    assert body["entries"] == [answer_entry(e) for e in board.neighbors("p077", 10)]


def test_a_read_that_outlives_its_deadline_is_never_answered_from_it(client: APIClient, season: Season,
                                                                     board: Standings, settings: Any) -> None:
    """Past its deadline a read may have overlapped a copy mutation: it is retried on the
    current version, then refused (503) rather than answered. Pinned to the current
    version too: that version has not expired (410 would send the client elsewhere for
    nothing), it cannot be served right now."""
    settings.READ_DEADLINE_SECONDS = 1e-9
    for url in (window_url(season.slug), rank_url(season.slug, "hi00"), neighbors_url(season.slug, "hi00")):
        for pinned in ({}, {"version": 1}):
            response = get(client, url, **pinned)
            assert response.status_code == 503, (url, pinned)
            assert response.json()["error"] == "unavailable"
    # The top of a version is read from its manifest alone: nothing to overlap.
    assert ok(client, top_url(season.slug))["entries"] == entries(board, 1, 100)
