"""The index build (docs/architecture.md, How versions are published): one index, both
copies its sides, filled from the current-scores table at a recorded watermark (a season's
first epoch, a new index beside the serving one, lost views, a rebuild, the bulk loader)."""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from operator import itemgetter
from typing import Any, Protocol

import psycopg
import redis
from django.conf import settings
from django.db import connections, transaction

from leaderboard.core.buckets import BucketLayout
from leaderboard.core.checksum import MODULUS, checksum_add, pair_hash
from leaderboard.core.gc_pause import gc_paused
from leaderboard.core.manifest import lookup_shards_for
from leaderboard.core.partitions import Watermark
from leaderboard.core.slots import bucket_group, shard_group
from leaderboard.core.tiebreak import FirstReached, index_key, value_token
from leaderboard.ingest.selectors import stream_committed_cursors
from leaderboard.ledger_reads import ledger_databases_list, ledger_rows_count
from leaderboard.models import PlayerScore
from leaderboard.views import rankview
from leaderboard.views.season_index import EpochError, season_keys, season_ties
from seasons.models import Season

log = logging.getLogger(__name__)

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
class BuildProgress(Protocol):
    def start(self, total: int) -> None: ...

    def advance(self, done: int) -> None: ...


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
    total = ledger_rows_count(season=season, queryset=PlayerScore.objects.filter(season_id=season.pk, hidden=False))
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
    # The stream position each ledger database's scores are read at, read in the snapshot
    # they are scanned in (_score_batches): the copies hold exactly the stream's state at
    # their watermark, which every later range applied to them starts from.
    cursors: dict[int, tuple[int, int]] = {}
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
            for batch, regions in _score_batches(season=season, ties=ties, regional=bool(first.boards), size=size,
                                                 cursors=cursors):
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
    watermark = Watermark.of_partitions(cursors)
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


def _score_batches(*, season: Season, ties: FirstReached | None, regional: bool, size: int,
                   cursors: dict[int, tuple[int, int]]) -> Iterator[tuple[list[tuple[str, Any]], list[str] | None]]:
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

    Each database's rows come from one snapshot, in which its partitions' stream cursors
    are read too, into `cursors`: the rows are the scores exactly at those cursors (a
    REPEATABLE READ transaction on PostgreSQL; on SQLite one transaction, which holds the
    writers off while the build reads).

    An asc board's values are max_score - score (core.season_options.BoardKind.flipped).
    """
    flip = season.board_kind.flip
    for alias in ledger_databases_list(season=season):
        yield from _score_batches_of(season=season, alias=alias, ties=ties, regional=regional, size=size,
                                     cursors=cursors, flip=flip)


def _score_batches_of(*, season: Season, alias: str, ties: FirstReached | None, regional: bool, size: int,
                      cursors: dict[int, tuple[int, int]], flip: int | None,
                      ) -> Iterator[tuple[list[tuple[str, Any]], list[str] | None]]:
    """`_score_batches` of one ledger database."""
    if connections[alias].vendor == "postgresql" and not connections[alias].in_atomic_block:
        yield from _score_batches_fetched(season=season, alias=alias, ties=ties, regional=regional, size=size,
                                          cursors=cursors, flip=flip)
        return
    # Hidden players are on no board (docs/rules.md, Hidden players).
    scores = PlayerScore.objects.using(alias).filter(season_id=season.pk, hidden=False)
    columns: tuple[str, ...] = ("player_id", "score") if ties is None else ("player_id", "score", "reached_at")
    if regional:
        columns = (*columns, "region")
    after = ""
    with transaction.atomic(using=alias):
        cursors.update(stream_committed_cursors(season_id=season.pk, alias=alias))
        while True:
            rows = list(scores.filter(player_id__gt=after).order_by("player_id").values_list(*columns)[:size])
            if not rows:
                return
            after = rows[-1][0]
            regions = [row[-1] for row in rows] if regional else None
            if flip is not None:
                rows = [(row[0], flip - row[1], *row[2:]) for row in rows]
            if ties is not None:
                yield [(row[0], (row[1], ties.reached_ms(row[2]))) for row in rows], regions
            else:
                yield [(row[0], row[1]) for row in rows], regions


_score_of = itemgetter(1)  # a fetched row's score


def _score_batches_fetched(*, season: Season, alias: str, ties: FirstReached | None, regional: bool, size: int,
                           cursors: dict[int, tuple[int, int]], flip: int | None,
                           ) -> Iterator[tuple[list[tuple[str, Any]], list[str] | None]]:
    columns = ["player_id", "score" if flip is None else "%s - score"]
    params: list[Any] = [] if flip is None else [flip]
    if ties is not None:
        columns.append("coalesce((extract(epoch FROM reached_at) * 1000)::bigint - %s, 0)")
        params.append(ties.origin_ms)
    if regional:
        columns.append("region")
    sql = f"SELECT {', '.join(columns)} FROM leaderboard_playerscore WHERE season_id = %s AND NOT hidden"
    conn = psycopg.connect(**connections[alias].get_connection_params())
    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    try:
        # One snapshot for the stream heads and the scan.
        with conn.transaction(), conn.cursor(name=f"build-{season.pk}") as cursor:
            heads = conn.execute("SELECT partition, head FROM leaderboard_streamhead WHERE season_id = %s",
                                 [season.pk]).fetchall()
            cursors.update(stream_committed_cursors(season_id=season.pk, alias=alias, rows=heads))
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
