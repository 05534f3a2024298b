"""The shared index (core.shared_index) in Redis: its bucket writes as fenced group ops,
and its reads as scripts that read a bucket and one copy's hidden set at once.

A bucket's sorted set and both copies' hidden sets of it must live in one slot: a write
changes the bucket and a hidden set together (`bucket_writes`, sent through the group
write script that every fenced write of the views uses), and a read of one copy counts in
the bucket and subtracts from its hidden set in one script, because the other copy's
epoch may be writing the same bucket meanwhile. Redis runs a script whole, so a reader
never sees half a bucket's write.

The views' two copies are the two sides of one index: an epoch writes its copy's side
with `bucket_writes` (rankview.apply.copy_range_apply), and every reader of a copy's buckets
reads through these scripts (one side: its hidden sets and its part of each lookup field).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from leaderboard.core.buckets import BucketLayout
from leaderboard.core.shared_index import (
    ADD,
    HIDDEN_KEY_DIGITS,
    HIDDEN_KEY_OFFSET,
    HIDE,
    REMOVE,
    SHOW,
    BucketOp,
    Seen,
    SharedIndexError,
    entry_player,
    hidden_member,
    lookup_decode,
)
from leaderboard.core.tiebreak import FirstReached, IndexValue, index_value
from leaderboard.views.rankview.fence import GroupOp
from leaderboard.views.rankview.wire import _script_call

# The two sides of a copy's buckets (core.shared_index's copy 0 and copy 1).
SIDES = (0, 1)

# core.shared_index.hidden_member in Lua. Its numbers are doubles, exact below 2**53, and
# string.format('%x') takes a C long (64 bits on the servers the views run on): a key is
# never added to past 2**53, which is why negative and nonnegative keys are spelled apart.
_HIDDEN_MEMBER_LUA = f"""
local function hidden(key, name)
  local k = tonumber(key)
  if k < 0 then return string.format('0%0{HIDDEN_KEY_DIGITS}x', k + {HIDDEN_KEY_OFFSET}) .. name end
  return string.format('1%0{HIDDEN_KEY_DIGITS}x', k) .. name
end
"""

# (ahead, position) of entry ARGV[2] (key ARGV[1]) in the bucket as copy of hidden set
# KEYS[2] sees it: the entries it sees strictly ahead of the key (the rank's share of the
# bucket), and the entry's index among those it sees (nil when the bucket lacks it). With
# ARGV[4] = 1 a third reply: the entries it sees with exactly the key (the entry's tied
# players, itself among them; the percentile's), its hidden ones those whose member starts
# with the key's prefix ARGV[3] (entry names are ASCII, below \255).
_PLACE = """
local key, prefix = ARGV[1], ARGV[3]
local ahead = redis.call('ZCOUNT', KEYS[1], '-inf', '(' .. key) - redis.call('ZLEXCOUNT', KEYS[2], '-', '(' .. prefix)
local index = redis.call('ZRANK', KEYS[1], ARGV[2])
if index then index = index - redis.call('ZLEXCOUNT', KEYS[2], '-', '(' .. prefix .. ARGV[2]) else index = false end
if ARGV[4] ~= '1' then return {ahead, index} end
return {ahead, index, redis.call('ZCOUNT', KEYS[1], key, key)
  - redis.call('ZLEXCOUNT', KEYS[2], '[' .. prefix, '(' .. prefix .. '\255')}
"""

# How many entries the copy of hidden set KEYS[2] sees in bucket KEYS[1] at or ahead of
# (key ARGV[1], name ARGV[2]): those strictly ahead of the key, and those of the key whose
# name is at most the name, found by bisecting the key's members by their bytes (Redis
# orders equal keys so; Lua's own string order follows the server's locale). What the
# other side has in the bucket is taken off as _PLACE does.
_THROUGH = _HIDDEN_MEMBER_LUA + """
local z, h = KEYS[1], KEYS[2]
local key, name = ARGV[1], ARGV[2]
local prefix = hidden(key, '')
local function le(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a <= #b
end
local ahead = redis.call('ZCOUNT', z, '-inf', '(' .. key)
local lo, hi = 0, redis.call('ZCOUNT', z, key, key)
while lo < hi do
  local mid = math.floor((lo + hi) / 2)
  local member = redis.call('ZRANGE', z, ahead + mid, ahead + mid)[1]
  if le(member, name) then lo = mid + 1 else hi = mid end
end
return ahead + lo - redis.call('ZLEXCOUNT', h, '-', '(' .. prefix)
  - redis.call('ZLEXCOUNT', h, '[' .. prefix, '[' .. prefix .. name)
"""

# Up to ARGV[2] entries the copy of hidden set KEYS[2] sees, from its ARGV[1]-th (0-based)
# in the bucket, as ZRANGE WITHSCORES gives them (name, key, ...). The first is found as
# core.shared_index.physical_index does; the rest are read in slices, each slice's hidden
# entries in one ZRANGEBYLEX between its first and last. A side with nothing hidden in the
# bucket (every bucket, while the two sides agree) reads it as one ZRANGE.
_WINDOW = _HIDDEN_MEMBER_LUA + """
local z, h = KEYS[1], KEYS[2]
local want, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
if redis.call('EXISTS', h) == 0 then return redis.call('ZRANGE', z, want, want + limit - 1, 'WITHSCORES') end
local at = want
while true do
  local row = redis.call('ZRANGE', z, at, at, 'WITHSCORES')
  if #row == 0 then return {} end
  local through = want + redis.call('ZLEXCOUNT', h, '-', '[' .. hidden(row[2], row[1]))
  if through == at then break end
  at = through
end
local out = {}
while #out < 2 * limit do
  local rows = redis.call('ZRANGE', z, at, at + limit - 1, 'WITHSCORES')
  if #rows == 0 then break end
  local seen = {}
  local first, last = hidden(rows[2], rows[1]), hidden(rows[#rows], rows[#rows - 1])
  for _, member in ipairs(redis.call('ZRANGEBYLEX', h, '[' .. first, '[' .. last)) do seen[member] = true end
  for i = 1, #rows, 2 do
    if #out < 2 * limit and not seen[hidden(rows[i + 1], rows[i])] then
      out[#out + 1] = rows[i]
      out[#out + 1] = rows[i + 1]
    end
  end
  at = at + #rows / 2
end
return out
"""


# The key of entry ARGV[1] in the bucket when the side of hidden set KEYS[2] sees it, else nil.
_SEEN_KEY = _HIDDEN_MEMBER_LUA + """
local key = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not key or redis.call('ZSCORE', KEYS[2], hidden(key, ARGV[1])) then return false end
return key
"""


# How many fields of the hashes KEYS one side sees (ARGV[1]: 0 or 1): a lookup or region
# shard field holds both sides' parts ("7|~23", either part empty for a player only one
# side has) or one value both see. A shard is a small listpack, read whole.
SEEN_FIELDS_SUM = """
local side, n = tonumber(ARGV[1]), 0
for i = 1, #KEYS do
  for _, value in ipairs(redis.call('HVALS', KEYS[i])) do
    local bar = string.find(value, '|', 1, true)
    if not bar or (side == 0 and bar > 1) or (side == 1 and bar < #value) then n = n + 1 end
  end
end
return n
"""


# How many entries of bucket KEYS[1] the side of hidden set KEYS[2] sees: both counted at
# once, since the other side's epoch may be writing the bucket meanwhile.
_SEEN_CARD = "return redis.call('ZCARD', KEYS[1]) - redis.call('ZCARD', KEYS[2])"


def bucket_writes(ops: Iterable[BucketOp], *, bucket_key: Callable[[int], str],
                  hidden_key: Callable[[int, int], str]) -> dict[int, list[GroupOp]]:
    """Each bucket's ops as the group writes that run them at once (fence.group_write_call),
    by bucket. Every removal of a key comes before its additions: a player's entry can
    leave a bucket and come back into it under the same name with another key.
    `hidden_key(copy, bucket)` names a copy's hidden set of a bucket.

    `ops` hold at most one change_plan per player (one epoch's newest value of each, for
    one copy): two plans for one player could touch the same hidden record twice, which
    the reordering would undo, so that raises SharedIndexError."""
    # Per bucket: [bucket ZREM names, {hidden key: ZREM members}, bucket ZADD pairs,
    # {hidden key: ZADD pairs}]; an epoch makes ~4 of these a changed player.
    buckets: dict[int, tuple[list[Any], dict[str, list[Any]], list[Any], dict[str, list[Any]]]] = {}
    records: set[tuple[str, str]] = set()
    seen_record = records.__contains__
    add_record = records.add
    for op_name, bucket, key, name, copy in ops:
        member = hidden_member(key, name)
        hidden = hidden_key(copy, bucket)
        record = (hidden, member)
        if seen_record(record):
            raise SharedIndexError(f"two ops on the hidden record of {name!r} in bucket {bucket}: "
                                   "one change_plan per player")
        add_record(record)
        lists = buckets.get(bucket)
        if lists is None:
            lists = buckets[bucket] = ([], {}, [], {})
        if op_name == ADD:
            lists[2].extend((key, name))
            lists[3].setdefault(hidden, []).extend((0, member))
        elif op_name == REMOVE:
            lists[0].append(name)
            lists[1].setdefault(hidden, []).append(member)
        elif op_name == HIDE:
            lists[3].setdefault(hidden, []).extend((0, member))
        else:
            assert op_name == SHOW, op_name
            lists[1].setdefault(hidden, []).append(member)
    writes: dict[int, list[GroupOp]] = {}
    for bucket in sorted(buckets):
        zrem, hidden_rem, zadd, hidden_add = buckets[bucket]
        out: list[GroupOp] = []
        key_name = bucket_key(bucket)
        if zrem:
            out.append(("ZREM", key_name, zrem))
        out += [("ZREM", hidden, members) for hidden, members in hidden_rem.items()]
        if zadd:
            out.append(("ZADD", key_name, zadd))
        out += [("ZADD", hidden, pairs) for hidden, pairs in hidden_add.items()]
        writes[bucket] = out
    return writes


def bucket_writes_expected(writes: Iterable[GroupOp]) -> list[int]:
    """What the group write replies for `writes` when the index held what the plan assumed:
    every entry added was absent and every entry removed present."""
    return [len(args) // 2 if command == "ZADD" else len(args) for command, _, args in writes]


def lookup_seen(raw: bytes | str | None, side: int) -> Seen | None:
    """What side `side` sees of a player from their lookup or region-shard field (None:
    no field, or not on that side's board)."""
    return None if raw is None else lookup_decode(raw)[side]


def place_call(*, bucket: str, hidden: str, key: int, name: str, tied: bool = False) -> tuple[Any, ...]:
    """The read of an entry's (ahead, position) in a bucket as one copy sees it; with
    `tied`, (ahead, position, tied): the entries it sees with exactly `key`."""
    return _script_call(_PLACE, [bucket, hidden], [key, name, hidden_member(key), int(tied)])


def through_call(*, bucket: str, hidden: str, key: int, name: str) -> tuple[Any, ...]:
    """The read of how many entries one copy sees in a bucket at or ahead of (key, name) in
    display order (a cursor's place: what is after it starts there)."""
    return _script_call(_THROUGH, [bucket, hidden], [key, name])


def ahead_call(*, bucket: str, hidden: str, key: int) -> tuple[Any, ...]:
    """The read of how many entries one copy sees in a bucket strictly ahead of `key`
    (the place read without an entry: its reply's position is None)."""
    return place_call(bucket=bucket, hidden=hidden, key=key, name="")


def seen_card_call(*, bucket: str, hidden: str) -> tuple[Any, ...]:
    """The read of how many entries one side sees in a bucket."""
    return _script_call(_SEEN_CARD, [bucket, hidden], [])


def seen_key_call(*, bucket: str, hidden: str, name: str) -> tuple[Any, ...]:
    """The read of an entry's sort key in a bucket, None when the bucket lacks it or one
    side does not see it (ZSCORE as that side sees the bucket)."""
    return _script_call(_SEEN_KEY, [bucket, hidden], [name])


def window_call(*, bucket: str, hidden: str, start: int, count: int) -> tuple[Any, ...]:
    """The read of `count` entries one copy sees in a bucket, from its `start`-th (0-based)."""
    return _script_call(_WINDOW, [bucket, hidden], [start, count])


def window_entries(reply: list[Any]) -> list[tuple[str, float]]:
    """A window read's reply as (player_id, sorted-set key) in order: entry names back to
    their players."""
    return [(entry_player(reply[i].decode()), float(reply[i + 1])) for i in range(0, len(reply), 2)]


def window_values(reply: list[Any], *, layout: BucketLayout, ties: FirstReached | None,
                  bucket: int) -> list[tuple[str, IndexValue]]:
    """A window read's reply from `bucket` as (player_id, value) in display order: the one
    decoder of the index's entries (scores, or first_reached (score, reached_ms))."""
    return [(player, index_value(layout, ties, bucket, key)) for player, key in window_entries(reply)]
