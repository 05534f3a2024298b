"""A staff revocation sticks (docs/rules.md, Revocations that stick): after it, a result
from the match service that would raise the player's score above the revoked score is
held for staff (status `held`, reason `score_revoked`, queued with the late results) and
changes nothing, until the match service acknowledges the revocation with a correction;
then its results count again. Through the write API and the staff services, on each
database the suite runs on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from leaderboard.models import LateResult, PlayerScore
from seasons.models import Season
from seasons.staff.late_results.services import late_result_dismiss
from seasons.staff.revocations.services import score_revocation_approve, score_revocation_propose
from tests.support import Events, db_scores, ledger_rows, post_ok, publish, reader_of, statuses
from tests.support.staff_console import actor_of

pytest_plugins = ["tests.support.staff_fixtures"]
pytestmark = pytest.mark.django_db
Post = Callable[..., Any]


@pytest.fixture
def revoked(season_factory: Callable[..., Season], post_scores: Post, make_staff: Callable[..., Any],
            ) -> tuple[Season, Events]:
    """alice at 975,593 revoked to 711,654 by two staff members; bob at 800,000."""
    season = season_factory(slug="hold")
    events = Events("hold", "2026-11-15T12:00:00Z")
    post_ok(post_scores, season, [events.result("alice", 975_593), events.result("bob", 800_000)])
    revocation = score_revocation_propose(season=season, player_id="alice", new_score=711_654, reason="cheated match",
                                          actor=actor_of(make_staff("reviewer")))
    assert score_revocation_approve(revocation=revocation, actor=actor_of(make_staff("approver"))).applied
    return season, events


def revoked_to(season: Season, player_id: str) -> int | None:
    (value,) = [row.revoked_to for row in ledger_rows(PlayerScore, season) if row.player_id == player_id]
    return value


def test_the_match_services_next_result_is_held_and_the_revocation_lasts(revoked: tuple[Season, Events],
                                                                        post_scores: Post) -> None:
    season, events = revoked
    assert revoked_to(season, "alice") == 711_654
    # Its absolute best still counts the revoked match, and it played one more.
    (held,) = post_ok(post_scores, season, [events.result("alice", 979_643)])
    assert (held["status"], held["reason"], held["score"], held["pending_version"]) == (
        "held", "score_revoked", 711_654, None)
    # At or below the revoked score a result is an ordinary one; other players are unaffected.
    below = post_ok(post_scores, season, [events.result("alice", 700_000), events.result("bob", 810_000)])
    assert statuses(below) == [("unchanged", ""), ("applied", "")]
    assert db_scores(season) == {"alice": 711_654, "bob": 810_000}
    publish(season)
    assert reader_of(season).rank("alice").entry.score == 711_654  # type: ignore[union-attr]
    # The held result waits for staff in the late-results queue; resent, it is the same answer.
    (queued,) = ledger_rows(LateResult, season)
    assert (queued.player_id, queued.best_score, queued.reason, queued.status) == (
        "alice", 979_643, "score_revoked", LateResult.Status.PENDING)
    (again,) = post_ok(post_scores, season, [events.sent[-3]])
    assert (again["status"], again["first_status"], again["reason"]) == ("duplicate", "held", "score_revoked")
    assert len(ledger_rows(LateResult, season)) == 1


def test_a_correction_from_the_match_service_acknowledges_the_revocation(revoked: tuple[Season, Events],
                                                                         post_scores: Post) -> None:
    season, events = revoked
    acknowledged = post_ok(post_scores, season, [events.correction("alice", 711_654, reason="revoked upstream"),
                                                 events.result("alice", 720_000)])
    assert statuses(acknowledged) == [("applied", ""), ("applied", "")]
    assert db_scores(season)["alice"] == 720_000 and revoked_to(season, "alice") is None


def test_staff_decide_a_held_result(revoked: tuple[Season, Events], post_scores: Post,
                                    make_staff: Callable[..., Any]) -> None:
    """Applied through the two-person flow at a score staff choose (the revocation then
    stands at that score), or dismissed with a reason."""
    season, events = revoked
    post_ok(post_scores, season, [events.result("alice", 979_643), events.result("alice", 985_000)])
    first, second = sorted(ledger_rows(LateResult, season), key=lambda late: late.best_score)
    reviewer, approver = actor_of(make_staff("reviewer")), actor_of(make_staff("approver"))
    late_result_dismiss(late_result=second, actor=reviewer, reason="still counts the cheated match")
    applied = score_revocation_propose(season=season, player_id="alice", new_score=730_000, late_result=first,
                                       reason="one genuine match after the revoked one", actor=reviewer)
    assert score_revocation_approve(revocation=applied, actor=approver).applied
    assert db_scores(season)["alice"] == 730_000 and revoked_to(season, "alice") == 730_000
    assert sorted(late.status for late in ledger_rows(LateResult, season)) == ["applied", "dismissed"]
    (held,) = post_ok(post_scores, season, [events.result("alice", 990_000)])
    assert (held["status"], held["score"]) == ("held", 730_000)


def test_the_player_page_and_the_queue_say_the_revocation_stands(revoked: tuple[Season, Events], post_scores: Post,
                                                                 client_as: Callable[..., Any]) -> None:
    season, events = revoked
    post_ok(post_scores, season, [events.result("alice", 979_643)])
    viewer = client_as("viewer")
    page = viewer.get(f"/staff/seasons/{season.slug}/players/alice/").content.decode()
    assert 'id="player-revoked">revoked to 711,654 by staff' in page
    assert 'id="player-revoked"' not in viewer.get(f"/staff/seasons/{season.slug}/players/bob/").content.decode()
    queue = viewer.get(f"/staff/seasons/{season.slug}/late/").content.decode()
    assert "held result<br><small>above a staff revocation</small>" in queue
