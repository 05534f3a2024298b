"""A season's pages: versions and buckets, the lifecycle, splits and rebuilds, reconciliation, players."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from leaderboard.core.events import ID_RULE, id_is_valid
from leaderboard.core.history import HISTORY_DAYS_DEFAULT
from leaderboard.core.humanize import instant_text
from leaderboard.core.lifecycle import SeasonState
from leaderboard.models import PlayerProfile, RebuildJob, ReconciliationRun
from leaderboard.profiles import player_name_reset
from leaderboard.recovery.rebuild import (
    RebuildError,
    rebuild_discard,
    rebuild_publish,
    season_rebuild_start,
    season_split_propose,
)
from seasons import staff_forms as f
from seasons.models import Season
from seasons.selectors import season_lifecycle_offer
from seasons.services import season_kind_set, season_regions_set, season_seal_ingest, season_transition
from seasons.staff.common import staff_actor
from seasons.staff.players import selectors as players_sel
from seasons.staff.players.services import player_hide, player_restore
from seasons.staff.season import selectors as sel
from seasons.staff.season.services import reconciliation_trigger
from seasons.staff_views.common import GET_OR_POST, Done, act, context, staff_required


@require_GET
@staff_required("console_view")
def season_page(request: HttpRequest, slug: str) -> HttpResponse:
    season = get_object_or_404(Season, slug=slug)
    return render(request, "staff/season.html", context(
        request, season=season, detail=sel.season_detail(season=season),
        manifests=sel.manifests_recent(season=season), jobs=sel.rebuild_jobs_recent(season=season),
        conflicts=sel.season_conflicts(season=season), regions=sel.season_region_sizes(season=season),
        lifecycle=season_lifecycle_offer(season=season),
        regions_form=f.RegionsForm(initial={"regions": ", ".join(season.regions)}),
        mode_form=f.ModeForm(initial={"mode": season.mode, "order": season.order, "max_score": season.max_score}),
        split_form=f.SplitProposeForm(), lookup_form=f.PlayerLookupForm(),
    ))


@require_GET
@staff_required("console_view")
def season_stats(request: HttpRequest, slug: str) -> HttpResponse:
    """The polled partial of the season page: current version, bucket chart and table, hot buckets."""
    season = get_object_or_404(Season, slug=slug)
    return render(request, "staff/partials/season_stats.html",
                  context(request, season=season, detail=sel.season_detail(season=season)))


@require_GET
@staff_required("console_view")
def season_region_sizes(request: HttpRequest, slug: str) -> HttpResponse:
    """The polled partial of the season page (while the season takes scores): players per region."""
    season = get_object_or_404(Season, slug=slug)
    return render(request, "staff/partials/season_regions.html",
                  context(request, season=season, regions=sel.season_region_sizes(season=season)))


@require_POST
@staff_required("season_transition")
def season_lifecycle(request: HttpRequest, slug: str) -> HttpResponse:
    season = get_object_or_404(Season, slug=slug)
    actor = staff_actor(request.user)

    def move(data: dict[str, Any]) -> str:
        if data["target"] == "seal":
            sealed = season_seal_ingest(season=season, actor=actor, reason=data["reason"])
            assert sealed.sealed_at is not None
            return (f"Ingest sealed at {instant_text(sealed.sealed_at, seconds=True)}: everything accepted until "
                    "then is in the FINAL candidate, which the lifecycle builds once the board covers it (FINAL "
                    "page). The season is FINALIZING.")
        moved = season_transition(season=season, target=SeasonState(data["target"]), actor=actor,
                                  reason=data["reason"])
        return f"Season is now {moved.state}"

    return act(request, f.LifecycleForm(request.POST), move, back=reverse("staff:season", args=[slug]))


@require_POST
@staff_required("season_transition")
def season_regions(request: HttpRequest, slug: str) -> HttpResponse:
    """Set a SCHEDULED season's regions (fixed once it opens)."""
    def set_regions(season: Season, data: dict[str, Any]) -> str:
        changed = season_regions_set(season=season, regions=data["regions"], actor=staff_actor(request.user),
                                     reason=data["reason"])
        return f"Regions: {', '.join(changed.regions) or 'none'}"

    return _season_option_post(request, slug, f.RegionsForm(request.POST), set_regions)


@require_POST
@staff_required("season_transition")
def season_mode(request: HttpRequest, slug: str) -> HttpResponse:
    """Set a SCHEDULED season's mode and score range (fixed once it opens)."""
    def set_mode(season: Season, data: dict[str, Any]) -> str:
        changed = season_kind_set(season=season, mode=data["mode"], order=data["order"], max_score=data["max_score"],
                                  actor=staff_actor(request.user), reason=data["reason"])
        return f"Mode: {changed.mode}; scores 0..{changed.max_score:,}, {changed.order}"

    return _season_option_post(request, slug, f.ModeForm(request.POST), set_mode)


def _season_option_post(request: HttpRequest, slug: str, form: Any,
                        apply: Callable[[Season, dict[str, Any]], str]) -> HttpResponse:
    """A SCHEDULED season's option set from its page's form, back to the page with the outcome."""
    season = get_object_or_404(Season, slug=slug)
    return act(request, form, lambda data: apply(season, data), back=reverse("staff:season", args=[slug]))


@require_POST
@staff_required("views_operate")
def split_propose(request: HttpRequest, slug: str) -> HttpResponse:
    season = get_object_or_404(Season, slug=slug)

    def propose(data: dict[str, Any]) -> Done:
        job = season_split_propose(season=season, actor=staff_actor(request.user),
                                   split_points=data["split_points"], reason=data["reason"])
        return Done(f"Shadow build {job.pk} started; its comparison report appears here when it is done",
                    then=reverse("staff:rebuild", args=[slug, job.pk]))

    return act(request, f.SplitProposeForm(request.POST), propose, back=reverse("staff:season", args=[slug]))


# ---------------------------------------------------------------------- rebuilds


@GET_OR_POST
@staff_required("console_view", post="views_operate")
def rebuilds(request: HttpRequest, slug: str) -> HttpResponse:
    """GET: the season's shadow builds. POST (views_operate): start a rebuild."""
    season = get_object_or_404(Season, slug=slug)
    if request.method == "POST":

        def start(data: dict[str, Any]) -> Done:
            job = season_rebuild_start(season=season, actor=staff_actor(request.user), reason=data["reason"])
            return Done(f"Rebuild {job.pk} queued", then=reverse("staff:rebuild", args=[slug, job.pk]))

        return act(request, f.OptionalReasonForm(request.POST), start, back=reverse("staff:rebuilds", args=[slug]))
    return render(request, "staff/rebuilds.html", context(
        request, season=season, jobs=sel.rebuild_jobs_recent(season=season, limit=100), form=f.OptionalReasonForm(),
    ))


def _job(slug: str, job_id: int) -> RebuildJob:
    return get_object_or_404(RebuildJob.objects.select_related("season"), pk=job_id, season__slug=slug)


@require_GET
@staff_required("console_view")
def rebuild_page(request: HttpRequest, slug: str, job_id: int) -> HttpResponse:
    job = _job(slug, job_id)
    return render(request, "staff/rebuild.html", context(request, season=job.season, job=job,
                                                          form=f.OptionalReasonForm()))


@require_GET
@staff_required("console_view")
def rebuild_progress(request: HttpRequest, slug: str, job_id: int) -> HttpResponse:
    """The polled partial (every second while the job runs): progress bar, status, report, actions."""
    job = _job(slug, job_id)
    return render(request, "staff/partials/rebuild_progress.html", context(request, season=job.season, job=job,
                                                                            form=f.OptionalReasonForm()))


@require_POST
@staff_required("split_publish")
def rebuild_publish_action(request: HttpRequest, slug: str, job_id: int) -> HttpResponse:
    job = _job(slug, job_id)

    def publish(data: dict[str, Any]) -> str:
        done = rebuild_publish(job=job, actor=staff_actor(request.user), reason=data["reason"])
        if done.status != RebuildJob.Status.PUBLISHED:
            raise RebuildError(f"not published: the second comparison failed ({done.error})")
        return f"Published as version {done.published_version}"

    return act(request, f.OptionalReasonForm(request.POST), publish, back=reverse("staff:rebuild", args=[slug, job_id]))


@require_POST
@staff_required("views_operate")
def rebuild_discard_action(request: HttpRequest, slug: str, job_id: int) -> HttpResponse:
    job = _job(slug, job_id)

    def discard(data: dict[str, Any]) -> str:
        rebuild_discard(job=job, actor=staff_actor(request.user), reason=data["reason"])
        return f"Shadow build {job.pk} discarded; the live version is unchanged"

    return act(request, f.OptionalReasonForm(request.POST), discard, back=reverse("staff:rebuild", args=[slug, job_id]))


# ---------------------------------------------------------------- reconciliation


@GET_OR_POST
@staff_required("console_view", post="views_operate")
def reconciliation(request: HttpRequest, slug: str) -> HttpResponse:
    """GET: the season's reconciliation runs. POST (views_operate): run one now."""
    season = get_object_or_404(Season, slug=slug)
    if request.method == "POST":

        def run_now(data: dict[str, Any]) -> str:
            run = reconciliation_trigger(season=season, actor=staff_actor(request.user))
            return f"Reconciliation run {run.pk} on version {run.version}: {'ok' if run.ok else 'FAILED'}"

        return act(request, forms.Form(request.POST), run_now, back=reverse("staff:reconciliation", args=[slug]))
    runs = ReconciliationRun.objects.filter(season=season).order_by("-id")
    page = Paginator(runs, 50).get_page(request.GET.get("page"))
    return render(request, "staff/reconciliation.html", context(request, season=season, page=page))


@require_GET
@staff_required("console_view")
def reconciliation_run_page(request: HttpRequest, slug: str, run_id: int) -> HttpResponse:
    run = get_object_or_404(ReconciliationRun.objects.select_related("season"), pk=run_id, season__slug=slug)
    return render(request, "staff/reconciliation_run.html", context(request, season=run.season, run=run))


# ------------------------------------------------------------------------ players


@require_GET
@staff_required("console_view")
def player_lookup(request: HttpRequest, slug: str) -> HttpResponse:
    season = get_object_or_404(Season, slug=slug)
    form = f.PlayerLookupForm(request.GET)
    if form.is_valid():
        return redirect("staff:player", slug, form.cleaned_data["player_id"])
    return render(request, "staff/player_lookup.html", context(request, season=season, form=form))


@require_GET
@staff_required("console_view")
def player_page(request: HttpRequest, slug: str, player_id: str) -> HttpResponse:
    season = get_object_or_404(Season, slug=slug)
    if not id_is_valid(player_id):
        # No player has an id outside the id rule (PostgreSQL would refuse a NUL in it).
        raise Http404(f"no player id is like {player_id!r}: player ids are {ID_RULE}")
    return render(request, "staff/player.html", context(
        request, season=season, player=players_sel.player_detail(season=season, player_id=player_id),
        regions=players_sel.player_regions(player_id=player_id),
        friends=players_sel.player_friends(player_id=player_id),
        reason_form=f.ReasonForm(), history_days=HISTORY_DAYS_DEFAULT,
    ))


@require_POST
@staff_required("players_moderate")
def player_name_reset_action(request: HttpRequest, slug: str, player_id: str) -> HttpResponse:
    season = get_object_or_404(Season, slug=slug)
    back = reverse("staff:player", args=[season.slug, player_id])

    def reset(data: dict[str, Any]) -> str:
        try:
            profile = player_name_reset(player_id=player_id, actor=staff_actor(request.user), reason=data["reason"])
        except PlayerProfile.DoesNotExist:
            raise Http404(f"{player_id} has no profile") from None
        return f"The name {profile.name_blocked!r} was reset; a profile write naming it again keeps no name"

    return act(request, f.ReasonForm(request.POST), reset, back=back)


@require_POST
@staff_required("players_moderate")
def player_hide_action(request: HttpRequest, slug: str, player_id: str) -> HttpResponse:
    season = get_object_or_404(Season, slug=slug)

    def hide(data: dict[str, Any]) -> str:
        score = player_hide(season=season, player_id=player_id, actor=staff_actor(request.user), reason=data["reason"])
        return (f"{player_id} is hidden from every board of {season.slug} from the next version; their score "
                f"({score.score:,}) still follows their events")

    return act(request, f.ReasonForm(request.POST), hide, back=reverse("staff:player", args=[season.slug, player_id]))


@require_POST
@staff_required("revocation_approve")
def player_restore_action(request: HttpRequest, slug: str, player_id: str) -> HttpResponse:
    season = get_object_or_404(Season, slug=slug)

    def restore(data: dict[str, Any]) -> str:
        score = player_restore(season=season, player_id=player_id, actor=staff_actor(request.user),
                               reason=data["reason"])
        return f"{player_id} is restored: the next version shows their current score ({score.score:,}) on every board"

    return act(request, f.ReasonForm(request.POST), restore,
               back=reverse("staff:player", args=[season.slug, player_id]))
