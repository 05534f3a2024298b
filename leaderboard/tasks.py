"""Celery tasks: thin, idempotent, loading by id. Overlap is safe: the epoch holds a fenced lease."""

from __future__ import annotations

import logging
from typing import Any

from celery import group, shared_task
from django.conf import settings

from leaderboard.core.lifecycle import MATERIALIZED_STATES
from leaderboard.metrics.samples import metrics_seasons_sample
from leaderboard.recovery.rebuild import rebuild_run, season_epoch_advance
from leaderboard.recovery.reconcile import reconciliation_run
from leaderboard.views.parts import PartSpec, part_run
from leaderboard.views.rankview import FenceLost
from seasons.models import Season

log = logging.getLogger(__name__)


@shared_task(ignore_result=True)
def epochs_dispatch() -> int:
    """Every EPOCH_SECONDS (beat): one epoch task per season that can still change."""
    season_ids = list(Season.objects.filter(state__in=MATERIALIZED_STATES).values_list("pk", flat=True))
    for season_id in season_ids:
        season_epoch.apply_async(args=[season_id], expires=max(settings.EPOCH_SECONDS * 2, 1.0))
    return len(season_ids)


@shared_task(ignore_result=True)
def season_epoch(season_id: int) -> str:
    season = Season.objects.filter(pk=season_id).first()
    if season is None:
        return "missing"
    try:
        result = season_epoch_advance(season=season)
    except FenceLost as lost:
        # Another coordinator holds the season, or this one's lease expired: nothing was
        # published, and the next lease holder goes on from what is left (a copy cut short
        # reads as broken and is built again).
        log.warning("season %s: the epoch lost the season's lease and published nothing: %s", season.slug, lost)
        return "lease lost"
    if result.status == "published":
        log.info("season %s: published v%s (%s players changed, %.1f ms; older copy caught up in %s ms)",
                 season.slug, result.version, result.changed_players, result.duration_ms,
                 "-" if result.catch_up_ms is None else f"{result.catch_up_ms:.1f}")
    return result.status


# acks_late (the settings') with reject_on_worker_lost: a part whose worker was killed is
# delivered again, and finds its report there (or its epoch gone) when it already ran.
@shared_task(ignore_result=True, reject_on_worker_lost=True)
def season_epoch_part(spec: dict[str, Any]) -> str:
    """One part of an epoch (views.parts): claimed, applied and reported, or left to the
    runner that has it, or skipped when its epoch is gone."""
    try:
        report = part_run(PartSpec.from_json(spec))
    except FenceLost as lost:
        log.warning("epoch part %s/%s: the season moved to a newer coordinator; nothing more written: %s",
                    spec.get("epoch"), spec.get("part"), lost)
        return "fenced"
    return "skipped" if report is None else "done"


def epoch_parts_enqueue(specs: list[dict[str, Any]], **_: object) -> None:
    """Receiver of views.signals.epoch_parts_wanted: the parts go to the Celery workers as one
    group (each its own message: every free worker takes one), to be run before the
    coordinator stops waiting for them."""
    group(season_epoch_part.s(spec) for spec in specs).apply_async(expires=settings.EPOCH_PART_TIMEOUT_SECONDS)


@shared_task(ignore_result=True)
def reconciliations_dispatch() -> int:
    season_ids = list(Season.objects.filter(published_version__gt=0).values_list("pk", flat=True))
    for season_id in season_ids:
        season_reconcile.apply_async(args=[season_id], expires=settings.RECONCILE_SECONDS)
    return len(season_ids)


@shared_task(ignore_result=True)
def season_reconcile(season_id: int) -> bool | None:
    season = Season.objects.filter(pk=season_id).first()
    if season is None:
        return None
    return reconciliation_run(season=season).ok


@shared_task(ignore_result=True)
def rebuild_run_task(job_id: int) -> str:
    """Runs a claimed shadow build; a second delivery finds the job claimed and returns."""
    return rebuild_run(job_id=job_id).status


def rebuild_job_enqueue(job_id: int, **_: object) -> None:
    """Receiver of recovery.rebuild.rebuild_job_queued: the job runs on a worker."""
    rebuild_run_task.delay(job_id)


@shared_task(ignore_result=True)
def metrics_sample() -> int:
    """Every METRICS_SAMPLE_SECONDS (beat): one health sample per live season; a repeat of a tick writes nothing."""
    return metrics_seasons_sample()
