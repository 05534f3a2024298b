"""The staff console (CONTRACT.md 6): one view per page, one view per action.

Pages are plain HTML that work without JavaScript; htmx only refreshes the partials that
poll (overview stats, bucket table, rebuild progress) and swaps the audit verification
result in place. Every view checks a StaffConsole permission (the roles are groups of
them); every action is a POST (CSRF-checked by the middleware) that calls one service,
reports the outcome as a message and redirects back (POST/redirect/GET).
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from functools import wraps
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.models import PermissionsMixin
from django.contrib.auth.views import redirect_to_login
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse, reverse_lazy
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from audit.services import audit_chain_verify
from leaderboard.core.lifecycle import SeasonState
from leaderboard.models import LateResult, RebuildJob, ReconciliationRun
from leaderboard.rebuild import (
    RebuildError,
    rebuild_discard,
    rebuild_publish,
    season_rebuild_start,
    season_split_propose,
)
from seasons import staff_forms as f
from seasons import staff_selectors as sel
from seasons.models import Dispute, FinalCandidate, ScoreRevocation, Season
from seasons.services import (
    SeasonError,
    season_final_approve,
    season_final_candidate_build,
    season_final_propose,
    season_final_reject,
    season_seal_ingest,
    season_transition,
)
from seasons.staff_services import (
    StaffError,
    dispute_assign,
    dispute_file,
    dispute_note_add,
    dispute_reject,
    late_result_dismiss,
    late_result_proposal_score,
    perm,
    reconciliation_trigger,
    score_revocation_approve,
    score_revocation_propose,
    score_revocation_reject,
    staff_actor,
    staff_role_of,
)

View = Callable[..., HttpResponseBase]
LOGIN_URL = reverse_lazy("staff:login")
# What a refused action reports to the staff member (anything else is a bug: a 500).
REFUSALS = (StaffError, SeasonError, RebuildError)
# A page that is also its form's action.
GET_OR_POST = require_http_methods(["GET", "POST"])


def staff_required(codename: str) -> Callable[[View], View]:
    """Anonymous: to the login page (coming back afterwards). Signed in without the permission: 403."""

    def decorator(view: View) -> View:
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path(), str(LOGIN_URL))
            if not _can(request, codename):
                return render(request, "staff/forbidden.html", {"needed": codename}, status=403)
            return view(request, *args, **kwargs)

        return wrapper

    return decorator


def _can(request: HttpRequest, codename: str) -> bool:
    user = request.user
    return isinstance(user, PermissionsMixin) and user.has_perm(perm(codename))


def _act(request: HttpRequest, form: forms.Form, action: Callable[[dict[str, Any]], str], back: str) -> HttpResponse:
    """Validate, run one service, report its outcome, redirect (PRG)."""
    if not form.is_valid():
        problems = "; ".join(f"{name}: {' '.join(str(e) for e in errors)}" for name, errors in form.errors.items())
        messages.error(request, f"Nothing was done: {problems}")
        return redirect(back)
    try:
        messages.success(request, action(form.cleaned_data))
    except REFUSALS as exc:
        messages.error(request, str(exc))
    return redirect(back)


def _context(request: HttpRequest, **extra: Any) -> dict[str, Any]:
    return {"role": staff_role_of(request.user), **extra}


# ------------------------------------------------------------------------ sign in


class LoginView(auth_views.LoginView):
    template_name = "staff/login.html"
    redirect_authenticated_user = True
    next_page = "staff:overview"  # a URL name: resolve_url resolves it


class LogoutView(auth_views.LogoutView):
    next_page = "staff:login"


# ----------------------------------------------------------------------- overview


@require_GET
@staff_required("console_view")
def overview(request: HttpRequest) -> HttpResponse:
    return render(request, "staff/overview.html", _context(request, stats=sel.seasons_overview()))


@require_GET
@staff_required("console_view")
def overview_stats(request: HttpRequest) -> HttpResponse:
    """The polled partial of the overview (every 2 s): numbers and charts only."""
    return render(request, "staff/partials/overview_stats.html", _context(request, stats=sel.seasons_overview()))


# ------------------------------------------------------------------ season detail


@require_GET
@staff_required("console_view")
def season_page(request: HttpRequest, slug: str) -> HttpResponse:
    season = get_object_or_404(Season, slug=slug)
    return render(request, "staff/season.html", _context(
        request, season=season, detail=sel.season_detail(season=season),
        manifests=sel.manifests_recent(season=season), jobs=sel.rebuild_jobs_recent(season=season),
        lifecycle_form=f.LifecycleForm(), split_form=f.SplitProposeForm(), lookup_form=f.PlayerLookupForm(),
    ))


@require_GET
@staff_required("console_view")
def season_stats(request: HttpRequest, slug: str) -> HttpResponse:
    """The polled partial of the season page: current version, bucket chart and table, hot buckets."""
    season = get_object_or_404(Season, slug=slug)
    return render(request, "staff/partials/season_stats.html",
                  _context(request, season=season, detail=sel.season_detail(season=season)))


@require_POST
@staff_required("season_transition")
def season_lifecycle(request: HttpRequest, slug: str) -> HttpResponse:
    season = get_object_or_404(Season, slug=slug)
    actor = staff_actor(request.user)

    def act(data: dict[str, Any]) -> str:
        if data["target"] == "seal":
            sealed = season_seal_ingest(season=season, actor=actor, reason=data["reason"])
            return f"Ingest sealed at {sealed.ingest_watermark_txid}:{sealed.ingest_watermark_id}; season FINALIZING"
        moved = season_transition(season=season, target=SeasonState(data["target"]), actor=actor,
                                  reason=data["reason"])
        return f"Season is now {moved.state}"

    return _act(request, f.LifecycleForm(request.POST), act, reverse("staff:season", args=[slug]))


@require_POST
@staff_required("views_operate")
def split_propose(request: HttpRequest, slug: str) -> HttpResponse:
    season = get_object_or_404(Season, slug=slug)
    form = f.SplitProposeForm(request.POST)
    if not form.is_valid():
        return _act(request, form, lambda data: "", reverse("staff:season", args=[slug]))
    try:
        job = season_split_propose(season=season, actor=staff_actor(request.user),
                                   split_points=form.cleaned_data["split_points"], reason=form.cleaned_data["reason"])
    except REFUSALS as exc:
        messages.error(request, str(exc))
        return redirect("staff:season", slug)
    messages.success(request, f"Shadow build {job.pk} started; its comparison report appears here when it is done")
    return redirect("staff:rebuild", slug, job.pk)


# ---------------------------------------------------------------------- rebuilds


@GET_OR_POST
@staff_required("console_view")
def rebuilds(request: HttpRequest, slug: str) -> HttpResponse:
    """GET: the season's shadow builds. POST (views_operate): start a rebuild."""
    season = get_object_or_404(Season, slug=slug)
    if request.method == "POST":
        if not _can(request, "views_operate"):
            return render(request, "staff/forbidden.html", {"needed": "views_operate"}, status=403)
        form = f.OptionalReasonForm(request.POST)
        if form.is_valid():
            try:
                job = season_rebuild_start(season=season, actor=staff_actor(request.user),
                                           reason=form.cleaned_data["reason"])
            except REFUSALS as exc:
                messages.error(request, str(exc))
                return redirect("staff:rebuilds", slug)
            messages.success(request, f"Rebuild {job.pk} queued")
            return redirect("staff:rebuild", slug, job.pk)
    return render(request, "staff/rebuilds.html", _context(
        request, season=season, jobs=sel.rebuild_jobs_recent(season=season, limit=100), form=f.OptionalReasonForm(),
    ))


def _job(slug: str, job_id: int) -> RebuildJob:
    return get_object_or_404(RebuildJob.objects.select_related("season"), pk=job_id, season__slug=slug)


@require_GET
@staff_required("console_view")
def rebuild_page(request: HttpRequest, slug: str, job_id: int) -> HttpResponse:
    job = _job(slug, job_id)
    return render(request, "staff/rebuild.html", _context(request, season=job.season, job=job,
                                                           form=f.OptionalReasonForm()))


@require_GET
@staff_required("console_view")
def rebuild_progress(request: HttpRequest, slug: str, job_id: int) -> HttpResponse:
    """The polled partial (every second while the job runs): progress bar, status, report, actions."""
    job = _job(slug, job_id)
    return render(request, "staff/partials/rebuild_progress.html", _context(request, season=job.season, job=job,
                                                                             form=f.OptionalReasonForm()))


@require_POST
@staff_required("split_publish")
def rebuild_publish_action(request: HttpRequest, slug: str, job_id: int) -> HttpResponse:
    job = _job(slug, job_id)

    def act(data: dict[str, Any]) -> str:
        done = rebuild_publish(job=job, actor=staff_actor(request.user), reason=data["reason"])
        if done.status != RebuildJob.Status.PUBLISHED:
            raise RebuildError(f"not published: the second comparison failed ({done.error})")
        return f"Published as version {done.published_version}"

    return _act(request, f.OptionalReasonForm(request.POST), act, reverse("staff:rebuild", args=[slug, job_id]))


@require_POST
@staff_required("views_operate")
def rebuild_discard_action(request: HttpRequest, slug: str, job_id: int) -> HttpResponse:
    job = _job(slug, job_id)

    def act(data: dict[str, Any]) -> str:
        rebuild_discard(job=job, actor=staff_actor(request.user), reason=data["reason"])
        return f"Shadow build {job.pk} discarded; the live version is unchanged"

    return _act(request, f.OptionalReasonForm(request.POST), act, reverse("staff:rebuild", args=[slug, job_id]))


# ---------------------------------------------------------------- reconciliation


@GET_OR_POST
@staff_required("console_view")
def reconciliation(request: HttpRequest, slug: str) -> HttpResponse:
    """GET: the season's reconciliation runs. POST (views_operate): run one now."""
    season = get_object_or_404(Season, slug=slug)
    if request.method == "POST":
        if not _can(request, "views_operate"):
            return render(request, "staff/forbidden.html", {"needed": "views_operate"}, status=403)

        def act(data: dict[str, Any]) -> str:
            run = reconciliation_trigger(season=season, actor=staff_actor(request.user))
            return f"Reconciliation run {run.pk} on version {run.version}: {'ok' if run.ok else 'FAILED'}"

        return _act(request, forms.Form(request.POST), act, reverse("staff:reconciliation", args=[slug]))
    runs = ReconciliationRun.objects.filter(season=season).order_by("-id")
    page = Paginator(runs, 50).get_page(request.GET.get("page"))
    return render(request, "staff/reconciliation.html", _context(request, season=season, page=page))


@require_GET
@staff_required("console_view")
def reconciliation_run_page(request: HttpRequest, slug: str, run_id: int) -> HttpResponse:
    run = get_object_or_404(ReconciliationRun.objects.select_related("season"), pk=run_id, season__slug=slug)
    return render(request, "staff/reconciliation_run.html", _context(request, season=run.season, run=run))


# ------------------------------------------------------------------------ players


@require_GET
@staff_required("console_view")
def player_lookup(request: HttpRequest, slug: str) -> HttpResponse:
    season = get_object_or_404(Season, slug=slug)
    form = f.PlayerLookupForm(request.GET)
    if form.is_valid():
        return redirect("staff:player", slug, form.cleaned_data["player_id"])
    return render(request, "staff/player_lookup.html", _context(request, season=season, form=form))


@require_GET
@staff_required("console_view")
def player_page(request: HttpRequest, slug: str, player_id: str) -> HttpResponse:
    season = get_object_or_404(Season, slug=slug)
    return render(request, "staff/player.html", _context(
        request, season=season, player=sel.player_detail(season=season, player_id=player_id),
    ))


# ----------------------------------------------------------------------- disputes


@require_GET
@staff_required("console_view")
def disputes(request: HttpRequest) -> HttpResponse:
    form = f.DisputeFilterForm(request.GET or {"status": "active"})
    data = form.cleaned_data if form.is_valid() else {"status": "active"}
    qs = sel.disputes_filtered(season=data.get("season", ""), status=data.get("status", ""),
                               assignee=data.get("assignee", ""), player_id=data.get("player_id", ""),
                               user_id=request.user.pk)
    page = Paginator(qs, 50).get_page(request.GET.get("page"))
    context = _context(request, form=form, page=page, seasons=Season.objects.order_by("-starts_at"),
                       staff=sel.staff_users())
    if request.htmx:  # type: ignore[attr-defined]
        # The filter form swaps only the table (and pushes the URL), so the filters stay as typed.
        return render(request, "staff/partials/dispute_table.html", context)
    return render(request, "staff/disputes.html", context)


@GET_OR_POST
@staff_required("disputes_manage")
def dispute_new(request: HttpRequest) -> HttpResponse:
    form = f.DisputeFileForm(request.POST or None, initial={"season": request.GET.get("season"),
                                                            "player_id": request.GET.get("player_id")})
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            dispute, _ = dispute_file(season=data["season"], player_id=data["player_id"], summary=data["summary"],
                                      details=data["details"], claimed_score=data["claimed_score"],
                                      match_id=data["match_id"], actor=staff_actor(request.user))
        except REFUSALS as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, f"Dispute {dispute.pk} filed")
            return redirect("staff:dispute", dispute.pk)
    return render(request, "staff/dispute_new.html", _context(request, form=form))


def _dispute(dispute_id: int) -> Dispute:
    return get_object_or_404(Dispute.objects.select_related("season", "assignee"), pk=dispute_id)


@require_GET
@staff_required("console_view")
def dispute_page(request: HttpRequest, dispute_id: int) -> HttpResponse:
    dispute = _dispute(dispute_id)
    return render(request, "staff/dispute.html", _context(
        request, dispute=dispute, notes=sel.dispute_notes(dispute=dispute),
        revocations=sel.dispute_revocations(dispute=dispute),
        assign_form=f.DisputeAssignForm(initial={"assignee": dispute.assignee_id}), note_form=f.NoteForm(),
        reject_form=f.ReasonForm(),
    ))


@require_POST
@staff_required("disputes_manage")
def dispute_assign_action(request: HttpRequest, dispute_id: int) -> HttpResponse:
    dispute = _dispute(dispute_id)

    def act(data: dict[str, Any]) -> str:
        done = dispute_assign(dispute=dispute, assignee=data["assignee"], actor=staff_actor(request.user))
        return f"Assigned to {done.assignee.get_username()}" if done.assignee else "Unassigned"

    return _act(request, f.DisputeAssignForm(request.POST), act, reverse("staff:dispute", args=[dispute_id]))


@require_POST
@staff_required("disputes_manage")
def dispute_note_action(request: HttpRequest, dispute_id: int) -> HttpResponse:
    dispute = _dispute(dispute_id)

    def act(data: dict[str, Any]) -> str:
        dispute_note_add(dispute=dispute, text=data["text"], actor=staff_actor(request.user))
        return "Note added"

    return _act(request, f.NoteForm(request.POST), act, reverse("staff:dispute", args=[dispute_id]))


@require_POST
@staff_required("disputes_manage")
def dispute_reject_action(request: HttpRequest, dispute_id: int) -> HttpResponse:
    dispute = _dispute(dispute_id)

    def act(data: dict[str, Any]) -> str:
        dispute_reject(dispute=dispute, reason=data["reason"], actor=staff_actor(request.user))
        return f"Dispute {dispute.pk} rejected"

    return _act(request, f.ReasonForm(request.POST), act, reverse("staff:dispute", args=[dispute_id]))


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
        chosen = Season.objects.filter(slug=request.POST.get("season") or request.GET.get("season")).first()
    if request.method == "POST" and form.is_valid():
        if chosen is None:
            form.add_error(None, "choose a season")
        else:
            data = form.cleaned_data
            try:
                revocation = score_revocation_propose(
                    season=chosen, player_id=data["player_id"], new_score=data["new_score"], reason=data["reason"],
                    evidence=data["evidence"], actor=staff_actor(request.user), dispute=dispute,
                    late_result=late_result,
                )
            except REFUSALS as exc:
                form.add_error(None, str(exc))
            else:
                messages.success(request, f"Revocation {revocation.pk} proposed; another approver must approve it")
                return redirect("staff:revocation", revocation.pk)
    current = None
    player_id = form["player_id"].value()
    if chosen is not None and player_id:
        current = sel.player_score_get(season=chosen, player_id=player_id)
    return render(request, "staff/revocation_new.html", _context(
        request, form=form, season=chosen, seasons=Season.objects.order_by("-starts_at"), dispute=dispute,
        late_result=late_result, current=current, back=back,
    ))


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
    page = Paginator(sel.revocations_filtered(status=data.get("status", ""), season=data.get("season", "")),
                     50).get_page(request.GET.get("page"))
    return render(request, "staff/revocations.html", _context(request, form=form, page=page))


def _revocation(revocation_id: int) -> ScoreRevocation:
    return get_object_or_404(ScoreRevocation.objects.select_related("season", "dispute", "late_result"),
                             pk=revocation_id)


@require_GET
@staff_required("console_view")
def revocation_page(request: HttpRequest, revocation_id: int) -> HttpResponse:
    revocation = _revocation(revocation_id)
    current = sel.player_score_get(season=revocation.season, player_id=revocation.player_id)
    moved = current is not None and current.score_version != revocation.base_version
    return render(request, "staff/revocation.html", _context(
        request, revocation=revocation, current=current, moved=moved, approve_form=f.OptionalReasonForm(),
        reject_form=f.ReasonForm(), own=revocation.proposed_by_id == request.user.pk,
    ))


@require_POST
@staff_required("revocation_approve")
def revocation_approve_action(request: HttpRequest, revocation_id: int) -> HttpResponse:
    revocation = _revocation(revocation_id)
    form = f.OptionalReasonForm(request.POST)
    back = reverse("staff:revocation", args=[revocation_id])
    if not form.is_valid():
        return _act(request, form, lambda data: "", back)
    try:
        result = score_revocation_approve(revocation=revocation, actor=staff_actor(request.user),
                                          reason=form.cleaned_data["reason"], rebase=request.POST.get("rebase") == "1")
    except REFUSALS as exc:
        messages.error(request, str(exc))
        return redirect(back)
    if result.applied:
        messages.success(request, f"Approved and written to the ledger: {result.detail}")
    else:
        # Not an error of the console: the ledger refused (usually stale); the page offers a retry.
        messages.warning(request, f"Not applied. {result.detail}")
    return redirect(back)


@require_POST
@staff_required("revocation_approve")
def revocation_reject_action(request: HttpRequest, revocation_id: int) -> HttpResponse:
    revocation = _revocation(revocation_id)

    def act(data: dict[str, Any]) -> str:
        score_revocation_reject(revocation=revocation, actor=staff_actor(request.user), reason=data["reason"])
        return f"Revocation {revocation.pk} rejected"

    return _act(request, f.ReasonForm(request.POST), act, reverse("staff:revocation", args=[revocation_id]))


# -------------------------------------------------------------------- late results


@require_GET
@staff_required("console_view")
def late_results(request: HttpRequest, slug: str) -> HttpResponse:
    season = get_object_or_404(Season, slug=slug)
    status = request.GET.get("status", LateResult.Status.PENDING)
    if status not in {"", *LateResult.Status.values}:
        status = LateResult.Status.PENDING
    return render(request, "staff/late_results.html", _context(
        request, season=season, rows=sel.late_results(season=season, status=status), status=status,
        statuses=LateResult.Status.values, dismiss_form=f.ReasonForm(),
    ))


def _late(slug: str, late_id: int) -> LateResult:
    return get_object_or_404(LateResult.objects.select_related("season", "ledger_event"), pk=late_id,
                             season__slug=slug)


@GET_OR_POST
@staff_required("revocation_propose")
def late_result_apply(request: HttpRequest, slug: str, late_id: int) -> HttpResponse:
    """Apply a late result through the two-person correction flow, prefilled with max(current, late)."""
    late = _late(slug, late_id)
    initial = {"player_id": late.player_id, "new_score": late_result_proposal_score(late_result=late),
               "reason": f"late result {late.ledger_event.event_id} (completed {late.completed_at:%Y-%m-%d %H:%M:%S}"
                         f" UTC, best {late.best_score}) applied after the seal"[:500]}
    return _revocation_form(request, season=late.season, initial=initial, late_result=late,
                            back=reverse("staff:late-results", args=[slug]))


@require_POST
@staff_required("late_results_dismiss")
def late_result_dismiss_action(request: HttpRequest, slug: str, late_id: int) -> HttpResponse:
    late = _late(slug, late_id)

    def act(data: dict[str, Any]) -> str:
        late_result_dismiss(late_result=late, actor=staff_actor(request.user), reason=data["reason"])
        return f"Late result {late.pk} dismissed"

    return _act(request, f.ReasonForm(request.POST), act, reverse("staff:late-results", args=[slug]))


# --------------------------------------------------------------------------- FINAL


@require_GET
@staff_required("console_view")
def final_page(request: HttpRequest, slug: str) -> HttpResponse:
    season = get_object_or_404(Season, slug=slug)
    return render(request, "staff/final.html", _context(
        request, season=season, candidates=sel.final_candidates(season=season), form=f.OptionalReasonForm(),
        reject_form=f.ReasonForm(), lifecycle_form=f.LifecycleForm(),
    ))


def _candidate(slug: str, candidate_id: int) -> FinalCandidate:
    return get_object_or_404(FinalCandidate.objects.select_related("season"), pk=candidate_id, season__slug=slug)


@require_POST
@staff_required("final_propose")
def final_build(request: HttpRequest, slug: str) -> HttpResponse:
    season = get_object_or_404(Season, slug=slug)

    def act(data: dict[str, Any]) -> str:
        candidate = season_final_candidate_build(season=season, actor=staff_actor(request.user))
        verdict = "reconciled" if candidate.reconciliation_ok else "reconciliation FAILED: it cannot be proposed"
        return f"Candidate {candidate.pk} (version {candidate.version}) built, {verdict}"

    return _act(request, forms.Form(request.POST), act, reverse("staff:final", args=[slug]))


@require_POST
@staff_required("final_propose")
def final_propose(request: HttpRequest, slug: str, candidate_id: int) -> HttpResponse:
    candidate = _candidate(slug, candidate_id)

    def act(data: dict[str, Any]) -> str:
        season_final_propose(candidate=candidate, actor=staff_actor(request.user), reason=data["reason"])
        return f"Version {candidate.version} proposed as FINAL; another approver must approve it"

    return _act(request, f.OptionalReasonForm(request.POST), act, reverse("staff:final", args=[slug]))


@require_POST
@staff_required("final_approve")
def final_approve(request: HttpRequest, slug: str, candidate_id: int) -> HttpResponse:
    candidate = _candidate(slug, candidate_id)

    def act(data: dict[str, Any]) -> str:
        season = season_final_approve(candidate=candidate, actor=staff_actor(request.user), reason=data["reason"])
        return f"Season {season.slug} is FINAL at version {season.final_version}"

    return _act(request, f.OptionalReasonForm(request.POST), act, reverse("staff:final", args=[slug]))


@require_POST
@staff_required("final_approve")
def final_reject(request: HttpRequest, slug: str, candidate_id: int) -> HttpResponse:
    candidate = _candidate(slug, candidate_id)

    def act(data: dict[str, Any]) -> str:
        season_final_reject(candidate=candidate, actor=staff_actor(request.user), reason=data["reason"])
        return f"Candidate {candidate.pk} rejected"

    return _act(request, f.ReasonForm(request.POST), act, reverse("staff:final", args=[slug]))


# --------------------------------------------------------------------------- audit


def _audit_rows(request: HttpRequest) -> tuple[f.AuditFilterForm, Any]:
    form = f.AuditFilterForm(request.GET)
    data = form.cleaned_data if form.is_valid() else {}
    return form, sel.audit_filtered(season=data.get("season", ""), actor=data.get("actor", ""),
                                    action=data.get("action", ""), date_from=data.get("date_from"),
                                    date_to=data.get("date_to"))


@require_GET
@staff_required("console_view")
def audit(request: HttpRequest) -> HttpResponse:
    form, rows = _audit_rows(request)
    page = Paginator(rows, 100).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    return render(request, "staff/audit.html", _context(request, form=form, page=page, query=query.urlencode()))


class _Echo:
    def write(self, value: str) -> str:
        return value


AUDIT_COLUMNS = ("seq", "id", "created_at", "actor_type", "actor_id", "actor_label", "action", "target_type",
                 "target_id", "season_slug", "before", "after", "reason", "prev_hash", "row_hash")


@require_GET
@staff_required("console_view")
def audit_export(request: HttpRequest) -> StreamingHttpResponse:
    """The filtered rows as CSV, streamed; with the hashes, so the export can be checked offline."""
    import json

    _, rows = _audit_rows(request)
    writer = csv.writer(_Echo())

    def lines() -> Any:
        yield writer.writerow(AUDIT_COLUMNS)
        for row in rows.order_by("seq").values_list(*AUDIT_COLUMNS).iterator(chunk_size=2000):
            values = list(row)
            values[2] = values[2].isoformat()
            values[10] = json.dumps(values[10], sort_keys=True) if values[10] is not None else ""
            values[11] = json.dumps(values[11], sort_keys=True) if values[11] is not None else ""
            # A cell starting with = + - @ is a formula to a spreadsheet: neutralise it.
            yield writer.writerow([f"'{v}" if isinstance(v, str) and v[:1] in "=+-@" else v for v in values])

    response = StreamingHttpResponse(lines(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = 'attachment; filename="audit.csv"'
    return response


@require_POST
@staff_required("console_view")
def audit_verify(request: HttpRequest) -> HttpResponse:
    """Recompute the chain. htmx swaps the result in place; without JS it is a page of its own."""
    report = audit_chain_verify()
    template = "staff/partials/audit_verify.html" if request.htmx else "staff/audit_verify.html"  # type: ignore[attr-defined]
    return render(request, template, _context(request, report=report), status=200)

