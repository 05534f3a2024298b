"""Celery tasks: thin, idempotent, loading by id. Overlap is safe: the epoch holds a fenced lease."""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from celery import current_app, group, shared_task
from django.conf import settings
from kombu.exceptions import OperationalError

from leaderboard.core.lifecycle import MATERIALIZED_STATES
from leaderboard.history.services import snapshots_due_take
from leaderboard.metrics.samples import metrics_seasons_sample
from leaderboard.profiles import names_recover
from leaderboard.recovery.rebuild import rebuild_jobs_resend_due, rebuild_run, season_epoch_advance
from leaderboard.recovery.reconcile import reconciliation_run
from leaderboard.views.parts import PartSpec, part_run
from leaderboard.views.rankview import FenceLost
from seasons.models import Season

log = logging.getLogger(__name__)


def broker_send(what: str, send: Callable[[], object]) -> bool:
    """Run `send` (an apply_async or a delay) and say whether the broker took it.

    A broker that refuses, or hangs until the timeouts of BROKER_TIMEOUT_SECONDS (at most
    BROKER_ENQUEUE_BOUND_SECONDS), is logged as a warning and answered False instead of
    raising: whoever enqueues has its own way on without it (the epoch's coordinator runs
    the parts nobody claimed, a rebuild job stays queued and rebuild_jobs_resend sends it
    again), so a hung broker never makes a 500 or fails an epoch. Any other error raises.
    """
    try:
        send()
    except Exception as exc:
        if not _broker_error(exc):
            raise
        log.warning("%s not sent: the Celery broker did not take it (%s: %s)", what, exc.__class__.__name__, exc)
        return False
    return True


def _broker_error(exc: BaseException) -> bool:
    """kombu's OperationalError (what its retries end in, and a full producer pool), or a
    connection or channel error of the broker's transport (redis-py's, py-amqp's, socket
    errors) that reached the caller as it is. Eager tasks run here: their errors are theirs."""
    app = current_app
    if app.conf.task_always_eager:
        return False
    if isinstance(exc, OperationalError):
        return True
    connection = app.connection_for_write()
    try:
        return isinstance(exc, (*connection.connection_errors, *connection.channel_errors))
    finally:
        connection.release()


@shared_task(ignore_result=True)
def epochs_dispatch() -> int:
    """Every EPOCH_SECONDS (beat): one epoch task per season that can still change. A
    broker that stops taking them ends this dispatch (the next one, a tick later, tries
    again) rather than waiting out its timeouts once per season."""
    season_ids = list(Season.objects.filter(state__in=MATERIALIZED_STATES).values_list("pk", flat=True))
    expires = max(settings.EPOCH_SECONDS * 2, 1.0)
    for season_id in season_ids:
        if not broker_send(f"season {season_id}'s epoch",
                           partial(season_epoch.apply_async, args=[season_id], expires=expires)):
            break
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


def epoch_parts_enqueue(specs: list[dict[str, Any]], **_: object) -> bool:
    """Receiver of views.signals.epoch_parts_wanted: the parts go to the Celery workers as one
    group (each its own message: every free worker takes one), to be run before the
    coordinator stops waiting for them. A broker that does not take them costs the epoch
    at most BROKER_ENQUEUE_BOUND_SECONDS: then nobody claims them, and the coordinator runs
    them itself after EPOCH_PART_CLAIM_SECONDS (views.parts._parts_wait)."""
    epoch = specs[0].get("epoch") if specs else None
    return broker_send(f"the {len(specs)} parts of epoch {epoch}", lambda: group(
        season_epoch_part.s(spec) for spec in specs).apply_async(expires=settings.EPOCH_PART_TIMEOUT_SECONDS))


@shared_task(ignore_result=True)
def reconciliations_dispatch() -> int:
    season_ids = list(Season.objects.filter(published_version__gt=0).values_list("pk", flat=True))
    for season_id in season_ids:
        if not broker_send(f"season {season_id}'s reconciliation",
                           partial(season_reconcile.apply_async, args=[season_id], expires=settings.RECONCILE_SECONDS)):
            break
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


def rebuild_job_enqueue(job_id: int, **_: object) -> bool:
    """Receiver of recovery.rebuild.rebuild_job_queued: the job runs on a worker. A broker
    that does not take it leaves the job queued (the staff console's request, the command,
    the epoch that asked for a recovery go on), and rebuild_jobs_resend sends it again
    once the broker answers."""
    return broker_send(f"rebuild job {job_id} (it stays queued and is sent again)",
                       lambda: rebuild_run_task.delay(job_id))


@shared_task(ignore_result=True)
def rebuild_jobs_resend() -> int:
    """Every REBUILD_RESEND_SECONDS (beat): the queued rebuild jobs no worker took within as
    long, sent again (recovery.rebuild.rebuild_jobs_resend_due): those whose first send the
    broker did not take. Stops at the first the broker refuses: that one and the rest are
    due again a period later."""
    due = rebuild_jobs_resend_due(idle_seconds=settings.REBUILD_RESEND_SECONDS)
    sent = 0
    for job_id in due:
        if not broker_send(f"rebuild job {job_id}, again", partial(rebuild_run_task.delay, job_id)):
            break
        log.info("rebuild job %s: still queued after %g s, sent to the workers again", job_id,
                 settings.REBUILD_RESEND_SECONDS)
        sent += 1
    return sent


@shared_task(ignore_result=True)
def metrics_sample() -> int:
    """Every METRICS_SAMPLE_SECONDS (beat): one health sample per live season; a repeat of a tick writes nothing."""
    return metrics_seasons_sample()


@shared_task(ignore_result=True)
def names_recover_task() -> int | None:
    """Every NAMES_CHECK_SECONDS (beat): refill the players' names in Redis when it lost them."""
    return names_recover()


@shared_task(ignore_result=True)
def snapshots_take() -> int | None:
    """Every SNAPSHOT_CHECK_SECONDS (beat): each accepting season's snapshots of the full hours
    it does not have yet; a second tick in the same hour finds them taken."""
    return snapshots_due_take()
