"""The epoch (docs/architecture.md, How versions are published): for one season, bring the
copy of the index that is not serving up to date with the change stream, verify it, and
publish it with a fenced pointer swap; then bring the other copy up to the new version.
A copy that cannot be brought up to date gets a new index from the build (views.build).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import redis
from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q

from leaderboard.core.buckets import BucketLayout
from leaderboard.core.epoch import newest_scores
from leaderboard.core.manifest import (
    LOOKUP_SHARD_OUTGROWN,
    Manifest,
    RegionBoard,
    lookup_shards_outgrown,
)
from leaderboard.core.partitions import Watermark
from leaderboard.core.tiebreak import FirstReached, IndexValue
from leaderboard.ingest import ledger_store
from leaderboard.ingest.selectors import (
    changes_after_q,
    changes_covered_q,
    score_change_heads_after,
    score_change_reached_after,
)
from leaderboard.ledger_reads import ledger_rows_list
from leaderboard.metrics import metrics_epoch_observe
from leaderboard.models import ACTIVE_REBUILD_STATUSES, RebuildJob, ScoreChange
from leaderboard.models import Manifest as ManifestRow
from leaderboard.redis_client import redis_get
from leaderboard.views import rankview
from leaderboard.views.build import BUILD_LEASE_SECONDS, season_copies_build
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


def change_values(changes: list[Change], ties: FirstReached | None) -> dict[str, IndexValue]:
    """The newest index value per player: scores, or (score, reached_ms) on a first_reached board."""
    if ties is None:
        return newest_scores((c[2], c[3], c[4]) for c in changes)
    origin = ties.origin_ms
    # reached_at None: a row from before it was recorded, reached at the start (FirstReached.reached_ms).
    return newest_scores((c[2], (c[3], 0 if c[6] is None else c[6] - origin), c[4]) for c in changes)


def change_regions(changes: list[Change]) -> dict[str, str]:
    """Each changed player's newest region, from the rows' trailing (region, old_region);
    the same rules as `change_values` (a region move is a row with the score unchanged)."""
    return newest_scores((c[2], c[-2], c[4]) for c in changes)


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
            # use: a build names its index after its first copy (season_copies_build). Each
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
        except redis.RedisError:
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
    keeper = rankview.LeaseKeeper(r, keys, token, ttl_ms=ttl_ms, max_seconds=LEASE_KEEP_MAX_SECONDS)
    try:
        keeper.start()
        result: EpochResult | None = None
        while True:
            run, read = _epoch(season=season, r=r, keys=keys, token=token, keeper=keeper)
            if catch_up and run.status == "published":
                run = replace(run, catch_up_ms=_catch_up_quietly(season=season, r=r, keys=keys, token=token,
                                                                 read=read))
            if result is None or run.status != "idle":
                result = run  # the last publication, not the idle run after it
            # Past the bound the note stays for the next tick's task to run; a waiting
            # rebuild gets the lease before the noted epoch.
            if (time.monotonic() - started > EPOCH_HOLD_SECONDS or rankview.lease_wanted(r, keys)
                    or not rankview.epoch_due_take(r, keys)):
                return result
            if keeper.lost:
                return result
    finally:
        keeper.stop()
        rankview.lease_release(r, keys, token)


def _catch_up_quietly(*, season: Season, r: redis.Redis, keys: rankview.Keys, token: int,
                      read: StreamRead | None) -> float | None:
    # The version is already published: a failed catch-up only leaves the copy to the
    # next epoch (broken, or not acknowledged by the replicas: rebuilt; failed before its
    # first chunk, still applying: re-applied from its watermark).
    try:
        return season_idle_copy_catch_up(season=season, r=r, keys=keys, token=token, read=read)
    except (EpochError, rankview.FenceLost, rankview.CopyMismatch, rankview.ReplicasBehind, redis.RedisError):
        log.warning("season %s: idle copy not caught up; the next epoch applies its changes", season.slug,
                    exc_info=True)
        return None


@dataclass(frozen=True, slots=True)
class StreamRead:
    """The change-stream rows an epoch read (cursor after `after`, oldest first), handed to
    the catch-up that follows it so the same rows are not read from the database twice."""

    after: Watermark
    changes: list[Change]

    def between(self, after: Watermark, upto: Watermark) -> list[Change] | None:
        """The rows after `after` and at or before `upto`; None when this read began later
        than `after` (in any partition)."""
        if not self.after <= after:
            return None
        return [c for c in self.changes if not after.covers(c[0], c[1]) and upto.covers(c[0], c[1])]


def _grace_wait(meta: rankview.CopyMeta) -> None:
    """Return once the copy's grace period is over: readers of the version it last served
    may still be running until then."""
    wait = meta.released_at + settings.COPY_GRACE_SECONDS - time.time()
    if wait > 0:
        time.sleep(min(wait, settings.COPY_GRACE_SECONDS))


def season_idle_copy_catch_up(*, season: Season, r: redis.Redis, keys: rankview.Keys, token: int,
                              read: StreamRead | None = None) -> float | None:
    """Bring the copy that is not current up to the current version's watermark.

    Called by the lease holder right after a publication, off the publication path:
    with R = 2 copies each change must reach both, and doing the older copy's share
    here, once its grace period is over, halves what the next epoch applies before
    its pointer swap. The copy keeps its old version number (its generation moves on,
    so that version now reads as expired).

    A crash once its chunks began leaves the copy broken (a chunk spans slot groups
    written one by one), and the next epoch rebuilds it; one before the first chunk
    leaves it "applying" at its old watermark, re-applied from there with old scores read
    from the copy (changes are absolute). With VIEW_REPLICAS_WAIT the copy is made ready
    only once the masters' replicas acknowledged its writes (else broken, as above).
    `read`: the rows the epoch just read, used when they cover the range (else the
    stream is read). `season.final_version` is taken as the epoch refreshed it.
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
    _grace_wait(idle)
    started = time.monotonic()
    changes = read.between(idle.watermark, current.watermark) if read is not None else None
    if changes is None:
        changes = list(changes_upto(season_id=season.pk, after=idle.watermark, upto=current.watermark,
                                     ties=idle.ties, regions=bool(idle.boards)))
    idle = rankview.copy_begin_mutation(r, keys, token, idle)
    copy_changes_apply(r=r, keys=keys, token=token, target=idle, changes=changes)
    rankview.copy_finish(r, keys, token, idle, watermark=current.watermark, version=idle.version,
                         **replicas_wait())
    return (time.monotonic() - started) * 1000


def copy_changes_apply(*, r: redis.Redis, keys: rankview.Keys, token: int, target: rankview.CopyMeta,
                        changes: list[Change]) -> int:
    """Apply stream rows (oldest first) to a copy being mutated and verify its counts."""
    newest = change_values(changes, target.ties)
    regions = change_regions(changes) if target.boards else None
    touched = rankview.copy_apply(r, keys, token, target, newest, regions)
    problems = rankview.copy_verify_counts(r, keys, target, touched)
    if problems:
        rankview.copy_broken_mark(r, keys, target.copy, token=token)
        raise EpochError(f"copy {target.copy} failed verification, marked for a rebuild: {'; '.join(problems)}")
    return len(newest)


def season_epoch_run_locked(*, season: Season, r: redis.Redis, keys: rankview.Keys, token: int,
                            keeper: rankview.LeaseKeeper | None = None) -> EpochResult:
    """The epoch itself, for a caller that already holds the season's lease (`token`),
    renewed by `keeper` (which a build from the scores stretches)."""
    return _epoch(season=season, r=r, keys=keys, token=token, keeper=keeper)[0]


def _epoch(*, season: Season, r: redis.Redis, keys: rankview.Keys, token: int,
           keeper: rankview.LeaseKeeper | None = None) -> tuple[EpochResult, StreamRead | None]:
    """The epoch, and the stream rows it applied (for the catch-up) when it published.
    `keeper`: the lease's keeper, whose lease a build from the scores stretches."""
    started = time.monotonic()
    season.refresh_from_db(fields=["published_version", "layout", "final_version"])
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
            reason="views lost: no current version in Redis")), None
    if current is not None and current.version > season.published_version:
        # A coordinator died between the pointer swap and its database record.
        manifest_record(season=season, manifest=current, changed=0, epoch_ms=0.0)

    copies = rankview.copies_get(r, keys)
    target_name = next(c for c in copies if current is None or c != current.copy)
    target = rankview.copy_meta_load(r, keys, target_name)
    layout = current.layout if current is not None else season.bucket_layout
    ties = season_ties(season)
    regional = bool(season.regions)
    # The two copies are the two sides of one index: a target that cannot be brought up
    # to date (broken, missing, or for other season options), or that is not the other
    # side of the current copy's index (copies from before they shared one), gets a new
    # index built beside the serving one.
    rebuild = (target is None or target.state == rankview.STATE_BROKEN or target.layout != layout
               or target.ties != ties or set(target.boards) != set(season.regions)
               or (current is not None and (target.index != current.index or target.side == current.side)))

    # (txid, id, player_id, new_score, score_version) in cursor order, read before the
    # target is touched: with nothing new since the current version the epoch is idle
    # and must leave the older copy alone. It still serves the previous version, and it
    # has not applied the current version's changes yet: moving its watermark past them
    # without applying them would lose them from every later version built on it.
    changes = []
    if target is not None and not rebuild:
        changes = list(_changes_after(season_id=season.pk, cursor=target.watermark, ties=ties,
                                      regions=regional))
    fresh: set[str] = set()  # players changed since the current version
    if current is not None:
        if target is not None and not rebuild and target.watermark <= current.watermark:
            fresh = {c[2] for c in changes if not current.watermark.covers(c[0], c[1])}
        else:
            fresh = {c[2] for c in _changes_after(season_id=season.pk, cursor=current.watermark,
                                                  ties=ties)}
        if not fresh and current.version >= season.published_version:
            return EpochResult(status="idle", version=current.version), None
        # Nothing new, but the pointer is older than a version the database recorded
        # (Redis restarted from an old snapshot): publish above it, never serve it for long.

    renamed: list[str] | None = None  # the copies of a new index, named when it is published
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
        with (keeper.stretched(int(BUILD_LEASE_SECONDS * 1000)) if keeper is not None
              else contextlib.nullcontext()):
            built = season_copies_build(season=season, copies=names, layout=layout, r=r, token=token, lease=keeper)
        target = built[0]
        changes = list(_changes_after(season_id=season.pk, cursor=target.watermark, ties=ties,
                                      regions=regional))
        if current is not None:
            fresh.update(c[2] for c in changes if not current.watermark.covers(c[0], c[1]))
    else:
        _grace_wait(target)
        target = rankview.copy_begin_mutation(r, keys, token, target)
    read = StreamRead(after=target.watermark, changes=changes)
    head = target.watermark.advanced(changes)

    applied = copy_changes_apply(r=r, keys=keys, token=token, target=target, changes=changes)

    version = max(current_version or 0, season.published_version) + 1
    target = rankview.copy_finish(r, keys, token, target, watermark=head, version=version, **replicas_wait())
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
    # Players whose entry differs from the previous version (every player of a first
    # one); the copy itself applied `newest`, the changes since it was last current.
    changed = len(fresh) if current is not None else manifest.total
    manifest_record(season=season, manifest=manifest, changed=changed, epoch_ms=epoch_ms)
    _metrics_observe(season=season, r=r, after=current.watermark if current is not None else None,
                     upto=manifest.watermark, published_at=published_at, epoch_ms=epoch_ms)
    wanted = (_shards_rebuild_wanted(season=season, manifest=manifest)
              if lookup_shards_outgrown(players=manifest.total, shards=target.lookup_shards) else None)
    return EpochResult(status="published", version=version, changed_players=changed, duration_ms=epoch_ms,
                       applied=applied, rebuild_wanted=wanted), read


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
        groups=meta.groups, side=meta.side, index=meta.index,
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


def _metrics_observe(*, season: Season, r: redis.Redis, after: Watermark | None, upto: Watermark,
                     published_at: datetime, epoch_ms: float) -> None:
    """The epoch's duration and the event-to-publish lag of the changes it published.

    The changes new in this version are those with a cursor in (previous watermark, new
    watermark]; a write batch shares one committed_at, so one GROUP BY gives a row per
    batch: (lag, events). Best effort: metrics never fail an epoch that published.
    """
    try:
        rows = ScoreChange.objects.filter(season_id=season.pk).filter(
            changes_covered_q(upto))
        if after is not None:
            rows = rows.filter(changes_after_q(after))
        batches = rows.values("committed_at").annotate(n=Count("id")).order_by().values_list("committed_at", "n")
        lags = [((published_at - committed_at).total_seconds(), int(n))
                for committed_at, n in ledger_rows_list(season=season, queryset=batches)]
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


def changes_upto(
    *, season_id: int, after: Watermark, upto: Watermark | None, ties: FirstReached | None = None,
    regions: bool = False,
) -> Iterator[Change]:
    """Changes after `after` and at or before `upto`; upto None: everything committed."""
    for change in _changes_after(season_id=season_id, cursor=after, ties=ties, regions=regions):
        if upto is None or upto.covers(change[0], change[1]):
            yield change


def _changes_after(*, season_id: int, cursor: Watermark, ties: FirstReached | None = None,
                   regions: bool = False) -> Iterator[Change]:
    # Only a first_reached board reads the reached_at columns, only regional boards the regions.
    read = score_change_heads_after if ties is None else score_change_reached_after
    while True:
        page: list[Change] = read(season_id=season_id, cursor=cursor, limit=STREAM_PAGE,  # type: ignore[assignment]
                                  regions=regions)
        yield from page
        if len(page) < STREAM_PAGE:
            return
        cursor = cursor.advanced(page)


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


