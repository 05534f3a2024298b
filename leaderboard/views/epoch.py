"""The epoch (docs/architecture.md, How versions are published): for one season, bring the
copy of the index that is not serving up to date with the change stream, verify it, and
publish it with a fenced pointer swap; then bring the other copy up to the new version.
A copy that cannot be brought up to date gets a new index from the build (views.build).
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import redis
from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q

from leaderboard.core.buckets import BucketLayout
from leaderboard.core.manifest import (
    LOOKUP_SHARD_OUTGROWN,
    Manifest,
    RegionBoard,
    lookup_shards_outgrown,
)
from leaderboard.core.partitions import Watermark
from leaderboard.core.tiebreak import instant_ms
from leaderboard.ingest import ledger_store
from leaderboard.ingest.selectors import (
    changes_after_q,
    changes_covered_q,
    stream_changes_between,
    stream_committed_watermark,
)
from leaderboard.ingest.services import season_version_range_plan
from leaderboard.ledger_reads import ledger_rows_list
from leaderboard.metrics.counters import metrics_epoch_observe
from leaderboard.models import ACTIVE_REBUILD_STATUSES, RebuildJob, ScoreChange
from leaderboard.models import Manifest as ManifestRow
from leaderboard.redis_client import redis_get
from leaderboard.redis_errors import REDIS_ERRORS
from leaderboard.views import build, rankview
from leaderboard.views.parts import PartsLost, RangeReport, parts_apply
from leaderboard.views.rankview.reads import version_holds
from leaderboard.views.season_index import EpochError, replicas_wait, season_keys, season_ties
from leaderboard.views.signals import version_published_on_commit
from seasons.models import Season

log = logging.getLogger(__name__)

COPIES = rankview.COPY_NAMES
STREAM_PAGE = 50_000
# A coordinator runs the epochs noted while it held the season back to back for at most
# this long, then leaves the note to the next tick's task (another worker may take it).
EPOCH_HOLD_SECONDS = 15.0
# Its lease is renewed while it works (rankview.LeaseKeeper); a hung one gives it back after this.
LEASE_KEEP_MAX_SECONDS = 3600.0
# The reason of the rebuild an epoch starts for a copy that outgrew its lookup shards; a
# failed one is not started again for this long (each is a full build of the season).
SHARDS_OUTGROWN_REASON = "lookup shards outgrown"
SHARDS_OUTGROWN_RETRY_SECONDS = 600.0

# txid, id, player, new score, version, old score; in a first_reached season also the new
# and old reached_at in ms since 1970 (selectors.score_change_reached_after); in a season
# with regions, last, the new and old region.
Change = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class EpochResult:
    status: str  # published | skipped | idle
    version: int | None = None
    changed_players: int = 0
    duration_ms: float = 0.0  # to the pointer swap
    detail: str = ""
    applied: int = 0  # players moved in the published copy before the swap
    parts: int = 0  # the parts that applied it (views.parts)
    parts_cpu_seconds: float = 0.0  # their CPU time, wherever they ran
    parts_seconds: float = 0.0  # from handing them out to their last report (in duration_ms)
    catch_up_ms: float | None = None  # the other copy brought up to this version, after its grace period
    # A shadow build the season needs (views lost, lookup shards outgrown). The epoch only
    # asks: the caller starts it (recovery.rebuild.season_epoch_advance), so that the views
    # never depend on the recovery that rebuilds them.
    rebuild_wanted: RebuildWanted | None = None


@dataclass(frozen=True, slots=True)
class RebuildWanted:
    kind: str  # a RebuildJob.Kind
    layout: BucketLayout
    reason: str


def season_lease_acquire(*, season: Season, r: redis.Redis, ttl_ms: int) -> int | None:
    """The season's coordinator lease under a fencing token issued by the database, or None
    while someone holds it. Tokens never go back, whatever Redis lost or restored."""
    keys = season_keys(season)
    token = ledger_store.fence_token_issue(season_id=season.pk)
    if rankview.lease_acquire(r, keys, token=token, ttl_ms=ttl_ms) is None:
        return None
    # Before anything is written or trusted: from here on no older coordinator writes into
    # any slot group of the season's copies (rankview.copy_groups_stamp), nor of a new
    # index one was building or the copies one replaced (recorded as retiring).
    try:
        copies = rankview.copies_get(r, keys)
        stamped: set[str] = set()
        for copy in [*copies, *rankview.copies_retiring(r, keys)]:
            meta = rankview.copy_meta_load(r, keys, copy)
            if meta is None and copy not in copies:
                continue
            # A copy without a meta is stamped in the index and groups its next build will
            # use: a build names its index after its first copy (views.build). Each
            # index once: both copies of one name it.
            index = meta.index if meta is not None else copies[0]
            if index in stamped:
                continue
            stamped.add(index)
            groups = meta.groups if meta is not None else settings.VIEW_SLOT_GROUPS
            rankview.copy_groups_stamp(r, keys, index, groups, token=token)
    except BaseException as error:
        # A lease kept by a failed stamp would block every epoch for a whole TTL (longer
        # for a renewed one). Released only while still ours (lease_release checks).
        try:
            rankview.lease_release(r, keys, token)
        except REDIS_ERRORS:
            log.warning("season %s: lease %s not released after a failed stamp", season.slug, token, exc_info=True)
        if isinstance(error, rankview.FenceLost):
            return None  # a newer coordinator stamped a group first: it holds the season
        raise
    return token


def season_epoch_run(*, season: Season, r: redis.Redis | None = None, catch_up: bool | None = None) -> EpochResult:
    """Epochs for one season while this caller holds its fenced lease (at most one coordinator).

    The lease is short (EPOCH_LEASE_SECONDS, 2 s by default) and renewed by a keeper
    thread while the coordinator works, so a killed coordinator is replaced about one
    lease after it died, while a long epoch (a copy rebuilt from the scores) keeps it.

    After publishing, the copy that stopped being current is brought up to the new
    version once its grace period is over (`catch_up`, default EPOCH_CATCH_UP), so the
    next epoch applies only the changes since this one. An epoch that comes due
    meanwhile finds the lease held and leaves a note; the holder then runs it at once
    instead of a whole period later, for at most EPOCH_HOLD_SECONDS.
    """
    r = r or redis_get()
    keys = season_keys(season)
    ttl_ms = int(settings.EPOCH_LEASE_SECONDS * 1000)
    due_ttl_ms = int(max(settings.EPOCH_SECONDS * 2, 1.0) * 1000)
    if rankview.lease_wanted(r, keys):
        # A rebuild waits for the lease to compare and publish: let it in; the note makes
        # the epoch after it run at once.
        rankview.epoch_due_mark(r, keys, ttl_ms=due_ttl_ms)
        return EpochResult(status="skipped", detail="a rebuild is waiting for the season")
    token = season_lease_acquire(season=season, r=r, ttl_ms=ttl_ms)
    if token is None:
        rankview.epoch_due_mark(r, keys, ttl_ms=due_ttl_ms)
        return EpochResult(status="skipped", detail="another coordinator holds the season")
    catch_up = settings.EPOCH_CATCH_UP if catch_up is None else catch_up
    started = time.monotonic()
    results: list[EpochResult] = []
    for attempt in (1, 2):
        keeper = rankview.LeaseKeeper(r, keys, token, ttl_ms=ttl_ms, max_seconds=LEASE_KEEP_MAX_SECONDS,
                                      stall_seconds=settings.EPOCH_STALL_SECONDS)
        try:
            keeper.start()
            return _epochs_held(season=season, r=r, keys=keys, token=token, keeper=keeper, catch_up=catch_up,
                                started=started, results=results)
        except PartsLost:
            # The lost part's runner may be paused, not dead, and write later under this
            # token: take the season again under a newer one, stamped into every slot group
            # before anything is written, and resume the side (once per call).
            if attempt == 2:
                raise
            log.warning("season %s: an epoch part was lost; resumed under a newer token", season.slug,
                        exc_info=True)
        finally:
            keeper.stop()
            rankview.lease_release(r, keys, token)
        retaken = season_lease_acquire(season=season, r=r, ttl_ms=ttl_ms)
        if retaken is None:
            rankview.epoch_due_mark(r, keys, ttl_ms=due_ttl_ms)
            break
        token = retaken
    return results[-1] if results else EpochResult(status="skipped", detail="another coordinator holds the season")


def _epochs_held(*, season: Season, r: redis.Redis, keys: rankview.Keys, token: int, keeper: rankview.LeaseKeeper,
                 catch_up: bool, started: float, results: list[EpochResult]) -> EpochResult:
    """Epochs under one token while one is due, each followed by its catch-up; the last
    publication (or the idle run) is appended to `results` and returned. PartsLost out of
    an epoch's apply; one out of a catch-up ends the run (the next holder's newer token
    fences the lost runner out before the next apply)."""
    while True:
        keeper.progress()
        run = _epoch(season=season, r=r, keys=keys, token=token, keeper=keeper)
        lost = False
        if catch_up and run.status == "published":
            try:
                run = replace(run, catch_up_ms=_catch_up_quietly(season=season, r=r, keys=keys, token=token,
                                                                 keeper=keeper))
            except PartsLost:
                log.warning("season %s: a catch-up part was lost; the next epoch resumes the copy under a newer "
                            "token", season.slug, exc_info=True)
                lost = True
        if not results or run.status != "idle":
            results.append(run)  # the last publication, not the idle run after it
        # Past the bound the note stays for the next tick's task to run; a waiting
        # rebuild gets the lease before the noted epoch.
        if (lost or time.monotonic() - started > EPOCH_HOLD_SECONDS or rankview.lease_wanted(r, keys)
                or not rankview.epoch_due_take(r, keys)):
            return results[-1]
        if keeper.lost:
            return results[-1]


# A catch-up that fails for these is left to the next epoch, which applies its changes.
_CATCH_UP_LEFT_FOR_LATER: tuple[type[Exception], ...] = (
    EpochError, rankview.FenceLost, rankview.CopyMismatch, rankview.ReplicasBehind, *REDIS_ERRORS)


def _catch_up_quietly(*, season: Season, r: redis.Redis, keys: rankview.Keys, token: int,
                      keeper: rankview.LeaseKeeper | None) -> float | None:
    # The version is already published: a failed catch-up only leaves the copy to the
    # next epoch (broken, or not acknowledged by the replicas: rebuilt; cut short: resumed
    # from its watermark).
    try:
        return season_idle_copy_catch_up(season=season, r=r, keys=keys, token=token, keeper=keeper)
    except PartsLost:
        raise
    except _CATCH_UP_LEFT_FOR_LATER:
        log.warning("season %s: idle copy not caught up; the next epoch applies its changes", season.slug,
                    exc_info=True)
        return None


def _grace_end(meta: rankview.CopyMeta) -> float:
    """When the copy's grace period is over (time.time()): readers of the version it last
    served may still be running until then."""
    return meta.released_at + settings.COPY_GRACE_SECONDS


def _grace_wait(meta: rankview.CopyMeta) -> None:
    wait = _grace_end(meta) - time.time()
    if wait > 0:
        time.sleep(min(wait, settings.COPY_GRACE_SECONDS))


def season_idle_copy_catch_up(*, season: Season, r: redis.Redis, keys: rankview.Keys, token: int,
                              keeper: rankview.LeaseKeeper | None = None) -> float | None:
    """Bring the copy that is not current up to the current version's watermark.

    Called by the lease holder right after a publication, off the publication path:
    with R = 2 copies each change must reach both, and doing the older copy's share
    here, once its grace period is over, halves what the next epoch applies before
    its pointer swap. The copy keeps its old version number (its generation moves on,
    so that version now reads as expired). Its parts read their rows at once and write
    them once the grace period is over.

    A crash leaves the copy "applying" at its old watermark, and the next epoch resumes
    it from there (copy_side_apply). With VIEW_REPLICAS_WAIT the copy is made ready
    only once the masters' replicas acknowledged its writes (else broken: the next epoch
    builds a new index). `season.final_version` is taken as the epoch refreshed it.
    Returns the milliseconds spent after the grace period, or None with nothing to do.
    """
    current_version = rankview.pointer_get(r, keys)
    current = rankview.manifest_get(r, keys, current_version) if current_version else None
    if current is None:
        return None
    idle_name = next((c for c in rankview.copies_get(r, keys) if c != current.copy), None)
    idle = rankview.copy_meta_load(r, keys, idle_name) if idle_name is not None else None
    if (idle is None or idle.state != rankview.STATE_READY or idle.index != current.index
            or idle.watermark >= current.watermark):
        return None
    if idle.version == season.final_version:
        # A correction after FINAL just replaced it as current: keep the FINAL version
        # readable until the next epoch needs this copy (corrections are rare by then).
        return None
    grace_end = _grace_end(idle)
    copy_side_apply(season=season, r=r, keys=keys, token=token, target=idle, upto=current.watermark,
                    current=current.watermark, not_before=grace_end, keeper=keeper)
    rankview.copy_finish(r, keys, token, idle, watermark=current.watermark, version=idle.version,
                         **replicas_wait())
    return max(0.0, time.time() - grace_end) * 1000


def copy_side_apply(*, season: Season, r: redis.Redis, keys: rankview.Keys, token: int | None,
                    target: rankview.CopyMeta, upto: Watermark, current: Watermark | None,
                    not_before: float = 0.0, keeper: rankview.LeaseKeeper | None = None,
                    parts: int | None = None) -> RangeReport:
    """Bring a copy's side from its watermark up to `upto` (views.parts: in parts, each
    reading its own partitions' rows), add up the counts and checksums the parts report
    into the copy meta and check the touched buckets against them. The copy stays
    "applying" at `upto`: the caller finishes it (copy_finish).

    A copy left part-way by an earlier apply (CopyMeta.applying_upto) first gets that
    range again, whose writes that landed then change nothing now; then the rest. A copy
    whose buckets disagree with the counts is marked broken (the next epoch builds a new
    index) and EpochError is raised. `current`: the serving version's watermark, what is
    new since it (the report's `fresh`)."""
    resumed = None
    if target.applying_upto is not None and target.applying_upto != target.watermark:
        resumed = _side_range(season=season, r=r, keys=keys, token=token, target=target,
                              upto=target.applying_upto, current=current, resume=True, not_before=not_before,
                              keeper=keeper, parts=parts)
        upto = upto.merge(target.watermark)
    rest = _side_range(season=season, r=r, keys=keys, token=token, target=target, upto=upto, current=current,
                       resume=False, not_before=not_before, keeper=keeper, parts=parts)
    return rest if resumed is None else resumed.then(rest)


def _side_range(*, season: Season, r: redis.Redis, keys: rankview.Keys, token: int | None,
                target: rankview.CopyMeta, upto: Watermark, current: Watermark | None, resume: bool,
                not_before: float, keeper: rankview.LeaseKeeper | None, parts: int | None) -> RangeReport:
    after = target.watermark
    target = rankview.copy_begin_mutation(r, keys, token, target, upto=upto)
    report = parts_apply(season=season, r=r, token=token, meta=target, after=after, upto=upto,
                         current=current, resume=resume, not_before=not_before, keeper=keeper, parts=parts)
    target.counts, target.checksums = report.boards[""].applied_to(target.counts, target.checksums)
    target.boards = {board: report.boards[board].applied_to(*counts) for board, counts in target.boards.items()}
    # The counts and the watermark they are at, in one write: a crash after it leaves a
    # copy applying at `upto` with nothing left of this range to apply.
    target.watermark, target.applying_upto = upto, None
    rankview.copy_fields_set(r, keys, target.copy, target.fields(), token=token)
    problems = rankview.copy_verify_counts(r, keys, target, report.touched())
    if problems:
        rankview.copy_broken_mark(r, keys, target.copy, token=token)
        raise EpochError(f"copy {target.copy} failed verification, marked for a rebuild: {'; '.join(problems)}")
    return report


def season_epoch_run_locked(*, season: Season, r: redis.Redis, keys: rankview.Keys, token: int,
                            keeper: rankview.LeaseKeeper | None = None) -> EpochResult:
    """The epoch itself, for a caller that already holds the season's lease (`token`),
    renewed by `keeper` (which a build from the scores stretches)."""
    return _epoch(season=season, r=r, keys=keys, token=token, keeper=keeper)


def _epoch(*, season: Season, r: redis.Redis, keys: rankview.Keys, token: int,
           keeper: rankview.LeaseKeeper | None = None) -> EpochResult:
    """One epoch. `keeper`: the lease's keeper, whose lease a build from the scores stretches.

    The coordinator's own work does not grow with the changes: it reads the stream's
    heads (the epoch's range ends there), hands the range to the parts, adds up their
    counts and checksums, checks the touched buckets (at most every bucket of the
    layout), and publishes."""
    started = time.monotonic()
    season.refresh_from_db(fields=["published_version", "layout", "final_version", "partitions", "partition_base"])
    _copies_retire(r=r, keys=keys, token=token)  # left by a coordinator that died after publishing
    current_version = rankview.pointer_get(r, keys)
    current = rankview.manifest_get(r, keys, current_version) if current_version else None
    if current is not None and not version_holds(r, keys, current):
        current = None
    if current is None and season.published_version > 0:
        # Versions were published, but the pointer, its manifest or its copy is gone
        # (Redis flushed or restarted empty): reads answer 503 until a recovery build,
        # reconciled against the ledger, publishes again. Started once: the job row is
        # the claim.
        return EpochResult(status="lost", detail="views lost", rebuild_wanted=RebuildWanted(
            kind=RebuildJob.Kind.RECOVERY, layout=season.bucket_layout,
            reason="views lost: no current version in Redis"))
    if current is not None and current.version > season.published_version:
        # A coordinator died between the pointer swap and its database record.
        manifest_record(season=season, manifest=current, changed=0, epoch_ms=0.0)

    copies = rankview.copies_get(r, keys)
    target_name = next(c for c in copies if current is None or c != current.copy)
    target = rankview.copy_meta_load(r, keys, target_name)
    layout = current.layout if current is not None else season.bucket_layout
    ties = season_ties(season)
    # The two copies are the two sides of one index: a target that cannot be brought up
    # to date (broken, missing, or for other season options), or that is not the other
    # side of the current copy's index (copies from before they shared one), gets a new
    # index built beside the serving one.
    rebuild = (target is None or target.state == rankview.STATE_BROKEN or target.layout != layout
               or target.ties != ties or set(target.boards) != set(season.regions)
               or (current is not None and (target.index != current.index or target.side == current.side)))

    # The epoch's range ends at the stream's committed heads, read before anything is
    # touched: with nothing new since the current version the epoch is idle and must leave
    # the older copy alone (it still serves the previous version and has not applied the
    # current version's changes: moving its watermark past them would lose them).
    upto = stream_committed_watermark(season_id=season.pk)
    if current is not None:
        upto = upto.merge(current.watermark)
        if (not stream_changes_between(season_id=season.pk, after=current.watermark, upto=upto)
                and current.version >= season.published_version):
            return EpochResult(status="idle", version=current.version)
        # Nothing new, but the pointer is older than a version the database recorded
        # (Redis restarted from an old snapshot): publish above it, never serve it for long.
    # The range's end fixed for the version this epoch publishes: a batch committing from
    # here on is told the version after, as its changes will be in it.
    upto = upto.merge(season_version_range_plan(
        season=season, version=max(current_version or 0, season.published_version) + 1))

    renamed: list[str] | None = None  # the copies of a new index, named when it is published
    fresh_before: int | None = None  # changed players the new index's build already holds
    built_batches: list[tuple[int, int]] = []  # and the write batches of their changes
    if target is None or rebuild:
        # The season's first index takes the copies' names; a new one beside a serving
        # index gets names of its own: the fencing token's (never issued twice) and the
        # version it is for (one coordinator runs several epochs under one token).
        built_for = max(current_version or 0, season.published_version) + 1
        names = list(copies) if current is None else [f"e{token}v{built_for}", f"e{token}v{built_for}b"]
        if current is not None and set(names) & set(copies):
            raise EpochError(f"a new index may not take the season's copies' names ({names}, {copies})")
        if current is not None and target is not None and target.index != current.index:
            # Copies from before they shared an index: the idle one is its own, which
            # nothing serves; it goes before the new index is built, not after.
            _grace_wait(target)
            rankview.copies_drop(r, keys, [target], token=token)
        if current is not None:
            renamed = names
            # Both the copies it replaces and its own are recorded: until the pointer names
            # it, the new index is the one to drop if this coordinator dies (the record
            # names the copies that are not the season's, whichever those are by then).
            rankview.copies_retiring_mark(r, keys, [*copies, *names], token=token)
        with (keeper.stretched(int(build.BUILD_LEASE_SECONDS * 1000)) if keeper is not None
              else contextlib.nullcontext()):
            built = build.season_copies_build(season=season, copies=names, layout=layout, r=r, token=token,
                                              lease=keeper)
        target = built[0]
        upto = upto.merge(target.watermark)
        if current is not None:
            fresh_before = len(changed_players(season=season, after=current.watermark, upto=target.watermark))
        built_batches = commit_batches(season=season, after=current.watermark if current is not None else None,
                                       upto=target.watermark)
        not_before = 0.0
    else:
        not_before = _grace_end(target)

    report = copy_side_apply(season=season, r=r, keys=keys, token=token, target=target, upto=upto,
                             current=current.watermark if current is not None else None, not_before=not_before,
                             keeper=keeper)
    version = max(current_version or 0, season.published_version) + 1
    target = rankview.copy_finish(r, keys, token, target, watermark=upto, version=version, **replicas_wait())
    as_of = datetime.now(UTC)
    manifest = copy_manifest(r=r, keys=keys, season=season, meta=target, version=version, as_of=as_of)
    rankview.manifest_store(r, keys, manifest, token=token)
    # The FINAL version keeps its manifest when a correction replaces it (the catch-up
    # leaves its copy alone too): it stays readable by number until that copy is needed.
    rankview.pointer_publish(r, keys, token=token, expected=current_version, version=version, copies=renamed,
                             keep_replaced=current_version is not None and current_version == season.final_version)
    published_at = datetime.now(UTC)
    if current is not None:
        rankview.copy_release(r, keys, current.copy, at=time.time(), token=token)
    if renamed is not None:
        rankview.copies_retired(r, keys, renamed, token=token)  # the season's copies now
        _copies_retire(r=r, keys=keys, token=token)
    epoch_ms = (time.monotonic() - started) * 1000
    # Players whose entry differs from the previous version (every player of a first one).
    changed = manifest.total if current is None else report.fresh + (fresh_before or 0)
    manifest_record(season=season, manifest=manifest, changed=changed, epoch_ms=epoch_ms)
    _metrics_observe(season=season, r=r, batches=built_batches + report.batches, published_at=published_at,
                     epoch_ms=epoch_ms)
    wanted = (_shards_rebuild_wanted(season=season, manifest=manifest)
              if lookup_shards_outgrown(players=manifest.total, shards=target.lookup_shards) else None)
    return EpochResult(status="published", version=version, changed_players=changed, duration_ms=epoch_ms,
                       applied=report.applied, rebuild_wanted=wanted, parts=len(report.parts),
                       parts_cpu_seconds=sum(part.cpu_seconds for part in report.parts),
                       parts_seconds=report.seconds)


def copy_manifest(*, r: redis.Redis, keys: rankview.Keys, season: Season, meta: rankview.CopyMeta, version: int,
                  as_of: datetime) -> Manifest:
    """The manifest of `version` as the copy holds it: where its data is (index, side, shards,
    groups), its counts and checksums, and the top 100 of each board read from it."""
    return Manifest(
        season=season.slug, version=version, as_of=as_of.isoformat(timespec="milliseconds"),
        watermark=meta.watermark, copy=meta.copy, gen=meta.gen, layout=meta.layout,
        counts=list(meta.counts), checksums=list(meta.checksums),
        top=rankview.copy_top(r, keys, meta, limit=100), ties=meta.ties,
        regions=copy_regions_boards(r=r, keys=keys, meta=meta), lookup_shards=meta.lookup_shards,
        groups=meta.groups, side=meta.side, index=meta.index, kind=season.board_kind, tiers=season.tiers_parsed,
    )


def _copies_retire(*, r: redis.Redis, keys: rankview.Keys, token: int) -> None:
    """Drop the copies a new index replaced (recorded before its publication), once the
    grace period of the one that served has passed: readers of its last version may still
    be running until then. Under the lease; a coordinator that died before leaves the
    record, and the next epoch drops them."""
    names = rankview.copies_retiring(r, keys)
    metas = [meta for name in names if (meta := rankview.copy_meta_load(r, keys, name)) is not None]
    for meta in metas:
        _grace_wait(meta)
    rankview.copies_drop(r, keys, metas, token=token, retire=True)
    rankview.copies_retired(r, keys, names, token=token)


def copy_regions_boards(*, r: redis.Redis, keys: rankview.Keys, meta: rankview.CopyMeta) -> dict[str, RegionBoard]:
    """The regional boards a manifest of this copy publishes: counts, checksums, top 100."""
    return {region: RegionBoard(counts=list(counts), checksums=list(checksums),
                                top=rankview.copy_top(r, keys, meta, limit=100, board=region))
            for region, (counts, checksums) in meta.boards.items()}


def _metrics_observe(*, season: Season, r: redis.Redis, batches: list[tuple[int, int]], published_at: datetime,
                     epoch_ms: float) -> None:
    """The epoch's duration and the event-to-publish lag of the changes it published: the
    parts report each write batch they applied that the previous version lacked (a batch
    shares one committed_at: (committed_at ms, changes)). Best effort: metrics never fail
    an epoch that published."""
    try:
        published_ms = published_at.timestamp() * 1000
        lags = [((published_ms - committed_ms) / 1000, n) for committed_ms, n in batches]
        metrics_epoch_observe(season_slug=season.slug, duration_ms=epoch_ms, lags=lags, r=r)
    except Exception:  # noqa: BLE001 - best effort
        log.warning("season %s: epoch metrics not recorded", season.slug, exc_info=True)


def _shards_rebuild_wanted(*, season: Season, manifest: Manifest) -> RebuildWanted | None:
    """A background rebuild of a season whose copy outgrew its lookup shards (it grew
    through epochs since it was built): the rebuild counts the players again and sizes
    both new copies for them. None while a shadow build is in flight, or soon after such a
    rebuild failed (one query a published epoch until the rebuild publishes)."""
    retry_after = datetime.now(UTC) - timedelta(seconds=SHARDS_OUTGROWN_RETRY_SECONDS)
    blocked = RebuildJob.objects.filter(season=season).filter(
        Q(status__in=ACTIVE_REBUILD_STATUSES)
        | Q(status=RebuildJob.Status.FAILED, reason__startswith=SHARDS_OUTGROWN_REASON, finished_at__gte=retry_after))
    if blocked.exists():
        return None
    reason = (f"{SHARDS_OUTGROWN_REASON}: copy {manifest.copy} holds {manifest.total:,} players in "
              f"{manifest.lookup_shards:,} lookup shards, more than {LOOKUP_SHARD_OUTGROWN} a shard")
    return RebuildWanted(kind=RebuildJob.Kind.REBUILD, layout=manifest.layout, reason=reason)


def commit_batches(*, season: Season, after: Watermark | None, upto: Watermark) -> list[tuple[int, int]]:
    """(committed_at ms, changes) of each write batch with changes after `after` (None: from
    the start) and at or before `upto`, for their publication lag: what the parts report of
    their rows, for the changes a new index's build took in (one GROUP BY)."""
    rows = ScoreChange.objects.filter(season_id=season.pk).filter(changes_covered_q(upto))
    if after is not None:
        rows = rows.filter(changes_after_q(after))
    grouped = rows.values("committed_at").annotate(n=Count("id")).order_by().values_list("committed_at", "n")
    return [(instant_ms(at), int(n)) for at, n in ledger_rows_list(season=season, queryset=grouped)]


def changed_players(*, season: Season, after: Watermark, upto: Watermark) -> set[str]:
    """The players with a change after `after` and at or before `upto` (a version built on
    a new index counts those its build took in, besides its parts' `fresh`; a recovery
    checks those its catch-up replayed one by one)."""
    rows = ScoreChange.objects.filter(season_id=season.pk).filter(changes_after_q(after) & changes_covered_q(upto))
    return set(ledger_rows_list(season=season, queryset=rows.values_list("player_id", flat=True).distinct()))


def manifest_record(*, season: Season, manifest: Manifest, changed: int, epoch_ms: float) -> None:
    with transaction.atomic():
        data = manifest.to_dict()
        ManifestRow.objects.get_or_create(
            season=season,
            version=manifest.version,
            defaults={
                "as_of": datetime.fromisoformat(manifest.as_of),
                "watermark_txid": manifest.watermark.columns()[0],
                "watermark_id": manifest.watermark.columns()[1],
                "watermark_vector": manifest.watermark.columns()[2],
                "copy": manifest.copy,
                "layout": data["layout"],
                "buckets": data["buckets"],
                "total_players": manifest.total,
                "changed_players": changed,
                "epoch_ms": epoch_ms,
                "published_at": datetime.now(UTC),
            },
        )
        Season.objects.filter(pk=season.pk, published_version__lt=manifest.version).update(
            published_version=manifest.version
        )
        # The state as this transaction sees it (a FINAL approved during the epoch shows).
        state, final_version = Season.objects.filter(pk=season.pk).values_list("state", "final_version").get()
        version_published_on_commit(season_slug=season.slug, version=manifest.version, state=state,
                                    final_version=final_version)
    season.published_version = max(season.published_version, manifest.version)


