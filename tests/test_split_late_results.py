"""Late results and held corrections of a season split over ledger databases, acted on from
the staff console (docs/operations.md, Late results and held corrections): each database
numbers its own, so a late result is named by (database alias, id) in URLs, services and
audit rows; applying one runs the revocation approval's three steps, its late result's
change committed in its database after "default"; a dismissal changes the row in its
database, then writes its audit row in "default"; resending either after a lost half
completes it once. A season all in "default" keeps its URLs and one-transaction behaviour.

The split tests need a second database: LEDGER_PARTITION_URLS="4-7=postgresql://.../<db>_ledger_b"
(.ci/run's ledger-databases step); without it they are skipped, the default-only ones run."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import OperationalError, transaction

from audit.models import AuditEntry
from leaderboard.ledger_databases import DEFAULT_ALIAS, ledger_placement_cache_clear, season_ledger_is_split
from leaderboard.models import LateResult, ScoreEvent
from seasons.models import ScoreRevocation, Season
from seasons.services import season_seal_ingest
from seasons.staff.common import StaffError
from seasons.staff.late_results import services as late_results_services
from seasons.staff.late_results.selectors import late_result_get
from seasons.staff.late_results.services import late_result_dismiss, late_result_proposal_score
from seasons.staff.revocations import services as revocations_services
from seasons.staff.revocations.services import score_revocation_approve, score_revocation_propose
from tests.support import TEST_ACTOR, Events, audit_action_failing, closing_season, db_scores, in_season, post_ok
from tests.support.staff_console import actor_of, follow_messages
from tests.test_partitions import players_in

pytest_plugins = ["tests.support.staff_fixtures"]

Post = Callable[..., Any]

needs_ledger_b = pytest.mark.skipif(
    not settings.LEDGER_PARTITION_ALIASES,
    reason="needs a second ledger database: LEDGER_PARTITION_URLS=\"4-7=postgresql://.../<db>_ledger_b\"")


def ledger_b() -> str:
    return sorted(set(settings.LEDGER_PARTITION_ALIASES.values()))[0]


def player_in(alias: str, prefix: str) -> str:
    """A player of an 8-partition season whose partition lives in `alias`."""
    placed = settings.LEDGER_PARTITION_ALIASES
    partition = min(p for p in range(8) if placed.get(p, DEFAULT_ALIAS) == alias)
    return players_in(8, partition, 1, prefix)[0]


def late_of(season: Season, player_id: str) -> LateResult:
    """The player's late result, from whichever database holds it."""
    for alias in (DEFAULT_ALIAS, *sorted(set(settings.LEDGER_PARTITION_ALIASES.values()))):
        row = LateResult.objects.using(alias).select_related("ledger_event").filter(
            season_id=season.pk, player_id=player_id).first()
        if row is not None:
            return row
    raise AssertionError(f"no late result of {player_id}")


def audit_of(season: Season, action: str) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(season_slug=season.slug, action=action).order_by("seq"))


@pytest.fixture
def split_sealed(season_factory: Callable[..., Season], post_scores: Post) -> Iterator[dict[str, Any]]:
    """A sealed season of 8 partitions split over "default" and the second database, with a
    late result of a player in each database and a held correction of one in the second."""
    ledger_placement_cache_clear()
    season = closing_season(lambda **kw: season_factory(**kw, partitions=8), f"split-late-{time.monotonic_ns()}")
    assert season_ledger_is_split(season=season)
    here, there, fixed = player_in(DEFAULT_ALIAS, "h"), player_in(ledger_b(), "t"), player_in(ledger_b(), "f")
    events = Events("sl", in_season(season))
    post_ok(post_scores, season, [events.result(here, 400), events.result(there, 300), events.result(fixed, 900)])
    season = season_seal_ingest(season=season, actor=TEST_ACTOR)
    results = post_ok(post_scores, season, [events.result(here, 650), events.result(there, 700),
                                            events.correction(fixed, 100, reason="cheating proven")])
    assert [r["status"] for r in results] == ["rejected", "rejected", "held"]
    yield {"season": season, "here": here, "there": there, "fixed": fixed}
    ledger_placement_cache_clear()


# --- through the services ------------------------------------------------------------------


@needs_ledger_b
@pytest.mark.django_db(databases="__all__")
def test_a_late_result_in_the_second_database_is_applied_and_another_dismissed(
        split_sealed: dict[str, Any], make_staff: Any) -> None:
    season, here, there, fixed = (split_sealed[k] for k in ("season", "here", "there", "fixed"))
    reviewer, approver = actor_of(make_staff("reviewer")), actor_of(make_staff("approver"))
    late, held, home = late_of(season, there), late_of(season, fixed), late_of(season, here)
    assert (late._state.db, held._state.db, home._state.db) == (ledger_b(), ledger_b(), DEFAULT_ALIAS)
    home_before = (home.pk, home.status)

    assert late_result_proposal_score(late_result=late) == 700
    revocation = score_revocation_propose(season=season, player_id=there, new_score=700, reason="late but valid",
                                          actor=reviewer, late_result=late)
    assert (revocation.late_result_id, revocation.late_result_alias) == (late.pk, ledger_b())
    assert ScoreRevocation.objects.using(DEFAULT_ALIAS).filter(pk=revocation.pk).exists()
    assert late_result_proposal_score(late_result=late) == 700
    with pytest.raises(StaffError, match="already has a proposed correction"):
        score_revocation_propose(season=season, player_id=there, new_score=700, reason="again", actor=reviewer,
                                 late_result=late)
    with pytest.raises(StaffError, match="reject it first"):
        late_result_dismiss(late_result=late, actor=reviewer, reason="no")

    result = score_revocation_approve(revocation=revocation, actor=approver)
    assert result.applied, result.detail
    assert db_scores(season)[there] == 700
    late.refresh_from_db()
    assert (late.status, late.resolved_by_label) == ("applied", approver.label)
    read = late_result_get(season=season, alias=revocation.late_result_alias, late_id=late.pk)
    assert read is not None and read.status == "applied"
    # The late result of "default" that may carry the same id is not touched.
    home.refresh_from_db()
    assert (home.pk, home.status) == home_before
    applied = audit_of(season, "late_result.applied")
    assert [(r.target_id, (r.after or {})["database"]) for r in applied] == [(f"{ledger_b()}:{late.pk}", ledger_b())]
    proposed = audit_of(season, "revocation.proposed")[-1]
    assert (proposed.after or {})["late_result_database"] == ledger_b()

    # The held correction: dismissed in its database, audited in "default".
    dismissed = late_result_dismiss(late_result=held, actor=reviewer, reason="the match service retracted it")
    assert dismissed.status == "dismissed"
    assert LateResult.objects.using(ledger_b()).get(pk=held.pk).status == "dismissed"
    rows = audit_of(season, "late_result.dismissed")
    assert [(r.target_id, (r.after or {})["database"], r.reason) for r in rows] == [
        (f"{ledger_b()}:{held.pk}", ledger_b(), "the match service retracted it")]
    with pytest.raises(StaffError, match="dismissed"):
        late_result_dismiss(late_result=held, actor=reviewer, reason="again")
    assert len(audit_of(season, "late_result.dismissed")) == 1
    assert db_scores(season)[fixed] == 900


@contextlib.contextmanager
def second_half_lost(*, aliases: Any) -> Iterator[None]:
    """ledger_atomic whose "default" part commits and whose other database's commit fails."""
    ordered = list(dict.fromkeys(aliases))
    other = next(alias for alias in ordered if alias != DEFAULT_ALIAS)
    with transaction.atomic(using=other):
        with transaction.atomic(using=DEFAULT_ALIAS):
            yield
        raise OperationalError(f"the connection to {other} was lost while committing")


def approved_losing_the_late_half(*, season: Season, player_id: str, late: LateResult, reviewer: Any, approver: Any,
                                  monkeypatch: pytest.MonkeyPatch) -> ScoreRevocation:
    """The late result proposed and approved, the approval's outcome committed in "default"
    and lost in the late result's database."""
    revocation = score_revocation_propose(season=season, player_id=player_id, new_score=700, reason="late",
                                          actor=reviewer, late_result=late)
    return approve_losing_the_late_half(revocation=revocation, approver=approver, monkeypatch=monkeypatch)


def approve_losing_the_late_half(*, revocation: ScoreRevocation, approver: Any,
                                 monkeypatch: pytest.MonkeyPatch) -> ScoreRevocation:
    real = revocations_services.ledger_atomic
    calls = iter(range(100))

    def outcome_loses_its_second_half(*, aliases: Any) -> Any:
        # The approval's first call records its attempt; its second records the outcome.
        return second_half_lost(aliases=aliases) if next(calls) == 1 else real(aliases=aliases)

    monkeypatch.setattr(revocations_services, "ledger_atomic", outcome_loses_its_second_half)
    with pytest.raises(OperationalError):
        score_revocation_approve(revocation=revocation, actor=approver)
    monkeypatch.setattr(revocations_services, "ledger_atomic", real)
    revocation.refresh_from_db()
    return revocation


@needs_ledger_b
@pytest.mark.django_db(databases="__all__")
def test_an_approval_whose_late_result_half_is_lost_completes_when_sent_again_once(
        split_sealed: dict[str, Any], make_staff: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    season, there = split_sealed["season"], split_sealed["there"]
    reviewer, approver = actor_of(make_staff("reviewer")), actor_of(make_staff("approver"))
    late = late_of(season, there)
    revocation = approved_losing_the_late_half(season=season, player_id=there, late=late, reviewer=reviewer,
                                               approver=approver, monkeypatch=monkeypatch)
    # "default" committed: applied and audited; the late result's own change was lost.
    assert revocation.status == "applied" and db_scores(season)[there] == 700
    assert LateResult.objects.using(ledger_b()).get(pk=late.pk).status == "pending"
    assert [r.action for r in AuditEntry.objects.filter(season_slug=season.slug).order_by("-seq")[:2]] == [
        "late_result.applied", "revocation.approved"]

    again = score_revocation_approve(revocation=revocation, actor=approver)
    assert again.applied and again.revocation.pk == revocation.pk
    repaired = LateResult.objects.using(ledger_b()).get(pk=late.pk)
    assert (repaired.status, repaired.resolved_by_label) == ("applied", approver.label)
    assert f"revocation {revocation.pk}" in repaired.resolution_reason
    # Exactly once: one correction in the ledger, one audit row of each.
    assert ScoreEvent.objects.using(ledger_b()).filter(
        season_id=season.pk, match_id=f"staff-revocation-{revocation.pk}").count() == 1
    assert len(audit_of(season, "revocation.approved")) == len(audit_of(season, "late_result.applied")) == 1
    with pytest.raises(StaffError, match="applied"):
        score_revocation_approve(revocation=revocation, actor=approver)
    with pytest.raises(StaffError, match="applied"):
        score_revocation_propose(season=season, player_id=there, new_score=1, reason="twice", actor=reviewer,
                                 late_result=late)


@needs_ledger_b
@pytest.mark.django_db(databases="__all__")
def test_a_proposal_after_a_lost_half_finds_the_late_result_applied(
        split_sealed: dict[str, Any], make_staff: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing applies a late result twice: a new proposal (or a dismissal) for one whose
    revocation is applied completes its lost half first, then refuses."""
    season, there = split_sealed["season"], split_sealed["there"]
    reviewer, approver = actor_of(make_staff("reviewer")), actor_of(make_staff("approver"))
    late = late_of(season, there)
    approved_losing_the_late_half(season=season, player_id=there, late=late, reviewer=reviewer, approver=approver,
                                  monkeypatch=monkeypatch)
    with pytest.raises(StaffError, match="is applied"):
        score_revocation_propose(season=season, player_id=there, new_score=800, reason="again", actor=reviewer,
                                 late_result=late)
    with pytest.raises(StaffError, match="is applied"):
        late_result_dismiss(late_result=late, actor=reviewer, reason="no")
    assert LateResult.objects.using(ledger_b()).get(pk=late.pk).status == "applied"
    assert ScoreRevocation.objects.filter(late_result_id=late.pk, late_result_alias=ledger_b()).count() == 1


# The modules calling _late_result_applied_repair (each imports it by name): a replacement goes into both.
REPAIR_CALLERS = (late_results_services, revocations_services)


def approved_right_after_the_repair_step(*, revocation: ScoreRevocation, approver: Any,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The next proposal or dismissal runs its repair step (nothing to repair yet), then the
    revocation's approval commits in "default" and loses its late result's half, before
    that proposal or dismissal takes the late result's lock: the order two staff members
    acting at once can produce."""
    real = late_results_services._late_result_applied_repair
    fired: list[bool] = []

    def repair_then_approval(*, alias: str, late_result_id: int) -> Any:
        repaired = real(alias=alias, late_result_id=late_result_id)
        if not fired:
            fired.append(True)
            assert repaired is None
            approve_losing_the_late_half(revocation=revocation, approver=approver, monkeypatch=monkeypatch)
            for module in REPAIR_CALLERS:
                monkeypatch.setattr(module, "_late_result_applied_repair", real)
        return repaired

    for module in REPAIR_CALLERS:
        monkeypatch.setattr(module, "_late_result_applied_repair", repair_then_approval)


def applied_once(season: Season, late: LateResult, revocation: ScoreRevocation) -> None:
    """The late result applied by `revocation` alone: its state, one revocation naming it,
    one correction in the ledger, no dismissal audited."""
    row = LateResult.objects.using(ledger_b()).get(pk=late.pk)
    assert (row.status, f"revocation {revocation.pk}" in row.resolution_reason) == ("applied", True)
    assert list(ScoreRevocation.objects.filter(late_result_id=late.pk, late_result_alias=ledger_b(),
                                               status="applied")) == [revocation]
    assert ScoreEvent.objects.using(ledger_b()).filter(season_id=season.pk, kind="correction",
                                                       match_id__startswith="staff-revocation-").count() == 1
    assert audit_of(season, "late_result.dismissed") == []
    assert len(audit_of(season, "late_result.applied")) == 1


@needs_ledger_b
@pytest.mark.django_db(databases="__all__")
@pytest.mark.parametrize("action", ["dismissal", "proposal"])
def test_an_action_waiting_while_an_approval_loses_its_late_half_refuses(
        split_sealed: dict[str, Any], make_staff: Any, monkeypatch: pytest.MonkeyPatch, action: str) -> None:
    """Under the late result's lock, pending is not enough: the applied revocation naming it
    is looked for too, its lost half completed, and the dismissal (or second proposal)
    refused."""
    season, there = split_sealed["season"], split_sealed["there"]
    reviewer, approver = actor_of(make_staff("reviewer")), actor_of(make_staff("approver"))
    late = late_of(season, there)
    revocation = score_revocation_propose(season=season, player_id=there, new_score=700, reason="late",
                                          actor=reviewer, late_result=late)
    approved_right_after_the_repair_step(revocation=revocation, approver=approver, monkeypatch=monkeypatch)
    with pytest.raises(StaffError, match="is applied"):
        if action == "dismissal":
            late_result_dismiss(late_result=late, actor=reviewer, reason="no")
        else:
            score_revocation_propose(season=season, player_id=there, new_score=800, reason="again",
                                     actor=reviewer, late_result=late)
    applied_once(season, late, revocation)


@needs_ledger_b
@pytest.mark.django_db(databases="__all__")
def test_a_second_revocation_of_a_late_result_applied_with_its_half_lost_is_refused(
        split_sealed: dict[str, Any], make_staff: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second proposal that raced the first's approval (as before proposals looked for an
    applied revocation) is refused on approval instead of applying the late result again."""
    season, there = split_sealed["season"], split_sealed["there"]
    reviewer, approver = actor_of(make_staff("reviewer")), actor_of(make_staff("approver"))
    late = late_of(season, there)
    first = approved_losing_the_late_half(season=season, player_id=there, late=late, reviewer=reviewer,
                                          approver=approver, monkeypatch=monkeypatch)
    assert LateResult.objects.using(ledger_b()).get(pk=late.pk).status == "pending"
    second = ScoreRevocation.objects.create(
        season=season, player_id=there, score_before=700, base_version=first.base_version + 1, new_score=800,
        reason="again", late_result_id=late.pk, late_result_alias=ledger_b(),
        proposed_by_id=first.proposed_by_id, proposed_by_label=first.proposed_by_label, proposed_at=first.proposed_at)
    with pytest.raises(StaffError, match="is applied"):
        score_revocation_approve(revocation=second, actor=approver)
    applied_once(season, late, first)
    second.refresh_from_db()
    assert (second.status, second.attempts) == ("proposed", 0)
    assert db_scores(season)[there] == 700


@needs_ledger_b
@pytest.mark.django_db(databases="__all__")
def test_a_dismissal_whose_audit_row_is_lost_writes_it_once_when_sent_again(
        split_sealed: dict[str, Any], make_staff: Any) -> None:
    season, fixed = split_sealed["season"], split_sealed["fixed"]
    reviewer = actor_of(make_staff("reviewer"))
    held = late_of(season, fixed)
    with audit_action_failing("late_result.dismissed"), pytest.raises(OperationalError):
        late_result_dismiss(late_result=held, actor=reviewer, reason="retracted")
    # Its database committed the dismissal; "default" has no audit row of it.
    assert LateResult.objects.using(ledger_b()).get(pk=held.pk).status == "dismissed"
    assert audit_of(season, "late_result.dismissed") == []

    late_result_dismiss(late_result=held, actor=reviewer, reason="retracted (sent again)")
    rows = audit_of(season, "late_result.dismissed")
    assert [(r.target_id, r.reason, (r.after or {})["database"]) for r in rows] == [
        (f"{ledger_b()}:{held.pk}", "retracted", ledger_b())]  # the reason the row was dismissed with
    with pytest.raises(StaffError, match="dismissed"):
        late_result_dismiss(late_result=held, actor=reviewer, reason="a third time")
    assert len(audit_of(season, "late_result.dismissed")) == 1


# --- through the staff pages ---------------------------------------------------------------


@needs_ledger_b
@pytest.mark.django_db(databases="__all__")
@pytest.mark.parametrize("htmx", [False, True], ids=["form-post", "htmx"])
def test_the_staff_page_applies_and_dismisses_late_results_of_the_second_database(
        split_sealed: dict[str, Any], client_as: Any, htmx: bool) -> None:
    season, there, fixed, here = (split_sealed[k] for k in ("season", "there", "fixed", "here"))
    headers = {"HTTP_HX_REQUEST": "true"} if htmx else {}
    reviewer, approver = client_as("reviewer"), client_as("approver")
    late, held, home = late_of(season, there), late_of(season, fixed), late_of(season, here)
    base = f"/staff/seasons/{season.slug}/late"

    listing = reviewer.get(f"{base}/").content.decode()
    assert f'href="{base}/{ledger_b()}/{late.pk}/apply"' in listing
    assert f'action="{base}/{ledger_b()}/{held.pk}/dismiss"' in listing
    assert f'href="{base}/{home.pk}/apply"' in listing  # "default"'s keep their URLs
    assert reviewer.get(f"{base}/nowhere/{late.pk}/apply").status_code == 404

    form = reviewer.get(f"{base}/{ledger_b()}/{late.pk}/apply").content.decode()
    assert 'value="700"' in form and f"{late.pk} (in {ledger_b()})" in form
    proposed = reviewer.post(f"{base}/{ledger_b()}/{late.pk}/apply", {"new_score": "700", "reason": "late but valid"},
                             **headers)
    assert follow_messages(reviewer, proposed)[-1].startswith("Revocation")
    revocation = ScoreRevocation.objects.latest("id")
    assert (revocation.late_result_id, revocation.late_result_alias, revocation.player_id) == (
        late.pk, ledger_b(), there)
    page = approver.get(f"/staff/revocations/{revocation.pk}/").content.decode()
    assert f"#{late.pk} (in {ledger_b()}) (pending)" in page
    approved = approver.post(f"/staff/revocations/{revocation.pk}/approve", **headers)
    assert follow_messages(approver, approved)[-1].startswith("Approved")
    assert LateResult.objects.using(ledger_b()).get(pk=late.pk).status == "applied"
    assert db_scores(season)[there] == 700

    dismissed = reviewer.post(f"{base}/{ledger_b()}/{held.pk}/dismiss", {"reason": "retracted"}, **headers)
    assert follow_messages(reviewer, dismissed) == [f"Late result {held.pk} (in {ledger_b()}) dismissed"]
    assert LateResult.objects.using(ledger_b()).get(pk=held.pk).status == "dismissed"
    home.refresh_from_db()
    assert home.status == "pending"
    assert [r.target_id for r in audit_of(season, "late_result.dismissed")] == [f"{ledger_b()}:{held.pk}"]


# --- a season all in "default" -------------------------------------------------------------


@pytest.mark.django_db
def test_a_season_all_in_default_keeps_its_urls_and_audit_ids(season_factory: Callable[..., Season],
                                                              post_scores: Post, client_as: Any) -> None:
    season = closing_season(lambda **kw: season_factory(**kw, partitions=1), "late-default")
    assert season.ledger_databases == []
    events = Events("ld", in_season(season))
    post_ok(post_scores, season, [events.result("carl", 400)])
    season_seal_ingest(season=season, actor=TEST_ACTOR)
    post_ok(post_scores, season, [events.result("carl", 650), events.result("dina", 20)])
    late = LateResult.objects.get(season=season, player_id="carl")
    other = LateResult.objects.get(season=season, player_id="dina")
    reviewer, approver = client_as("reviewer"), client_as("approver")
    base = f"/staff/seasons/{season.slug}/late"
    listing = reviewer.get(f"{base}/").content.decode()
    assert f'href="{base}/{late.pk}/apply"' in listing and "data-late-database" not in listing
    reviewer.post(f"{base}/{late.pk}/apply", {"new_score": "650", "reason": "late but valid"})
    revocation = ScoreRevocation.objects.latest("id")
    assert (revocation.late_result_id, revocation.late_result_alias) == (late.pk, DEFAULT_ALIAS)
    approver.post(f"/staff/revocations/{revocation.pk}/approve")
    late.refresh_from_db()
    assert late.status == "applied"
    reviewer.post(f"{base}/{other.pk}/dismiss", {"reason": "test account"}, HTTP_HX_REQUEST="true")
    other.refresh_from_db()
    assert other.status == "dismissed"
    assert [(r.action, r.target_id) for r in AuditEntry.objects.filter(
        season_slug=season.slug, target_type="late_result").order_by("seq")] == [
        ("late_result.applied", str(late.pk)), ("late_result.dismissed", str(other.pk))]
    assert reviewer.get(f"{base}/{DEFAULT_ALIAS}/{other.pk}/apply").status_code == 200


@pytest.mark.django_db
@pytest.mark.parametrize("alias", ["ledger_gone", DEFAULT_ALIAS], ids=["database-unconfigured", "row-missing"])
def test_a_revocation_whose_late_result_cannot_be_read_shows_why(
        season_factory: Callable[..., Season], make_staff: Any, client_as: Any, alias: str) -> None:
    """A late result in a database of the season this server has no settings for is a 503
    page with the reason (as any read of that database); one whose row is not there is
    shown unavailable."""
    season = season_factory(slug=f"late-unread-{time.monotonic_ns()}", partitions=1)
    revocation = score_revocation_propose(season=season, player_id="carl", new_score=5, reason="late",
                                          actor=actor_of(make_staff("reviewer")))
    missing = 1 + (LateResult.objects.order_by("-id").values_list("id", flat=True).first() or 0)
    ScoreRevocation.objects.filter(pk=revocation.pk).update(late_result_id=missing, late_result_alias=alias)
    if alias != DEFAULT_ALIAS:
        # The season's partition was placed in a database this server has no settings for.
        Season.objects.filter(pk=season.pk).update(ledger_databases=[alias])
        ledger_placement_cache_clear()
    response = client_as("approver").get(f"/staff/revocations/{revocation.pk}/")
    page = response.content.decode()
    if alias == DEFAULT_ALIAS:
        assert response.status_code == 200, page[:500]
        assert f"#{missing} <strong" in page and "unavailable" in page
    else:
        assert response.status_code == 503, page[:500]
        assert "ledger_gone" in page and "LEDGER_PARTITION_URLS" in page
        assert response["Retry-After"] == "60"
