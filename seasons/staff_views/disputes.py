"""Disputes, score revocations (the two-person correction flow) and late results.

A dispute and a late result are both resolved by a revocation, so the three share the
revocation form: another approver approves what one proposes.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from leaderboard.ledger_databases import DEFAULT_ALIAS
from leaderboard.models import LateResult
from seasons import staff_forms as f
from seasons.models import Dispute, ScoreRevocation, Season
from seasons.selectors import season_get
from seasons.staff.accounts import selectors as accounts_sel
from seasons.staff.common import StaffError, staff_actor
from seasons.staff.disputes import selectors as disputes_sel
from seasons.staff.disputes.services import dispute_assign, dispute_file, dispute_note_add, dispute_reject
from seasons.staff.late_results import selectors as late_results_sel
from seasons.staff.late_results.services import (
    late_result_dismiss,
    late_result_name,
    late_result_name_of,
    late_result_proposal_score,
)
from seasons.staff.players import selectors as players_sel
from seasons.staff.revocations import selectors as revocations_sel
from seasons.staff.revocations.services import (
    score_revocation_approve,
    score_revocation_propose,
    score_revocation_rebase,
    score_revocation_reject,
)
from seasons.staff_views.common import GET_OR_POST, Done, act, context, staff_required

# ----------------------------------------------------------------------- disputes


@require_GET
@staff_required("console_view")
def disputes(request: HttpRequest) -> HttpResponse:
    form = f.DisputeFilterForm(request.GET or {"status": "active"})
    data = form.cleaned_data if form.is_valid() else {"status": "active"}
    qs = disputes_sel.disputes_filtered(season=data.get("season", ""), status=data.get("status", ""),
                               assignee=data.get("assignee", ""), player_id=data.get("player_id", ""),
                               user_id=request.user.pk)
    page = Paginator(qs, 50).get_page(request.GET.get("page"))
    ctx = context(request, form=form, page=page, seasons=Season.objects.order_by("-starts_at"),
                  staff=accounts_sel.staff_users())
    if request.htmx:  # type: ignore[attr-defined]
        # The filter form swaps only the table (and pushes the URL), so the filters stay as typed.
        return render(request, "staff/partials/dispute_table.html", ctx)
    return render(request, "staff/disputes.html", ctx)


@GET_OR_POST
@staff_required("disputes_manage")
def dispute_new(request: HttpRequest) -> HttpResponse:
    form = f.DisputeFileForm(request.POST or None, initial={"season": request.GET.get("season"),
                                                            "player_id": request.GET.get("player_id")})

    def page() -> HttpResponse:
        return render(request, "staff/dispute_new.html", context(request, form=form))

    if request.method != "POST":
        return page()

    def file(data: dict[str, Any]) -> Done:
        dispute, _ = dispute_file(season=data["season"], player_id=data["player_id"], summary=data["summary"],
                                  details=data["details"], claimed_score=data["claimed_score"],
                                  match_id=data["match_id"], actor=staff_actor(request.user))
        return Done(f"Dispute {dispute.pk} filed", then=reverse("staff:dispute", args=[dispute.pk]))

    return act(request, form, file, back=reverse("staff:dispute-new"), page=page)


def _dispute(dispute_id: int) -> Dispute:
    return get_object_or_404(Dispute.objects.select_related("season", "assignee"), pk=dispute_id)


@require_GET
@staff_required("console_view")
def dispute_page(request: HttpRequest, dispute_id: int) -> HttpResponse:
    dispute = _dispute(dispute_id)
    return render(request, "staff/dispute.html", context(
        request, dispute=dispute, notes=disputes_sel.dispute_notes(dispute=dispute),
        revocations=disputes_sel.dispute_revocations(dispute=dispute),
        assign_form=f.DisputeAssignForm(initial={"assignee": dispute.assignee_id}), note_form=f.NoteForm(),
        reject_form=f.ReasonForm(),
    ))


@require_POST
@staff_required("disputes_manage")
def dispute_assign_action(request: HttpRequest, dispute_id: int) -> HttpResponse:
    dispute = _dispute(dispute_id)

    def assign(data: dict[str, Any]) -> str:
        done = dispute_assign(dispute=dispute, assignee=data["assignee"], actor=staff_actor(request.user))
        return f"Assigned to {done.assignee.get_username()}" if done.assignee else "Unassigned"

    return act(request, f.DisputeAssignForm(request.POST), assign, back=reverse("staff:dispute", args=[dispute_id]))


@require_POST
@staff_required("disputes_manage")
def dispute_note_action(request: HttpRequest, dispute_id: int) -> HttpResponse:
    dispute = _dispute(dispute_id)

    def note(data: dict[str, Any]) -> str:
        dispute_note_add(dispute=dispute, text=data["text"], actor=staff_actor(request.user))
        return "Note added"

    return act(request, f.NoteForm(request.POST), note, back=reverse("staff:dispute", args=[dispute_id]))


@require_POST
@staff_required("disputes_manage")
def dispute_reject_action(request: HttpRequest, dispute_id: int) -> HttpResponse:
    dispute = _dispute(dispute_id)

    def reject(data: dict[str, Any]) -> str:
        dispute_reject(dispute=dispute, reason=data["reason"], actor=staff_actor(request.user))
        return f"Dispute {dispute.pk} rejected"

    return act(request, f.ReasonForm(request.POST), reject, back=reverse("staff:dispute", args=[dispute_id]))


@GET_OR_POST
@staff_required("revocation_propose")
def dispute_revocation(request: HttpRequest, dispute_id: int) -> HttpResponse:
    """Resolve a dispute by a revocation: propose the corrected score (another approver approves)."""
    dispute = _dispute(dispute_id)
    initial = {"player_id": dispute.player_id, "new_score": dispute.claimed_score,
               "reason": f"dispute {dispute.pk}: {dispute.summary}"[:500]}
    return _revocation_form(request, season=dispute.season, initial=initial, dispute=dispute,
                            back=reverse("staff:dispute", args=[dispute.pk]))


# -------------------------------------------------------------------- revocations


def _revocation_form(request: HttpRequest, *, season: Season | None, initial: dict[str, Any], back: str,
                     dispute: Dispute | None = None, late_result: LateResult | None = None) -> HttpResponse:
    form = f.RevocationProposeForm(request.POST or None, initial=initial)
    if late_result is not None or dispute is not None:
        # The player is fixed by the dispute or late result the revocation resolves.
        form.fields["player_id"].disabled = True
    chosen = season
    if season is None:
        chosen = season_get(slug=request.POST.get("season") or request.GET.get("season") or "")

    def page() -> HttpResponse:
        current = None
        player_id = form["player_id"].value()
        if chosen is not None and player_id:
            current = players_sel.player_score_get(season=chosen, player_id=player_id)
        return render(request, "staff/revocation_new.html", context(
            request, form=form, season=chosen, seasons=Season.objects.order_by("-starts_at"), dispute=dispute,
            late_result=late_result, late_name=late_result_name(late_result) if late_result else "", current=current,
            back=back,
        ))

    if request.method != "POST":
        return page()

    def propose(data: dict[str, Any]) -> Done:
        if chosen is None:
            raise StaffError("choose a season")
        revocation = score_revocation_propose(
            season=chosen, player_id=data["player_id"], new_score=data["new_score"], reason=data["reason"],
            evidence=data["evidence"], public_reason=data["public_reason"], actor=staff_actor(request.user),
            dispute=dispute, late_result=late_result,
        )
        return Done(f"Revocation {revocation.pk} proposed; another approver must approve it",
                    then=reverse("staff:revocation", args=[revocation.pk]))

    return act(request, form, propose, back=back, page=page)


@GET_OR_POST
@staff_required("revocation_propose")
def revocation_new(request: HttpRequest) -> HttpResponse:
    return _revocation_form(request, season=None, initial={"player_id": request.GET.get("player_id")},
                            back=reverse("staff:revocations"))


@require_GET
@staff_required("console_view")
def revocations(request: HttpRequest) -> HttpResponse:
    form = f.RevocationFilterForm(request.GET or {"status": "proposed"})
    data = form.cleaned_data if form.is_valid() else {"status": "proposed"}
    page = Paginator(revocations_sel.revocations_filtered(status=data.get("status", ""), season=data.get("season", "")),
                     50).get_page(request.GET.get("page"))
    return render(request, "staff/revocations.html", context(request, form=form, page=page))


def _revocation(revocation_id: int) -> ScoreRevocation:
    # Not the late result: it lives in its own ledger database (late_results_sel.late_result_get).
    return get_object_or_404(ScoreRevocation.objects.select_related("season", "dispute"), pk=revocation_id)


@require_GET
@staff_required("console_view")
def revocation_page(request: HttpRequest, revocation_id: int) -> HttpResponse:
    revocation = _revocation(revocation_id)
    current = players_sel.player_score_get(season=revocation.season, player_id=revocation.player_id)
    # The score moved since the proposal (a version that moved alone does not stop an approval).
    moved = current is not None and current.score != revocation.score_before
    late_result = (late_results_sel.late_result_get(season=revocation.season, alias=revocation.late_result_alias,
                                       late_id=revocation.late_result_id)
                   if revocation.late_result_id is not None else None)
    late_name = (late_result_name_of(alias=revocation.late_result_alias, late_result_id=revocation.late_result_id)
                 if revocation.late_result_id is not None else "")
    return render(request, "staff/revocation.html", context(
        request, revocation=revocation, current=current, moved=moved, approve_form=f.OptionalReasonForm(),
        late_result=late_result, late_name=late_name,
        reject_form=f.ReasonForm(), own=revocation.proposed_by_id == request.user.pk,
    ))


@require_POST
@staff_required("revocation_approve")
def revocation_approve_action(request: HttpRequest, revocation_id: int) -> HttpResponse:
    revocation = _revocation(revocation_id)

    def approve(data: dict[str, Any]) -> Done:
        result = score_revocation_approve(revocation=revocation, actor=staff_actor(request.user),
                                          reason=data["reason"])
        if result.applied:
            return Done(f"Approved and written to the ledger: {result.detail}")
        # Not an error of the console: the ledger refused (usually stale); the page offers a re-proposal.
        return Done(f"Not applied. {result.detail}", level=messages.WARNING)

    return act(request, f.OptionalReasonForm(request.POST), approve,
               back=reverse("staff:revocation", args=[revocation_id]))


@require_POST
@staff_required("revocation_propose")
def revocation_rebase_action(request: HttpRequest, revocation_id: int) -> HttpResponse:
    revocation = _revocation(revocation_id)

    def rebase(data: dict[str, Any]) -> str:
        rebased = score_revocation_rebase(revocation=revocation, actor=staff_actor(request.user), reason=data["reason"])
        return (f"Revocation {rebased.pk} re-proposed on version {rebased.base_version} "
                f"(score {rebased.score_before}); another approver must approve it")

    return act(request, f.OptionalReasonForm(request.POST), rebase,
               back=reverse("staff:revocation", args=[revocation_id]))


@require_POST
@staff_required("revocation_approve")
def revocation_reject_action(request: HttpRequest, revocation_id: int) -> HttpResponse:
    revocation = _revocation(revocation_id)

    def reject(data: dict[str, Any]) -> str:
        score_revocation_reject(revocation=revocation, actor=staff_actor(request.user), reason=data["reason"])
        return f"Revocation {revocation.pk} rejected"

    return act(request, f.ReasonForm(request.POST), reject, back=reverse("staff:revocation", args=[revocation_id]))


# -------------------------------------------------------------------- late results


@require_GET
@staff_required("console_view")
def late_results(request: HttpRequest, slug: str) -> HttpResponse:
    season = get_object_or_404(Season, slug=slug)
    status = request.GET.get("status", LateResult.Status.PENDING)
    if status not in {"", *LateResult.Status.values}:
        status = LateResult.Status.PENDING
    return render(request, "staff/late_results.html", context(
        request, season=season, rows=late_results_sel.late_results(season=season, status=status), status=status,
        statuses=LateResult.Status.values, dismiss_form=f.ReasonForm(),
    ))


def _late(slug: str, late_id: int, alias: str) -> tuple[Season, LateResult]:
    """The season's late result (alias, id): a season's ledger databases each number their own."""
    season = get_object_or_404(Season, slug=slug)
    late = late_results_sel.late_result_get(season=season, alias=alias, late_id=late_id)
    if late is None:
        raise Http404(f"season {slug} has no late result {late_id} in the database {alias}")
    return season, late


def _late_back(slug: str) -> str:
    return reverse("staff:late-results", args=[slug])


@GET_OR_POST
@staff_required("revocation_propose")
def late_result_apply(request: HttpRequest, slug: str, late_id: int, alias: str = DEFAULT_ALIAS) -> HttpResponse:
    """Apply a queued event through the two-person correction flow: a late result prefilled
    with max(current, late), a held correction with the score it sets and its reason."""
    season, late = _late(slug, late_id, alias)
    event = late.ledger_event
    what = (f"held correction {event.event_id} ({event.reason})" if event.kind == "correction"
            else f"late result {event.event_id} (completed {late.completed_at:%Y-%m-%d %H:%M:%S} UTC, "
                 f"best {late.best_score})")
    initial = {"player_id": late.player_id, "new_score": late_result_proposal_score(late_result=late),
               "reason": f"{what} applied after the seal"[:500]}
    return _revocation_form(request, season=season, initial=initial, late_result=late, back=_late_back(slug))


@require_POST
@staff_required("late_results_dismiss")
def late_result_dismiss_action(request: HttpRequest, slug: str, late_id: int, alias: str = DEFAULT_ALIAS
                               ) -> HttpResponse:
    _, late = _late(slug, late_id, alias)

    def dismiss(data: dict[str, Any]) -> str:
        late_result_dismiss(late_result=late, actor=staff_actor(request.user), reason=data["reason"])
        return f"Late result {late_result_name(late)} dismissed"

    return act(request, f.ReasonForm(request.POST), dismiss, back=_late_back(slug))
