"""A range of the change stream written into one side of an index (core.epoch.RangeValues):
what an epoch's part, a copy's catch-up and a rebuild's catch-up do.

Each player's ops come from core.shared_index.change_plan, planned from both sides'
lookup (and region-shard) fields as read first, so the other side keeps serving exact
answers from the same buckets while this one is written. The writes go in two phases:

1. every bucket write (entries and hidden records, by slot group: one fenced script a
   group and piece, every master at once);
2. then every lookup and region-shard field (by slot group likewise).

A player's lookup part is what the next planner reads, and it moves only once all of
their bucket writes landed: a write cut short (a killed process, a lost lease) leaves
each player either untouched, or with some bucket writes landed and their lookup as it
was, or done. Applying the range again plans the same ops from the same lookup (and none
for a player already done), and re-sends them: an entry already added or removed, a
record already hidden or shown, changes nothing. So a range can be applied again after
any crash (`resume`), and a part run twice writes nothing new; the counts and checksums
the side gains come from the stream (core.epoch.range_deltas), not from what the writes
report, and the caller verifies the touched buckets against them.

A first application checks every op's reply against what the plan expects (members,
hidden records and fields added or removed): an index that did not hold what the plan
assumed is marked broken and CopyMismatch is raised. A resumed one cannot tell a write
it made before from one it makes now; it relies on the caller's verification of counts.
In both, a player whose side holds a value the range never gave them is a mismatch.
"""

from __future__ import annotations

import sys
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import redis

from leaderboard.core.epoch import RangeValues
from leaderboard.core.shared_index import (
    BucketOp,
    Seen,
    Views,
    change_plan,
    lookup_decode,
    lookup_encode,
)
from leaderboard.core.slots import bucket_group, shard_group
from leaderboard.core.tiebreak import index_key, lookup_value, value_token
from leaderboard.views.rankview.copies import (
    CopyMeta,
    CopyMismatch,
    Fields,
    copy_broken_mark,
    copy_fields_get,
)
from leaderboard.views.rankview.fence import GroupOp, group_write_call, groups_send
from leaderboard.views.rankview.keys import Keys
from leaderboard.views.rankview.shared import SIDES, bucket_writes, bucket_writes_expected

# Players whose bucket writes go in one script per slot group: a player's entry and its
# hidden record must change in one script (a reader in between would see an entry the
# other side must not), so bucket writes are cut between players, never inside one's. One
# script holds its master's only thread while it runs.
CHUNK_PLAYERS = 2000
# Fields a script of lookup and region-shard writes holds at most (fields are independent).
PIECE_WRITES = 4000
# Scripts sent a round trip, every master at once.
PIECES_PER_SEND = 256

# No part of a player the index lacks.
_NOWHERE: Views = (None, None)


# One script's worth of a slot group's writes: its ops, each with the reply a first
# application expects of it.
_Writes = list[tuple[GroupOp, int]]


@dataclass(slots=True)
class _Plan:
    """The writes of a range on one side of an index: the bucket writes of each chunk of
    players by slot group (one script each), and the field writes by slot group."""

    buckets: list[dict[int, _Writes]] = field(default_factory=list)
    fields: dict[int, _Writes] = field(default_factory=dict)
    moved: int = 0


def copy_range_apply(r: redis.Redis, keys: Keys, token: int | None, meta: CopyMeta, values: RangeValues, *,
                     resume: bool = False, fields: dict[str, Fields] | None = None,
                     progress: Callable[[], None] | None = None) -> int:
    """Give side `meta.side` of index `meta.index` every player's value after the range
    (values.new, and values.new_region in a season with regional boards). `resume`: the
    side may hold some of the range's writes already (an earlier application cut short).
    `fields`: the players' lookup and region-shard fields, when the caller read them.
    `progress`: called as the apply gets on (fields read, planned, each round trip landed).
    Returns how many players' side changed."""
    if not values.new:
        return 0
    tick = progress or (lambda: None)
    if fields is None:
        fields = copy_fields_get(r, keys, meta, values.new)
        tick()
    try:
        plan = _range_plan(keys, meta, values, fields, resume=resume)
        tick()
        _send(r, keys, token, meta, [(group, writes) for chunk in plan.buckets for group, writes in chunk.items()],
              check=not resume, progress=tick)
        _send(r, keys, token, meta, list(_field_pieces(plan.fields)), check=not resume, progress=tick)
    except CopyMismatch:
        copy_broken_mark(r, keys, meta.copy, token=token)
        raise
    return plan.moved


def _range_plan(keys: Keys, meta: CopyMeta, values: RangeValues, fields: dict[str, Fields], *,
                resume: bool) -> _Plan:
    side, ties, layout = meta.side, meta.ties, meta.layout
    regional = bool(meta.boards)
    places: dict[str, tuple[int, int]] = {}

    def place(text: str) -> tuple[int, int]:
        # One parse a distinct value: a range's players share many old and new values.
        found = places.get(text)
        if found is None:
            found = places[text] = index_key(layout, ties, lookup_value(ties, text))
        return found

    plan = _Plan()
    ops: list[BucketOp] = []
    board_ops: dict[str, list[BucketOp]] = {}
    lookups: list[tuple[str, bytes | None, str | None]] = []
    region_fields: list[tuple[str, bytes | None, str | None]] = []
    new_region = values.new_region or {}
    moved = 0
    names = {board: _KeyNames(keys, meta.index, layout.layout_id, board, meta.groups) for board in ("", *meta.boards)}
    for n, (player_id, new) in enumerate(values.new.items()):
        if n and n % CHUNK_PLAYERS == 0:
            plan.buckets.append(_bucket_ops(meta, names, ops, board_ops))
            ops, board_ops = [], {}
        raw, region_raw = fields[player_id]
        views = _views(raw)
        mine = views[side]
        text = None if new is None else str(value_token(new))  # None: off every board (hidden)
        if (None if mine is None else mine.value) != text:
            _held_check(player_id, mine, values, resume=resume)
        planned, after = change_plan(copy=side, player_id=player_id, views=views, value=text, place=place)
        if planned:
            ops += planned
            moved += 1
        if after != views:
            lookups.append((player_id, raw, lookup_encode(after)))
        if not regional:
            continue
        placed = _views(region_raw)
        home = placed[side]
        was = home.value if home is not None else ""
        now = new_region.get(player_id, was)
        parts = list(placed)
        parts[side] = None
        for board in {was, now} & meta.boards.keys():
            # The board's entries of the player: each side's value under the name its
            # region-shard part gives, for the sides placing them on this board.
            seen: list[Seen | None] = [None, None]
            for s in SIDES:
                held, where = views[s], placed[s]
                if held is not None and where is not None and where.value == board:
                    seen[s] = Seen(held.value, second=where.second)
            board_views: Views = (seen[0], seen[1])
            planned, on_board = change_plan(copy=side, player_id=player_id, views=board_views,
                                            value=text if board == now else None, place=place)
            if planned:
                board_ops.setdefault(board, []).extend(planned)
            entry = on_board[side]
            if board == now and entry is not None:
                parts[side] = Seen(now, second=entry.second)
        placed_after: Views = (parts[0], parts[1])
        if placed_after != placed:
            region_fields.append((player_id, region_raw, lookup_encode(placed_after)))
    plan.buckets.append(_bucket_ops(meta, names, ops, board_ops))
    plan.moved = moved
    _field_ops(keys, meta, plan, lookups, region_fields)
    return plan


def _views(raw: bytes | None) -> Views:
    """Both sides' parts of a lookup or region-shard field (the usual field, one value both
    sides see, without the general decoder)."""
    if raw is None:
        return _NOWHERE
    if b"|" not in raw:
        seen = Seen(raw[1:].decode(), True) if raw[:1] == b"~" else Seen(raw.decode())
        if not seen.value:
            return lookup_decode(raw)  # refused with its reason
        return seen, seen
    return lookup_decode(raw)


def _held_check(player_id: str, mine: Seen | None, values: RangeValues, *, resume: bool) -> None:
    """What the side holds of a player the range moves must be their value before the range
    (or, resumed, any value the range gave them): anything else means the index is not the
    one the watermark says, and nothing is written."""
    old = values.old[player_id]
    held = None if mine is None else mine.value
    if held == (None if old is None else str(value_token(old))):
        return
    # None taken: the range hid the player (off every board), which a resumed apply may have done.
    if resume and held in {None if v is None else str(value_token(v)) for v in values.taken[player_id]}:
        return
    raise CopyMismatch(f"player {player_id}: the side holds {held!r}, the stream says "
                       f"{None if old is None else value_token(old)!r} before this range")


def _bucket_ops(meta: CopyMeta, names: dict[str, _KeyNames], ops: list[BucketOp],
                board_ops: dict[str, list[BucketOp]]) -> dict[int, _Writes]:
    """One chunk's bucket writes on every board (rankview.shared.bucket_writes: per bucket,
    removals before additions) by slot group, each with the reply it must give."""
    out: dict[int, _Writes] = {}
    for board, planned in (("", ops), *board_ops.items()):
        if not planned:
            continue
        board_names = names[board]
        writes = bucket_writes(planned, bucket_key=board_names.bucket, hidden_key=board_names.hidden)
        for bucket, bucket_ops in writes.items():
            group = out.setdefault(bucket_group(bucket=bucket, groups=meta.groups, board=board), [])
            group += zip(bucket_ops, bucket_writes_expected(bucket_ops), strict=True)
    return out


class _KeyNames:
    """One board's bucket and hidden-set key names, each made once per apply (a range
    names the same few buckets thousands of times)."""

    def __init__(self, keys: Keys, index: str, layout_id: int, board: str, groups: int):
        self.keys, self.index, self.layout_id, self.board, self.groups = keys, index, layout_id, board, groups
        self._buckets: dict[int, str] = {}
        self._hidden: dict[tuple[int, int], str] = {}

    def bucket(self, bucket: int) -> str:
        name = self._buckets.get(bucket)
        if name is None:
            name = self._buckets[bucket] = self.keys.bucket(self.index, self.layout_id, bucket, self.board,
                                                            groups=self.groups)
        return name

    def hidden(self, side: int, bucket: int) -> str:
        name = self._hidden.get((side, bucket))
        if name is None:
            name = self._hidden[side, bucket] = self.keys.hidden(self.index, side, self.layout_id, bucket,
                                                                 self.board, groups=self.groups)
        return name


def _field_ops(keys: Keys, meta: CopyMeta, plan: _Plan, lookups: list[tuple[str, bytes | None, str | None]],
               region_fields: list[tuple[str, bytes | None, str | None]]) -> None:
    """The lookup and region-shard field writes (an HSET and an HDEL per shard) by slot
    group, each with the fields it must create or delete."""
    index, groups, shards = meta.index, meta.groups, meta.lookup_shards
    crc32 = zlib.crc32
    for key_of, changed in ((keys.lookup, lookups), (keys.region, region_fields)):
        sets: dict[int, tuple[list[Any], list[int]]] = {}
        dels: dict[int, list[str]] = {}
        for player_id, raw, text in changed:
            shard = crc32(player_id.encode()) % shards  # keys.lookup_shard, inlined
            if text is None:
                found = dels.get(shard)
                if found is None:
                    found = dels[shard] = []
                found.append(player_id)
            else:
                entry = sets.get(shard)
                if entry is None:
                    entry = sets[shard] = ([], [0])
                entry[0].extend((player_id, text))
                if raw is None:
                    entry[1][0] += 1
        for shard, (pairs, created) in sets.items():
            plan.fields.setdefault(shard_group(shard=shard, groups=groups), []).append(
                (("HSET", key_of(index, shard, groups=groups), pairs), created[0]))
        for shard, players in dels.items():
            plan.fields.setdefault(shard_group(shard=shard, groups=groups), []).append(
                (("HDEL", key_of(index, shard, groups=groups), players), len(players)))


def _field_pieces(by_group: dict[int, _Writes]) -> Iterator[tuple[int, _Writes]]:
    """Each group's field writes in pieces of about PIECE_WRITES fields, cut between shards
    (a shard holds a few dozen players: one HSET and one HDEL each at most)."""
    for group, group_ops in by_group.items():
        piece: _Writes = []
        size = 0
        for op, want in group_ops:
            width = len(op[2]) // (2 if op[0] == "HSET" else 1)
            if piece and size + width > PIECE_WRITES:
                yield group, piece
                piece, size = [], 0
            piece.append((op, want))
            size += width
        if piece:
            yield group, piece


def _send(r: redis.Redis, keys: Keys, token: int | None, meta: CopyMeta, scripts: list[tuple[int, _Writes]], *,
          check: bool, progress: Callable[[], None]) -> None:
    """One phase's scripts (slot group, writes), PIECES_PER_SEND a round trip, every master
    at once; with more than one round trip, a helper thread sends round i while this one
    encodes round i+1. `check`: every reply against its plan (CopyMismatch at the first
    that differs)."""
    calls: list[tuple[str, tuple[Any, ...], list[GroupOp], list[int]]] = []
    for group, writes in scripts:
        fence = keys.fence(meta.index, group)
        ops = [op for op, _ in writes]
        calls.append((fence, group_write_call(fence, token, meta.gen, ops, side=meta.side), ops,
                      [want for _, want in writes]))
    rounds = [calls[i:i + PIECES_PER_SEND] for i in range(0, len(calls), PIECES_PER_SEND)]

    def landed(batch: list[tuple[str, tuple[Any, ...], list[GroupOp], list[int]]], replies: list[Any]) -> None:
        _landed(batch, replies, check=check)
        progress()

    if len(rounds) <= 1:
        for batch in rounds:
            landed(batch, groups_send(r, [(fence, call) for fence, call, _, _ in batch]))
        return
    _rounds_send(r, rounds, landed)


def _rounds_send(r: redis.Redis, rounds: list[list[tuple[str, tuple[Any, ...], list[GroupOp], list[int]]]],
                 landed: Callable[[Any, list[Any]], None]) -> None:
    sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="range-apply")
    # The sender needs the GIL for a moment when each reply arrives; with the default
    # 5 ms switch interval it waits for this thread and Redis sits idle.
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(min(switch_interval, 0.0005))
    try:
        in_flight: tuple[Future[list[Any]], Any] | None = None
        for batch in rounds:
            future = sender.submit(groups_send, r, [(fence, call) for fence, call, _, _ in batch])
            time.sleep(0)  # hand the GIL over: the sender starts now
            if in_flight is not None:
                landed(in_flight[1], in_flight[0].result())
            in_flight = (future, batch)
        if in_flight is not None:
            landed(in_flight[1], in_flight[0].result())
    finally:
        sender.shutdown(wait=True)
        sys.setswitchinterval(switch_interval)


def _landed(batch: Iterable[tuple[str, tuple[Any, ...], list[GroupOp], list[int]]], replies: list[Any], *,
            check: bool) -> None:
    if not check:
        return
    for (fence, _, ops, expected), reply in zip(batch, replies, strict=True):
        got = [int(n) for n in reply]
        if got != expected:
            wrong = [f"{op[0]} {op[1]}: {n}, expected {want}"
                     for op, n, want in zip(ops, got, expected, strict=True) if n != want]
            raise CopyMismatch(f"{fence}: " + "; ".join(wrong[:5]))
