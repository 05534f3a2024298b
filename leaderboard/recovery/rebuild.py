"""Shadow builds of a season's views from the ledger: rebuilds, recovery, bucket-layout splits.

A shadow copy is filled from the current-scores table at a recorded watermark (with
persisted progress), caught up with the change stream to exactly the live version's
watermark, and compared with the live version on each board (the global one, and in a
season with regions each region's): player count, per-bucket counts and checksums, top
100, sampled ranks and neighbour windows. Only when every check passes is a manifest
naming the shadow (and its regional boards) published; otherwise the old version keeps
serving and the differences are reported. After a flush there is no live version to
compare with, so a recovery is reconciled against the ledger instead, board by board.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import redis
from django.conf import settings
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models import Q
from django.dispatch import Signal
from django.utils import timezone

from audit.services import SYSTEM, Actor, audit_log
from leaderboard.core.buckets import BucketLayout, LayoutError
from leaderboard.core.checksum import MODULUS
from leaderboard.core.errors import DomainError
from leaderboard.core.manifest import Manifest
from leaderboard.core.partitions import Watermark
from leaderboard.core.reconciliation import (
    Report,
    board_check,
    board_sample,
    first_mismatch,
    stratified_positions,
    version_boards,
)
from leaderboard.core.season_options import TIE_BREAK_FIRST_REACHED
from leaderboard.core.splits import SplitProposal, split_points_valid, split_recommendations
from leaderboard.core.tiebreak import first_reached_problem, value_score
from leaderboard.ingest.selectors import score_change_heads_after, stream_changes_between, stream_committed_watermark
from leaderboard.ledger_reads import ledger_querysets_each
from leaderboard.models import ACTIVE_REBUILD_STATUSES, RebuildJob, ScoreChange
from leaderboard.recovery.reconcile import recovery_reconcile, version_reconcile
from leaderboard.redis_client import redis_get
from leaderboard.redis_errors import REDIS_OUTAGES
from leaderboard.views import build, rankview
from leaderboard.views.epoch import (
    EpochResult,
    changed_players,
    copy_manifest,
    copy_side_apply,
    manifest_record,
    season_epoch_run,
    season_epoch_run_locked,
    season_lease_acquire,
)
from leaderboard.views.invariants import IndexSizes, index_sizes, sampled_reads
from leaderboard.views.rankview.reads import version_holds
from leaderboard.views.rankview.shared import window_call, window_values
from leaderboard.views.season_index import EpochError, replicas_wait, season_keys
from seasons.models import Season

log = logging.getLogger(__name__)

# Sent with job_id once a started shadow build's row commits: the Celery tasks run it
# (connected in LeaderboardConfig.ready), so that this module never imports the tasks
# that import it.
rebuild_job_queued = Signal()

LEASE_WAIT_SECONDS = 30.0
LEASE_KEEP_MAX_SECONDS = 3600.0  # a hung comparison gives the season back after this long
# How long a failed job tries to drop its shadow copies while Redis does not answer: a
# Redis Cluster failover (cluster-node-timeout, 15 s by default, and an election) and more.
SHADOW_DROP_RETRY_SECONDS = 60.0
# The statuses in which a process works on the job and keeps its heartbeat moving.
WORKED_STATUSES = (*ACTIVE_REBUILD_STATUSES, RebuildJob.Status.PUBLISHING)


class RebuildError(DomainError):
    code = "rebuild_refused"


def season_rebuild_start(
    *, season: Season, actor: Actor, kind: str = RebuildJob.Kind.REBUILD, layout: BucketLayout | None = None,
    reason: str = "", enqueue: bool = True,
) -> RebuildJob:
    """Claim the season's one shadow-build slot and queue the work (Celery, after commit).

    A job of the season whose worker is gone (no heartbeat for REBUILD_STALE_SECONDS) is
    failed first, so a killed builder never blocks the next recovery.
    """
    layout = layout or _live_layout(season)
    if season.tie_break == TIE_BREAK_FIRST_REACHED and (problem := first_reached_problem(
            layout=layout, starts_at=season.starts_at, cutoff=season.cutoff)):
        raise RebuildError(problem)  # its sort keys would not fit 53 bits (core.tiebreak)
    rebuild_jobs_fail_stale(season=season, actor=actor)
    try:
        with transaction.atomic():
            job = RebuildJob.objects.create(
                season=season, kind=kind, layout=layout.as_dict(), requested_by_label=actor.label, reason=reason,
                heartbeat_at=timezone.now(),
            )
            action = {"rebuild": "views.rebuild.requested", "split": "views.split.proposed",
                      "recovery": "views.recovery.started"}[kind]
            audit_log(actor=actor, action=action, target_type="rebuild_job", target_id=str(job.pk),
                      season_slug=season.slug, after={"kind": kind, "layout": layout.as_dict()}, reason=reason)
            if enqueue:
                transaction.on_commit(lambda: rebuild_job_queued.send(sender=None, job_id=job.pk))
    except IntegrityError:
        raise RebuildError(f"a shadow build is already running for {season.slug}") from None
    return job


def _live_layout(season: Season) -> BucketLayout:
    r = redis_get()
    keys = season_keys(season)
    version = rankview.pointer_get(r, keys)
    manifest = rankview.manifest_get(r, keys, version) if version else None
    return manifest.layout if manifest is not None else season.bucket_layout


def _second(job: RebuildJob) -> str:
    return f"{job.copy}b"


class _JobProgress:
    """Persists progress every ~second: the console polls the row, the terminal gets a callback."""

    def __init__(self, job: RebuildJob, on_progress: Callable[[RebuildJob], None] | None):
        self.job = job
        self.on_progress = on_progress
        self.started = time.monotonic()
        self.saved = 0.0

    def start(self, total: int) -> None:
        self.job.total = total
        self.job.done = 0
        self._save(force=True)

    def advance(self, done: int) -> None:
        self.job.done = done
        elapsed = max(time.monotonic() - self.started, 1e-6)
        self.job.rate = done / elapsed
        remaining = max(self.job.total - done, 0)
        self.job.eta_seconds = remaining / self.job.rate if self.job.rate else None
        self._save(force=done >= self.job.total)

    def _save(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.saved >= 1.0:
            RebuildJob.objects.filter(pk=self.job.pk).update(
                done=self.job.done, total=self.job.total, rate=self.job.rate, eta_seconds=self.job.eta_seconds
            )
            self.saved = now
        if self.on_progress is not None:
            self.on_progress(self.job)


def rebuild_run(*, job_id: int, on_progress: Callable[[RebuildJob], None] | None = None) -> RebuildJob:
    """Run a queued job to its end. Idempotent: a job already claimed by someone else is left alone."""
    now = timezone.now()
    claimed = RebuildJob.objects.filter(pk=job_id, status=RebuildJob.Status.QUEUED).update(
        status=RebuildJob.Status.BUILDING, started_at=now, heartbeat_at=now
    )
    job = RebuildJob.objects.select_related("season").get(pk=job_id)
    if not claimed:
        return job
    try:
        with _Heartbeat(job.pk):
            return _run(job=job, on_progress=on_progress)
    except Exception as exc:
        log.exception("shadow build %s failed", job.pk)
        _finish(job, RebuildJob.Status.FAILED, error=f"{exc.__class__.__name__}: {exc}")
        _drop_shadow_retried(job)
        raise


def _run(*, job: RebuildJob, on_progress: Callable[[RebuildJob], None] | None) -> RebuildJob:
    season = job.season
    r = redis_get()
    keys = season_keys(season)
    layout = BucketLayout.from_dict(job.layout)
    job.copy = f"r{job.pk}"
    RebuildJob.objects.filter(pk=job.pk).update(copy=job.copy)

    # The long part holds no season lease: epochs keep publishing the live version
    # meanwhile. Only this job writes its shadows (it claimed the row), so they are
    # unfenced. The new index is built here, off the lease, with both copies as its two
    # sides: one set of buckets and one lookup, written once from one read of the
    # current scores.
    copies = [job.copy, _second(job)]
    shadow = build.season_copies_build(season=season, copies=copies, layout=layout, r=r, token=None,
                                 progress=_JobProgress(job, on_progress))[0]
    txid, ident, vector = shadow.watermark.columns()
    RebuildJob.objects.filter(pk=job.pk).update(
        status=RebuildJob.Status.COMPARING, watermark_txid=txid, watermark_id=ident, watermark_vector=vector
    )
    job.status = RebuildJob.Status.COMPARING
    if on_progress is not None:
        on_progress(job)
    return _compare_and_maybe_publish(job=job, r=r, keys=keys, publish=job.kind != RebuildJob.Kind.SPLIT, built=True)


def _claim(job: RebuildJob, *, to: str, actor: Actor, action: str, reason: str) -> RebuildJob:
    """Move a READY job to `to` in one conditional UPDATE, with its audit row: of two
    approvers (or a double click, or a publish and a discard) exactly one gets the job,
    the others are refused with the status they found."""
    now = timezone.now()
    with transaction.atomic():
        fields: dict[str, object] = {"status": to, "heartbeat_at": now}
        if to == RebuildJob.Status.DISCARDED:
            fields["finished_at"] = now
        if not RebuildJob.objects.filter(pk=job.pk, status=RebuildJob.Status.READY).update(**fields):
            found = RebuildJob.objects.filter(pk=job.pk).values_list("status", flat=True).first()
            raise RebuildError(f"job {job.pk} is {found}, only a ready shadow can be published or discarded")
        audit_log(actor=actor, action=action, target_type="rebuild_job", target_id=str(job.pk),
                  season_slug=job.season.slug, reason=reason)
    return RebuildJob.objects.select_related("season").get(pk=job.pk)


def rebuild_publish(*, job: RebuildJob, actor: Actor, reason: str = "") -> RebuildJob:
    """Publish a READY split: catch the shadow up again, compare again, then swap.

    The job is claimed first (READY -> PUBLISHING); a publication that stops short of the
    swap (the lease stayed busy, Redis failed) gives it back as READY, shadow kept.
    """
    job = _claim(job, to=RebuildJob.Status.PUBLISHING, actor=actor, action="views.split.publish_requested",
                 reason=reason)
    try:
        with _Heartbeat(job.pk):
            return _compare_and_maybe_publish(job=job, r=redis_get(), keys=season_keys(job.season), publish=True,
                                              built=False)
    except Exception:
        _publication_abandoned(job)
        raise


def _publication_abandoned(job: RebuildJob) -> str:
    """The status of a PUBLISHING job whose publisher stopped (an error, or its worker died):
    PUBLISHED when its shadow is the live copy already, else READY again."""
    live = job.copy in rankview.copies_get(redis_get(), season_keys(job.season))
    status = RebuildJob.Status.PUBLISHED if live else RebuildJob.Status.READY
    RebuildJob.objects.filter(pk=job.pk, status=RebuildJob.Status.PUBLISHING).update(
        status=status, finished_at=timezone.now() if live else None)
    return status


def rebuild_discard(*, job: RebuildJob, actor: Actor, reason: str = "") -> RebuildJob:
    job = _claim(job, to=RebuildJob.Status.DISCARDED, actor=actor, action="views.split.discarded", reason=reason)
    _drop_shadow(job)
    return job


class _Heartbeat:
    """Moves the job's heartbeat_at every few seconds from a daemon thread while this
    process works on it. A killed worker stops it: once it is older than
    REBUILD_STALE_SECONDS, rebuild_jobs_fail_stale fails the job, so the season's next
    recovery can start (the job row is the season's claim)."""

    def __init__(self, job_id: int):
        self.job_id = job_id
        self.interval = min(max(settings.REBUILD_STALE_SECONDS / 4, 0.1), 10.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"rebuild-heartbeat-{job_id}", daemon=True)

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                try:
                    RebuildJob.objects.filter(pk=self.job_id, status__in=WORKED_STATUSES).update(
                        heartbeat_at=timezone.now())
                except DatabaseError:
                    log.warning("rebuild %s: heartbeat not recorded", self.job_id, exc_info=True)
        finally:
            connection.close()


def rebuild_jobs_fail_stale(*, season: Season | None, actor: Actor, stale_seconds: float | None = None
                            ) -> list[RebuildJob]:
    """Fail the jobs (of `season`, or every season) whose worker stopped beating.

    A job still queued, building or comparing after REBUILD_STALE_SECONDS without a
    heartbeat is failed and its shadows dropped; a publishing one goes back to READY (or
    PUBLISHED if its swap happened). Each is a conditional UPDATE on the heartbeat it was
    found with, so a worker that beats meanwhile keeps its job; each writes an audit row.
    """
    stale_seconds = settings.REBUILD_STALE_SECONDS if stale_seconds is None else stale_seconds
    now = timezone.now()
    cutoff = now - timedelta(seconds=stale_seconds)
    found = RebuildJob.objects.select_related("season").filter(status__in=WORKED_STATUSES).filter(
        Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True, created_at__lt=cutoff))
    if season is not None:
        found = found.filter(season=season)
    failed = []
    for job in found:
        beat = job.heartbeat_at or job.created_at
        error = f"stale: no heartbeat for {(now - beat).total_seconds():.0f} s (its worker is gone)"
        with transaction.atomic():
            claim = RebuildJob.objects.filter(pk=job.pk, status=job.status, heartbeat_at=job.heartbeat_at)
            if job.status == RebuildJob.Status.PUBLISHING:
                if not claim.update(heartbeat_at=now):
                    continue
                status = _publication_abandoned(job)
            else:
                status = RebuildJob.Status.FAILED
                if not claim.update(status=status, finished_at=now, error=error):
                    continue
            audit_log(actor=actor, action="views.rebuild.stale_failed", target_type="rebuild_job",
                      target_id=str(job.pk), season_slug=job.season.slug,
                      before={"status": job.status, "heartbeat_at": beat.isoformat()}, after={"status": status},
                      reason=error)
        if status == RebuildJob.Status.FAILED:
            _drop_shadow(job)
        job.status, job.error = status, error
        failed.append(job)
    return failed


def rebuild_jobs_resend_due(*, idle_seconds: float) -> list[int]:
    """The queued jobs no worker has taken `idle_seconds` after they were queued or last
    sent, to be sent to the workers again: their message never reached the broker (one
    that did not answer: tasks.broker_send gave up and the job stayed queued), or it waits
    behind busy workers, where a second one is harmless (rebuild_run claims a job with a
    compare-and-swap on QUEUED: a second delivery returns at once).

    Each one's heartbeat moves to now, conditionally on the heartbeat it was found with,
    as rebuild_jobs_fail_stale's update is: two dispatchers send a job once, and a job is
    either sent again or failed as stale, never both. A job whose sends keep landing is
    never stale; one queued while the broker hung is sent once the broker answers (the
    dispatcher runs on a worker, so only then), unless something failed it first: after
    REBUILD_STALE_SECONDS, the season's next rebuild or recovery, or `rebuild_views
    --fail-stale`.
    """
    cutoff = timezone.now() - timedelta(seconds=idle_seconds)
    found = RebuildJob.objects.filter(status=RebuildJob.Status.QUEUED).filter(
        Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True, created_at__lt=cutoff)
    ).values_list("pk", "heartbeat_at")
    due = []
    for job_id, beat in found:
        if RebuildJob.objects.filter(pk=job_id, status=RebuildJob.Status.QUEUED, heartbeat_at=beat).update(
                heartbeat_at=timezone.now()):
            due.append(job_id)
    return due


def _compare_and_maybe_publish(*, job: RebuildJob, r: redis.Redis, keys: rankview.Keys, publish: bool,
                               built: bool) -> RebuildJob:
    """`built`: this process filled the shadow just before (`_run`), so with nothing live to
    compare with, its build's own checks stand in for a full read of the season
    (reconcile.recovery_reconcile); a split published later is reconciled in full."""
    season = job.season
    deadline = time.monotonic() + LEASE_WAIT_SECONDS
    ttl_ms = int(settings.EPOCH_LEASE_SECONDS * 1000)
    token = None
    while token is None:
        rankview.lease_wanted_mark(r, keys, ttl_ms=1000)
        token = season_lease_acquire(season=season, r=r, ttl_ms=ttl_ms)
        if token is None:
            if time.monotonic() > deadline:
                raise RebuildError("the season's coordinator lease stayed busy")
            time.sleep(0.05)
    rankview.lease_wanted_clear(r, keys)
    # The comparison, and after a flush the reconciliation against the ledger (a few
    # seconds per million players; a full one ~30 s), can outlast the lease's TTL.
    keeper = rankview.LeaseKeeper(r, keys, token, ttl_ms=ttl_ms, max_seconds=LEASE_KEEP_MAX_SECONDS).start()
    version: int | None = None
    try:
        # Re-checked under the lease: the job may have been failed as stale, or published
        # by someone else, while this process waited for it.
        if not RebuildJob.objects.filter(pk=job.pk, status=job.status).exists():
            raise RebuildError(f"job {job.pk} is no longer {job.status}")
        shadow = rankview.copy_meta_load(r, keys, job.copy)
        if shadow is None:
            raise RebuildError(f"shadow copy {job.copy} is gone")
        live_version = rankview.pointer_get(r, keys)
        live = rankview.manifest_get(r, keys, live_version) if live_version else None
        if live is not None and not version_holds(r, keys, live):
            live = None  # its copy is gone or lost writes: nothing to compare with
        if live is not None and _changes_after(season, live.watermark):
            # Publish a live version of everything committed first (we hold the lease), and
            # catch the shadow up to the same point: the build scanned the scores in pages
            # after taking its watermark, so it may hold scores newer than the watermark,
            # or than an older live version; at the head both show one state.
            season_epoch_run_locked(season=season, r=r, keys=keys, token=token, keeper=keeper)
            live_version = rankview.pointer_get(r, keys)
            live = rankview.manifest_get(r, keys, live_version or 0)
            if live is None or stream_changes_between(season_id=season.pk, after=live.watermark,
                                                      upto=shadow.watermark):
                raise RebuildError("the live version could not be brought up to the shadow's watermark")
        # Catch the shadow up to the live version; a shadow whose snapshot cursor is past
        # the live watermark with no change in between already shows the same state.
        upto = None if live is None else live.watermark.merge(shadow.watermark)
        season.refresh_from_db(fields=["published_version"])
        version = max(live_version or 0, season.published_version) + 1
        shadow, replayed = _catch_up(r=r, keys=keys, token=token, season=season, shadow=shadow, upto=upto,
                                     version=version)
        candidate = copy_manifest(r=r, keys=keys, season=season, meta=shadow, version=version,
                                  as_of=datetime.now(UTC))
        if live is not None:
            report = shadow_compare(r=r, keys=keys, live=live, shadow=candidate, sample=settings.REBUILD_SAMPLE_SIZE,
                                    aligned=not _changes_between(season, live.watermark, candidate.watermark))
        else:
            rankview.manifest_store(r, keys, candidate, token=token)
            if built:
                report = recovery_reconcile(r=r, keys=keys, season_id=season.pk, version=version, replayed=replayed,
                                            sample=settings.REBUILD_SAMPLE_SIZE, season=season)
            else:
                report = version_reconcile(r=r, keys=keys, season_id=season.pk, version=version,
                                           sample=settings.REBUILD_SAMPLE_SIZE, season=season)
        RebuildJob.objects.filter(pk=job.pk).update(compared_version=live.version if live else None,
                                                    report=report.as_dict())
        job.report = report.as_dict()
        if not report.ok:
            _finish(job, RebuildJob.Status.FAILED,
                    error="shadow comparison failed: " + ", ".join(f.check for f in report.failures()))
            _drop_shadow(job)
            return job
        if not publish:
            _finish(job, RebuildJob.Status.READY)
            return job
        rankview.manifest_store(r, keys, candidate, token=token)
        named = [shadow.copy, _second(job)]
        retired = [name for name in rankview.copies_get(r, keys) if name not in named]
        # The pointer and the copy names change in one step: a coordinator dying right
        # after it leaves the shadow live and named, never dropped as a failed build's.
        rankview.pointer_publish(r, keys, token=token, expected=live_version, version=version, copies=named)
        # No manifest names these copies any more; readers of an older version fail their
        # generation check and retry on the new one (or get 410 when pinned).
        rankview.copies_drop(r, keys, [meta for name in retired
                                       if (meta := rankview.copy_meta_load(r, keys, name)) is not None], retire=True)
        manifest_record(season=season, manifest=candidate, changed=0, epoch_ms=0.0)
        if job.kind == RebuildJob.Kind.SPLIT:
            Season.objects.filter(pk=season.pk).update(layout=shadow.layout.as_dict())
        job.published_version = version
        RebuildJob.objects.filter(pk=job.pk).update(published_version=version)
        _finish(job, RebuildJob.Status.PUBLISHED)
        with transaction.atomic():
            audit_log(actor=Actor(kind="system", id="", label="rebuild"), action="views.rebuild.published",
                      target_type="rebuild_job", target_id=str(job.pk), season_slug=season.slug,
                      before={"version": live_version, "copy": live.copy if live else None},
                      after={"version": version, "copy": shadow.copy, "layout": shadow.layout.as_dict()})
        return job
    finally:
        keeper.stop()
        if version is not None and rankview.pointer_get(r, keys) != version:
            # The candidate was not published, and its number will be used again: a
            # recovery's reconciliation read (and cached) its manifest in this process.
            rankview.manifest_cache_forget(keys, version)
        rankview.lease_release(r, keys, token)


def _catch_up(*, r: redis.Redis, keys: rankview.Keys, token: int, season: Season, shadow: rankview.CopyMeta,
              upto: Watermark | None, version: int) -> tuple[rankview.CopyMeta, set[str]]:
    """Apply the changes after the shadow's watermark, up to `upto` (None: everything
    committed), on every board, in parts as an epoch does: a region move takes the player
    from one regional board to the other. Returns the finished shadow and the players it
    replayed."""
    upto = (upto or stream_committed_watermark(season_id=season.pk)).merge(shadow.watermark)
    replayed = changed_players(season=season, after=shadow.watermark, upto=upto)
    if replayed:
        copy_side_apply(season=season, r=r, keys=keys, token=token, target=shadow, upto=upto, current=None)
    problems = rankview.copy_verify_counts(r, keys, shadow, range(shadow.layout.size), lookups=True)
    if problems:
        raise EpochError(f"shadow {shadow.copy} failed verification: {'; '.join(problems)}")
    return (rankview.copy_finish(r, keys, token, shadow, watermark=upto, version=version, **replicas_wait()),
            replayed)


def _changes_after(season: Season, cursor: Watermark) -> bool:
    return bool(score_change_heads_after(season_id=season.pk, cursor=cursor, limit=1))


def _changes_between(season: Season, a: Watermark, b: Watermark) -> bool:
    """Whether the change stream holds anything between two watermarks (covered by one, not the other)."""
    return (stream_changes_between(season_id=season.pk, after=a, upto=b)
            or stream_changes_between(season_id=season.pk, after=b, upto=a))


def shadow_compare(*, r: redis.Redis, keys: rankview.Keys, live: Manifest, shadow: Manifest, sample: int,
                   aligned: bool) -> Report:
    """The shadow against the live version at the same watermark, board by board (the
    global one, then each region's); layouts may differ (a split).

    `aligned`: no change lies between the two watermarks, so both must show one state.
    """
    report = Report(version=live.version)
    report.add("same_watermark", aligned, f"live {live.watermark}, shadow {shadow.watermark}")
    if live.regions or shadow.regions:
        report.add("region_boards", sorted(live.regions) == sorted(shadow.regions),
                   f"live {sorted(live.regions)}, shadow {sorted(shadow.regions)}")
    # The shadow's index itself, not only its bookkeeping: reads locate positions with
    # the counts, so a stray or missing member would go unseen by the sampled windows
    # (a member in a bucket counted empty is never read at all) yet break the invariants.
    sizes = index_sizes(r, keys, shadow, lookups=True)
    reader = rankview.RankReader(r, keys, deadline=3600)
    for live_board in version_boards(live):
        shadow_board = shadow.board_of(live_board.board) if live_board.board else shadow
        if shadow_board is not None:
            _board_compare(reader=reader, live=live_board, shadow=shadow_board, sizes=sizes, report=report,
                           sample=board_sample(sample, board=live_board, regions=len(live.regions)))
    if not rankview.copy_holds(r, keys, live):
        report.add("live_copy", False, "the live copy moved during the comparison; compare again")
    return report


def _board_compare(*, reader: rankview.RankReader, live: Manifest, shadow: Manifest, sizes: IndexSizes, sample: int,
                   report: Report) -> None:
    """One board of the shadow against the same board of the live version."""
    board = live.board
    report.add(board_check("player_count", board), live.total == shadow.total,
               f"live {live.total}, shadow {shadow.total} (difference {shadow.total - live.total})")
    # Per live bucket: the shadow buckets inside its range must hold the same players
    # (count) with the same (player, score) pairs (the checksum is a sum, so it adds up).
    wrong = []
    for bucket in range(live.layout.size):
        low, high = live.layout.range_of(bucket)
        inside = [b for b in range(shadow.layout.size) if low <= shadow.layout.range_of(b)[0] <= high]
        count = sum(shadow.counts[b] for b in inside)
        checksum = sum(shadow.checksums[b] for b in inside) % MODULUS
        if count != live.counts[bucket] or checksum != live.checksums[bucket]:
            wrong.append(f"bucket {bucket} [{low}..{high}]: live {live.counts[bucket]}/{live.checksums[bucket]:016x}, "
                         f"shadow {count}/{checksum:016x}")
    report.add(board_check("bucket_counts_and_checksums", board), not wrong, "; ".join(wrong[:10]))
    index_wrong = sizes.bucket_problems(shadow)
    if not board:
        if sizes.lookup != shadow.total:
            index_wrong.append(f"lookup holds {sizes.lookup} players, counted {shadow.total}")
        if shadow.regions and (placed := sizes.placed_problem(shadow)):
            index_wrong.append(placed)
    report.add(board_check("shadow_index_counts", board), not index_wrong, "; ".join(index_wrong[:10]))
    report.add(board_check("top_100", board), live.top == shadow.top, first_mismatch(live.top, shadow.top))
    def compared_at(position: int) -> tuple[str, str]:
        """(the window's difference, the sampled player's) at one position ("" when equal)."""
        first = max(1, position - 10)
        live_window = reader.entries_at(live, first, 21)
        shadow_window = reader.entries_at(shadow, first, 21)
        differs = first_mismatch(live_window, shadow_window)
        window = f"window at {first}: {differs}" if live_window != shadow_window else ""
        me = next((e for e in live_window if e.position == position), None)
        if me is None:
            return window, ""
        # On a regional board the lookup path also reads the player's region shard.
        a = reader.locate(live, me.player_id)
        b = reader.locate(shadow, me.player_id)
        return window, f"{me.player_id}: live (score, position, rank) {a}, shadow {b}" if a != b else ""

    compared = sampled_reads(compared_at, stratified_positions(live.total, sample))
    window_wrong = [window for window, _ in compared if window]
    rank_wrong = [rank for _, rank in compared if rank]
    report.add(board_check("sampled_ranks", board), not rank_wrong, "; ".join(rank_wrong[:10]))
    report.add(board_check("neighbor_windows", board), not window_wrong, "; ".join(window_wrong[:10]))


def _finish(job: RebuildJob, status: str, error: str = "") -> None:
    job.status = status
    job.finished_at = timezone.now()
    job.error = error
    RebuildJob.objects.filter(pk=job.pk).update(status=status, finished_at=job.finished_at, error=error)


def _drop_shadow_retried(job: RebuildJob) -> None:
    """A failed job's `_drop_shadow`, tried again while Redis does not answer: what failed
    the build is often what fails the drop (a Redis Cluster master's failover leaves its
    slots unserved for about cluster-node-timeout and an election), and copies left behind
    would stay in Redis for ever. Given up after SHADOW_DROP_RETRY_SECONDS (logged)."""
    deadline = time.monotonic() + SHADOW_DROP_RETRY_SECONDS
    while True:
        try:
            _drop_shadow(job)
            return
        except REDIS_OUTAGES:
            if time.monotonic() > deadline:
                log.warning("shadow build %s: its shadow copies %s and %s could not be dropped", job.pk, job.copy,
                            _second(job), exc_info=True)
                return
            time.sleep(0.5)


def _drop_shadow(job: RebuildJob) -> None:
    if not job.copy:
        return
    r = redis_get()
    keys = season_keys(job.season)
    live = rankview.copies_get(r, keys)
    if job.copy in live:
        return  # published: the season's copies now
    metas = [meta for name in (job.copy, _second(job)) if (meta := rankview.copy_meta_load(r, keys, name)) is not None]
    rankview.copies_drop(r, keys, metas, retire=True)


# ----------------------------------------------------------------------- hot buckets


def season_split_recommendations(*, season: Season, window_seconds: float = 600.0) -> list[SplitProposal]:
    """Split proposals from the live version's bucket sizes and the last minutes' change rates."""
    r = redis_get()
    keys = season_keys(season)
    version = rankview.pointer_get(r, keys)
    live = rankview.manifest_get(r, keys, version) if version else None
    if live is None:
        return []
    since = timezone.now() - timedelta(seconds=window_seconds)
    changes = [0] * live.layout.size
    recent = ScoreChange.objects.filter(season_id=season.pk, committed_at__gte=since).values_list("new_score",
                                                                                                 flat=True)
    left = 200_000
    for rows in ledger_querysets_each(season=season, queryset=recent):
        for score in rows[:left].iterator(chunk_size=20_000):
            changes[live.layout.bucket_of(live.kind.flipped(score))] += 1
            left -= 1
        if left <= 0:
            break
    parts = 4
    quantiles: dict[int, list[int]] = {}
    order: list[int] = []
    commands: list[tuple[Any, ...]] = []
    for bucket, count in enumerate(live.counts):
        if count >= parts:
            key = keys.bucket(live.index, live.layout.layout_id, bucket, groups=live.groups)
            hidden = keys.hidden(live.index, live.side, live.layout.layout_id, bucket, groups=live.groups)
            for k in range(1, parts):
                commands.append(window_call(bucket=key, hidden=hidden, start=count * k // parts, count=1))
                order.append(bucket)
    replies = rankview.round_trip(r, commands) if commands else []
    for bucket, reply in zip(order, replies, strict=True):
        if reply:
            # Boundaries go just above a quantile score, so its ties stay on one side.
            score = value_score(window_values(reply, layout=live.layout, ties=live.ties, bucket=bucket)[0][1])
            quantiles.setdefault(bucket, []).append(score + 1)
    return split_recommendations(layout=live.layout, counts=live.counts, changes=changes,
                                 quantile_scores=quantiles, parts=parts)


def season_split_propose(*, season: Season, actor: Actor, split_points: list[object], reason: str = "") -> RebuildJob:
    """Build a shadow with narrower buckets at `split_points`; a person publishes it after its comparison."""
    live_layout = _live_layout(season)
    try:
        points = split_points_valid(live_layout, split_points)
        layout = live_layout.split(at=points, layout_id=live_layout.layout_id + 1)
    except LayoutError as exc:
        raise RebuildError(str(exc)) from exc
    return season_rebuild_start(season=season, actor=actor, kind=RebuildJob.Kind.SPLIT, layout=layout,
                                reason=reason or f"split at {', '.join(map(str, points))}")


def season_epoch_advance(*, season: Season, r: redis.Redis | None = None, catch_up: bool | None = None) -> EpochResult:
    """An epoch (views.epoch.season_epoch_run), then the shadow build it asked for:
    a recovery of lost views, or a rebuild of a copy that outgrew its lookup shards. The
    epoch tasks call this; the job row is the claim, so a build is started once whoever asks."""
    result = season_epoch_run(season=season, r=r, catch_up=catch_up)
    wanted = result.rebuild_wanted
    if wanted is None:
        return result
    try:
        job: RebuildJob | None = season_rebuild_start(season=season, actor=SYSTEM, kind=wanted.kind,
                                                      layout=wanted.layout, reason=wanted.reason)
    except RebuildError:
        job = None
    if result.status == "lost":
        detail = "views lost; a rebuild is in flight" if job is None else f"views lost; recovery job {job.pk} started"
        return dataclasses.replace(result, detail=detail)
    if job is not None:
        log.info("season %s: rebuild %s started: %s", season.slug, job.pk, wanted.reason)
    return result
