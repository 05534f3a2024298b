"""Hourly snapshots and a player's daily history (docs/api.md, Movement and history).

The clock is moved by hand: each version's publication instant is set to the hour it
stands for, and the snapshots are taken for those hours after the ledger has moved on, so
every snapshot is rebuilt from the ledger as of its version's watermark. Each history
point is held to a board computed from the scores each stage sent. Real PostgreSQL (or
the README's SQLite) and Redis.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from leaderboard.core.history import (
    HOURLY_KEPT,
    chunk_of,
    histogram_chunks,
    hour_floor,
    hourly_expired,
    midnights,
    value_at,
)
from leaderboard.history.selectors import player_history_get
from leaderboard.history.services import (
    movement_snapshot_name,
    season_snapshot_take,
    season_snapshots_prune,
    snapshots_due_take,
)
from leaderboard.models import Manifest, SeasonSnapshot, SnapshotChunk
from leaderboard.redis_client import redis_get
from leaderboard.views.rankview.keys import Keys
from seasons.models import Season
from tests.support import Events, Profiles, apply_events, fast_get, publish

pytest_plugins = ["tests.support.staff_fixtures"]


def settings_module() -> Any:
    from django.conf import settings as django_settings

    return django_settings


# --- the core --------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.integers(-5, 3000), min_size=1, max_size=400), size=st.integers(1, 40))
def test_a_chunked_histogram_counts_the_players_above_every_value(values: list[int], size: int) -> None:
    counts: dict[int, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    chunks = histogram_chunks(counts, size=size)
    assert [v for c in chunks for v in c.values] == sorted(counts)
    assert all(len(c.values) <= size for c in chunks)
    lows = [c.low for c in chunks]
    for v in set(values):
        at = chunk_of(lows, v)
        assert at is not None
        assert chunks[at].ahead_of(v) == sum(1 for w in values if w > v), v
        decoded = type(chunks[at]).decoded(*chunks[at].encoded(), above=chunks[at].above)
        assert decoded.ahead_of(v) == chunks[at].ahead_of(v)
    assert chunk_of(lows, min(values) - 1) is None


def test_the_score_at_a_version_is_the_last_change_published_by_then() -> None:
    changes = [(3, 10), (3, 12), (5, 20), (9, 7)]
    assert [value_at(changes, v) for v in (2, 3, 4, 5, 8, 9, 100)] == [None, 12, 12, 20, 20, 7, 7]


def test_midnights_and_the_hours_kept() -> None:
    assert midnights(today=date(2026, 3, 1), days=3) == [
        datetime(2026, 2, 27, tzinfo=UTC), datetime(2026, 2, 28, tzinfo=UTC), datetime(2026, 3, 1, tzinfo=UTC)]
    assert hour_floor(datetime(2026, 3, 1, 5, 59, 59, 999, tzinfo=UTC)) == datetime(2026, 3, 1, 5, tzinfo=UTC)
    latest = datetime(2026, 3, 5, 12, tzinfo=UTC)
    assert hourly_expired(latest - HOURLY_KEPT - timedelta(hours=1), latest=latest)
    assert not hourly_expired(latest - HOURLY_KEPT, latest=latest)
    assert not hourly_expired(datetime(2026, 2, 1, tzinfo=UTC), latest=latest)  # a midnight: the history's


# --- snapshots and the history, against the stages' boards ---------------------------------------

TODAY = datetime.now(UTC).date()
# Four stages, one version each: what each sends (a lower best is kept below the best, a
# correction lowers it), published just before the midnight of the day it stands for;
# the last one after today's midnight, so today's snapshot is stage 3's version.
STAGES: list[list[tuple[str, int, str]]] = [
    [("a", 50, "r"), ("b", 40, "r"), ("c", 40, "r"), ("d", 10, "r")],
    [("d", 60, "r"), ("e", 45, "r"), ("b", 30, "r")],  # d first, e arrives, b's lower result kept at 40
    [("a", 20, "c"), ("f", 40, "r"), ("c", 70, "r")],  # a revoked to 20, f ties b
    [("b", 99, "r"), ("g", 5, "r")],  # after today's midnight: in no snapshot
]


def _boards(*, ascending: bool = False) -> list[dict[str, int]]:
    """The scores after each stage, by the rules of a best season."""
    better = (lambda x, y: x < y) if ascending else (lambda x, y: x > y)
    boards: list[dict[str, int]] = []
    scores: dict[str, int] = {}
    for stage in STAGES:
        for player, score, kind in stage:
            if kind == "c" or player not in scores or better(score, scores[player]):
                scores[player] = score
        boards.append(dict(scores))
    return boards


def _rank(board: dict[str, int], player: str, *, ascending: bool = False) -> int:
    mine = board[player]
    return 1 + sum(1 for s in board.values() if (s < mine if ascending else s > mine))


def _stage_instants() -> list[datetime]:
    """When each stage's version is published: a minute before the midnights of 3, 2 and
    1 days ago and of today, and the last one now."""
    return [*(m - timedelta(minutes=1) for m in midnights(today=TODAY, days=3)), datetime.now(UTC)]


def _staged(season: Season) -> list[int]:
    """The stages written and published, each version's publication moved to its instant."""
    events = Events(season.slug)
    versions = []
    for stage, instant in zip(STAGES, _stage_instants(), strict=True):
        apply_events(season, [events.correction(p, s) if kind == "c" else events.result(p, s)
                              for p, s, kind in stage])
        version = publish(season)
        Manifest.objects.filter(season=season, version=version).update(published_at=instant)
        versions.append(version)
    return versions


def _history(season: Season, player: str, days: int | str = 4) -> list[dict[str, object]]:
    response = APIClient().get(f"/v1/seasons/{season.slug}/players/{player}/history?days={days}")
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["season_id"], body["player_id"], body["days"]) == (season.slug, player, int(days))
    return body["entries"]  # type: ignore[no-any-return]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
@pytest.mark.parametrize("ascending", [False, True], ids=["desc", "asc"])
def test_a_history_is_the_players_exact_rank_at_each_midnight(season_factory: Callable[..., Season],
                                                               ascending: bool) -> None:
    season = season_factory(slug=f"hist-{'asc' if ascending else 'desc'}",
                            **({"order": "asc"} if ascending else {}))
    # The same stages on an asc board: the lower score is the better one.
    versions = _staged(season)
    boards = _boards(ascending=ascending)
    # Taken after every stage is written: each from the ledger as of its own version.
    days = midnights(today=TODAY, days=4)
    for midnight in days:
        season_snapshot_take(season=season, taken_for=midnight)
    taken = list(SeasonSnapshot.objects.filter(season=season).order_by("taken_for").values_list(
        "taken_for", "version", "total_players"))
    # 4 days ago: before any version, no snapshot; then stages 1, 2 and 3.
    assert taken == [(days[1], versions[0], 4), (days[2], versions[1], 5), (days[3], versions[2], 6)]
    for player in "abcdefg":
        expected = [{"date": midnight.date().isoformat(), "rank": _rank(board, player, ascending=ascending),
                     "score": board[player], "total_players": len(board), "leaderboard_version": version}
                    for midnight, board, version in zip(days[1:], boards, versions, strict=False)
                    if player in board]
        assert _history(season, player, 4) == expected, player
    # Spot checks of the rules the boards encode (desc): b's lower result kept, f tying b,
    # a revoked below everyone, g in no snapshot.
    if not ascending:
        assert [e["rank"] for e in _history(season, "b")] == [2, 4, 4]
        assert [e["rank"] for e in _history(season, "f")] == [4]
        assert [(e["score"], e["rank"]) for e in _history(season, "a")][-1] == (20, 6)
        assert _history(season, "g") == []
    # days=2: the last two midnights; a player with no score is no error.
    assert [e["date"] for e in _history(season, "c", 2)] == [d.date().isoformat() for d in days[2:]]
    assert _history(season, "nobody") == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_the_staff_player_page_charts_the_rank_at_each_midnight(season_factory: Callable[..., Season],
                                                                client_as: Any) -> None:
    season = season_factory(slug="hist-staff")
    versions = _staged(season)
    for midnight in midnights(today=TODAY, days=3):
        season_snapshot_take(season=season, taken_for=midnight)
    page = client_as("viewer").get(f"/staff/seasons/{season.slug}/players/b/").content.decode()
    card = page.split('id="player-history"')[1].split("</section>")[0]
    assert 'id="player-history-chart"' in card and "<polyline" in card
    rows = re.findall(r"<tr><td>([0-9-]+)</td><td class=\"num\">(\d+)</td><td class=\"num\">(\d+)</td>"
                      r"<td class=\"num\">(\d+)</td><td class=\"num\">(\d+)</td></tr>", card)
    # Newest first: b at 4th of 6 (stage 3), 4th of 5, 2nd of 4.
    assert [(r, s, n, v) for _, r, s, n, v in rows] == [
        ("4", "40", "6", str(versions[2])), ("4", "40", "5", str(versions[1])), ("2", "40", "4", str(versions[0]))]
    unranked = client_as("viewer").get(f"/staff/seasons/{season.slug}/players/nobody/").content.decode()
    assert "No snapshot at 00:00 UTC ranked this player" in unranked


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_history_refuses_bad_days_and_unknown_names(season_factory: Callable[..., Season]) -> None:
    season = season_factory(slug="hist-bad")
    client = APIClient()
    for days in ("0", "367", "x", "-1", "1.5", " 3"):
        response = client.get(f"/v1/seasons/{season.slug}/players/a/history?days={days}")
        assert response.status_code == 400, (days, response.content)
        assert "days" in response.json()["fields"], response.json()
    assert client.get(f"/v1/seasons/{season.slug}/players/a/history?days=366").status_code == 200
    assert client.get(f"/v1/seasons/{season.slug}/players/a/history").json()["days"] == 30
    missing = client.get("/v1/seasons/no-such/players/a/history")
    assert (missing.status_code, missing.json()["error"]) == (404, "season_not_found")
    bad = client.get(f"/v1/seasons/{season.slug}/players/bad%20id/history")
    assert (bad.status_code, bad.json()["error"]) == (404, "player_not_found")


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_beat_takes_each_missing_hour_once_and_prunes_what_no_read_needs(
        season_factory: Callable[..., Season]) -> None:
    season = season_factory(slug="hist-beat")
    events = Events(season.slug)
    apply_events(season, [events.result(f"p{i}", 10 * i) for i in range(1, 8)])
    version = publish(season)
    now = hour_floor(datetime.now(UTC))
    Manifest.objects.filter(season=season, version=version).update(published_at=now - timedelta(days=4))
    # A beat down for days: the last day's 25 full hours are taken, once.
    assert snapshots_due_take(now=now + timedelta(minutes=5)) == 25
    assert snapshots_due_take(now=now + timedelta(minutes=6)) == 0
    hours = sorted(SeasonSnapshot.objects.filter(season=season).values_list("taken_for", flat=True))
    assert hours == [now - timedelta(hours=h) for h in range(24, -1, -1)]
    assert {s.version for s in SeasonSnapshot.objects.filter(season=season)} == {version}
    assert SnapshotChunk.objects.filter(snapshot__season=season).count() == 25  # 7 values: one chunk each
    # rank_24h_ago's snapshot is named: the one a day before the latest.
    moved = Keys(settings_module().REDIS_KEY_PREFIX, season.slug).moved
    assert redis_get().hget(moved, "") == str(SeasonSnapshot.objects.get(
        season=season, taken_for=now - timedelta(hours=24)).pk).encode()
    # Two days on, the hours older than HOURLY_KEPT go; midnight's stay for the history.
    later = now + timedelta(days=2)
    season_snapshot_take(season=season, taken_for=later)
    assert season_snapshots_prune(season=season) == sum(1 for h in hours if h.hour != 0 and h < later - HOURLY_KEPT)
    kept = set(SeasonSnapshot.objects.filter(season=season).values_list("taken_for", flat=True))
    assert {h for h in hours if h.hour == 0} <= kept and later in kept
    assert not SnapshotChunk.objects.filter(snapshot__season=season).exclude(snapshot__in=SeasonSnapshot.objects.all()
                                                                               ).exists()
    # The player's place at the midnight within those hours.
    midnight = next(h for h in hours if h.hour == 0)
    places = player_history_get(season=season, player_id="p3", days=1, today=midnight.date())
    assert [(p.rank, p.score, p.total_players) for p in places] == [(5, 30, 7)]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_a_first_reached_season_keeps_no_snapshot(season_factory: Callable[..., Season]) -> None:
    season = season_factory(slug="hist-fr", tie_break="first_reached")
    events = Events(season.slug)
    apply_events(season, [events.result("a", 10)])
    publish(season)
    assert season_snapshot_take(season=season, taken_for=datetime.now(UTC) + timedelta(hours=1)) is None
    assert not SeasonSnapshot.objects.filter(season=season).exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_the_rank_answer_carries_the_rank_of_a_day_before_the_latest_snapshot(
        season_factory: Callable[..., Season], django_assert_num_queries: Any) -> None:
    season = season_factory(slug="moved", regions=["eu"])
    Profiles().set(a="eu")
    events = Events(season.slug)
    day_ago = {"a": 10, "b": 30, "c": 20}
    apply_events(season, [events.result(p, s) for p, s in day_ago.items()])
    first = publish(season)
    apply_events(season, [events.result("a", 50), events.result("d", 40), events.correction("b", 5)])
    second = publish(season)
    latest = hour_floor(datetime.now(UTC))
    Manifest.objects.filter(season=season, version=first).update(published_at=latest - timedelta(hours=25))
    Manifest.objects.filter(season=season, version=second).update(published_at=latest - timedelta(minutes=1))
    for hour in (latest - timedelta(hours=24), latest):
        season_snapshot_take(season=season, taken_for=hour)
    target = movement_snapshot_name(season=season)
    assert target == SeasonSnapshot.objects.get(season=season, taken_for=latest - timedelta(hours=24)).pk
    url = f"/v1/seasons/{season.slug}/players/{{}}/rank"
    # a: 3rd a day ago, 1st now (up 2); b: 1st, now last; d: new, so null.
    for player, then, now in [("a", 3, 1), ("b", 1, 4), ("c", 2, 3), ("d", None, 2)]:
        body = fast_get(url.format(player)).json()
        assert (body["rank"], body["rank_24h_ago"]) == (now, then), (player, body)
    # Once read, the rank of that snapshot rides the read's first round trip: no query.
    with django_assert_num_queries(0):
        assert APIClient().get(url.format("a")).json()["rank_24h_ago"] == 3
    assert redis_get().hget(Keys(settings_module().REDIS_KEY_PREFIX, season.slug).moved, "c") == f"{target}:2".encode()
    # A regional board's answer has none (the snapshots are of the global board).
    regional = fast_get(f"/v1/seasons/{season.slug}/regions/eu/players/a/rank").json()
    assert regional["rank"] == 1 and "rank_24h_ago" not in regional
    # A newer latest snapshot with none a day before it: null, the kept ranks gone.
    season_snapshot_take(season=season, taken_for=latest + timedelta(hours=1))
    assert movement_snapshot_name(season=season) is None
    assert fast_get(url.format("a")).json()["rank_24h_ago"] is None
    assert not redis_get().exists(Keys(settings_module().REDIS_KEY_PREFIX, season.slug).moved)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_a_player_hidden_at_a_midnight_has_no_place_that_day_and_counts_for_no_one(
        season_factory: Callable[..., Season]) -> None:
    from seasons.staff.players.services import player_hide, player_restore
    from tests.support.lifecycle import staff

    season = season_factory(slug="hist-hidden")
    events = Events(season.slug)
    days = midnights(today=TODAY, days=3)
    apply_events(season, [events.result("a", 50), events.result("b", 40), events.result("c", 30)])
    steps = [publish(season)]
    player_hide(season=season, player_id="b", actor=staff(), reason="exploit")
    apply_events(season, [events.result("b", 60)])  # applied while hidden: no board shows it
    steps.append(publish(season))
    player_restore(season=season, player_id="b", actor=staff(), reason="cleared")
    steps.append(publish(season))
    for version, midnight in zip(steps, days, strict=True):
        Manifest.objects.filter(season=season, version=version).update(published_at=midnight - timedelta(minutes=1))
    # Taken after the restore: each from the ledger as of its own version, hidden or not.
    for midnight in days:
        season_snapshot_take(season=season, taken_for=midnight)
    assert list(SeasonSnapshot.objects.filter(season=season).order_by("taken_for").values_list(
        "total_players", "hidden")) == [(3, []), (2, ["b"]), (3, [])]
    assert [(e["date"], e["rank"], e["score"]) for e in _history(season, "b", 3)] == [
        (days[0].date().isoformat(), 2, 40), (days[2].date().isoformat(), 1, 60)]
    assert [(e["rank"], e["total_players"]) for e in _history(season, "c", 3)] == [(3, 3), (2, 2), (3, 3)]
