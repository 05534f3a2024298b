"""Hidden players (docs/rules.md, Hidden players): a reviewer hides a player of a season
and an approver restores them, audited; from the next version a hidden player is on no
board (global, regional, friends), counted in no rank or total, their events still
applied; restored, their current score is back everywhere. Every version is held to the
ledger's standings less the hidden players (tests.support.db_standings) and passes the
full invariant check and the reconciliation; a rebuild and a recovery never bring a
hidden player back, and a FINAL approved while they are hidden leaves them out. Real
PostgreSQL (or the README's SQLite) and Redis."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from rest_framework.test import APIClient

from audit.models import AuditEntry
from leaderboard.models import PlayerScore, RebuildJob
from leaderboard.recovery.rebuild import rebuild_run, season_epoch_advance, season_rebuild_start
from leaderboard.recovery.reconcile import version_reconcile
from leaderboard.redis_client import redis_get
from leaderboard.views import rankview
from seasons.models import FinalStanding, Season
from seasons.staff.players.services import HideRefused, player_hide, player_restore
from tests.support import (
    Events,
    Profiles,
    apply_events,
    assert_matches_ledger,
    db_scores,
    fast_get,
    keys_of,
    ledger_rows,
    publish,
)
from tests.support.lifecycle import finalize, in_season, staff

pytest_plugins = ["tests.support.staff_fixtures"]
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]

SCORES = {"a": 90, "b": 80, "c": 70, "d": 60, "e": 50}


def _season(season_factory: Callable[..., Season], slug: str, **options: Any) -> tuple[Season, Events]:
    season = season_factory(slug=slug, regions=["eu", "na"], **options)
    Profiles().set(a="eu", b="eu", c="na", d="na")
    events = Events(slug, **({"completed_at": in_season(season)} if "cutoff" in options else {}))
    apply_events(season, [events.result(p, s) for p, s in SCORES.items()])
    publish(season)
    return season, events


def _rank(season: Season, player: str, region: str = "") -> tuple[int, dict[str, Any]]:
    board = f"regions/{region}/" if region else ""
    response = fast_get(f"/v1/seasons/{season.slug}/{board}players/{player}/rank")
    return response.status_code, response.json()


def _checked(season: Season) -> int:
    """The current version against the ledger less the hidden players, fully checked and
    reconciled; its number."""
    version = assert_matches_ledger(season, exhaustive=False)
    report = version_reconcile(r=redis_get(), keys=keys_of(season), season_id=season.pk, version=version)
    assert report.ok, report.failures()
    return version


def test_a_hidden_player_is_on_no_board_and_counted_nowhere_until_restored(
        season_factory: Callable[..., Season]) -> None:
    season, events = _season(season_factory, "hide")
    player_hide(season=season, player_id="b", actor=staff("rita"), reason="aimbot in replays")
    # Until the next version the board is as it was.
    assert _rank(season, "b")[1]["rank"] == 2
    publish(season)
    _checked(season)
    status, body = _rank(season, "b")
    assert (status, body["error"]) == (404, "not_ranked")
    assert _rank(season, "b", "eu")[0] == 404
    c = _rank(season, "c")[1]
    assert (c["rank"], c["total_players"]) == (2, 4)  # b no longer ahead of c, nor counted
    a_eu = _rank(season, "a", "eu")[1]
    assert (a_eu["rank"], a_eu["total_players"]) == (1, 1)
    top = fast_get(f"/v1/seasons/{season.slug}/leaderboard/top").json()
    assert [e["player_id"] for e in top["entries"]] == ["a", "c", "d", "e"] and top["total_players"] == 4
    pending = APIClient().get(f"/v1/seasons/{season.slug}/players/b/rank?include_pending=true")
    assert pending.status_code == 404
    # Their events are still recorded and applied, and still move no board.
    apply_events(season, [events.result("b", 99), events.result("e", 75)])
    publish(season)
    _checked(season)
    assert db_scores(season)["b"] == 99
    assert _rank(season, "b")[0] == 404 and _rank(season, "e")[1]["rank"] == 2
    # Restored: their current score, everywhere.
    player_restore(season=season, player_id="b", actor=staff("ann"), reason="false positive: cleared on appeal")
    publish(season)
    _checked(season)
    assert (_rank(season, "b")[1]["rank"], _rank(season, "b")[1]["score"]) == (1, 99)
    assert _rank(season, "b", "eu")[1]["rank"] == 1 and _rank(season, "b")[1]["total_players"] == 5
    actions = list(AuditEntry.objects.filter(target_id="b").order_by("seq").values_list("action", "reason"))
    assert actions == [("player.hidden", "aimbot in replays"), ("player.restored", "false positive: cleared on appeal")]


def test_a_hide_and_a_restore_in_one_version_and_the_refusals(season_factory: Callable[..., Season]) -> None:
    season, _ = _season(season_factory, "hide-both")
    player_hide(season=season, player_id="a", actor=staff(), reason="suspicious")
    player_restore(season=season, player_id="a", actor=staff(), reason="checked")
    player_hide(season=season, player_id="e", actor=staff(), reason="smurf")
    publish(season)
    _checked(season)
    assert _rank(season, "a")[1]["rank"] == 1 and _rank(season, "e")[0] == 404
    for call, player, says in [(player_hide, "e", "already hidden"), (player_restore, "a", "is not hidden"),
                               (player_hide, "nobody", "has no score"), (player_hide, "a", "reason is required")]:
        with pytest.raises(HideRefused, match=says):
            call(season=season, player_id=player, actor=staff(), reason="" if "reason" in says else "why")


def test_a_rebuild_and_a_recovery_leave_hidden_players_off(season_factory: Callable[..., Season]) -> None:
    season, events = _season(season_factory, "hide-rebuild")
    player_hide(season=season, player_id="c", actor=staff(), reason="boosting")
    publish(season)
    # A rebuild of the views from the ledger.
    job = season_rebuild_start(season=season, actor=staff(), reason="test", enqueue=False)
    assert rebuild_run(job_id=job.pk).status == "published"
    _checked(season)
    assert _rank(season, "c")[0] == 404
    # Redis lost: the recovery, with a write between its build and its catch-up.
    redis_get().flushdb()
    rankview.manifest_cache_clear()
    assert season_epoch_advance(season=season).status == "lost"
    recovery = RebuildJob.objects.get(season=season, kind="recovery", status="queued")
    apply_events(season, [events.result("c", 95)])
    assert rebuild_run(job_id=recovery.pk).status == "published"
    _checked(season)
    assert _rank(season, "c")[0] == 404 and _rank(season, "a")[1]["total_players"] == 4


def test_a_final_approved_while_a_player_is_hidden_leaves_them_out(season_factory: Callable[..., Season]) -> None:
    cutoff = datetime.now(UTC) - timedelta(minutes=5)
    season, _ = _season(season_factory, "hide-final", starts_at=cutoff - timedelta(days=10), cutoff=cutoff)
    player_hide(season=season, player_id="a", actor=staff(), reason="cheated")
    publish(season)
    finalize(season, proposer=staff("carol"), approver=staff("dave"))
    rows = list(FinalStanding.objects.filter(season=season).order_by("position").values_list("player_id", "rank"))
    assert rows == [("b", 1), ("c", 2), ("d", 3), ("e", 4)]
    season.refresh_from_db()
    with pytest.raises(HideRefused, match="sealed"):
        player_restore(season=season, player_id="a", actor=staff(), reason="too late")


def test_the_staff_player_page_hides_with_a_reviewer_and_restores_with_an_approver(
        season_factory: Callable[..., Season], client_as: Any) -> None:
    season, _ = _season(season_factory, "hide-console")
    page = f"/staff/seasons/{season.slug}/players/d/"
    hide, restore = f"{page}hide/", f"{page}restore/"
    assert client_as("viewer").post(hide, {"reason": "x"}).status_code == 403
    reviewer = client_as("reviewer")
    assert "Nothing was done: reason" in reviewer.post(hide, {"reason": " "}, follow=True).content.decode()
    done = reviewer.post(hide, {"reason": "wallhack"}, follow=True).content.decode()
    assert "hidden from every board" in done and 'id="player-hidden"' in done
    assert reviewer.post(restore, {"reason": "ok"}).status_code == 403
    restored = client_as("approver").post(restore, {"reason": "appeal upheld"}, follow=True).content.decode()
    assert "restored" in restored and ("d", False) in ledger_rows(PlayerScore, season, "player_id", "hidden")
