"""Paging without expiry (docs/api.md, Paging without expiry): top and window answers carry
`next_cursor`; `after=<cursor>` continues after the page's last entry in the current
version, however many versions later, so a player who did not move in between is never
shown twice nor skipped; a made-up, altered or foreign cursor is a 400. Real PostgreSQL
and Redis, both read front ends."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import pytest
from rest_framework.test import APIClient

from leaderboard.api.cursors import cursor_make
from leaderboard.core.buckets import BucketLayout
from leaderboard.core.profiles import ProfileWrite
from leaderboard.core.ranking import Standings
from leaderboard.profiles import player_profiles_apply
from seasons.models import Season
from tests.support import Events, apply_events, fast_get, publish

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]


def page(path: str, *, fast: bool = True) -> dict[str, Any]:
    response = fast_get(path) if fast else APIClient().get(path)
    assert response.status_code == 200, (path, response.content)
    body: dict[str, Any] = response.json()
    return body


def walk(base: str, limit: int, *, between: Callable[[int], None] | None = None,
         fast: bool = True) -> list[str]:
    """Every player a client paging with cursors sees, in order: the top, then `after=` till
    next_cursor is null; `between(n)` runs after the n-th page."""
    body = page(f"{base}/leaderboard/top?limit={limit}", fast=fast)
    seen = [e["player_id"] for e in body["entries"]]
    pages = 1
    while body["next_cursor"] is not None:
        if between is not None:
            between(pages)
        body = page(f"{base}/leaderboard?after={quote(body['next_cursor'])}&limit={limit}", fast=fast)
        assert "from_position" not in body
        seen += [e["player_id"] for e in body["entries"]]
        pages += 1
    return seen


@pytest.mark.parametrize("kind", [{}, {"order": "asc"}, {"tie_break": "first_reached"}])
def test_cursors_walk_the_whole_board_once_in_display_order(season_factory: Callable[..., Season],
                                                            kind: dict[str, Any]) -> None:
    season = season_factory(slug="walk", layout=BucketLayout.uniform(width=100), **kind)
    rnd = random.Random(7)
    # Few distinct scores: long ties across page and bucket edges.
    scores = {f"p{i:03}": rnd.choice([0, 50, 150, 150, 150, 420, 999]) for i in range(157)}
    apply_events(season, [Events("walk").result(p, s) for p, s in scores.items()])
    assert publish(season) == 1
    everyone = [e["player_id"] for e in page("/v1/seasons/walk/leaderboard?limit=100")["entries"]]
    everyone += [e["player_id"] for e in page("/v1/seasons/walk/leaderboard?from_position=101&limit=100")["entries"]]
    assert len(everyone) == 157
    for limit in (1, 7, 50, 100):
        assert walk("/v1/seasons/walk", limit) == everyone, limit
    assert walk("/v1/seasons/walk", 13, fast=False) == everyone
    if not kind:
        assert everyone == [e.player_id for e in Standings(scores).top(157)]


def test_paging_while_players_move_never_repeats_or_skips_one_who_did_not(
        season_factory: Callable[..., Season]) -> None:
    season = season_factory(slug="moving", layout=BucketLayout.uniform(width=100))
    events = Events("moving")
    rnd = random.Random(11)
    scores = {f"m{i:03}": rnd.randrange(0, 1000, 10) for i in range(240)}
    apply_events(season, [events.result(p, s) for p, s in scores.items()])
    publish(season)
    moved: set[str] = set()

    def writes(_: int) -> None:
        # Between pages: some players raise their score (best mode), a version publishes.
        batch = {}
        for player in rnd.sample(sorted(scores), 12):
            batch[player] = scores[player] + rnd.randrange(10, 400, 10)
        apply_events(season, [events.result(p, s) for p, s in batch.items()])
        scores.update(batch)
        moved.update(batch)
        publish(season)

    seen = walk("/v1/seasons/moving", 20, between=writes)
    counts = Counter(seen)
    still = set(scores) - moved
    assert moved and still
    assert [p for p in still if counts[p] != 1] == []
    assert len(page("/v1/seasons/moving/leaderboard/top")["entries"]) == 100
    assert page("/v1/seasons/moving/leaderboard/top")["leaderboard_version"] > 5  # cursors outlived many versions


def test_regional_boards_page_with_their_own_cursors(season_factory: Callable[..., Season]) -> None:
    season = season_factory(slug="reg", regions=["eu", "na"])
    players = [f"r{i:02}" for i in range(30)]
    player_profiles_apply(profiles=[ProfileWrite(player_id=p, region=["eu", "na"][i % 2], profile_version=1)
                                    for i, p in enumerate(players)], client=None)
    apply_events(season, [Events("reg").result(p, 10 * (i % 7)) for i, p in enumerate(players)])
    publish(season)
    eu = [e["player_id"] for e in page("/v1/seasons/reg/regions/eu/leaderboard?limit=100")["entries"]]
    assert walk("/v1/seasons/reg/regions/eu", 4) == eu and len(eu) == 15
    cursor = page("/v1/seasons/reg/regions/eu/leaderboard/top?limit=4")["next_cursor"]
    foreign = fast_get(f"/v1/seasons/reg/regions/na/leaderboard?after={quote(cursor)}")
    assert foreign.status_code == 400 and "another board" in foreign.json()["fields"]["after"][0]
    assert fast_get(f"/v1/seasons/reg/leaderboard?after={quote(cursor)}").status_code == 400


def test_a_made_up_or_altered_cursor_is_a_400_naming_after(season_factory: Callable[..., Season]) -> None:
    season = season_factory(slug="bad")
    apply_events(season, [Events("bad").result(f"b{i}", i) for i in range(5)])
    publish(season)
    cursor = page("/v1/seasons/bad/leaderboard/top?limit=2")["next_cursor"]
    assert page(f"/v1/seasons/bad/leaderboard?after={quote(cursor)}&limit=2")["entries"][0]["position"] == 3
    altered = cursor[:-2] + ("AA" if not cursor.endswith("AA") else "BB")
    other_season = cursor_make(season="elsewhere", region=None, value=3, player_id="b3")
    for bad in ("", "x", "not:a:cursor", altered, other_season, "a" * 600):
        for get in (fast_get, APIClient().get):
            response = get(f"/v1/seasons/bad/leaderboard?after={quote(bad)}")
            assert response.status_code == 400, (bad, response.content)
            assert list(response.json()["fields"]) == ["after"], bad
    for extra in ("from_position=3", "version=1"):
        response = fast_get(f"/v1/seasons/bad/leaderboard?after={quote(cursor)}&{extra}")
        assert response.status_code == 400 and list(response.json()["fields"]) == [extra.split("=")[0]]
    # The last page says so.
    assert page("/v1/seasons/bad/leaderboard/top?limit=5")["next_cursor"] is None
    assert page("/v1/seasons/bad/leaderboard?from_position=4&limit=2")["next_cursor"] is None
    assert page("/v1/seasons/bad/leaderboard?from_position=9")["next_cursor"] is None
