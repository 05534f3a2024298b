"""Services that materialize and publish leaderboard versions (docs/architecture.md, How versions are published).

`season_epoch_run` is one epoch for one season: it brings the oldest copy of the index
up to date with the change stream, verifies it, and publishes it with a fenced pointer
swap. `season_copies_build` fills one index, both copies' sides of it, from the
current-scores table at a recorded watermark (first start, a new index beside the
serving one, lost views, the bulk loader).
"""

from __future__ import annotations

import contextlib
import logging
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from operator import itemgetter
from typing import Any, Protocol, TypedDict

import psycopg
import redis
from django.conf import settings
from django.db import connections, transaction
from django.db.models import Count, Q

from leaderboard.core.buckets import BucketLayout
from leaderboard.core.checksum import MODULUS, checksum_add, pair_hash
from leaderboard.core.epoch import newest_scores
from leaderboard.core.gc_pause import gc_paused
from leaderboard.core.manifest import (
    LOOKUP_SHARD_OUTGROWN,
    Manifest,
    RegionBoard,
    lookup_shards_for,
    lookup_shards_outgrown,
)
from leaderboard.core.partitions import Watermark
from leaderboard.core.season_options import TIE_BREAK_FIRST_REACHED
from leaderboard.core.slots import bucket_group, shard_group
from leaderboard.core.tiebreak import FirstReached, IndexValue, first_reached_of, index_key, value_token
from leaderboard.ingest import ledger_store
from leaderboard.ingest.selectors import (
    changes_after_q,
    changes_covered_q,
    score_change_heads_after,
    score_change_reached_after,
    stream_committed_watermark,
)
from leaderboard.ledger_reads import ledger_databases_list, ledger_rows_count, ledger_rows_list
from leaderboard.metrics import metrics_epoch_observe
from leaderboard.models import ACTIVE_REBUILD_STATUSES, PlayerScore, RebuildJob, ScoreChange
from leaderboard.models import Manifest as ManifestRow
from leaderboard.redis_client import redis_get
from leaderboard.views import rankview
from leaderboard.views.rankview.reads import version_holds
from leaderboard.views.signals import version_published_on_commit
from seasons.models import Season

log = logging.getLogger(__name__)

COPIES = rankview.COPY_NAMES
STREAM_PAGE = 50_000
# Players read, sorted, encoded and sent per batch of a build from the scores: at least
# BUILD_BATCH, and BUILD_SHARD_FILL per lookup shard of the copy. A bigger batch inserts
# closer together in the index's order and names each shard with more players at once
# (2M players, two copies: ~10 s of Redis CPU in batches of 200,000, ~14 s in 50,000;
# in the 262,144 shards of a 10M-player copy, ~8.8 s in batches of 1M, ~13.7 s in
# 200,000). It is sent in transactions of at most BUILD_TRANSACTION_WRITES members and
# fields, since Redis serves nobody else while one runs (~0.1 s at 10M players, against
# ~0.15 s for the 20,000 unsorted players a transaction held before).
# And at most BUILD_BATCH_MAX: the fill grows with the players (a 50M-player copy has
# 1,048,576 shards, so 4 a shard is 4.2M rows), and two batches are in Python at once
# (one encoded while the other is sent: ~1 GB of the build's process at 1,048,576 rows,
# measured at 50M players), beside the Redis that receives them.
BUILD_BATCH = 200_000
BUILD_SHARD_FILL = 4
BUILD_BATCH_MAX = 1 << 20
BUILD_TRANSACTION_WRITES = 50_000
# A batch's rows are fetched and sorted this many at a time, in sorted runs: psycopg
# converts a fetch's rows, and list.sort sorts, in one call each that holds the
# interpreter, and the lease's keeper thread cannot renew meanwhile (a fetch of 1M rows
# held it 0.3 s at load 7, its sort 0.3-0.7 s; 200,000 at a time, about a fifth of that).
BUILD_FETCH_PIECE = 200_000
# An epoch that builds a copy from the scores holds the season's lease this long between
# renewals (rankview.LeaseKeeper.stretched) instead of EPOCH_LEASE_SECONDS: a build pauses
# its process for a second and more on a loaded machine, and a killed coordinator's build
# is lost anyway, so another taking over 30 s later instead of 2 costs nothing readers see.
BUILD_LEASE_SECONDS = 30.0
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


class EpochError(RuntimeError):
    pass


class BuildProgress(Protocol):
    def start(self, total: int) -> None: ...

    def advance(self, done: int) -> None: ...


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


class ReplicasWait(TypedDict):
    replicas: int
    replicas_ms: int


def replicas_wait() -> ReplicasWait:
    """copy_finish's durability arguments from the settings (VIEW_REPLICAS_WAIT, _MS)."""
    return {"replicas": settings.VIEW_REPLICAS_WAIT, "replicas_ms": settings.VIEW_REPLICAS_WAIT_MS}


def season_keys(season: Season) -> rankview.Keys:
    return rankview.Keys(settings.REDIS_KEY_PREFIX, season.slug)


def season_ties(season: Season) -> FirstReached | None:
    """The key encoding of a first_reached season's boards (core.tiebreak), None for a shared one."""
    if season.tie_break != TIE_BREAK_FIRST_REACHED:
        return None
    return first_reached_of(starts_at=season.starts_at, cutoff=season.cutoff)


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


def season_copies_build(
    *, season: Season, copies: list[str], layout: BucketLayout, r: redis.Redis, token: int | None,
    progress: BuildProgress | None = None, lease: rankview.LeaseKeeper | None = None,
) -> list[rankview.CopyMeta]:
    """Fill one index from the current-scores table, from a change-stream watermark taken
    first, in one read of the table; `copies` (one or two names) are its sides, 0 and 1,
    the index named after the first. Both sides see every entry: the buckets hold one
    member a player and the lookup one value, written once whatever the copies' number.

    The watermark is read before the scan: on PostgreSQL every change numbered at or
    below the season's committed stream head is committed, so the scan sees it (or a
    newer one); every change after the watermark is replayed by whoever finishes the
    copy (an epoch, or a rebuild's catch-up), and replay is absolute and keeps the newest
    version per player, so a score the scan already saw changing is harmless.

    `lease`: the keeper of the lease `token` holds, renewed before each batch: a lease
    lost mid-build stops it at the next batch instead of at its end, minutes later.

    The rows stream out of PostgreSQL on a connection of the build's own
    (`_score_batches`), so progress and heartbeats still commit on Django's meanwhile.
    Each batch is encoded once, its bucket, key and checksum computed once for every
    copy, and a helper thread sends batch i (fenced slot-group scripts, every master at
    once, fenced by `token` when an epoch builds under its lease) while this one reads and encodes batch i+1:
    Redis's inserts and Python's encoding overlap on two cores. Every write must report
    each of its members and fields as new: with the bucket sizes checked at the end, the
    copy then holds exactly the pairs its counts and checksums were computed from (a
    recovery's reconciliation relies on it, reconcile.recovery_reconcile).
    """
    keys = season_keys(season)
    ties = season_ties(season)
    # Counted first: the copies' lookup shards are sized for the players they will hold.
    total = ledger_rows_count(season=season, queryset=PlayerScore.objects.filter(season_id=season.pk))
    shards = lookup_shards_for(players=total, minimum=settings.VIEW_LOOKUP_SHARDS_MIN)
    index = copies[0]
    olds = [old for copy in copies if (old := rankview.copy_meta_load(r, keys, copy)) is not None]
    # Names are fresh but for the season's first build; one left by a failed attempt goes.
    rankview.copies_drop(r, keys, olds, token=token)
    metas = []
    for side, copy in enumerate(copies):
        meta = rankview.copy_meta_init(r, keys, copy, layout, ties, regions=season.regions, lookup_shards=shards,
                                       groups=settings.VIEW_SLOT_GROUPS, token=token, index=index, side=side)
        # Broken until the verified counts and watermark land, in the same write as
        # "applying" (below): a build cut short is rebuilt, never finished from there.
        metas.append(rankview.copy_begin_mutation(r, keys, token, meta, state=rankview.STATE_BROKEN))
    first = metas[0]
    counts = [0] * layout.size
    checksums = [0] * layout.size
    watermark = stream_committed_watermark(season_id=season.pk)
    done = 0
    if progress is not None:
        progress.start(total)
    shard_keys = _ShardKeys(keys, index, shards, first.groups)
    sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"build-{season.slug}")
    in_flight: Future[None] | None = None
    started = time.monotonic()
    try:
        # The collector off for the whole loop, not batch by batch: turned back on while a
        # batch is alive (rows, writes, their encoding: millions of objects), its next
        # collection walks them all in one call that holds the interpreter (1.7 s for a
        # batch of 1M rows at load 9), and the lease's keeper cannot renew meanwhile. The
        # loop makes no cycles; each batch is freed by reference counting once sent.
        size = min(BUILD_BATCH_MAX, max(BUILD_BATCH, BUILD_SHARD_FILL * shards))
        with gc_paused():
            for batch, regions in _score_batches(season=season, ties=ties, regional=bool(first.boards), size=size):
                if lease is not None:
                    lease.renew()
                writes = _build_writes(keys, first, batch, counts, checksums, regions, shard_keys, token)
                # Routed to their masters and encoded here, while the sender waits on Redis.
                packed = rankview.nodes_pack(r, [(fence, call) for _, fence, call, _ in writes])
                if in_flight is not None:
                    in_flight.result()
                in_flight = sender.submit(_send_build_batch, r, keys, writes, packed, token)
                done += len(batch)
                if progress is not None:
                    progress.advance(done)
                del batch, regions, writes, packed  # gone before the collector is back on
            if in_flight is not None:
                in_flight.result()
    except rankview.FenceLost:
        _build_lease_lost(season=season, copies=copies, done=done, total=total, started=started)
        raise
    finally:
        sender.shutdown(wait=True)
    for meta in metas:
        meta.counts = list(counts)
        meta.checksums = list(checksums)
        meta.boards = {region: (list(c), list(s)) for region, (c, s) in first.boards.items()}
        problems = rankview.copy_verify_counts(r, keys, meta, range(layout.size), lookups=True)
        if problems:
            rankview.copy_broken_mark(r, keys, meta.copy, token=token)
            raise EpochError(f"copy {meta.copy} built from scores failed verification: {'; '.join(problems)}")
        # "applying", not ready, until an epoch finishes it with the watermark of what it
        # applied; from here an epoch may take the build over (the changes since `watermark`).
        meta.watermark = watermark
        meta.state = rankview.STATE_APPLYING
        try:
            rankview.copy_fields_set(r, keys, meta.copy, meta.fields(), token=token)
        except rankview.FenceLost:
            _build_lease_lost(season=season, copies=copies, done=done, total=total, started=started)
            raise
    return metas


def _build_lease_lost(*, season: Season, copies: list[str], done: int, total: int, started: float) -> None:
    log.warning("season %s: the season's lease was lost while building copy %s from the scores (%s of %s players "
                "written, %.0f s): the copy stays broken and the next lease holder builds it again",
                season.slug, ", ".join(copies), f"{done:,}", f"{total:,}", time.monotonic() - started)


def _send_build_batch(r: redis.Redis, keys: rankview.Keys, writes: list[_BuildWrite],
                      packed: rankview.NodesPacked, token: int | None) -> None:
    replies = rankview.groups_packed_send(packed)
    for (copy, fence, _, new), reply in zip(writes, replies, strict=True):
        written = sum(int(n) for n in reply)
        if written != new:
            # A member or field the copy held already (its size alone could still add up).
            rankview.copy_broken_mark(r, keys, copy, token=token)
            raise EpochError(f"copy {copy}: a build write to {fence} added {written} members and fields, not {new}")


def _score_batches(*, season: Season, ties: FirstReached | None, regional: bool, size: int
                   ) -> Iterator[tuple[list[tuple[str, Any]], list[str] | None]]:
    """The season's current scores in batches of `size`: (player_id, value) rows
    (value: the score, or (score, reached_ms) on a first_reached board) and, in a season
    with regions, each row's region.

    On PostgreSQL outside a transaction: one server-side cursor on a connection of its own,
    fetched `size` rows at a time (rows made by psycopg's C loaders: ~3.5x the rows
    per second of the COPY text it replaced, split and parsed in Python, and ~15x keyset
    pages ordered by player_id), with reached_at already in ms (no timestamp parsed per
    row). Inside a transaction (tests that never commit), and on SQLite, keyset pages
    through the ORM on Django's connection. Each ledger database of the season in turn (a
    build does not need the rows in any order).
    """
    for alias in ledger_databases_list(season=season):
        yield from _score_batches_of(season=season, alias=alias, ties=ties, regional=regional, size=size)


def _score_batches_of(*, season: Season, alias: str, ties: FirstReached | None, regional: bool, size: int
                      ) -> Iterator[tuple[list[tuple[str, Any]], list[str] | None]]:
    """`_score_batches` of one ledger database."""
    if connections[alias].vendor == "postgresql" and not connections[alias].in_atomic_block:
        yield from _score_batches_fetched(season=season, alias=alias, ties=ties, regional=regional, size=size)
        return
    scores = PlayerScore.objects.using(alias).filter(season_id=season.pk)
    columns: tuple[str, ...] = ("player_id", "score") if ties is None else ("player_id", "score", "reached_at")
    if regional:
        columns = (*columns, "region")
    after = ""
    while True:
        rows = list(scores.filter(player_id__gt=after).order_by("player_id").values_list(*columns)[:size])
        if not rows:
            return
        after = rows[-1][0]
        regions = [row[-1] for row in rows] if regional else None
        if ties is not None:
            yield [(row[0], (row[1], ties.reached_ms(row[2]))) for row in rows], regions
        else:
            yield [(row[0], row[1]) for row in rows], regions


_score_of = itemgetter(1)  # a fetched row's score


def _score_batches_fetched(*, season: Season, alias: str, ties: FirstReached | None, regional: bool, size: int
                           ) -> Iterator[tuple[list[tuple[str, Any]], list[str] | None]]:
    columns = ["player_id", "score"]
    if ties is not None:
        columns.append("coalesce((extract(epoch FROM reached_at) * 1000)::bigint - %s, 0)")
    if regional:
        columns.append("region")
    params: list[Any] = [ties.origin_ms] if ties is not None else []
    sql = f"SELECT {', '.join(columns)} FROM leaderboard_playerscore WHERE season_id = %s"
    conn = psycopg.connect(**connections[alias].get_connection_params())
    try:
        # One statement, one snapshot, taken after the watermark was read (as COPY's was).
        with conn.transaction(), conn.cursor(name=f"build-{season.pk}") as cursor:
            cursor.execute(sql, [*params, season.pk])
            while rows := _rows_sorted_fetch(cursor, size):
                regions = [row[-1] for row in rows] if regional else None
                if ties is None:
                    yield [(row[0], row[1]) for row in rows], regions
                else:
                    yield [(row[0], (row[1], row[2])) for row in rows], regions
    finally:
        conn.close()


def _rows_sorted_fetch(cursor: psycopg.ServerCursor[Any], size: int) -> list[Any]:
    """Up to `size` rows in runs of BUILD_FETCH_PIECE, each sorted score descending, fetched
    and sorted a run at a time so that no call holding the interpreter is long (merging
    the runs would be one more: 0.6 s for 1M rows at load 6). Score descending is the
    index's order: each bucket's ZADD then inserts each member of a run next to the
    previous one, so Redis's skiplist search stays in cache (into a 5M-member set ~2.3 us
    a member in sorted batches of 200k, ~5.9 unsorted)."""
    rows: list[Any] = []
    while len(rows) < size and (piece := cursor.fetchmany(min(BUILD_FETCH_PIECE, size - len(rows)))):
        piece.sort(key=_score_of, reverse=True)
        rows += piece
    return rows


class _ShardKeys:
    """An index's lookup and region shard key names, made once per build: a batch names
    tens of thousands of shards (an index of 10M players has 262,144)."""

    def __init__(self, keys: rankview.Keys, index: str, shards: int, groups: int):
        self.keys = keys
        self.index = index
        self.shards = shards
        self.groups = groups
        self._lookups: list[str] | None = None
        self._regions: list[str] | None = None

    def lookups(self) -> list[str]:
        if self._lookups is None:
            self._lookups = [self.keys.lookup(self.index, shard, groups=self.groups) for shard in range(self.shards)]
        return self._lookups

    def regions(self) -> list[str]:
        if self._regions is None:
            self._regions = [self.keys.region(self.index, shard, groups=self.groups) for shard in range(self.shards)]
        return self._regions


# One fenced write of a build batch: (index, its group's fence key, the EVAL, the members
# and fields it must add: all of them, a build writes into an empty index).
_BuildWrite = tuple[str, str, tuple[Any, ...], int]


def _build_writes(
    keys: rankview.Keys, meta: rankview.CopyMeta, batch: list[tuple[str, Any]], counts: list[int],
    checksums: list[int], regions: list[str] | None, shard_keys: _ShardKeys, token: int | None,
) -> list[_BuildWrite]:
    """One batch of a build as fenced group writes into the index of `meta` (rankview
    group_write_call: per slot group, a ZADD per bucket and an HSET per lookup or region
    shard, in scripts of at most BUILD_TRANSACTION_WRITES new members and fields): `batch`
    (player_id, score), or (player_id, (score,
    reached_ms)) on a first_reached board; `regions`: each player's region, in a season
    with regional boards (their counts and checksums accumulate in meta.boards)."""
    layout = meta.layout
    shards = meta.lookup_shards
    zadds: dict[int, list[Any]] = {}
    hsets: dict[int, list[Any]] = {}
    # The batch's pair hashes per bucket, added to the checksums once at the end.
    sums = [0] * layout.size
    crc32 = zlib.crc32
    # (bucket, key, token) per player, for the regional boards.
    placed: list[tuple[int, int, int | str]] = []
    if meta.ties is None:
        # Fetched batches come sorted by score: the bucket changes only between runs of rows.
        low, high, members, bucket = 1, 0, [], 0
        for player_id, score in batch:
            if not low <= score <= high:
                bucket = layout.bucket_of(score)
                low, high = layout.range_of(bucket)
                members = zadds.setdefault(bucket, [])
            members += (-score, player_id)
            # rankview.lookup_shard, inlined: a call per player is a tenth of this loop.
            hsets.setdefault(crc32(player_id.encode()) % shards, []).extend((player_id, score))
            counts[bucket] += 1
            sums[bucket] += pair_hash(player_id, score)
            if regions is not None:
                placed.append((bucket, -score, score))
    else:
        for player_id, value in batch:
            bucket, key = index_key(layout, meta.ties, value)
            lookup = value_token(value)
            zadds.setdefault(bucket, []).extend((key, player_id))
            hsets.setdefault(crc32(player_id.encode()) % shards, []).extend((player_id, lookup))
            counts[bucket] += 1
            sums[bucket] += pair_hash(player_id, lookup)
            if regions is not None:
                placed.append((bucket, key, lookup))
    for bucket, added in enumerate(sums):
        checksums[bucket] = (checksums[bucket] + added) % MODULUS
    region_zadds, region_hsets = ({}, {}) if regions is None else _regional_build_pairs(meta, batch, regions, placed)
    groups, layout_id, index = meta.groups, layout.layout_id, meta.index
    ops: dict[int, list[tuple[rankview.GroupOp, int]]] = {}
    board_pairs = [(("", b), pairs) for b, pairs in zadds.items()] + list(region_zadds.items())
    for (board, b), pairs in board_pairs:
        ops.setdefault(bucket_group(bucket=b, groups=groups, board=board), []).extend(
            _zadd_pieces(keys.bucket(index, layout_id, b, board, groups=groups), pairs))
    for names, shard_pairs in ((shard_keys.lookups(), hsets),
                               (shard_keys.regions() if region_hsets else [], region_hsets)):
        for shard, fields in shard_pairs.items():
            ops.setdefault(shard_group(shard=shard, groups=groups), []).append(
                (("HSET", names[shard], fields), len(fields) // 2))
    out: list[_BuildWrite] = []
    for group, group_ops in ops.items():
        fence = keys.fence(index, group)
        out += [(index, fence, rankview.group_write_call(fence, token, meta.gen, part), added)
                for part, added in _transactions(group_ops)]
    return out


def _zadd_pieces(key: str, pairs: list[Any]) -> Iterator[tuple[rankview.GroupOp, int]]:
    """A bucket's (key, member) pairs as ZADDs of at most BUILD_TRANSACTION_WRITES members,
    each with its member count."""
    step = 2 * BUILD_TRANSACTION_WRITES
    for start in range(0, len(pairs), step):
        piece = pairs[start:start + step]
        yield ("ZADD", key, piece), len(piece) // 2


def _transactions(writes: list[tuple[rankview.GroupOp, int]]) -> list[tuple[list[rankview.GroupOp], int]]:
    """A group's writes in scripts of at most BUILD_TRANSACTION_WRITES new members and
    fields (one write more only when it alone is that big), each with that count: a
    script holds its master's only thread while it runs."""
    out: list[tuple[list[rankview.GroupOp], int]] = []
    ops: list[rankview.GroupOp] = []
    added = 0
    for op, new in writes:
        if ops and added + new > BUILD_TRANSACTION_WRITES:
            out.append((ops, added))
            ops, added = [], 0
        ops.append(op)
        added += new
    if ops:
        out.append((ops, added))
    return out


def _regional_build_pairs(meta: rankview.CopyMeta, batch: list[tuple[str, Any]], regions: list[str],
                          placed: list[tuple[int, int, int | str]]
                          ) -> tuple[dict[tuple[str, int], list[Any]], dict[int, list[Any]]]:
    """A build batch's regional boards: each player with one of the season's regions on
    that board, with the global board's key, and in the region shards; the ZADD pairs per
    (region, bucket) and the HSET pairs per region shard."""
    zadds: dict[tuple[str, int], list[Any]] = {}
    shards: dict[int, list[Any]] = {}
    for (player_id, _), region, (bucket, key, token) in zip(batch, regions, placed, strict=True):
        board = meta.boards.get(region)
        if board is None:
            continue
        zadds.setdefault((region, bucket), []).extend((key, player_id))
        shards.setdefault(rankview.lookup_shard(player_id, meta.lookup_shards), []).extend((player_id, region))
        board_counts, board_checksums = board
        board_counts[bucket] += 1
        board_checksums[bucket] = checksum_add(board_checksums[bucket], player_id, token)
    return zadds, shards
