"""A copy of the index in Redis: its meta hash, fenced writes of an epoch's changes, scans and verification."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis

from leaderboard.core.buckets import BucketLayout
from leaderboard.core.checksum import checksum_of
from leaderboard.core.partitions import Watermark
from leaderboard.core.ranking import ranked_values
from leaderboard.core.slots import bucket_group, shard_group
from leaderboard.core.tiebreak import (
    FirstReached,
    IndexValue,
    value_token,
)
from leaderboard.views.rankview.fence import (
    _HLEN_SUM,
    ReplicasBehind,
    _fenced,
    copy_groups_stamp,
    group_unlink_call,
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
    shards_of,
)
from leaderboard.views.rankview.shared import (
    SEEN_FIELDS_SUM,
    SIDES,
    lookup_seen,
    seen_card_call,
    window_call,
    window_values,
)
from leaderboard.views.rankview.wire import _script_call, nodes_round_trip, round_trip

# ---------------------------------------------------------------------------- copies



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
    # While a range of the stream is being applied to the side: where it ends. An apply cut
    # short leaves it, and the next one first finishes that range, planning the same writes
    # from the same lookups (rankview.apply: writes landed then change nothing now).
    applying_upto: Watermark | None = None

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
            "applying_upto": "" if self.applying_upto is None else self.applying_upto.dump(),
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
            ties=FirstReached.from_dict(orjson.loads(raw[b"ties"])) if b"ties" in raw else None,
            boards={name: ([int(c) for c in b["counts"]], [int(c, 16) for c in b["checksums"]])
                    for name, b in orjson.loads(raw[b"boards"]).items()} if b"boards" in raw else {},
            lookup_shards=int(raw.get(b"lookup_shards", LOOKUP_SHARDS)),
            groups=groups,
            side=int(raw.get(b"side", 0)),
            index=raw[b"index"].decode() if b"index" in raw else copy,
            applying_upto=Watermark.parse(raw[b"applying_upto"].decode()) if raw.get(b"applying_upto") else None,
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
                   lookup_shards: int = LOOKUP_SHARDS, *, groups: int, token: int | None, index: str = "",
                   side: int = 0) -> CopyMeta:
    """A new, empty copy's meta, written only while `token` holds the lease (None: a
    shadow copy the rebuild job claimed in the database).

    Broken until its build lands: an empty watermark with zero counts would otherwise
    read as a copy that only needs every change since the start, and a build cut short
    (its lease lost, its process killed) would be trusted with whatever it had written."""
    meta = CopyMeta(
        copy=copy, gen=0, state=STATE_BROKEN, watermark=Watermark(), layout=layout,
        counts=[0] * layout.size, checksums=[0] * layout.size, version=0, released_at=0.0, ties=ties,
        boards={region: ([0] * layout.size, [0] * layout.size) for region in regions}, lookup_shards=lookup_shards,
        groups=groups, index=index, side=side,
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


def copies_drop(r: redis.Redis, keys: Keys, metas: Iterable[CopyMeta], *, token: int | None = None,
                retire: bool = False) -> None:
    """`copy_drop` of copies whose indexes no other copy reads: each index's data once.

    Every copy's generation moves before any index's key goes: both copies of an index
    read its data, and a reader of the copy dropped second would otherwise find its
    generation unchanged while the data under it was already going (a count of a
    bucket already unlinked reads 0, a rank from it is wrong, and the seqlock passes)."""
    metas = list(metas)
    _fenced(r, keys, token, [command for meta in metas for command in (
        ("HINCRBY", keys.copy_meta(meta.copy), "gen", 1), ("HSET", keys.copy_meta(meta.copy), "state", STATE_BROKEN))])
    dropped: set[str] = set()
    for meta in metas:
        copy_drop(r, keys, meta, token=token, retire=retire, data=meta.index not in dropped)
        dropped.add(meta.index)


def copy_drop(r: redis.Redis, keys: Keys, meta: CopyMeta, *, token: int | None = None,
              retire: bool = False, data: bool = True) -> None:
    """Delete a copy's data keys, its buckets' hidden sets with them (after a layout change
    or before a rebuild into it); with `token`, only while that token holds the lease (an
    epoch rebuilding its target copy) and only in groups no newer token stamped.

    UNLINK, not DEL: the keys are gone at once either way, but DEL frees a big bucket
    in the server's only thread (a 9M-member sorted set: seconds, every client stalls
    and ours times out); UNLINK frees it in the background. The group fences stay: they
    keep the tokens that fence the copy's next contents. `retire`: the copy's name is
    never used again (a rebuild's replaced or discarded copies), so its fences go too,
    each its group's last write. The index is both sides' data: only a caller dropping
    both copies that read it drops it (`copies_drop`); `data` False drops the meta alone.
    """
    if not data:
        _fenced(r, keys, token, [("UNLINK", keys.copy_meta(meta.copy))])
        return
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
    """The season's two copies, the two sides of one index: the current one and the one
    the next epoch updates. "0" and "1" until a new index (a rebuild's shadow, or one an
    epoch built beside a copy it could not update) is published with its own names."""
    raw = r.get(keys.copies)
    return [str(c) for c in orjson.loads(raw)] if raw else list(COPY_NAMES)


def copies_set(r: redis.Redis, keys: Keys, copies: list[str]) -> None:
    r.set(keys.copies, orjson.dumps(copies))


def copies_retiring_mark(r: redis.Redis, keys: Keys, names: Iterable[str], *, token: int) -> None:
    """Record copies about to be replaced by a new index, before the pointer names it: a
    coordinator that dies before dropping them leaves the record to its successor."""
    _fenced(r, keys, token, [("SADD", keys.retiring, *names)])


def copies_retiring(r: redis.Redis, keys: Keys) -> list[str]:
    """The copies recorded as replaced that the season's copies no longer name."""
    recorded = r.smembers(keys.retiring)
    if not recorded:
        return []
    live = set(copies_get(r, keys))
    return sorted(name for raw in recorded if (name := raw.decode() if isinstance(raw, bytes) else raw) not in live)


def copies_retired(r: redis.Redis, keys: Keys, names: Iterable[str], *, token: int) -> None:
    """Forget copies recorded as replaced, once dropped."""
    names = list(names)
    if names:
        _fenced(r, keys, token, [("SREM", keys.retiring, *names)])


def copy_begin_mutation(r: redis.Redis, keys: Keys, token: int | None, meta: CopyMeta, *,
                        state: str = STATE_APPLYING, upto: Watermark | None = None) -> CopyMeta:
    """Bump the copy's generation before touching it: readers of its old version retry.

    `state`: STATE_BROKEN for a build, whose counts and watermark land only at its end.
    `upto`: the end of the range about to be applied (CopyMeta.applying_upto)."""
    key = keys.copy_meta(meta.copy)
    _fenced(r, keys, token, [("HINCRBY", key, "gen", 1), ("HSET", key, "state", state, "applying_upto",
                                                          "" if upto is None else upto.dump())])
    meta.gen += 1
    meta.state = state
    meta.applying_upto = upto
    return meta


# A player's lookup and region-shard fields as read (None: no field), both sides' parts.
Fields = tuple[bytes | None, bytes | None]


def copy_fields_get(r: redis.Redis, keys: Keys, meta: CopyMeta, player_ids: Iterable[str]) -> dict[str, Fields]:
    """Each player's lookup field and (in a season with regions) region-shard field in the
    copy's index, both sides' parts: one HMGET per shard holding some of them,
    SHARD_SCAN_BATCH shards a round trip (an epoch's 10,000 changes name ~10,000 shards of
    a 10M-player index)."""
    order = list(shards_of(player_ids, meta.lookup_shards).items())
    regional = bool(meta.boards)
    out: dict[str, Fields] = {}
    for start in range(0, len(order), SHARD_SCAN_BATCH):
        batch = order[start:start + SHARD_SCAN_BATCH]
        commands = [("HMGET", keys.lookup(meta.index, shard, groups=meta.groups), *players) for shard, players in batch]
        if regional:
            commands += [("HMGET", keys.region(meta.index, shard, groups=meta.groups), *players)
                         for shard, players in batch]
        replies = round_trip(r, commands)
        for at, (_, players) in enumerate(batch):
            regions = replies[len(batch) + at] if regional else [None] * len(players)
            for player_id, value, region in zip(players, replies[at], regions, strict=True):
                out[player_id] = (value, region)
    return out


class CopyMismatch(RuntimeError):
    """A chunk's replies show the copy did not hold what its plan assumed."""


def copy_finish(r: redis.Redis, keys: Keys, token: int | None, meta: CopyMeta, *, watermark: Watermark,
                version: int, replicas: int = 0, replicas_ms: int = 0) -> CopyMeta:
    """Mark the copy ready at `watermark`.

    Every group fence gets the copy's generation first (the one its manifests carry), so
    a reader of a group this mutation did not write still finds the generation it expects.
    `replicas`: the copy is made ready only once that many replicas of every master it
    lives on acknowledged its writes (copy_groups_stamp); else it is marked broken (the
    next epoch rebuilds it) and ReplicasBehind is raised: a copy a failover could take
    writes from is never published."""
    try:
        copy_groups_stamp(r, keys, meta.index, meta.groups, token=token, gen=meta.gen, side=meta.side,
                          replicas=replicas, replicas_ms=replicas_ms)
    except ReplicasBehind:
        copy_broken_mark(r, keys, meta.copy, token=token)
        raise
    meta.watermark = watermark
    meta.state = STATE_READY
    meta.version = version
    meta.applying_upto = None
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
    replies = round_trip(r, [seen_card_call(
        bucket=keys.bucket(meta.index, layout_id, bucket, board, groups=meta.groups),
        hidden=keys.hidden(meta.index, meta.side, layout_id, bucket, board, groups=meta.groups))
        for board, bucket in checks]) if checks else []
    problems = []
    for (board, bucket), actual in zip(checks, (int(n) for n in replies), strict=True):
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
    every field counts: HLEN. Otherwise the fields are read (SEEN_FIELDS_SUM). Counted by
    HLEN, they are checked again afterwards: the other side's epoch may have begun
    meanwhile (a reader holds no lease), and then they are counted again by reading them."""
    hidden = list(hidden)

    def one_sided() -> bool:
        return not hidden or not any(round_trip(r, [("EXISTS", key) for key in hidden]))

    if one_sided():
        sizes = _shard_sizes(r, keys, index, shards, regions=regions, groups=groups, script=_HLEN_SUM, argv=[])
        if one_sided():
            return sizes
    return _shard_sizes(r, keys, index, shards, regions=regions, groups=groups, script=SEEN_FIELDS_SUM, argv=[side])


def _shard_sizes(r: redis.Redis, keys: Keys, index: str, shards: int, *, regions: bool, groups: int, script: str,
                 argv: list[Any]) -> tuple[int, int]:
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
    values = [value for (bucket, _), reply in zip(plan, replies, strict=True)
              for value in window_values(reply, layout=meta.layout, ties=meta.ties, bucket=bucket)]
    entries = [entry.as_dict() for entry in ranked_values(values)]
    if meta.ties is not None:
        # Where a page after an entry starts needs its whole value (api.cursors): kept in
        # the manifest, left out of what players see (Manifest.shown_top).
        for entry, (_, value) in zip(entries, values, strict=True):
            entry["reached_ms"] = value[1]  # type: ignore[index]
    return entries


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
        yield from window_values(reply, layout=layout, ties=ties, bucket=bucket)
        if len(reply) < 2 * batch:
            return
        start += batch


def bucket_checksum_scan(r: redis.Redis, keys: Keys, meta: CopyMeta, bucket: int, board: str = "") -> tuple[int, int]:
    """(count, checksum) of a bucket of a board of a copy by a full scan."""
    pairs = [(p, value_token(v))
             for p, v in bucket_values_scan(r, keys, meta.index, meta.layout, meta.ties, bucket, board=board,
                                            groups=meta.groups, side=meta.side)]
    return len(pairs), checksum_of(pairs)
