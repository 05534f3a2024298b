"""The staff console's services (seasons/staff/): roles, disputes, two-person score
revocations through the ledger (stale included), the late-results queue, and that every
action's audit row commits in the same transaction as the action itself."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.core.management.base import CommandError

from audit.models import AuditEntry
from leaderboard.models import LateResult, PlayerScore, ScoreEvent
from seasons.models import Dispute, DisputeNote, FinalCorrection, ScoreRevocation, Season
from seasons.services import season_seal_ingest
from seasons.staff.accounts.services import ROLE_PERMISSIONS, staff_role_of, staff_user_create
from seasons.staff.common import StaffError
from seasons.staff.disputes.services import dispute_assign, dispute_file, dispute_note_add, dispute_reject
from seasons.staff.late_results.services import late_result_dismiss, late_result_proposal_score
from seasons.staff.revocations.services import (
    score_revocation_approve,
    score_revocation_propose,
    score_revocation_rebase,
    score_revocation_reject,
)
from tests.support import TEST_ACTOR, Events, closing_season, db_scores, in_season, ledger_rows, post_ok
from tests.support.failure import staff_services_modules
from tests.support.staff_console import actor_of, audit_actions, audit_head, audit_rows

# The staff fixtures (make_staff, client_as, fast_passwords).
pytest_plugins = ["tests.support.staff_fixtures"]

pytestmark = pytest.mark.django_db
Post = Callable[..., Any]


@pytest.fixture
def open_season(season_factory: Callable[..., Season], post_scores: Post) -> tuple[Season, Events]:
    season = season_factory(slug="svc")
    events = Events("svc", "2026-11-15T12:00:00Z")
    post_ok(post_scores, season, [events.result("alice", 500), events.result("bob", 300),
                                  events.result("alice", 900)])
    return season, events


def score_of(season: Season, player_id: str) -> int:
    return db_scores(season)[player_id]


def event_of(season: Season, event_id: str) -> ScoreEvent:
    """A ledger event of the season, from the database holding its player's partition."""
    (event,) = [row for row in ledger_rows(ScoreEvent, season) if row.event_id == event_id]
    return event


@pytest.fixture
def people(make_staff: Callable[..., Any]) -> dict[str, Any]:
    return {"reviewer": make_staff("reviewer"), "approver": make_staff("approver"),
            "approver2": make_staff("approver"), "viewer": make_staff("viewer")}


# --- roles and accounts ----------------------------------------------------------------------


def test_roles_are_groups_of_console_permissions_each_including_the_one_before(make_staff: Any) -> None:
    viewer, reviewer, approver = make_staff("viewer"), make_staff("reviewer"), make_staff("approver")
    for role, user in (("viewer", viewer), ("reviewer", reviewer), ("approver", approver)):
        assert staff_role_of(user) == role
        codenames = set(Group.objects.get(name=role).permissions.values_list("codename", flat=True))
        assert codenames == set(ROLE_PERMISSIONS[role])
        for codename in ROLE_PERMISSIONS["approver"]:
            assert user.has_perm(f"seasons.{codename}") == (codename in ROLE_PERMISSIONS[role]), (role, codename)
    assert set(ROLE_PERMISSIONS["viewer"]) < set(ROLE_PERMISSIONS["reviewer"]) < set(ROLE_PERMISSIONS["approver"])


def test_the_migration_created_the_role_groups() -> None:
    # A plain (rolled-back) test database holds what the migrations wrote.
    assert set(Group.objects.filter(name__in=ROLE_PERMISSIONS).values_list("name", flat=True)) == set(ROLE_PERMISSIONS)


def test_create_staff_command_makes_and_updates_an_account_and_audits_it(settings: Any, monkeypatch: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    out = StringIO()
    call_command("create_staff", "carol", "--role", "reviewer", "--password", "a-long-password-1", stdout=out)
    assert "staff account carol created with role reviewer" in out.getvalue()
    from django.contrib.auth import authenticate

    user = authenticate(username="carol", password="a-long-password-1")
    assert user is not None and staff_role_of(user) == "reviewer"

    monkeypatch.setenv("STAFF_PASSWORD", "another-long-password-2")
    call_command("create_staff", "carol", "--role", "approver", stdout=out)
    user = authenticate(username="carol", password="another-long-password-2")
    assert user is not None and staff_role_of(user) == "approver"
    rows = audit_rows()
    assert [r.action for r in rows[-2:]] == ["staff.user.created", "staff.user.updated"]
    assert rows[-1].before == {"role": "reviewer"} and rows[-1].after == {"username": "carol", "role": "approver"}
    assert rows[-1].actor_label == "manage.py create_staff"

    monkeypatch.delenv("STAFF_PASSWORD")
    monkeypatch.setattr("sys.stdin", StringIO(""))  # not a terminal: no prompt
    with pytest.raises(CommandError, match="no password"):
        call_command("create_staff", "dave", "--role", "viewer")
    with pytest.raises(CommandError, match="too short|too common"):
        call_command("create_staff", "dave", "--role", "viewer", "--password", "short")
    with pytest.raises(CommandError):
        call_command("create_staff", "dave", "--role", "boss", "--password", "a-long-password-1")


# --- disputes ----------------------------------------------------------------------------------


def test_a_dispute_is_filed_assigned_annotated_and_rejected_with_audit_rows(open_season: Any,
                                                                             people: dict[str, Any]) -> None:
    season, _ = open_season
    reviewer = actor_of(people["reviewer"])
    start = audit_head()
    dispute, created = dispute_file(season=season, player_id="alice", summary="score too low", claimed_score=950,
                                    actor=reviewer)
    assert created and dispute.status == Dispute.Status.OPEN and dispute.filed_by_label == reviewer.label
    dispute_assign(dispute=dispute, assignee=people["reviewer"], actor=reviewer)
    dispute_note_add(dispute=dispute, text="checked the match log", actor=reviewer)
    with pytest.raises(StaffError, match="reason"):
        dispute_reject(dispute=dispute, reason="  ", actor=reviewer)
    dispute_reject(dispute=dispute, reason="the log shows 900", actor=reviewer)
    dispute.refresh_from_db()
    assert dispute.status == Dispute.Status.REJECTED and dispute.resolved_by_label == reviewer.label
    rows = audit_rows(season, since=start)
    assert [r.action for r in rows] == ["dispute.filed", "dispute.assigned", "dispute.note_added",
                                        "dispute.rejected"]
    assert rows[1].after == {"assignee": people["reviewer"].username} and rows[1].before == {"assignee": None}
    assert rows[3].reason == "the log shows 900" and all(r.actor_label == reviewer.label for r in rows)
    with pytest.raises(StaffError, match="rejected"):
        dispute_assign(dispute=dispute, assignee=None, actor=reviewer)


def test_a_dispute_with_a_known_ticket_is_filed_once(open_season: Any, people: dict[str, Any]) -> None:
    season, _ = open_season
    actor = actor_of(people["reviewer"])
    first, created = dispute_file(season=season, player_id="bob", summary="x", external_ref="T-1", actor=actor)
    again, created_again = dispute_file(season=season, player_id="bob", summary="x", external_ref="T-1", actor=actor)
    assert created and not created_again and again.pk == first.pk
    assert audit_actions(season).count("dispute.filed") == 1


@pytest.mark.parametrize("bad", [
    {"player_id": "no spaces"}, {"summary": ""}, {"claimed_score": 1_000_001}, {"claimed_score": -1},
    {"summary": "x" * 201}, {"details": "nul \x00"},
])
def test_a_dispute_is_validated(open_season: Any, people: dict[str, Any], bad: dict[str, Any]) -> None:
    season, _ = open_season
    params = {"season": season, "player_id": "bob", "summary": "s", "actor": actor_of(people["reviewer"]), **bad}
    with pytest.raises(StaffError):
        dispute_file(**params)
    assert not Dispute.objects.exists()


# --- revocations: the two-person rule and the ledger ------------------------------------------


def test_a_revocation_is_approved_by_another_person_and_written_through_the_ledger(
    open_season: Any, people: dict[str, Any]
) -> None:
    season, events = open_season
    version = events.versions["alice"]  # of her best result, 900
    reviewer, approver = actor_of(people["reviewer"]), actor_of(people["approver"])
    dispute, _ = dispute_file(season=season, player_id="alice", summary="cheated", actor=reviewer)
    revocation = score_revocation_propose(season=season, player_id="alice", new_score=100, reason="cheating proven",
                                          evidence="match m-9 replay", actor=reviewer, dispute=dispute)
    assert (revocation.score_before, revocation.base_version) == (900, version)
    dispute.refresh_from_db()
    assert dispute.status == Dispute.Status.REVOCATION_PROPOSED

    with pytest.raises(StaffError, match="own proposal"):
        score_revocation_approve(revocation=revocation, actor=reviewer)
    approver_revocation = score_revocation_propose(season=season, player_id="bob", new_score=1, reason="r",
                                                   actor=approver)
    with pytest.raises(StaffError, match="own proposal"):  # an approver neither
        score_revocation_approve(revocation=approver_revocation, actor=approver)

    start = audit_head()
    result = score_revocation_approve(revocation=revocation, actor=approver, reason="replay reviewed")
    assert result.applied and result.status == "applied"
    assert score_of(season, "alice") == 100  # lower: a revocation
    event = event_of(season, result.revocation.event_id)
    assert (event.kind, event.best_score, event.score_version, event.status, event.client_id) == (
        "correction", 100, version + 1, "applied", None)
    assert event.reason == "cheating proven"
    revocation.refresh_from_db()
    assert revocation.status == ScoreRevocation.Status.APPLIED and revocation.decided_by_label == approver.label
    dispute.refresh_from_db()
    assert dispute.status == Dispute.Status.RESOLVED and "revoked to 100" in dispute.resolution_reason
    rows = audit_rows(season, since=start)
    assert [r.action for r in rows] == ["revocation.approved", "dispute.resolved"]
    assert rows[0].before == {"score": 900, "score_version": version}
    assert rows[0].after is not None
    assert rows[0].after["score"] == 100 and rows[0].after["proposed_by"] == reviewer.label
    assert rows[0].actor_label == approver.label and rows[0].reason == "replay reviewed"
    with pytest.raises(StaffError, match="applied"):
        score_revocation_approve(revocation=revocation, actor=approver)


def test_a_stale_approval_changes_nothing_reports_why_and_can_be_retried(
    open_season: Any, people: dict[str, Any], post_scores: Post
) -> None:
    season, events = open_season
    reviewer, approver = actor_of(people["reviewer"]), actor_of(people["approver"])
    revocation = score_revocation_propose(season=season, player_id="alice", new_score=10, reason="bug", actor=reviewer)
    based_on = events.versions["alice"]
    # The match service settles another match of alice meanwhile: her version moves on.
    post_ok(post_scores, season, [events.result("alice", 1200)])
    newer = events.versions["alice"]
    start = audit_head()
    result = score_revocation_approve(revocation=revocation, actor=approver)
    assert result.status == "stale" and not result.applied
    assert f"version {newer} (score 1200)" in result.detail and f"based on version {based_on}" in result.detail
    assert score_of(season, "alice") == 1200
    assert event_of(season, f"staff-revocation-{revocation.pk}-1").status == "stale"
    revocation.refresh_from_db()
    assert (revocation.status, revocation.last_outcome, revocation.attempts) == ("proposed", "stale", 1)
    assert audit_actions(season, since=start) == ["revocation.approval_failed"]

    # Whoever re-proposes it on the new state becomes its proposer: a second person approves.
    rebased = score_revocation_rebase(revocation=revocation, actor=approver, reason="still a bug")
    assert (rebased.base_version, rebased.score_before, rebased.proposed_by_label) == (
        newer, 1200, people["approver"].username)
    with pytest.raises(StaffError, match="nobody approves their own proposal"):
        score_revocation_approve(revocation=revocation, actor=approver)
    retried = score_revocation_approve(revocation=revocation, actor=actor_of(people["approver2"]))
    assert retried.applied
    assert score_of(season, "alice") == 10
    revocation.refresh_from_db()
    assert revocation.event_id == f"staff-revocation-{revocation.pk}-2"
    assert audit_actions(season)[-2:] == ["revocation.rebased", "revocation.approved"]
    rebase_row = audit_rows(season)[-2]
    assert (rebase_row.before or {})["score_version"] == based_on
    assert (rebase_row.after or {})["score_version"] == newer


def test_an_approver_whose_role_the_proposer_granted_is_no_second_person(
    open_season: Any, people: dict[str, Any], fast_passwords: None
) -> None:
    season, _ = open_season
    proposer = actor_of(people["approver"])
    # The proposer makes a second account and gives it the approver role.
    sock, _ = staff_user_create(username="sock-puppet", role="approver", password="x" * 12, actor=proposer)
    revocation = score_revocation_propose(season=season, player_id="alice", new_score=1, reason="r", actor=proposer)
    with pytest.raises(StaffError, match="the proposer granted the approver's role"):
        score_revocation_approve(revocation=revocation, actor=actor_of(sock))
    assert score_revocation_approve(revocation=revocation, actor=actor_of(people["approver2"])).applied


def test_a_rejected_revocation_sends_its_dispute_back_to_the_queue(open_season: Any, people: dict[str, Any]) -> None:
    season, _ = open_season
    reviewer, approver = actor_of(people["reviewer"]), actor_of(people["approver"])
    dispute, _ = dispute_file(season=season, player_id="bob", summary="s", actor=reviewer)
    revocation = score_revocation_propose(season=season, player_id="bob", new_score=0, reason="r", actor=reviewer,
                                          dispute=dispute)
    with pytest.raises(StaffError, match="reject its proposed revocation first"):
        dispute_reject(dispute=dispute, reason="no", actor=reviewer)
    with pytest.raises(StaffError, match="already has a proposed revocation"):  # one at a time
        score_revocation_propose(season=season, player_id="bob", new_score=5, reason="r", actor=reviewer,
                                 dispute=dispute)
    score_revocation_reject(revocation=revocation, actor=approver, reason="evidence too thin")
    dispute.refresh_from_db()
    assert dispute.status == Dispute.Status.OPEN
    assert score_of(season, "bob") == 300
    assert audit_actions(season)[-1] == "revocation.rejected"


@pytest.mark.parametrize("bad", [
    {"new_score": 1_000_001}, {"new_score": -5}, {"reason": ""}, {"reason": "r" * 501}, {"player_id": "a b"},
])
def test_a_revocation_is_validated(open_season: Any, people: dict[str, Any], bad: dict[str, Any]) -> None:
    season, _ = open_season
    params = {"season": season, "player_id": "bob", "new_score": 5, "reason": "r",
              "actor": actor_of(people["reviewer"]), **bad}
    with pytest.raises(StaffError):
        score_revocation_propose(**params)
    assert not ScoreRevocation.objects.exists()


def test_only_a_signed_in_staff_member_acts(open_season: Any) -> None:
    season, _ = open_season
    with pytest.raises(StaffError, match="staff member"):
        score_revocation_propose(season=season, player_id="bob", new_score=5, reason="r", actor=TEST_ACTOR)


# --- atomicity: the action and its audit row commit together ----------------------------------------


def _boom(**kwargs: Any) -> None:
    raise RuntimeError("audit write failed")


def test_when_the_audit_row_cannot_be_written_the_action_does_not_happen(
    season_factory: Callable[..., Season], post_scores: Post, people: dict[str, Any], monkeypatch: Any
) -> None:
    # A season in one database: there an approval's ledger row commits with its audit row.
    # (Split over databases it cannot: tests/test_ledger_databases.py has that approval.)
    season = season_factory(slug="svc-one", partitions=1)
    events = Events("svc1", "2026-11-15T12:00:00Z")
    post_ok(post_scores, season, [events.result("alice", 900), events.result("bob", 300)])
    reviewer, approver = actor_of(people["reviewer"]), actor_of(people["approver"])
    dispute, _ = dispute_file(season=season, player_id="alice", summary="s", actor=reviewer)
    revocation = score_revocation_propose(season=season, player_id="alice", new_score=7, reason="r", actor=reviewer)
    ledger_before = ScoreEvent.objects.count()
    audit_before = AuditEntry.objects.count()

    for module in staff_services_modules():
        monkeypatch.setattr(module, "audit_log", _boom)
    actions: list[Callable[[], Any]] = [
        lambda: dispute_file(season=season, player_id="bob", summary="s2", actor=reviewer),
        lambda: dispute_assign(dispute=dispute, assignee=people["reviewer"], actor=reviewer),
        lambda: dispute_note_add(dispute=dispute, text="n", actor=reviewer),
        lambda: dispute_reject(dispute=dispute, reason="r", actor=reviewer),
        lambda: score_revocation_propose(season=season, player_id="bob", new_score=1, reason="r", actor=reviewer),
        lambda: score_revocation_approve(revocation=revocation, actor=approver),
        lambda: score_revocation_reject(revocation=revocation, actor=approver, reason="r"),
        lambda: staff_user_create(username="eve", role="viewer", password="pw-eve-12345", actor=TEST_ACTOR),
    ]
    for action in actions:
        with pytest.raises(RuntimeError, match="audit write failed"):
            action()
    assert Dispute.objects.count() == 1 and not DisputeNote.objects.exists()
    dispute.refresh_from_db()
    assert dispute.status == Dispute.Status.OPEN and dispute.assignee is None
    assert ScoreRevocation.objects.count() == 1
    revocation.refresh_from_db()
    assert revocation.status == "proposed" and revocation.attempts == 0
    # The correction the approval wrote to the ledger was rolled back with the audit row.
    assert ScoreEvent.objects.count() == ledger_before
    assert score_of(season, "alice") == 900
    assert AuditEntry.objects.count() == audit_before
    from django.contrib.auth import get_user_model

    assert not get_user_model().objects.filter(username="eve").exists()


# --- late results --------------------------------------------------------------------------


@pytest.fixture
def sealed_with_late(season_factory: Callable[..., Season], post_scores: Post) -> tuple[Season, Events]:
    season = closing_season(season_factory, "late-svc")
    events = Events("late", in_season(season))
    post_ok(post_scores, season, [events.result("carl", 400), events.result("dina", 700)])
    season_seal_ingest(season=season, actor=TEST_ACTOR)
    results = post_ok(post_scores, season, [events.result("carl", 650), events.result("dina", 500),
                                            events.result("newbie", 50)])
    assert {r["reason"] for r in results} == {"late_after_seal"}
    return season, events


def test_a_late_result_is_applied_through_an_approved_correction(sealed_with_late: Any,
                                                                 people: dict[str, Any]) -> None:
    season, _ = sealed_with_late
    late = {r.player_id: r for r in ledger_rows(LateResult, season)}
    assert late_result_proposal_score(late_result=late["carl"]) == 650  # max(400, 650)
    assert late_result_proposal_score(late_result=late["dina"]) == 700  # max(700, 500): no change
    assert late_result_proposal_score(late_result=late["newbie"]) == 50
    reviewer, approver = actor_of(people["reviewer"]), actor_of(people["approver"])
    revocation = score_revocation_propose(season=season, player_id="carl", new_score=650, reason="late but valid",
                                          actor=reviewer, late_result=late["carl"])
    with pytest.raises(StaffError, match="already has a proposed correction"):
        score_revocation_propose(season=season, player_id="carl", new_score=650, reason="again", actor=reviewer,
                                 late_result=late["carl"])
    with pytest.raises(StaffError, match="reject it first"):
        late_result_dismiss(late_result=late["carl"], actor=reviewer, reason="no")
    result = score_revocation_approve(revocation=revocation, actor=approver)
    assert result.applied, result.detail
    assert score_of(season, "carl") == 650
    event = event_of(season, result.revocation.event_id)
    assert event.completed_at == late["carl"].completed_at  # the result's own pre-cutoff time
    late["carl"].refresh_from_db()
    assert late["carl"].status == LateResult.Status.APPLIED and late["carl"].resolved_by_label == approver.label
    assert audit_actions(season)[-2:] == ["revocation.approved", "late_result.applied"]

    # A newcomer's late result: a correction creates the player (version 1).
    newbie = score_revocation_propose(season=season, player_id="newbie", new_score=50, reason="late",
                                      actor=reviewer, late_result=late["newbie"])
    assert newbie.base_version == 0 and newbie.score_before is None
    assert score_revocation_approve(revocation=newbie, actor=approver).applied
    assert dict(ledger_rows(PlayerScore, season, "player_id", "score_version"))["newbie"] == 1

    dismissed = late_result_dismiss(late_result=late["dina"], actor=reviewer, reason="lower than her best")
    assert dismissed.status == LateResult.Status.DISMISSED
    assert audit_rows(season)[-1].action == "late_result.dismissed"
    with pytest.raises(StaffError, match="dismissed"):
        late_result_dismiss(late_result=late["dina"], actor=reviewer, reason="again")


def test_a_revocation_after_final_is_listed_as_a_final_correction(season_factory: Callable[..., Season],
                                                                 post_scores: Post, people: dict[str, Any]) -> None:
    season = season_factory(slug="was-final", starts_at=datetime(2026, 11, 1, tzinfo=UTC),
                            cutoff=datetime.now(UTC) + timedelta(days=1))
    events = Events("wf", "2026-11-15T12:00:00Z")
    post_ok(post_scores, season, [events.result("champ", 999)])
    # The FINAL flow itself is covered elsewhere; here only the state matters.
    Season.objects.filter(pk=season.pk).update(state="FINAL", final_version=1)
    revocation = score_revocation_propose(season=season, player_id="champ", new_score=0, reason="doping",
                                          actor=actor_of(people["reviewer"]))
    assert score_revocation_approve(revocation=revocation, actor=actor_of(people["approver"])).applied
    correction = FinalCorrection.objects.get(season=season)
    assert (correction.score_before, correction.score_after, correction.actor_label) == (
        999, 0, people["approver"].username)
    assert "season.final.correction" in audit_actions(season)


def test_an_approval_follows_a_version_that_moved_while_the_score_stayed(
    open_season: Any, people: dict[str, Any], post_scores: Post
) -> None:
    """Results that left the score as it was (unchanged) do not make the proposal stale:
    both people looked at the same score, and the correction takes the version after them."""
    season, events = open_season
    reviewer, approver = actor_of(people["reviewer"]), actor_of(people["approver"])
    revocation = score_revocation_propose(season=season, player_id="alice", new_score=10, reason="bug", actor=reviewer)
    post_ok(post_scores, season, [events.result("alice", 700), events.result("alice", 800)])  # below 900
    newer = events.versions["alice"]
    result = score_revocation_approve(revocation=revocation, actor=approver)
    assert result.applied and score_of(season, "alice") == 10
    assert event_of(season, result.revocation.event_id).score_version == newer + 1
    assert audit_rows(season)[-1].before == {"score": 900, "score_version": newer}
