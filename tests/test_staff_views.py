"""The staff console's pages and actions (seasons/staff_views/) through Django's test client:
who may do what (viewer, reviewer, approver; nobody approves their own proposal; anonymous
users go to the login page), CSRF on every action, the audit row each action writes, and
the pages with real published versions (bucket table, hot buckets, splits, rebuild
progress, reconciliation, FINAL, the player view)."""

from __future__ import annotations

import csv
import html
import io
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from audit.models import AuditEntry
from audit.services import audit_log
from leaderboard.core.buckets import BucketLayout
from leaderboard.ledger_databases import DEFAULT_ALIAS
from leaderboard.metrics.samples import metrics_seasons_sample
from leaderboard.models import LateResult, RebuildJob, ReconciliationRun
from leaderboard.recovery.rebuild import rebuild_run
from seasons.models import Dispute, FinalCandidate, ScoreRevocation, Season
from seasons.services import season_seal_ingest
from seasons.staff.accounts.services import ROLE_PERMISSIONS
from seasons.staff.revocations.services import score_revocation_propose
from tests.support import TEST_ACTOR, Events, closing_season, db_scores, in_season, ledger_rows, materialize, post_ok
from tests.support.staff_console import PASSWORD, actor_of, audit_actions, audit_head, audit_rows, follow_messages

# The staff fixtures (make_staff, client_as, fast_passwords).
pytest_plugins = ["tests.support.staff_fixtures"]

Post = Callable[..., Any]
TOO_LONG = "x" * 10_001  # longer than every text field: makes any action's form invalid


@pytest.fixture
def world(season_factory: Callable[..., Season], post_scores: Post, make_staff: Any) -> dict[str, Any]:
    """One of everything the console shows, without Redis: a season with scores, a sealed
    season with a late result and a FINAL candidate, a dispute, a proposed revocation, a
    shadow build waiting for a decision and a reconciliation run."""
    season = season_factory(slug="w")
    events = Events("w", "2026-11-15T12:00:00Z")
    post_ok(post_scores, season, [events.result("alice", 900), events.result("bob", 300)])
    sealed = closing_season(season_factory, "late-w")
    late_events = Events("lw", in_season(sealed))
    post_ok(post_scores, sealed, [late_events.result("carl", 400)])
    season_seal_ingest(season=sealed, actor=TEST_ACTOR)
    post_ok(post_scores, sealed, [late_events.result("carl", 650), late_events.result("dina", 20)])
    proposer = make_staff("reviewer", "proposer")
    dispute = Dispute.objects.create(season=season, player_id="alice", summary="too low", source="console",
                                     filed_by_label="t", created_at=timezone.now(), updated_at=timezone.now())
    revocation = score_revocation_propose(season=season, player_id="bob", new_score=1, reason="r",
                                          actor=actor_of(proposer))
    report = {"version": 1, "ok": True, "findings": [{"check": "player_count", "ok": True, "detail": "ledger 2"}]}
    job = RebuildJob.objects.create(season=season, kind="split", status="ready",
                                    layout=BucketLayout.uniform().as_dict(), requested_by_label="t", report=report)
    run = ReconciliationRun.objects.create(season=season, version=1, mode="sampled", ok=True,
                                           findings=report["findings"], started_at=timezone.now(), duration_ms=3.0)
    candidate = FinalCandidate.objects.create(season=sealed, version=1, built_at=timezone.now(), report=report,
                                              reconciliation_ok=True)
    late = late_of(sealed, "carl")
    return {"season": season, "sealed": sealed, "dispute": dispute, "revocation": revocation, "job": job, "run": run,
            "candidate": candidate, "late": late, "events": events, "proposer": proposer}


def late_of(season: Season, player_id: str) -> LateResult:
    """The player's late result, from the database holding their partition."""
    (late,) = [row for row in ledger_rows(LateResult, season) if row.player_id == player_id]
    return late


def late_url(season: Season, late: LateResult, action: str) -> str:
    """A late result's action: by id in "default", by database and id elsewhere."""
    alias = late._state.db or DEFAULT_ALIAS
    where = f"{late.pk}" if alias == DEFAULT_ALIAS else f"{alias}/{late.pk}"
    return f"/staff/seasons/{season.slug}/late/{where}/{action}"


def pages(w: dict[str, Any]) -> list[str]:
    s, sealed = w["season"].slug, w["sealed"].slug
    return [
        "/staff/", "/staff/overview/stats", f"/staff/seasons/{s}/", f"/staff/seasons/{s}/stats",
        f"/staff/seasons/{s}/rebuilds/", f"/staff/seasons/{s}/rebuilds/{w['job'].pk}/",
        f"/staff/seasons/{s}/rebuilds/{w['job'].pk}/progress", f"/staff/seasons/{s}/reconciliation/",
        f"/staff/seasons/{s}/reconciliation/{w['run'].pk}/", f"/staff/seasons/{s}/players/alice/",
        f"/staff/seasons/{s}/players/", f"/staff/seasons/{sealed}/late/", f"/staff/seasons/{sealed}/final/",
        "/staff/disputes/", f"/staff/disputes/{w['dispute'].pk}/", "/staff/revocations/",
        f"/staff/revocations/{w['revocation'].pk}/", "/staff/audit/", "/staff/audit/export.csv",
    ]


def form_pages(w: dict[str, Any]) -> list[tuple[str, str]]:
    """(page, permission) of the pages that are forms for an action."""
    return [
        ("/staff/disputes/new", "disputes_manage"),
        (f"/staff/disputes/{w['dispute'].pk}/revocation", "revocation_propose"),
        ("/staff/revocations/new", "revocation_propose"),
        (late_url(w["sealed"], w["late"], "apply"), "revocation_propose"),
    ]


def actions(w: dict[str, Any]) -> list[tuple[str, str]]:
    """(action URL, permission) of every POST action."""
    s, sealed, job, c = w["season"].slug, w["sealed"].slug, w["job"].pk, w["candidate"].pk
    d, r = w["dispute"].pk, w["revocation"].pk
    return [
        (f"/staff/seasons/{s}/lifecycle", "season_transition"),
        (f"/staff/seasons/{s}/splits", "views_operate"),
        (f"/staff/seasons/{s}/rebuilds/", "views_operate"),
        (f"/staff/seasons/{s}/rebuilds/{job}/publish", "split_publish"),
        (f"/staff/seasons/{s}/rebuilds/{job}/discard", "views_operate"),
        (f"/staff/seasons/{s}/reconciliation/", "views_operate"),
        (late_url(w["sealed"], w["late"], "dismiss"), "late_results_dismiss"),
        (f"/staff/seasons/{sealed}/final/build", "final_propose"),
        (f"/staff/seasons/{sealed}/final/{c}/propose", "final_propose"),
        (f"/staff/seasons/{sealed}/final/{c}/approve", "final_approve"),
        (f"/staff/seasons/{sealed}/final/{c}/reject", "final_approve"),
        (f"/staff/disputes/{d}/assign", "disputes_manage"),
        (f"/staff/disputes/{d}/notes", "disputes_manage"),
        (f"/staff/disputes/{d}/reject", "disputes_manage"),
        (f"/staff/revocations/{r}/approve", "revocation_approve"),
        (f"/staff/revocations/{r}/reject", "revocation_approve"),
        ("/staff/audit/verify", "console_view"),
    ] + form_pages(w)


INVALID = {"reason": TOO_LONG, "text": TOO_LONG, "target": "nowhere", "split_points": "", "assignee": "999999",
           "new_score": "", "player_id": "", "summary": ""}


# --- who may do what ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_an_anonymous_user_is_sent_to_the_login_page_from_every_page_and_action(world: dict[str, Any]) -> None:
    client = Client()
    for url in pages(world) + [p for p, _ in form_pages(world)]:
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/staff/login/?next="), url
    head = audit_head()
    for url, _ in actions(world):
        response = client.post(url, {"reason": "x"})
        assert response.status_code == 302 and response["Location"].startswith("/staff/login/"), url
    assert audit_head() == head


@pytest.mark.django_db
def test_login_goes_back_to_the_page_asked_for_and_logout_ends_the_session(world: dict[str, Any],
                                                                           make_staff: Any) -> None:
    make_staff("viewer", "vic")
    client = Client()
    page = client.get("/staff/login/?next=/staff/disputes/")
    assert page.status_code == 200 and b'name="csrfmiddlewaretoken"' in page.content
    wrong = client.post("/staff/login/", {"username": "vic", "password": "nope", "next": "/staff/disputes/"})
    assert wrong.status_code == 200 and b"Wrong username or password" in wrong.content
    ok = client.post("/staff/login/", {"username": "vic", "password": PASSWORD, "next": "/staff/disputes/"})
    assert ok.status_code == 302 and ok["Location"] == "/staff/disputes/"
    assert client.get("/staff/").status_code == 200
    assert client.post("/staff/logout/").status_code == 302
    assert client.get("/staff/").status_code == 302
    # Sign-ins are in the trail; a failed one is counted outside it (tests/test_rate_limits.py).
    rows = [(r.action, r.actor_type, r.actor_label) for r in audit_rows()[-2:]]
    assert rows == [("auth.login", "user", "vic"), ("auth.logout", "user", "vic")]
    assert "nope" not in str([r.after for r in audit_rows()])
    # Off-site redirects after login are refused.
    evil = Client().post("/staff/login/", {"username": "vic", "password": PASSWORD, "next": "https://evil.example/"})
    assert evil["Location"] == "/staff/"


@pytest.mark.django_db
@pytest.mark.parametrize("role", ["viewer", "reviewer", "approver"])
def test_each_role_can_do_exactly_what_its_permissions_say(world: dict[str, Any], client_as: Any, role: str) -> None:
    client = client_as(role)
    granted = set(ROLE_PERMISSIONS[role])
    for url in pages(world):
        response = client.get(url)
        assert response.status_code in (200, 302), (role, url, response.status_code)
    for url, needed in form_pages(world):
        assert (client.get(url).status_code == 403) == (needed not in granted), (role, url)
    before = audit_head()
    for url, needed in actions(world):
        response = client.post(url, INVALID)
        assert (response.status_code == 403) == (needed not in granted), (role, url, response.status_code)
        if response.status_code == 403:
            page = response.content.decode()
            assert "Not allowed" in page and needed in page
            # The page names the signed-in user's role, in its text and its header badge.
            assert f'id="forbidden-role">{role}<' in page and f'class="role role-{role}">{role}<' in page
    # The invalid forms changed nothing; the actions without a form (build a FINAL
    # candidate, run a reconciliation) ran only for roles that may run them.
    written = audit_actions(since=before)
    assert set(written) <= {"views.reconciliation.run"}
    assert ("views.reconciliation.run" in written) == ("views_operate" in granted)
    world["revocation"].refresh_from_db()
    world["candidate"].refresh_from_db()
    assert world["revocation"].status == "proposed" and world["candidate"].status == "built"
    assert Season.objects.get(pk=world["season"].pk).state == "OPEN"


@pytest.mark.django_db
def test_every_action_needs_a_csrf_token(world: dict[str, Any], make_staff: Any) -> None:
    approver = make_staff("approver")
    client = Client(enforce_csrf_checks=True)
    client.force_login(approver)
    url = f"/staff/disputes/{world['dispute'].pk}/notes"
    assert client.post(url, {"text": "no token"}).status_code == 403
    page = client.get(f"/staff/disputes/{world['dispute'].pk}/")
    token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page.content)
    assert token is not None
    assert client.post(url, {"text": "with token", "csrfmiddlewaretoken": token.group(1).decode()}).status_code == 302
    # htmx requests carry it as a header (hx-headers on <body>).
    assert b'hx-headers=\'{"X-CSRFToken": "' in page.content
    verify = client.post("/staff/audit/verify", HTTP_X_CSRFTOKEN=token.group(1).decode(), HTTP_HX_REQUEST="true")
    assert verify.status_code == 200
    assert audit_actions()[-1] == "dispute.note_added"


@pytest.mark.django_db
def test_pages_load_nothing_from_other_sites(world: dict[str, Any], client_as: Any) -> None:
    client = client_as("approver")
    for url in pages(world)[:-1]:
        html = client.get(url, follow=True).content.decode()
        assert not re.search(r"""(src|href)=["']?(https?:)?//""", html), url
    overview = client.get("/staff/").content.decode()
    assert '<script src="/static/staff/htmx.min.js" defer></script>' in overview
    assert 'hx-get="/staff/overview/stats" hx-trigger="every 2s"' in overview


# --- the two-person flows through the pages --------------------------------------------------------


@pytest.mark.django_db
def test_a_dispute_is_resolved_by_a_revocation_another_approver_approves(world: dict[str, Any],
                                                                         client_as: Any) -> None:
    season = world["season"]
    reviewer, approver = client_as("reviewer", "rita"), client_as("approver", "arno")
    start = audit_head()
    filed = reviewer.post("/staff/disputes/new", {"season": season.slug, "player_id": "alice",
                                                  "summary": "lost points in m-3", "claimed_score": "950"})
    assert filed.status_code == 302
    dispute = Dispute.objects.latest("id")
    assert follow_messages(reviewer, filed) == [f"Dispute {dispute.pk} filed"]
    assert follow_messages(reviewer, reviewer.post(f"/staff/disputes/{dispute.pk}/assign",
                                                   {"assignee": reviewer.user.pk})) == ["Assigned to rita"]
    reviewer.post(f"/staff/disputes/{dispute.pk}/notes", {"text": "replay confirms 950"})
    form = reviewer.get(f"/staff/disputes/{dispute.pk}/revocation")
    assert form.status_code == 200 and b'value="950"' in form.content  # prefilled with the claim
    proposed = reviewer.post(f"/staff/disputes/{dispute.pk}/revocation",
                             {"new_score": "950", "reason": "replay confirms", "evidence": "m-3 replay"})
    revocation = ScoreRevocation.objects.latest("id")
    assert proposed["Location"] == f"/staff/revocations/{revocation.pk}/"
    assert revocation.player_id == "alice" and revocation.dispute_id == dispute.pk

    page = reviewer.get(f"/staff/revocations/{revocation.pk}/")
    assert b"An approver decides." in page.content and b"approve-form" not in page.content
    assert reviewer.post(f"/staff/revocations/{revocation.pk}/approve").status_code == 403

    page = approver.get(f"/staff/revocations/{revocation.pk}/")
    assert b'id="approve-form"' in page.content
    done = approver.post(f"/staff/revocations/{revocation.pk}/approve", {"reason": "agree"})
    assert follow_messages(approver, done)[0].startswith("Approved and written to the ledger")
    assert db_scores(season)["alice"] == 950
    dispute.refresh_from_db()
    assert dispute.status == "resolved"
    rows = audit_rows(since=start)
    assert [(r.action, r.actor_label) for r in rows] == [
        ("dispute.filed", "rita"), ("dispute.assigned", "rita"), ("dispute.note_added", "rita"),
        ("revocation.proposed", "rita"), ("revocation.approved", "arno"), ("dispute.resolved", "arno"),
    ]
    assert all(r.actor_type == "user" and r.season_slug == season.slug for r in rows)


@pytest.mark.django_db
def test_nobody_approves_their_own_proposal_and_a_stale_approval_offers_a_re_proposal(
    world: dict[str, Any], client_as: Any, post_scores: Post
) -> None:
    season = world["season"]
    first, second = client_as("approver", "ann"), client_as("approver", "ben")
    first.post(f"/staff/revocations/new?season={season.slug}",
               {"season": season.slug, "player_id": "alice", "new_score": "5", "reason": "exploit"})
    revocation = ScoreRevocation.objects.latest("id")
    assert revocation.proposed_by_label == "ann"
    page = first.get(f"/staff/revocations/{revocation.pk}/")
    assert b'id="own-proposal"' in page.content and b'id="approve-form"' not in page.content
    refused = first.post(f"/staff/revocations/{revocation.pk}/approve")
    assert follow_messages(first, refused) == ["nobody approves their own proposal: another approver must do it"]
    revocation.refresh_from_db()
    assert revocation.status == "proposed" and revocation.attempts == 0

    # The match service moves alice after the proposal; the approver's click comes back stale.
    post_ok(post_scores, season, [world["events"].result("alice", 990)])
    stale = second.post(f"/staff/revocations/{revocation.pk}/approve")
    message = follow_messages(second, stale)[-1]
    assert message.startswith("Not applied. stale: the match service moved alice")
    assert db_scores(season)["alice"] == 990
    page = second.get(f"/staff/revocations/{revocation.pk}/").content.decode()
    assert 'id="retry-form"' in page
    assert "Re-propose on the current score (990)" in page
    rebased = second.post(f"/staff/revocations/{revocation.pk}/rebase", {"reason": "still wrong"})
    assert "another approver must approve it" in follow_messages(second, rebased)[-1]
    # The re-proposal is ben's now: ann, who sees the same new state, approves it.
    assert b'id="own-proposal"' in second.get(f"/staff/revocations/{revocation.pk}/").content
    approved = first.post(f"/staff/revocations/{revocation.pk}/approve")
    assert follow_messages(first, approved)[-1].startswith("Approved")
    assert db_scores(season)["alice"] == 5
    assert audit_actions(season)[-4:] == ["revocation.proposed", "revocation.approval_failed", "revocation.rebased",
                                          "revocation.approved"]


@pytest.mark.django_db
def test_late_results_are_applied_through_a_correction_or_dismissed(world: dict[str, Any], client_as: Any) -> None:
    sealed, late = world["sealed"], world["late"]
    reviewer, approver = client_as("reviewer"), client_as("approver")
    listing = reviewer.get(f"/staff/seasons/{sealed.slug}/late/").content.decode()
    assert f'data-late="{late.pk}"' in listing and "Apply…" in listing
    form = reviewer.get(late_url(sealed, late, "apply")).content.decode()
    assert 'value="650"' in form  # max(current 400, late 650)
    reviewer.post(late_url(sealed, late, "apply"), {"new_score": "650", "reason": "late but valid"})
    revocation = ScoreRevocation.objects.latest("id")
    assert (revocation.late_result_id, revocation.late_result_alias) == (late.pk, late._state.db)
    assert revocation.player_id == "carl"
    approver.post(f"/staff/revocations/{revocation.pk}/approve")
    late.refresh_from_db()
    assert late.status == "applied" and db_scores(sealed)["carl"] == 650

    other = late_of(sealed, "dina")
    no_reason = reviewer.post(late_url(sealed, other, "dismiss"), {"reason": ""})
    assert follow_messages(reviewer, no_reason)[-1].startswith("Nothing was done")
    reviewer.post(late_url(sealed, other, "dismiss"), {"reason": "test account"})
    other.refresh_from_db()
    assert other.status == "dismissed" and other.resolution_reason == "test account"
    assert audit_actions(sealed)[-3:] == ["revocation.approved", "late_result.applied", "late_result.dismissed"]


@pytest.mark.django_db
def test_lifecycle_buttons_are_for_approvers_and_audited(world: dict[str, Any], client_as: Any) -> None:
    season = world["season"]
    reviewer, approver = client_as("reviewer"), client_as("approver", "olga")
    # Before the cutoff nothing can close the season: no button, the time it closes by itself.
    page = approver.get(f"/staff/seasons/{season.slug}/").content.decode()
    assert "Close now" not in page and re.search(r'id="lifecycle-next">Takes results until the cutoff, '
                                                 r'\d{4}-\d\d-\d\d \d\d:\d\d UTC \(in \d+ days?\)', page)
    early = approver.post(f"/staff/seasons/{season.slug}/lifecycle", {"target": "CLOSING"})
    assert re.fullmatch(r"the cutoff, \d{4}-\d\d-\d\d \d\d:\d\d UTC \(in \d+ days?\), has not "
                        r"passed yet", follow_messages(approver, early)[0])
    Season.objects.filter(pk=season.pk).update(cutoff=datetime.now(UTC) - timedelta(minutes=1))
    page = reviewer.get(f"/staff/seasons/{season.slug}/").content.decode()
    assert 'id="lifecycle-next"' in page and "Close now" not in page  # what happens next; no button
    assert reviewer.post(f"/staff/seasons/{season.slug}/lifecycle", {"target": "CLOSING"}).status_code == 403
    assert b"Close now" in approver.get(f"/staff/seasons/{season.slug}/").content
    closed = approver.post(f"/staff/seasons/{season.slug}/lifecycle", {"target": "CLOSING", "reason": "cutoff"})
    assert follow_messages(approver, closed) == ["Season is now CLOSING"]
    page = approver.get(f"/staff/seasons/{season.slug}/").content.decode()
    assert "Seal ingest now" in page and "Close now" not in page and "Open the season" not in page
    again = approver.post(f"/staff/seasons/{season.slug}/lifecycle", {"target": "OPEN"})
    assert "cannot become OPEN" in follow_messages(approver, again)[0]
    sealed = approver.post(f"/staff/seasons/{season.slug}/lifecycle", {"target": "seal", "reason": "all in"})
    message = follow_messages(approver, sealed)[0]
    # For people: a time, not the change stream's positions.
    assert re.match(r"Ingest sealed at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(", message), message
    assert not re.search(r"\d+:\d+,", message), message
    assert "Seal ingest now" not in approver.get(f"/staff/seasons/{season.slug}/").content.decode()
    rows = audit_rows(season)[-2:]
    assert [(r.action, r.actor_label, r.reason) for r in rows] == [
        ("season.closing", "olga", "cutoff"), ("season.ingest.sealed", "olga", "all in")]
    assert rows[0].before is not None and rows[0].after is not None
    assert rows[0].before["state"] == "OPEN" and rows[0].after["state"] == "CLOSING"


# --- queues, filters, the audit trail ---------------------------------------------------------------


@pytest.mark.django_db
def test_the_dispute_queue_filters_by_season_status_assignee_and_player(world: dict[str, Any],
                                                                        client_as: Any) -> None:
    reviewer = client_as("reviewer")
    now = timezone.now()
    mine = Dispute.objects.create(season=world["sealed"], player_id="carl", summary="mine", source="api",
                                  filed_by_label="t", assignee=reviewer.user, created_at=now, updated_at=now)
    Dispute.objects.create(season=world["season"], player_id="bob", summary="closed one", source="console",
                           filed_by_label="t", status="rejected", created_at=now, updated_at=now)

    def shown(query: str) -> set[str]:
        html = reviewer.get(f"/staff/disputes/?{query}").content.decode()
        return set(re.findall(r'data-dispute="(\d+)"', html))

    first, closed = str(world["dispute"].pk), str(mine.pk + 1)
    assert shown("") == {first, str(mine.pk)}  # active by default
    assert shown("status=") == {first, str(mine.pk), closed}
    assert shown("status=rejected") == {closed}
    assert shown(f"season={world['sealed'].slug}&status=") == {str(mine.pk)}
    assert shown("assignee=me&status=") == {str(mine.pk)}
    assert shown("assignee=none&status=active") == {first}
    assert shown("player_id=bob&status=") == {closed}
    partial = reviewer.get("/staff/disputes/?status=rejected", HTTP_HX_REQUEST="true").content.decode()
    assert partial.startswith('<div id="dispute-table">') and "<html" not in partial


@pytest.mark.django_db
def test_the_audit_trail_filters_exports_csv_and_verifies(world: dict[str, Any], client_as: Any) -> None:
    viewer = client_as("viewer")
    total = AuditEntry.objects.count()
    page = viewer.get("/staff/audit/").content.decode()
    assert page.count("data-seq=") == min(total, 100)
    html = viewer.get(f"/staff/audit/?season={world['sealed'].slug}").content.decode()
    assert "season.ingest.sealed" in html and "revocation.proposed" not in html
    assert "revocation.proposed" in viewer.get("/staff/audit/?actor=proposer").content.decode()
    by_action = viewer.get("/staff/audit/?action=season.").content.decode()
    assert "season.created" in by_action and "staff.user" not in by_action
    today = timezone.now().date()
    assert viewer.get(f"/staff/audit/?date_from={today}&date_to={today}").content.decode().count("data-seq=") == \
        min(total, 100)
    tomorrow = today + timedelta(days=1)
    assert "data-seq=" not in viewer.get(f"/staff/audit/?date_from={tomorrow}").content.decode()

    export = viewer.get(f"/staff/audit/export.csv?season={world['season'].slug}")
    assert export["Content-Type"].startswith("text/csv")
    assert export["Content-Disposition"] == 'attachment; filename="audit.csv"'
    rows = list(csv.DictReader(io.StringIO(b"".join(export.streaming_content).decode())))
    expected = AuditEntry.objects.filter(season_slug=world["season"].slug).order_by("seq")
    assert [r["seq"] for r in rows] == [str(e.seq) for e in expected]
    assert [r["row_hash"] for r in rows] == [e.row_hash for e in expected]
    assert rows[0]["action"] == "season.created" and rows[-1]["action"] == "revocation.proposed"

    verified = viewer.post("/staff/audit/verify", HTTP_HX_REQUEST="true").content.decode()
    assert 'data-ok="true"' in verified and f"{total} rows verified" in verified


@pytest.mark.django_db
def test_long_audit_values_are_summarised_with_the_whole_behind_show_all(client_as: Any) -> None:
    """A rebuild's 101 bucket bounds and a watermark of many partitions: a few short lines
    in the row (the page stays readable), every value one click away."""
    bounds = [i * 10_000 for i in range(101)]
    watermark = ",".join(f"{p << 48}:{27_030 + p}" for p in range(8))
    audit_log(actor=TEST_ACTOR, action="views.rebuild.requested", target_type="rebuild_job", target_id="1",
              before={"ingest_watermark": watermark}, after={"layout": {"lower_bounds": bounds}, "players": 5})
    row = html.unescape(client_as("viewer").get("/staff/audit/?action=views.rebuild").content.decode()
                        ).split("data-seq=")[1]
    before, after = re.findall(r'<pre class="json">(.*?)</pre>', row, re.S)[0:3:2]
    assert len(after.splitlines()) <= 6 and "… 101 in all" in after and '"players": 5' in after, after
    assert len(before.splitlines()) <= 3 and "characters)" in before and watermark not in before, before
    alls = re.findall(r'<details class="json-all"><summary>show all \((\d+) lines\)</summary>'
                      r'<pre class="json">(.*?)</pre>', row, re.S)
    assert len(alls) == 2 and watermark in alls[0][1] and str(bounds)[1:-1] in alls[1][1]
    # A short value is shown whole, with nothing to expand.
    audit_log(actor=TEST_ACTOR, action="dispute.rejected", target_type="dispute", target_id="1",
              before={"status": "open"}, after={"status": "rejected"})
    row = html.unescape(client_as("viewer").get("/staff/audit/?action=dispute.").content.decode()
                        ).split("data-seq=")[1].split("</tr>")[0]
    assert "json-all" not in row and '"status": "rejected"' in row, row


# --- with published versions (real Redis, epochs: transactional on PostgreSQL) -----------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_season_pages_show_versions_buckets_hot_splits_rebuilds_and_reconciliation(
    season_factory: Callable[..., Season], post_scores: Post, client_as: Any
) -> None:
    season = season_factory(slug="hot")
    events = Events("hot", "2026-11-15T12:00:00Z")
    # Most players crowd into bucket 5 (50,000..59,999): a hot bucket.
    post_ok(post_scores, season, [events.result(f"p{i:03d}", 50_000 + i * 37) for i in range(150)]
            + [events.result(f"q{i}", 1_000 * i) for i in range(40)])
    manifest = materialize(season)
    reviewer, approver = client_as("reviewer", "rev"), client_as("approver", "apr")

    def overview_row() -> str:
        html = reviewer.get("/staff/overview/stats").content.decode()
        assert f'data-season="{season.slug}"' in html
        return html.split(f'data-season="{season.slug}"')[1].split("</tr>")[0]

    row = overview_row()
    assert re.search(rf'data-field="version">\s*{manifest.version}<', row)
    assert re.search(r'data-field="players">190<', row)  # the published version's count
    assert "<svg" in row and re.search(r'data-field="ingest"><span[^>]*>–</span>', row)  # one sample so far

    page = reviewer.get(f"/staff/seasons/{season.slug}/").content.decode()
    assert 'id="bucket-chart"' in page and 'class="bar hot"' in page
    assert re.search(r'<tr class="hot"[^>]*><td>5</td><td>50,000..59,999</td><td class="num">150</td>', page)
    assert 'id="hot-buckets"' in page and "holds 79% of players" in page
    assert f"<td class=\"num\">{manifest.version}</td>" in page  # version history
    stats = reviewer.get(f"/staff/seasons/{season.slug}/stats").content.decode()
    assert stats.startswith('<div id="season-stats"') and 'hx-trigger="every 5s"' in stats

    # A split proposed from the page runs as a shadow build and waits with its report.
    suggested = re.search(r'name="split_points" value="([0-9,]+)"', page)
    assert suggested is not None
    proposed = reviewer.post(f"/staff/seasons/{season.slug}/splits",
                             {"split_points": suggested.group(1), "reason": "hot bucket 5"})
    job = RebuildJob.objects.get(season=season, kind="split")
    assert proposed["Location"] == f"/staff/seasons/{season.slug}/rebuilds/{job.pk}/"
    queued = reviewer.get(f"/staff/seasons/{season.slug}/rebuilds/{job.pk}/progress").content.decode()
    assert 'data-status="queued"' in queued and 'hx-trigger="every 1s"' in queued
    assert rebuild_run(job_id=job.pk).status == "ready"
    ready = reviewer.get(f"/staff/seasons/{season.slug}/rebuilds/{job.pk}/").content.decode()
    assert 'data-status="ready"' in ready and "all checks pass" in ready and "sampled_ranks" in ready
    assert 'value="100.0"' in ready and "hx-trigger" not in ready.split('id="rebuild-progress"')[1].split(">")[0]
    assert "An approver publishes splits." in ready
    assert reviewer.post(f"/staff/seasons/{season.slug}/rebuilds/{job.pk}/publish").status_code == 403
    published = approver.post(f"/staff/seasons/{season.slug}/rebuilds/{job.pk}/publish", {"reason": "go"})
    message = follow_messages(approver, published)[-1]
    assert message == f"Published as version {manifest.version + 1}"
    season.refresh_from_db()
    assert len(season.layout["lower_bounds"]) > 101

    # A rebuild started from the page; its progress partial reaches 100%.
    started = reviewer.post(f"/staff/seasons/{season.slug}/rebuilds/", {"reason": "drill"})
    rebuild = RebuildJob.objects.get(season=season, kind="rebuild")
    assert started["Location"] == f"/staff/seasons/{season.slug}/rebuilds/{rebuild.pk}/"
    assert rebuild_run(job_id=rebuild.pk).status == "published"
    done = reviewer.get(f"/staff/seasons/{season.slug}/rebuilds/{rebuild.pk}/progress").content.decode()
    assert 'data-status="published"' in done and '<strong id="rebuild-percent">100%</strong>' in done
    assert f"published as version {manifest.version + 2}" in done

    ran = reviewer.post(f"/staff/seasons/{season.slug}/reconciliation/")
    message = follow_messages(reviewer, ran)[-1]
    assert re.fullmatch(rf"Reconciliation run \d+ on version {manifest.version + 2}: ok", message)
    run = ReconciliationRun.objects.get(season=season)
    runs = reviewer.get(f"/staff/seasons/{season.slug}/reconciliation/").content.decode()
    assert f"/reconciliation/{run.pk}/" in runs

    assert [(a, r) for a, r in ((e.action, e.actor_label) for e in audit_rows(season))
            if a.startswith("views.")] == [
        ("views.split.proposed", "rev"), ("views.split.publish_requested", "apr"),
        ("views.rebuild.published", "rebuild"), ("views.rebuild.requested", "rev"),
        ("views.rebuild.published", "rebuild"), ("views.reconciliation.run", "rev"),
    ]

    # The overview's ingest rate: the events the server's samples counted (tests/test_metrics_samples.py).
    sampled = timezone.now()
    metrics_seasons_sample(now=sampled - timedelta(seconds=10))
    post_ok(post_scores, season, [events.result(f"r{i}", 5) for i in range(30)])
    metrics_seasons_sample(now=sampled)
    rate = re.search(r'data-field="ingest">([0-9.]+)/s', overview_row())
    assert rate is not None and float(rate.group(1)) == 3.0  # 30 events in 10 s


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_final_is_proposed_and_approved_by_two_people_and_the_player_page_explains_scores(
    season_factory: Callable[..., Season], post_scores: Post, client_as: Any
) -> None:
    season = closing_season(season_factory, "fin")
    events = Events("fin", in_season(season))
    sent = [events.result("ann", 500), events.result("bo", 700), events.result("cy", 700),
            events.result("ann", 800), events.result("ann", 650)]
    post_ok(post_scores, season, sent)
    ann_best, ann_last = sent[3], sent[4]
    materialize(season)
    reviewer, first, second = client_as("reviewer", "rev"), client_as("approver", "ap1"), client_as("approver", "ap2")
    first.post(f"/staff/seasons/{season.slug}/lifecycle", {"target": "seal"})
    materialize(season)

    assert 'id="build-form"' in reviewer.get(f"/staff/seasons/{season.slug}/final/").content.decode()
    built = reviewer.post(f"/staff/seasons/{season.slug}/final/build")
    assert "reconciled" in follow_messages(reviewer, built)[0]
    candidate = FinalCandidate.objects.get(season=season)
    page = reviewer.get(f"/staff/seasons/{season.slug}/final/").content.decode()
    assert "ledger_sampled_ranks" in page and "Propose as FINAL" in page and "approve-form" not in page
    # A candidate of the current version exists: building another would only supersede it.
    assert 'id="build-form"' not in page
    first.post(f"/staff/seasons/{season.slug}/final/{candidate.pk}/propose", {"reason": "checked"})
    candidate.refresh_from_db()
    assert (candidate.status, candidate.proposed_by_label) == ("proposed", "ap1")
    assert reviewer.post(f"/staff/seasons/{season.slug}/final/{candidate.pk}/approve").status_code == 403
    page = first.get(f"/staff/seasons/{season.slug}/final/").content.decode()
    assert "You proposed this candidate" in page and "approve-form" not in page
    own = first.post(f"/staff/seasons/{season.slug}/final/{candidate.pk}/approve")
    assert follow_messages(first, own) == ["the proposer cannot approve their own proposal"]
    approved = second.post(f"/staff/seasons/{season.slug}/final/{candidate.pk}/approve", {"reason": "agree"})
    assert follow_messages(second, approved) == [f"Season fin is FINAL at version {candidate.version}"]
    assert 'id="final-done"' in second.get(f"/staff/seasons/{season.slug}/final/").content.decode()
    assert [(r.action, r.actor_label) for r in audit_rows(season)][-4:] == [
        ("season.ingest.sealed", "ap1"), ("season.final.candidate_built", "rev"), ("season.final.proposed", "ap1"),
        ("season.final.approved", "ap2")]

    player = reviewer.get(f"/staff/seasons/{season.slug}/players/ann/").content.decode()
    # The match service's score version and the board's version are named apart.
    assert re.search(rf'id="player-score">800 <small>the match service\'s score version {ann_last["score_version"]},',
                     player)
    assert re.search(r'id="player-rank">1 <small>position 1 of 3 on board version \d+', player)
    assert re.search(r'id="player-final">1 <small>position 1, score 800', player)
    assert re.search(rf'id="player-why">set by <code>{ann_best["event_id"]}</code> \(result\)', player)
    outcomes = re.findall(r'<span class="status status-(\w+)">', player.split('id="player-events"')[1])
    assert outcomes == ["applied", "applied", "unchanged"]
    assert 'class="outcome-applied setter"' in player
    tied = reviewer.get(f"/staff/seasons/{season.slug}/players/cy/").content.decode()
    assert re.search(r'id="player-rank">2 <small>position 3 of 3', tied)  # ties share rank 2, bo before cy
    nobody = reviewer.get(f"/staff/seasons/{season.slug}/players/zed/").content.decode()
    assert "not ranked in version" in nobody and "not in the FINAL standings" in nobody
    assert reviewer.get(f"/staff/seasons/{season.slug}/players/?player_id=ann")["Location"] == \
        f"/staff/seasons/{season.slug}/players/ann/"


@pytest.mark.django_db
def test_a_season_id_outside_the_id_rule_in_a_console_query_is_no_season(client_as: Any) -> None:
    approver = client_as("approver")
    page = approver.get("/staff/revocations/new", {"season": "bad\x00id"})
    assert page.status_code == 200
    refused = approver.post("/staff/revocations/new", {"season": "bad\x00id", "player_id": "alice",
                                                       "new_score": "5", "reason": "r"})
    assert refused.status_code in (200, 302)
    assert not ScoreRevocation.objects.exists()
