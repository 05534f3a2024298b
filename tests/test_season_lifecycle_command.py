"""manage.py season_lifecycle SLUG open|close|seal|candidate|propose|approve|reject [--as USER]."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from audit.models import AuditEntry
from leaderboard.core.lifecycle import SeasonState
from seasons.models import FinalCandidate, FinalStanding, Season
from seasons.staff.accounts.services import staff_roles_ensure
from tests.support import Events, closing_season, current_manifest, final_rows, in_season, materialize, post_ok

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]

Post = Callable[..., Any]
SeasonFactory = Callable[..., Season]


def run(*args: str) -> str:
    out = StringIO()
    call_command("season_lifecycle", *args, stdout=out)
    return out.getvalue()


def state(slug: str) -> str:
    return Season.objects.get(slug=slug).state


@pytest.fixture
def users(db: Any) -> None:
    model = get_user_model()
    groups = staff_roles_ensure()
    for name, role in (("alice", "approver"), ("bob", "approver"), ("vic", "viewer")):
        model.objects.create_user(username=name).groups.add(groups[role])
    model.objects.create_user(username="nobody")
    model.objects.create_user(username="gone", is_active=False)


def test_as_names_a_staff_member_whose_role_allows_the_action(
    season_factory: SeasonFactory, users: None, post_scores: Post
) -> None:
    season = closing_season(season_factory, "perm")
    post_ok(post_scores, season, [Events("perm", in_season(season)).result("x", 1)])
    with pytest.raises(CommandError, match=r"vic \(viewer\) may not seal"):
        run("perm", "seal", "--as", "vic")
    run("perm", "seal")
    materialize(season)
    run("perm", "candidate")
    with pytest.raises(CommandError, match=r"nobody \(no staff role\) may not propose"):
        run("perm", "propose", "--as", "nobody")
    run("perm", "propose", "--as", "alice")
    with pytest.raises(CommandError, match=r"vic \(viewer\) may not approve"):
        run("perm", "approve", "--as", "vic")
    assert state("perm") == SeasonState.FINALIZING


def test_open_and_close_by_hand_with_audit_rows(season_factory: SeasonFactory, users: None) -> None:
    now = datetime.now(UTC)
    season_factory(slug="cmd", starts_at=now + timedelta(hours=1), cutoff=now + timedelta(days=3))
    assert run("cmd", "open", "--reason", "early access") == "cmd: OPEN\n"
    entry = AuditEntry.objects.get(action="season.opened")
    assert (entry.actor_type, entry.actor_label, entry.reason) == ("system", "manage.py season_lifecycle",
                                                                   "early access")
    with pytest.raises(CommandError, match="has not passed yet"):
        run("cmd", "close")
    assert state("cmd") == SeasonState.OPEN
    Season.objects.filter(slug="cmd").update(starts_at=now - timedelta(days=1), cutoff=now - timedelta(seconds=1))
    assert run("cmd", "close", "--as", "alice") == "cmd: CLOSING\n"
    entry = AuditEntry.objects.get(action="season.closing")
    assert (entry.actor_type, entry.actor_label) == ("user", "alice")
    # A step already taken (by the clock, when the service runs) is reported, not refused.
    assert run("cmd", "open") == "cmd: CLOSING already\n"
    assert run("cmd", "close") == "cmd: CLOSING already\n"
    assert AuditEntry.objects.filter(action="season.closing").count() == 1


def test_the_whole_way_to_final_from_the_command_line(
    season_factory: SeasonFactory, post_scores: Post, users: None
) -> None:
    season = closing_season(season_factory, "cli")
    events = Events("cli", in_season(season))
    post_ok(post_scores, season, [events.result(p, s) for p, s in {"x": 30, "y": 20, "z": 20}.items()])
    assert run("cli", "seal", "--as", "alice", "--reason", "results are in") == "cli: FINALIZING\n"
    sealed = AuditEntry.objects.get(action="season.ingest.sealed")
    assert (sealed.actor_label, sealed.reason) == ("alice", "results are in")

    assert run("cli", "seal") == "cli: FINALIZING already\n"
    with pytest.raises(CommandError, match="no published version yet"):
        run("cli", "candidate", "--wait", "0")
    materialize(season)
    out = run("cli", "candidate")
    candidate = FinalCandidate.objects.get(season=season)
    assert out == f"candidate #{candidate.pk}: v{candidate.version}, reconciliation ok\n"
    # The candidate of the current version (the clock builds one too) is reported, not replaced.
    assert run("cli", "candidate") == out and FinalCandidate.objects.filter(season=season).count() == 1

    with pytest.raises(CommandError, match="no proposed FINAL candidate"):
        run("cli", "approve", "--as", "bob")
    assert run("cli", "propose", "--as", "alice") == "cli: FINALIZING\n"
    with pytest.raises(CommandError, match="no built FINAL candidate"):
        run("cli", "propose", "--as", "alice")
    with pytest.raises(CommandError, match="the proposer cannot approve their own proposal"):
        run("cli", "approve", "--as", "alice")
    assert run("cli", "approve", "--as", "bob", "--reason", "checked") == "cli: FINAL\n"
    candidate.refresh_from_db()
    assert (candidate.status, candidate.proposed_by_label, candidate.decided_by_label, candidate.decision_reason) == (
        "approved", "alice", "bob", "checked")
    assert final_rows(season) == [(1, 1, "x", 30), (2, 2, "y", 20), (3, 2, "z", 20)]


def test_propose_approve_and_reject_need_a_staff_member(
    season_factory: SeasonFactory, post_scores: Post, users: None
) -> None:
    season = closing_season(season_factory, "who")
    post_ok(post_scores, season, [Events("who", in_season(season)).result("x", 1)])
    run("who", "seal")
    materialize(season)
    run("who", "candidate")
    for action in ("propose", "reject"):
        with pytest.raises(CommandError, match="only a staff member can propose, approve or reject"):
            run("who", action, "--reason", "r")
    run("who", "propose", "--as", "alice")
    with pytest.raises(CommandError, match="only a staff member"):
        run("who", "approve")
    with pytest.raises(CommandError, match="no active user 'gone'"):
        run("who", "approve", "--as", "gone")
    with pytest.raises(CommandError, match="no active user 'mallory'"):
        run("who", "approve", "--as", "mallory")
    assert state("who") == SeasonState.FINALIZING


def test_reject_takes_the_proposed_candidate_or_else_the_built_one(
    season_factory: SeasonFactory, post_scores: Post, users: None
) -> None:
    season = closing_season(season_factory, "rej")
    post_ok(post_scores, season, [Events("rej", in_season(season)).result("x", 1)])
    run("rej", "seal")
    materialize(season)
    run("rej", "candidate")
    with pytest.raises(CommandError, match="a rejection needs a reason"):
        run("rej", "reject", "--as", "bob")
    assert run("rej", "reject", "--as", "bob", "--reason", "built one looks off") == "rej: FINALIZING\n"
    run("rej", "candidate")
    run("rej", "propose", "--as", "alice")
    assert run("rej", "reject", "--as", "bob", "--reason", "proposed one too") == "rej: FINALIZING\n"
    assert list(FinalCandidate.objects.order_by("id").values_list("status", "decision_reason")) == [
        ("rejected", "built one looks off"), ("rejected", "proposed one too")]
    with pytest.raises(CommandError, match="no proposed FINAL candidate"):
        run("rej", "reject", "--as", "bob", "--reason", "nothing left")
    assert [e.reason for e in AuditEntry.objects.filter(action="season.final.rejected").order_by("id")] == [
        "built one looks off", "proposed one too"]


def test_a_failed_reconciliation_is_printed_with_the_failing_checks(
    season_factory: SeasonFactory, post_scores: Post, users: None
) -> None:
    from leaderboard.redis_client import redis_get
    from leaderboard.views.season_index import season_keys

    season = closing_season(season_factory, "bad")
    post_ok(post_scores, season, [Events("bad", in_season(season)).result("x", 5)])
    run("bad", "seal")
    manifest = materialize(season)
    assert manifest == current_manifest(season)
    key = season_keys(season).bucket(manifest.copy, manifest.layout.layout_id, 0, groups=manifest.groups)
    redis_get().zrem(key, "x")
    out = run("bad", "candidate")
    assert "reconciliation FAILED: " in out
    assert "bucket_counts" in out
    with pytest.raises(CommandError, match=r"the reconciliation failed \(.*bucket_counts"):
        run("bad", "propose", "--as", "alice")
    assert not FinalStanding.objects.exists()


def test_errors_are_command_errors(season_factory: SeasonFactory, users: None) -> None:
    season_factory(slug="err", starts_at=datetime.now(UTC) - timedelta(days=1),
                   cutoff=datetime.now(UTC) + timedelta(days=1))
    with pytest.raises(CommandError, match="no season 'nope'"):
        run("nope", "open")
    with pytest.raises(CommandError, match="invalid choice: 'finalize'"):
        run("err", "finalize")
    with pytest.raises(CommandError, match=r"a OPEN season cannot become FINALIZING \(only CLOSING\)"):
        run("err", "seal")
    with pytest.raises(CommandError, match="a OPEN season has no FINAL candidate to build"):
        run("err", "candidate")
    with pytest.raises(CommandError, match="no built FINAL candidate"):
        run("err", "propose", "--as", "alice")
    with pytest.raises(CommandError, match="no active user 'ghost'"):
        run("err", "open", "--as", "ghost")
    assert state("err") == SeasonState.OPEN
