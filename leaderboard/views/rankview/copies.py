"""A copy of the index in Redis: its meta hash, fenced writes of an epoch's changes, scans and verification."""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis

from leaderboard.core.buckets import BucketLayout
from leaderboard.core.checksum import checksum_of
from leaderboard.core.epoch import EpochPlan, board_plan, epoch_plan, regional_values
from leaderboard.core.partitions import Watermark
from leaderboard.core.ranking import ranked, ranked_values
from leaderboard.core.shared_index import entry_player
from leaderboard.core.slots import bucket_group, shard_group
from leaderboard.core.tiebreak import (
    FirstReached,
    IndexValue,
    index_key,
    index_value,
    lookup_value,
    value_token,
)
from leaderboard.views.rankview.fence import (
    _HLEN_SUM,
    GroupOp,
    ReplicasBehind,
    _fenced,
    copy_groups_stamp,
    group_unlink_call,
    group_write_call,
    groups_send,
)
from leaderboard.views.rankview.keys import (
    COPY_NAMES,
    DROP_BATCH,
    LEGACY_GROUPS,
    LOOKUP_SHARDS,
    SHARD_SCAN_BATCH,
    SLOT_GROUPS,
    STATE_APPLYING,
    STATE_BROKEN,
    STATE_READY,
    Keys,
    legacy_data_keys,
    lookup_shard,
    shards_of,
)
from leaderboard.views.rankview.shared import SEEN_FIELDS_SUM, SIDES, lookup_seen, window_call
from leaderboard.views.rankview.wire import _script_call, nodes_round_trip, round_trip

# ---------------------------------------------------------------------------- copies


# Players per chunk of an epoch's apply (its fenced slot-group scripts, every master at once).
APPLY_CHUNK = 2000

@dataclass(slots=True)
class CopyMeta:
    copy: str
    gen: int
    state: str
    watermark: Watermark
    layout: BucketLayout
    counts: list[int]
    checksums: list[int]
    version: int
    released_at: float
    # Holds exactly the ledger at `watermark` (finished by an epoch, which reads every
    # committed change): the next epoch may then take the old scores from the change
    # stream instead of reading them from the copy's lookup.
    exact: bool = False
    # A first_reached copy's key encoding (core.tiebreak); None: a shared board.
    ties: FirstReached | None = None
    # A season with regions: each region's board, (counts, checksums) per bucket.
    boards: dict[str, Board] = field(default_factory=dict)
    # Lookup (and region) shards, fixed when the copy is built (core.manifest.lookup_shards_for).
    lookup_shards: int = LOOKUP_SHARDS
    # Slot groups the copy's data keys are spread over (core.slots), fixed when it is made.
    groups: int = SLOT_GROUPS
    # The side of the buckets this copy reads (rankview.shared): its hidden sets and its
    # part of each lookup field.
    side: int = 0
    # The index (data keys) the copy's side is in: its own name unless it shares one.
    index: str = ""

    def __post_init__(self) -> None:
        if not self.index:
            self.index = self.copy

    def fields(self) -> dict[Any, Any]:
        return {
            "lookup_shards": self.lookup_shards,
            "groups": self.groups,
            **({"side": self.side} if self.side else {}),
            **({"index": self.index} if self.index != self.copy else {}),
            **({} if self.ties is None else {"ties": orjson.dumps(self.ties.as_dict())}),
            **({} if not self.boards else {"boards": boards_dumps(self.boards)}),
            "gen": self.gen,
            "state": self.state,
            "watermark": self.watermark.dump(),
            "layout": orjson.dumps(self.layout.as_dict()),
            "counts": orjson.dumps(self.counts),
            "checksums": orjson.dumps([f"{c:016x}" for c in self.checksums]),
            "version": self.version,
            "released_at": repr(self.released_at),
            "exact": int(self.exact),
        }

    @classmethod
    def parse(cls, copy: str, raw: dict[Any, Any]) -> CopyMeta:
        groups = int(raw.get(b"groups", LEGACY_GROUPS))
        return cls(
            copy=copy,
            gen=int(raw[b"gen"]),
            state=STATE_BROKEN if groups == LEGACY_GROUPS else raw[b"state"].decode(),
            watermark=Watermark.parse(raw[b"watermark"].decode()),
            layout=BucketLayout.from_dict(orjson.loads(raw[b"layout"])),
            counts=[int(c) for c in orjson.loads(raw[b"counts"])],
            checksums=[int(c, 16) for c in orjson.loads(raw[b"checksums"])],
            version=int(raw[b"version"]),
            released_at=float(raw[b"released_at"]),
            exact=raw.get(b"exact") == b"1",
            ties=FirstReached.from_dict(orjson.loads(raw[b"ties"])) if b"ties" in raw else None,
            boards={name: ([int(c) for c in b["counts"]], [int(c, 16) for c in b["checksums"]])
                    for name, b in orjson.loads(raw[b"boards"]).items()} if b"boards" in raw else {},
            lookup_shards=int(raw.get(b"lookup_shards", LOOKUP_SHARDS)),
            groups=groups,
            side=int(raw.get(b"side", 0)),
            index=raw[b"index"].decode() if b"index" in raw else copy,
        )


# A regional board's (counts, checksums), bucket by bucket.
Board = tuple[list[int], list[int]]


def boards_dumps(boards: Mapping[str, Board]) -> bytes:
    return orjson.dumps({name: {"counts": counts, "checksums": [f"{c:016x}" for c in checksums]}
                         for name, (counts, checksums) in boards.items()})


def copy_meta_load(r: redis.Redis, keys: Keys, copy: str) -> CopyMeta | None:
    raw = r.hgetall(keys.copy_meta(copy))
    if not raw or b"gen" not in raw:
        return None
    return CopyMeta.parse(copy, raw)


def copy_meta_init(r: redis.Redis, keys: Keys, copy: str, layout: BucketLayout,
                   ties: FirstReached | None = None, regions: Iterable[str] = (),
                   lookup_shards: int = LOOKUP_SHARDS, *, groups: int, token: int | None) -> CopyMeta:
    """A new, empty copy's meta, written only while `token` holds the lease (None: a
    shadow copy the rebuild job claimed in the database).

    Broken until its build lands: an empty watermark with zero counts would otherwise
    read as a copy that only needs every change since the start, and a build cut short
    (its lease lost, its process killed) would be trusted with whatever it had written."""
    meta = CopyMeta(
        copy=copy, gen=0, state=STATE_BROKEN, watermark=Watermark(), layout=layout,
        counts=[0] * layout.size, checksums=[0] * layout.size, version=0, released_at=0.0, ties=ties,
        boards={region: ([0] * layout.size, [0] * layout.size) for region in regions}, lookup_shards=lookup_shards,
        groups=groups,
    )
    copy_fields_set(r, keys, copy, meta.fields(), token=token)
    return meta


def copy_fields_set(r: redis.Redis, keys: Keys, copy: str, fields: Mapping[Any, Any], *, token: int | None) -> None:
    """HSET fields of a copy's meta, only while `token` holds the lease (None: a shadow copy)."""
    _fenced(r, keys, token, [("HSET", keys.copy_meta(copy), *itertools.chain(*fields.items()))])


def copy_broken_mark(r: redis.Redis, keys: Keys, copy: str, *, token: int | None) -> None:
    """Mark a copy broken (the next epoch rebuilds it), only while `token` holds the lease:
    a coordinator that lost the season must not write the control slot either."""
    copy_fields_set(r, keys, copy, {"state": STATE_BROKEN}, token=token)


def copy_drop(r: redis.Redis, keys: Keys, meta: CopyMeta, *, token: int | None = None,
              retire: bool = False) -> None:
    """Delete a copy's data keys, its buckets' hidden sets with them (after a layout change
    or before a rebuild into it); with `token`, only while that token holds the lease (an
    epoch rebuilding its target copy) and only in groups no newer token stamped.

    UNLINK, not DEL: the keys are gone at once either way, but DEL frees a big bucket
    in the server's only thread (a 9M-member sorted set: seconds, every client stalls
    and ours times out); UNLINK frees it in the background. The group fences stay: they
    keep the tokens that fence the copy's next contents. `retire`: the copy's name is
    never used again (a rebuild's replaced or discarded copies), so its fences go too,
    each its group's last write.
    """
    if meta.groups == LEGACY_GROUPS:
        _legacy_copy_drop(r, keys, meta, token=token)
        return
    doomed: dict[int, list[str]] = {}
    layout_id, groups = meta.layout.layout_id, meta.groups
    for board in ("", *meta.boards):
        for b in range(meta.layout.size):
            doomed.setdefault(bucket_group(bucket=b, groups=groups, board=board), []).extend(
                [keys.bucket(meta.index, layout_id, b, board, groups=groups),
                 *(keys.hidden(meta.index, side, layout_id, b, board, groups=groups) for side in SIDES)])
    for k in range(meta.lookup_shards):
        group = doomed.setdefault(shard_group(shard=k, groups=groups), [])
        group.append(keys.lookup(meta.index, k, groups=groups))
        if meta.boards:
            group.append(keys.region(meta.index, k, groups=groups))
    # A 10M-player copy has ~520,000 shards, each freed in the server's thread (too small
    # for the lazy-free one): one UNLINK of them all would stall every client for a good
    # part of a second, so each group's go DROP_BATCH at a time, one script per group and
    # round, every master at once. The generation moves first (readers of the copy's
    # versions retry from then on), and the meta goes last: a crash part-way leaves it,
    # broken, naming the keys still to drop.
    meta_key = keys.copy_meta(meta.copy)
    _fenced(r, keys, token, [("HINCRBY", meta_key, "gen", 1), ("HSET", meta_key, "state", STATE_BROKEN)])
    per_round = max(1, DROP_BATCH // max(1, len(doomed)))
    for start in range(0, max((len(names) for names in doomed.values()), default=0), per_round):
        groups_send(r, [(fence, group_unlink_call(fence, token, None, names[start:start + per_round]))
                        for fence, names in ((keys.fence(meta.index, g), names) for g, names in doomed.items())
                        if names[start:start + per_round]])
    if retire:
        fences = [keys.fence(meta.index, g) for g in range(groups)]
        groups_send(r, [(fence, group_unlink_call(fence, token, None, [fence])) for fence in fences])
    _fenced(r, keys, token, [("UNLINK", meta_key)])


def _legacy_copy_drop(r: redis.Redis, keys: Keys, meta: CopyMeta, *, token: int | None) -> None:
    """`copy_drop` of a copy made before slot groups: its keys under their old names. Only
    a single Redis can hold one (the old names put a copy's keys in many slots, which no
    cluster ever accepted in one transaction), so they go DROP_BATCH to an UNLINK."""
    meta_key = keys.copy_meta(meta.copy)
    _fenced(r, keys, token, [("HINCRBY", meta_key, "gen", 1), ("HSET", meta_key, "state", STATE_BROKEN)])
    doomed = legacy_data_keys(keys, meta.copy, meta.layout.layout_id, meta.layout.size, meta.boards,
                              meta.lookup_shards)
    for start in range(0, len(doomed), DROP_BATCH):
        r.unlink(*doomed[start:start + DROP_BATCH])
    _fenced(r, keys, token, [("UNLINK", meta_key)])


def copies_get(r: redis.Redis, keys: Keys) -> list[str]:
    """The season's R copies (R = 2): the current one and the one the next epoch updates.

    "0" and "1" until a rebuild publishes a shadow copy in place of one of them.
    """
    raw = r.get(keys.copies)
    return [str(c) for c in orjson.loads(raw)] if raw else list(COPY_NAMES)


def copies_set(r: redis.Redis, keys: Keys, copies: list[str]) -> None:
    r.set(keys.copies, orjson.dumps(copies))


def copy_begin_mutation(r: redis.Redis, keys: Keys, token: int | None, meta: CopyMeta, *,
                        state: str = STATE_APPLYING) -> CopyMeta:
    """Bump the copy's generation before touching it: readers of its old version retry.

    `state`: STATE_BROKEN for a build, whose counts and watermark land only at its end."""
    key = keys.copy_meta(meta.copy)
    _fenced(r, keys, token, [("HINCRBY", key, "gen", 1), ("HSET", key, "state", state, "exact", 0)])
    meta.gen += 1
    meta.state = state
    meta.exact = False
    return meta


def copy_scores_get(r: redis.Redis, keys: Keys, meta: CopyMeta, player_ids: list[str]
                    ) -> dict[str, IndexValue | None]:
    """Each player's value in the copy's lookup (None: absent), in the copy's encoding."""
    ties, side = meta.ties, meta.side
    return {player_id: lookup_value(ties, seen.value) if (seen := lookup_seen(value, side)) is not None else None
            for player_id, value in _shard_fields_get(r, meta, keys.lookup, player_ids)}


def copy_regions_get(r: redis.Redis, keys: Keys, meta: CopyMeta, player_ids: list[str]) -> dict[str, str]:
    """Each player's region in the copy ("" for none: no regional board holds them)."""
    side = meta.side
    return {player_id: seen.value if (seen := lookup_seen(value, side)) is not None else ""
            for player_id, value in _shard_fields_get(r, meta, keys.region, player_ids)}


def _shard_fields_get(r: redis.Redis, meta: CopyMeta, key_of: Callable[..., str], player_ids: list[str]
                      ) -> Iterator[tuple[str, bytes | None]]:
    """(player, raw field) of each player in the copy's lookup or region shards (`key_of`):
    one HMGET per shard holding some of them, SHARD_SCAN_BATCH shards a round trip (an
    epoch's 10,000 changes name ~10,000 shards of a 10M-player copy)."""
    order = list(shards_of(player_ids, meta.lookup_shards).items())
    for start in range(0, len(order), SHARD_SCAN_BATCH):
        batch = order[start:start + SHARD_SCAN_BATCH]
        replies = round_trip(r, [("HMGET", key_of(meta.index, shard, groups=meta.groups), *players)
                                 for shard, players in batch])
        for (_, players), values in zip(batch, replies, strict=True):
            yield from zip(players, values, strict=True)


@dataclass(frozen=True, slots=True)
class RegionMoves:
    """The changed players' regions before and after, for a copy with regional boards."""

    old: Mapping[str, str]
    new: Mapping[str, str]


class CopyMismatch(RuntimeError):
    """A chunk's replies show the copy did not hold the scores its plan assumed."""


def copy_apply(r: redis.Redis, keys: Keys, token: int | None, meta: CopyMeta,
               old_scores: Mapping[str, IndexValue | None], new_scores: Mapping[str, IndexValue],
               regions: RegionMoves | None = None) -> dict[str, set[int]]:
    """Move each changed player to its new score, in chunks of fenced slot-group scripts.

    Each chunk is planned from the counts and checksums the previous one left; its group
    writes go to every master at once, then its counts to the copy meta. A chunk spans
    slot groups written one by one, so a crash can leave one half-landed: the copy reads
    as broken from its first chunk until the last landed, and the next epoch rebuilds a
    copy left so. Returns the touched buckets of each board ("" the global one).

    `regions`: a copy with regional boards moves each player on their old and new
    region's boards in the same chunk, with the region shards, so a player is never on
    two boards, nor on none, at a chunk boundary.

    With several chunks, a helper thread sends chunk i and waits for Redis while this
    one plans and encodes chunk i+1, so the epoch's Python work hides behind Redis's (at
    10M players Redis takes ~3x the Python time). Chunk i+1 is sent only once chunk i
    succeeded: its counts assume chunk i's moves, so a failed chunk stops the rest.

    Every chunk's replies are checked against its plan (members removed, members and
    lookup entries inserted): a copy that did not hold the old scores the plan assumed
    is marked broken, so the next epoch rebuilds it, and CopyMismatch is raised.
    """
    players = list(new_scores)
    touched: dict[str, set[int]] = {"": set(), **{board: set() for board in meta.boards}}
    counts, checksums = meta.counts, meta.checksums
    boards = dict(meta.boards)
    sender: ThreadPoolExecutor | None = None
    in_flight: tuple[Future[list[Any]], _Chunk] | None = None
    opened = False

    def landed(chunk: _Chunk, replies: list[Any]) -> None:
        problem = _chunk_mismatch(chunk, replies)
        if problem:
            copy_broken_mark(r, keys, meta.copy, token=token)
            raise CopyMismatch(f"copy {meta.copy}: {problem}")
        meta.counts = chunk.plan.counts
        meta.checksums = chunk.plan.checksums
        touched[""].update(chunk.plan.touched)
        for board, plan in chunk.boards.items():
            meta.boards[board] = (plan.counts, plan.checksums)
            touched[board].update(plan.touched)

    try:
        for start in range(0, len(players), APPLY_CHUNK):
            ids = players[start : start + APPLY_CHUNK]
            olds = {p: old_scores.get(p) for p in ids}
            news = {p: new_scores[p] for p in ids}
            plan = epoch_plan(layout=meta.layout, counts=counts, checksums=checksums, old_scores=olds,
                              new_scores=news)
            chunk = _Chunk(plan=plan)
            if regions is not None and meta.boards:
                _regional_plans(chunk, meta, boards, olds, news, regions)
            if not plan.lookups and not chunk.region_sets and not chunk.region_drops:
                continue
            if not opened:
                # A chunk spans slot groups, each written on its own: a crash between two
                # leaves no chunk boundary to re-plan from. Until every chunk landed the
                # copy reads as broken (the next epoch rebuilds it), never as applying.
                copy_broken_mark(r, keys, meta.copy, token=token)
                opened = True
            counts, checksums = plan.counts, plan.checksums
            boards.update({board: (p.counts, p.checksums) for board, p in chunk.boards.items()})
            _chunk_commands(keys, token, meta, chunk, boards)
            if in_flight is not None:
                landed(in_flight[1], in_flight[0].result())
                in_flight = None
            if sender is None and start + APPLY_CHUNK < len(players):
                sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"apply-{keys.season}")
                # The sender needs the GIL for a moment when each reply arrives; with the
                # default 5 ms switch interval it waits for this thread's planning and
                # Redis sits idle (~10% of an epoch at 10M players).
                switch_interval = sys.getswitchinterval()
                sys.setswitchinterval(min(switch_interval, 0.0005))
            if sender is None:
                landed(chunk, _chunk_send(r, keys, token, chunk))
            else:
                in_flight = (sender.submit(_chunk_send, r, keys, token, chunk), chunk)
                # Hand the GIL over now: otherwise the sender waits for it until this
                # thread blocks, after planning the next chunk, and nothing overlaps.
                time.sleep(0)
        if in_flight is not None:
            landed(in_flight[1], in_flight[0].result())
        if opened:
            _fenced(r, keys, token, [("HSET", keys.copy_meta(meta.copy), "state", STATE_APPLYING)])
    finally:
        if sender is not None:
            sender.shutdown(wait=True)
            sys.setswitchinterval(switch_interval)
    return touched


def _chunk_send(r: redis.Redis, keys: Keys, token: int | None, chunk: _Chunk) -> list[Any]:
    """A chunk's group writes, every master at once, then its counts in the copy meta: the
    group writes' replies."""
    replies = groups_send(r, chunk.calls)
    _fenced(r, keys, token, [chunk.meta_command])
    return replies


@dataclass(slots=True)
class _Chunk:
    """One chunk of `copy_apply`: the global plan, each regional board's, the region-shard
    writes, and the commands they became (in that order; the copy-meta HSET last)."""

    plan: EpochPlan
    boards: dict[str, EpochPlan] = field(default_factory=dict)
    region_sets: dict[str, str] = field(default_factory=dict)
    # Players who left every regional board (their region is none now, or not the season's).
    region_drops: list[str] = field(default_factory=list)
    # Those of region_sets who had no region field before (HSET reports them as new).
    region_new: int = 0
    # One fenced write per slot group the chunk touches: (fence key, EVAL), and each of its
    # ops' (command, label) for _chunk_mismatch; then the copy meta's counts (control slot).
    calls: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)
    labels: list[list[tuple[str, str]]] = field(default_factory=list)
    meta_command: tuple[Any, ...] = ()


def _regional_plans(chunk: _Chunk, meta: CopyMeta, boards: Mapping[str, Board],
                    olds: Mapping[str, IndexValue | None], news: Mapping[str, IndexValue],
                    regions: RegionMoves) -> None:
    for board, (old_values, new_values) in regional_values(
            regions=meta.boards, old_values=olds, new_values=news, old_regions=regions.old,
            new_regions=regions.new).items():
        if new_values:
            counts, checksums = boards[board]
            chunk.boards[board] = board_plan(layout=meta.layout, counts=counts, checksums=checksums,
                                             old_values=old_values, new_values=new_values)
    # A region-shard entry exists exactly for the players the copy holds on a regional board.
    for player_id in news:
        was = regions.old.get(player_id, "")
        now = regions.new.get(player_id, was)
        had = olds.get(player_id) is not None and was in meta.boards
        if now in meta.boards:
            if not had or was != now:
                chunk.region_sets[player_id] = now
                chunk.region_new += not had
        elif had:
            chunk.region_drops.append(player_id)


def _chunk_mismatch(chunk: _Chunk, replies: list[Any]) -> str:
    """What a chunk's replies say that its plans did not expect. On each board ZREM counts
    the members removed and ZADD the ones inserted; the lookup shards' HSETs count the
    players new to the copy, the region shards' HSETs and HDELs those new to or gone from
    every regional board. `replies`: each group write's list of op replies."""
    counted: dict[tuple[str, str], int] = {}
    for labels, reply in zip(chunk.labels, replies, strict=True):
        for label, n in zip(labels, reply, strict=True):
            counted[label] = counted.get(label, 0) + int(n)
    for board, plan in (("", chunk.plan), *chunk.boards.items()):
        name = f"region {board}" if board else "the global board"
        removed = counted.get(("ZREM", f"board:{board}"), 0)
        added = counted.get(("ZADD", f"board:{board}"), 0)
        moved = len(plan.removals) - len(plan.departures)
        if removed != len(plan.removals):
            return f"{name}: removed {removed} members, the plan moved {len(plan.removals)} out of their buckets"
        if added != moved + plan.arrivals:
            return f"{name}: inserted {added} members, the plan expected {moved + plan.arrivals}"
    arrived = counted.get(("HSET", "lookup"), 0)
    if arrived != chunk.plan.arrivals:
        return f"inserted {arrived} lookup entries, the plan expected {chunk.plan.arrivals}"
    placed, dropped = counted.get(("HSET", "regions"), 0), counted.get(("HDEL", "regions"), 0)
    if placed != chunk.region_new or dropped != len(chunk.region_drops):
        return (f"inserted {placed} and removed {dropped} region entries, the plan expected "
                f"{chunk.region_new} and {len(chunk.region_drops)}")
    return ""


def _chunk_commands(keys: Keys, token: int | None, meta: CopyMeta, chunk: _Chunk, boards: Mapping[str, Board]
                    ) -> None:
    """The group writes of one chunk, each op labelled with what it writes (for
    _chunk_mismatch): per slot group a ZREM and a ZADD per touched bucket, an HSET per
    touched lookup or region shard and an HDEL per region shard losing players, all in
    the group's one fenced script (~64 scripts for ~3,000 commands, not a command each).
    The copy meta's new counts go to the control slot after every group landed."""
    plan = chunk.plan
    index, groups = meta.index, meta.groups
    ops: dict[str, list[GroupOp]] = {}
    labels: dict[str, list[tuple[str, str]]] = {}

    def add(group: int, op: GroupOp, label: str) -> None:
        fence = keys.fence(index, group)
        ops.setdefault(fence, []).append(op)
        labels.setdefault(fence, []).append((op[0], label))

    for board, board_plan_ in (("", plan), *chunk.boards.items()):
        for bucket, command, args in _board_ops(meta, board_plan_):
            add(bucket_group(bucket=bucket, groups=groups, board=board),
                (command, keys.bucket(index, meta.layout.layout_id, bucket, board, groups=groups), args),
                f"board:{board}")
    hsets: dict[int, list[Any]] = {}
    shards = meta.lookup_shards
    if meta.ties is None:
        for player_id, score in plan.lookups.items():
            hsets.setdefault(lookup_shard(player_id, shards), []).extend((player_id, score))
    else:  # a first_reached board: "score:reached_ms" in the lookup
        for player_id, value in plan.lookups.items():
            hsets.setdefault(lookup_shard(player_id, shards), []).extend((player_id, value_token(value)))
    for shard, pairs in hsets.items():
        add(shard_group(shard=shard, groups=groups), ("HSET", keys.lookup(index, shard, groups=groups), pairs),
            "lookup")
    regions: dict[int, list[Any]] = {}
    for player_id, region in chunk.region_sets.items():
        regions.setdefault(lookup_shard(player_id, shards), []).extend((player_id, region))
    for shard, pairs in regions.items():
        add(shard_group(shard=shard, groups=groups), ("HSET", keys.region(index, shard, groups=groups), pairs),
            "regions")
    for shard, players in shards_of(chunk.region_drops, shards).items():
        add(shard_group(shard=shard, groups=groups), ("HDEL", keys.region(index, shard, groups=groups), players),
            "regions")
    chunk.calls = [(fence, group_write_call(fence, token, meta.gen, group_ops, side=meta.side))
                   for fence, group_ops in ops.items()]
    chunk.labels = list(labels.values())
    chunk.meta_command = ("HSET", keys.copy_meta(meta.copy), "counts", orjson.dumps(plan.counts),
                          "checksums", orjson.dumps([f"{c:016x}" for c in plan.checksums]),
                          *(("boards", boards_dumps(boards)) if meta.boards else ()))


def _board_ops(meta: CopyMeta, plan: EpochPlan) -> Iterator[tuple[int, str, list[Any]]]:
    """One board's (bucket, ZREM or ZADD, arguments) of a chunk, a ZREM and a ZADD per touched bucket."""
    zrems: dict[int, list[Any]] = {}
    for bucket, player_id in plan.removals:
        zrems.setdefault(bucket, []).append(player_id)
    zadds: dict[int, list[Any]] = {}
    if meta.ties is None:
        for bucket, player_id, score in plan.additions:
            zadds.setdefault(bucket, []).extend((-score, player_id))  # type: ignore[operator]
    else:
        for bucket, player_id, value in plan.additions:
            zadds.setdefault(bucket, []).extend((index_key(meta.layout, meta.ties, value)[1], player_id))
    for bucket, members in zrems.items():
        yield bucket, "ZREM", members
    for bucket, pairs in zadds.items():
        yield bucket, "ZADD", pairs


def copy_finish(r: redis.Redis, keys: Keys, token: int | None, meta: CopyMeta, *, watermark: Watermark,
                version: int, exact: bool = False, replicas: int = 0, replicas_ms: int = 0) -> CopyMeta:
    """Mark the copy ready at `watermark`; `exact` only when it applied every change committed so far.

    Every group fence gets the copy's generation first (the one its manifests carry), so
    a reader of a group this mutation did not write still finds the generation it expects.
    `replicas`: the copy is made ready only once that many replicas of every master it
    lives on acknowledged its writes (copy_groups_stamp); else it is marked broken (the
    next epoch rebuilds it) and ReplicasBehind is raised: a copy a failover could take
    writes from is never published."""
    try:
        copy_groups_stamp(r, keys, meta.index, meta.groups, token=token, gen=meta.gen, side=meta.side,
                          replicas=replicas,
                          replicas_ms=replicas_ms)
    except ReplicasBehind:
        copy_broken_mark(r, keys, meta.copy, token=token)
        raise
    meta.watermark = watermark
    meta.state = STATE_READY
    meta.version = version
    meta.exact = exact
    copy_fields_set(r, keys, meta.copy, meta.fields(), token=token)
    return meta


def copy_release(r: redis.Redis, keys: Keys, copy: str, *, at: float, token: int | None) -> None:
    """Record when a copy stopped being current: its grace period starts now (under the lease)."""
    copy_fields_set(r, keys, copy, {"released_at": repr(at)}, token=token)


def copy_verify_counts(r: redis.Redis, keys: Keys, meta: CopyMeta,
                       buckets: Iterable[int] | Mapping[str, Iterable[int]], *, lookups: bool = False) -> list[str]:
    """ZCARD of the given buckets against the copy's counts; with `lookups`, also the
    lookup's size against them and the region shards' against the regional boards' total.
    `buckets`: the global board's, or each board's ("" global) as copy_apply returns them;
    a plain iterable checks every bucket of every regional board too.

    `lookups` counts every shard (HLEN, SHARD_SCAN_BATCH a round trip): after a build,
    not after each epoch, whose chunks checked their lookup and region-shard writes
    against their plans already (copy_apply), and whose copy can have ~260,000 shards."""
    wanted = {"": sorted(set(buckets))} if not isinstance(buckets, Mapping) else {
        board: sorted(set(bs)) for board, bs in buckets.items()}
    if not isinstance(buckets, Mapping):
        wanted.update({board: list(range(meta.layout.size)) for board in meta.boards})
    checks = [(board, bucket) for board, bs in wanted.items() for bucket in bs]
    layout_id = meta.layout.layout_id
    # The entries the copy's side sees: the bucket's less its hidden ones.
    replies = round_trip(r, [command for board, bucket in checks for command in (
        ("ZCARD", keys.bucket(meta.index, layout_id, bucket, board, groups=meta.groups)),
        ("ZCARD", keys.hidden(meta.index, meta.side, layout_id, bucket, board, groups=meta.groups)))]) if checks else []
    problems = []
    for (board, bucket), actual in zip(checks, (int(a) - int(h) for a, h in zip(replies[::2], replies[1::2],
                                                                                 strict=True)), strict=True):
        counted = meta.boards[board][0][bucket] if board else meta.counts[bucket]
        if actual != counted:
            where = f"region {board} bucket {bucket}" if board else f"bucket {bucket}"
            problems.append(f"{where}: {actual} members, counted {counted}")
    if not lookups:
        return problems
    lookup_total, placed = copy_shard_sizes(
        r, keys, meta.index, meta.lookup_shards, regions=bool(meta.boards), groups=meta.groups, side=meta.side,
        hidden=hidden_keys_of(keys, meta.index, meta.layout, meta.boards, groups=meta.groups))
    if lookup_total != sum(meta.counts):
        problems.append(f"lookup holds {lookup_total} players, buckets {sum(meta.counts)}")
    if meta.boards:
        regional = sum(sum(counts) for counts, _ in meta.boards.values())
        if placed != regional:
            problems.append(f"region shards hold {placed} players, regional boards {regional}")
    return problems


def hidden_keys_of(keys: Keys, index: str, layout: BucketLayout, boards: Iterable[str], *, groups: int) -> list[str]:
    """Every hidden set a copy's buckets can have, of both sides and every board."""
    return [keys.hidden(index, side, layout.layout_id, b, board, groups=groups)
            for board in ("", *boards) for b in range(layout.size) for side in SIDES]


def copy_shard_sizes(r: redis.Redis, keys: Keys, index: str, shards: int, *, regions: bool,
                     groups: int, side: int = 0, hidden: Iterable[str] = ()) -> tuple[int, int]:
    """(players in the lookup, players in the region shards: 0 without `regions`) of a copy
    of `shards` shards in `groups` slot groups as side `side` sees them, summed by a script
    per slot group (a script touches one slot), SHARD_SCAN_BATCH shards a call (a reply
    per shard would cost the client more than the server), every master at once.

    While none of the copy's `hidden` sets exists the two sides see the same players, and
    every field counts: HLEN. Otherwise the fields are read (SEEN_FIELDS_SUM)."""
    hidden = list(hidden)
    one_sided = not hidden or not any(round_trip(r, [("EXISTS", key) for key in hidden]))
    script, argv = (_HLEN_SUM, []) if one_sided else (SEEN_FIELDS_SUM, [side])
    key_of = [keys.lookup, *((keys.region,) if regions else ())]
    sizes = [0, 0]
    for which, key in enumerate(key_of):
        by_group: dict[int, list[str]] = {}
        for shard in range(shards):
            by_group.setdefault(shard_group(shard=shard, groups=groups), []).append(key(index, shard, groups=groups))
        calls = [(names[start], _script_call(script, names[start:start + SHARD_SCAN_BATCH], argv))
                 for names in by_group.values() for start in range(0, len(names), SHARD_SCAN_BATCH)]
        replies = nodes_round_trip(r, calls)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        sizes[which] = sum(int(n) for n in replies)
    return sizes[0], sizes[1]


def copy_shards_scan(r: redis.Redis, keys: Keys, index: str, shards: int, *, regions: bool = False,
                     groups: int, side: int = 0) -> Iterator[tuple[bytes, str]]:
    """Every (player, value) of a copy's lookup shards (`regions`: its region shards), as
    side `side` sees them (players on its board only).

    One HSCAN from cursor 0 per shard, SHARD_SCAN_BATCH shards a round trip (on a cluster,
    each node's shards on its own connection, all sent before any reply is read): it
    answers a listpack shard whole at once; a bigger shard (a copy built with 16 before
    the shards were sized) goes on by HSCAN, so no reply holds a whole big hash."""
    key_of = keys.region if regions else keys.lookup
    for start in range(0, shards, SHARD_SCAN_BATCH):
        batch = [key_of(index, shard, groups=groups) for shard in range(start, min(shards, start + SHARD_SCAN_BATCH))]
        replies = round_trip(r, [("HSCAN", key, 0, "COUNT", 1000) for key in batch])
        for key, (cursor, flat) in zip(batch, replies, strict=True):
            yield from _seen_fields(flat, side)
            while int(cursor) != 0:
                cursor, flat = round_trip(r, [("HSCAN", key, cursor, "COUNT", 5000)])[0]
                yield from _seen_fields(flat, side)


def _seen_fields(flat: list[bytes], side: int) -> Iterator[tuple[bytes, str]]:
    for player, raw in zip(flat[::2], flat[1::2], strict=True):
        seen = lookup_seen(raw, side)
        if seen is not None:
            yield player, seen.value


def copy_top(r: redis.Redis, keys: Keys, meta: CopyMeta, limit: int = 100, board: str = "") -> list[dict[str, Any]]:
    """The first `limit` entries of a board in display order, from its few highest non-empty buckets."""
    counts = meta.boards[board][0] if board else meta.counts
    plan: list[tuple[int, int]] = []
    needed = limit
    for bucket in range(meta.layout.size - 1, -1, -1):
        if needed <= 0:
            break
        if counts[bucket]:
            take = min(needed, counts[bucket])
            plan.append((bucket, take))
            needed -= take
    # One round trip (per node on a cluster: the buckets are in several slot groups).
    layout_id = meta.layout.layout_id
    replies = round_trip(r, [window_call(bucket=keys.bucket(meta.index, layout_id, bucket, board, groups=meta.groups),
                                         hidden=keys.hidden(meta.index, meta.side, layout_id, bucket, board,
                                                            groups=meta.groups),
                                         start=0, count=take) for bucket, take in plan]) if plan else []
    if meta.ties is None:
        pairs = [(entry_player(m.decode()), -int(float(s)))
                 for reply in replies for m, s in zip(reply[::2], reply[1::2], strict=True)]
        return [entry.as_dict() for entry in ranked(pairs)]
    values = [(entry_player(m.decode()), index_value(meta.layout, meta.ties, bucket, float(s)))
              for (bucket, _), reply in zip(plan, replies, strict=True)
              for m, s in zip(reply[::2], reply[1::2], strict=True)]
    return [entry.as_dict() for entry in ranked_values(values)]


def bucket_values_scan(r: redis.Redis, keys: Keys, index: str, layout: BucketLayout, ties: FirstReached | None,
                       bucket: int, batch: int = 5000, board: str = "", *, groups: int, side: int = 0
                       ) -> Iterator[tuple[str, IndexValue]]:
    """Any board's bucket as side `side` sees it, (player_id, value) in display order:
    scores, or first_reached (score, reached_ms)."""
    key = keys.bucket(index, layout.layout_id, bucket, board, groups=groups)
    hidden = keys.hidden(index, side, layout.layout_id, bucket, board, groups=groups)
    start = 0
    while True:
        (reply,) = round_trip(r, [window_call(bucket=key, hidden=hidden, start=start, count=batch)])
        for at in range(0, len(reply), 2):
            yield entry_player(reply[at].decode()), index_value(layout, ties, bucket, float(reply[at + 1]))
        if len(reply) < 2 * batch:
            return
        start += batch


def bucket_checksum_scan(r: redis.Redis, keys: Keys, meta: CopyMeta, bucket: int, board: str = "") -> tuple[int, int]:
    """(count, checksum) of a bucket of a board of a copy by a full scan."""
    pairs = [(p, value_token(v))
             for p, v in bucket_values_scan(r, keys, meta.index, meta.layout, meta.ties, bucket, board=board,
                                            groups=meta.groups, side=meta.side)]
    return len(pairs), checksum_of(pairs)
