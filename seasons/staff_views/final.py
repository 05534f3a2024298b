"""FINAL: build a candidate, propose it, and approve or reject it (two people)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from seasons import staff_forms as f
from seasons.models import FinalCandidate, Season
from seasons.selectors import season_lifecycle_offer
from seasons.services import (
    season_final_approve,
    season_final_candidate_build,
    season_final_propose,
    season_final_reject,
)
from seasons.staff.common import staff_actor
from seasons.staff.final import selectors as sel
from seasons.staff_views.common import act, context, staff_required


@require_GET
@staff_required("console_view")
def final_page(request: HttpRequest, slug: str) -> HttpResponse:
    season = get_object_or_404(Season, slug=slug)
    return render(request, "staff/final.html", context(
        request, season=season, candidates=sel.final_candidates(season=season), form=f.OptionalReasonForm(),
        reject_form=f.ReasonForm(), lifecycle=season_lifecycle_offer(season=season),
    ))


def _candidate(slug: str, candidate_id: int) -> FinalCandidate:
    return get_object_or_404(FinalCandidate.objects.select_related("season"), pk=candidate_id, season__slug=slug)


@require_POST
@staff_required("final_propose")
def final_build(request: HttpRequest, slug: str) -> HttpResponse:
    season = get_object_or_404(Season, slug=slug)

    def build(data: dict[str, Any]) -> str:
        candidate = season_final_candidate_build(season=season, actor=staff_actor(request.user))
        verdict = "reconciled" if candidate.reconciliation_ok else "reconciliation FAILED: it cannot be proposed"
        return f"Candidate {candidate.pk} (version {candidate.version}) built, {verdict}"

    return act(request, forms.Form(request.POST), build, back=reverse("staff:final", args=[slug]))


@require_POST
@staff_required("final_propose")
def final_propose(request: HttpRequest, slug: str, candidate_id: int) -> HttpResponse:
    candidate = _candidate(slug, candidate_id)

    def propose(data: dict[str, Any]) -> str:
        season_final_propose(candidate=candidate, actor=staff_actor(request.user), reason=data["reason"])
        return f"Version {candidate.version} proposed as FINAL; another approver must approve it"

    return act(request, f.OptionalReasonForm(request.POST), propose, back=reverse("staff:final", args=[slug]))


@require_POST
@staff_required("final_approve")
def final_approve(request: HttpRequest, slug: str, candidate_id: int) -> HttpResponse:
    candidate = _candidate(slug, candidate_id)

    def approve(data: dict[str, Any]) -> str:
        season = season_final_approve(candidate=candidate, actor=staff_actor(request.user), reason=data["reason"])
        return f"Season {season.slug} is FINAL at version {season.final_version}"

    return act(request, f.OptionalReasonForm(request.POST), approve, back=reverse("staff:final", args=[slug]))


@require_POST
@staff_required("final_approve")
def final_reject(request: HttpRequest, slug: str, candidate_id: int) -> HttpResponse:
    candidate = _candidate(slug, candidate_id)

    def reject(data: dict[str, Any]) -> str:
        season_final_reject(candidate=candidate, actor=staff_actor(request.user), reason=data["reason"])
        return f"Candidate {candidate.pk} rejected"

    return act(request, f.ReasonForm(request.POST), reject, back=reverse("staff:final", args=[slug]))
