"""The staff console's player page (seasons/staff_views/season.py: player_page): what the
ledger holds for one player, and the deliveries it refused as conflicts."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from leaderboard.ledger_reads import ledger_queryset_of_player
from leaderboard.models import ScoreEventConflict
from seasons.models import Season
from tests.support import Events, ledger_rows, post_ok

pytest_plugins = ["tests.support.staff_fixtures"]

Post = Callable[..., Any]


@pytest.mark.django_db
def test_conflicting_deliveries_of_a_players_event_ids_are_listed_on_the_player_page(
    season_factory: Callable[..., Season], post_scores: Post, client_as: Any
) -> None:
    season = season_factory(slug="pp")
    events = Events("pp", "2026-11-15T12:00:00Z")
    first = events.result("alice", 1_200)
    post_ok(post_scores, season, [first, events.result("bob", 10)])
    # The same event id again: once with another score, once naming another player.
    replays = [{**first, "best_score": 9_999}, {**first, "player_id": "carol", "best_score": 5}]
    assert [r["status"] for r in post_ok(post_scores, season, replays)] == ["conflict", "conflict"]
    assert len(ledger_rows(ScoreEventConflict, season)) == 2
    viewer = client_as("viewer")

    alice = viewer.get(f"/staff/seasons/{season.slug}/players/alice/").content.decode()
    table = alice.split('id="player-conflict-table"')[1].split("</table>")[0]
    assert "Conflicting deliveries (2)" in alice
    assert table.count(f"<code>{first['event_id']}</code>") == 2
    # What differs from the ledger row the id belongs to, and the refused payload itself.
    assert re.search(r'status-conflict">best_score</span>', table)
    assert re.search(r'status-conflict">player_id</span>', table)
    assert "best 9,999" in table and "best 1,200" in table
    assert "match-service" in table  # the API client that sent it

    # The player a refused payload named sees it too; a player without any sees none.
    carol = viewer.get(f"/staff/seasons/{season.slug}/players/carol/").content.decode()
    assert "Conflicting deliveries (1)" in carol and f"<code>{first['event_id']}</code>" in carol
    bob = viewer.get(f"/staff/seasons/{season.slug}/players/bob/").content.decode()
    assert "Conflicting deliveries (0)" in bob and 'id="player-conflict-table"' not in bob


@pytest.mark.django_db
def test_conflicting_deliveries_cannot_be_rewritten_or_deleted(
    season_factory: Callable[..., Season], post_scores: Post
) -> None:
    from django.db import connections, transaction
    from django.db.utils import DatabaseError

    season = season_factory(slug="pp2")
    events = Events("pp2", "2026-11-15T12:00:00Z")
    first = events.result("alice", 1)
    post_ok(post_scores, season, [first])
    post_ok(post_scores, season, [{**first, "best_score": 2}])
    # The conflict lives beside the ledger rows of the event's player, in their database.
    conflicts = ledger_queryset_of_player(season=season, player_id="alice",
                                          queryset=ScoreEventConflict.objects.filter(season=season))
    conflict = conflicts.get()
    alias = conflicts.db
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(using=alias):
        conflicts.filter(pk=conflict.pk).update(payload={})
    if connections[alias].vendor == "postgresql":  # SQLite's test runner flushes with DELETE: UPDATE only there
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(using=alias):
            conflicts.filter(pk=conflict.pk).delete()


@pytest.mark.django_db
@pytest.mark.parametrize("player_id", ["a%00b", "%00", "a%C2%85b", "a%20b"])
def test_a_player_id_outside_the_id_rule_is_a_404_not_a_server_error(
    season_factory: Callable[..., Season], client_as: Any, player_id: str
) -> None:
    """A console URL naming no possible player (a NUL, which PostgreSQL refuses in text, a
    control or a space) is the console's 404, never a 500."""
    season = season_factory(slug="pp3")
    viewer = client_as("viewer")
    response = viewer.get(f"/staff/seasons/{season.slug}/players/{player_id}/")
    assert response.status_code == 404
