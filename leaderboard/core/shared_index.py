"""One physical index for the two versions a season serves: the rules, without Redis.

The views keep two copies of the bucketed index, one serving the published version
while the epoch brings the other up to date. Two complete copies would cost two
sorted-set members a player (~240 bytes at 10M players, docs/benchmarks.md, Memory).
The two versions differ only by the players an epoch changed, so one set of buckets
holds both, each copy one side of it:

- Every player has one entry in the buckets while the two versions agree on their value,
  named by their id. A player whose value differs between the versions has two entries,
  the id and the id followed by SECOND ("\\x00" sorts it right after the id and before any
  other id, so equal keys still order players by id). Each entry is seen by one copy or
  both.
- Beside each bucket, each copy has a small hidden set of the bucket's entries it must
  not see. Its members are lex-ordered text, `hidden_member(key, name)`, whose byte order
  is the bucket's own (sort key, then name): one ZLEXCOUNT counts a copy's hidden entries
  ahead of any (key, name), so a copy's count ahead of a player in a bucket is ZCOUNT
  minus that, and its position ZRANK minus that.
- One lookup holds both copies' values of a player (`lookup_encode`): the bare value text
  while the copies share the entry, both parts while they do not. A part says which of
  the player's two names that copy's entry has.

A copy's apply (`change_plan`) never changes what the other copy sees: it removes only
entries hidden from the other copy (with their hidden record, in the same bucket write)
and adds entries hidden from it (likewise), and it leaves the other copy's lookup part as
it was. So the serving copy stays exact while the other is written, as long as each
bucket's writes are one atomic write and a reader reads a bucket and its hidden set
atomically. When the lagging copy applies the same change, its old entry (now its alone)
is removed and the other copy's new entry is shown to it: the player is back to one
entry, named either way.

Pure: no Django, no Redis. Reference for the scripts that run it in Redis.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NamedTuple

from leaderboard.core.buckets import MAX_SCORE_LIMIT
from leaderboard.core.tiebreak import KEY_LIMIT

# A player's second entry's name is their id followed by this byte. Player ids are
# [A-Za-z0-9_.:-], so no other id starts with an id followed by it.
SECOND = "\x00"
# Sorted-set keys run from -MAX_SCORE_LIMIT (-score on a shared board) to below 2**53 (a
# first_reached key). A hidden member spells a negative key as "0" and the key plus
# MAX_SCORE_LIMIT, a nonnegative one as "1" and the key, each in 14 fixed-width lowercase hex
# digits, which order as the numbers do. Not one offset for all: the scripts compute the
# same text with doubles, and a key near 2**53 plus any offset is no longer exact.
HIDDEN_KEY_OFFSET = MAX_SCORE_LIMIT
HIDDEN_KEY_DIGITS = 14
# The lookup's separator of the two copies' parts, and the mark of a part whose entry is
# the player's second one. Lookup values are "score" or "score:reached_ms".
_PARTS = "|"
_SECOND_MARK = "~"

# The ops of a bucket write (BucketOp.op).
Op = Literal["add", "remove", "hide", "show"]
ADD: Op = "add"
REMOVE: Op = "remove"
HIDE: Op = "hide"
SHOW: Op = "show"


class SharedIndexError(ValueError):
    """A value the shared index cannot hold: a lookup text it could not read back, a sort
    key outside the hidden sets' encoding."""


class Seen(NamedTuple):
    """What one copy sees of a player: the value's lookup text and which entry holds it.
    (A tuple: an epoch makes two a changed player, ~4x faster than a frozen dataclass.)"""

    value: str
    second: bool = False


# What copy 0 and copy 1 see of one player (None: not on that copy's board).
Views = tuple[Seen | None, Seen | None]


class BucketOp(NamedTuple):
    """One change to a bucket, always applied with the rest of that bucket's ops at once.

    ADD: the entry (key, name) joins the bucket, hidden from `copy` (recorded in its hidden
    set). REMOVE: the entry leaves the bucket and `copy`'s hidden set. HIDE: `copy` stops
    seeing the entry. SHOW: `copy` sees it again."""

    op: Op
    bucket: int
    key: int
    name: str
    copy: int


def entry_name(player_id: str, second: bool) -> str:
    return player_id + SECOND if second else player_id


def entry_player(name: str) -> str:
    """The player of an entry's name (either of their two)."""
    return name[:-1] if name.endswith(SECOND) else name


def hidden_member(key: int, name: str = "") -> str:
    """An entry as a member of a hidden set, where every score is 0 and members order by
    their bytes: the key's sign, the key in fixed-width hex, then the name. With an empty
    name, the lower bound of every entry of that key."""
    if 0 <= key < KEY_LIMIT:
        return f"1{key:0{HIDDEN_KEY_DIGITS}x}{name}"
    if -HIDDEN_KEY_OFFSET <= key < 0:
        return f"0{key + HIDDEN_KEY_OFFSET:0{HIDDEN_KEY_DIGITS}x}{name}"
    # Out of range, the fixed width would no longer order as the keys do.
    raise SharedIndexError(f"sort key {key} is outside the hidden sets' encoding")


def lookup_encode(views: Views) -> str | None:
    """The lookup's text for a player, or None when neither copy has them (no field)."""
    first, second = views
    if first == second:
        return None if first is None else _part(first)
    return f"{_part(first)}{_PARTS}{_part(second)}"


def lookup_decode(raw: str | bytes) -> Views:
    text = raw.decode() if isinstance(raw, bytes) else raw
    if _PARTS not in text:
        seen = _parse_part(text)
        if seen is None:
            raise SharedIndexError(f"empty lookup value {text!r}")
        return seen, seen
    first, _, second = text.partition(_PARTS)
    views = (_parse_part(first), _parse_part(second))
    if views[0] == views[1]:
        raise SharedIndexError(f"lookup value {text!r} names one entry twice")
    return views


def _part(seen: Seen | None) -> str:
    if seen is None:
        return ""
    return _SECOND_MARK + seen.value if seen.second else seen.value


def _parse_part(text: str) -> Seen | None:
    if not text:
        return None
    second = text.startswith(_SECOND_MARK)
    value = text[1:] if second else text
    if not value:
        raise SharedIndexError(f"lookup part {text!r} has no value")
    return Seen(value, second=second)


def change_plan(*, copy: int, player_id: str, views: Views, value: str | None,
                place: Callable[[str], tuple[int, int]]) -> tuple[list[BucketOp], Views]:
    """The bucket ops that give copy `copy` the player's new value (None: off the board),
    and the views after them. `views` is what both copies see now; `place` maps a value's
    lookup text to its (bucket, sorted-set key). Idempotent: a copy that already sees
    `value` gets no op. What the other copy sees is never changed."""
    other = 1 - copy
    mine, theirs = views[copy], views[other]
    if (mine.value if mine is not None else None) == value:
        return [], views
    ops: list[BucketOp] = []
    if mine is not None:
        bucket, key = place(mine.value)
        name = entry_name(player_id, mine.second)
        if mine == theirs:
            ops.append(BucketOp(HIDE, bucket, key, name, copy))
        else:
            ops.append(BucketOp(REMOVE, bucket, key, name, other))
    seen: Seen | None = None
    if value is not None:
        bucket, key = place(value)
        if theirs is not None and theirs.value == value:
            seen = theirs
            ops.append(BucketOp(SHOW, bucket, key, entry_name(player_id, seen.second), copy))
        else:
            # The name the other copy's entry does not have (the id when it has none).
            seen = Seen(value, second=theirs is not None and not theirs.second)
            ops.append(BucketOp(ADD, bucket, key, entry_name(player_id, seen.second), other))
    after: Views = (seen, theirs) if copy == 0 else (theirs, seen)
    return ops, after


def physical_index(visible: int, hidden_through: Callable[[int], int]) -> int:
    """The bucket index of a copy's `visible`-th entry (0-based) in that bucket.

    `hidden_through(i)`: how many of the bucket's entries 0..i the copy does not see (one
    ZRANGE of entry i and one ZLEXCOUNT of the hidden set up to it). The least i with
    i = visible + hidden_through(i) is the answer, reached from below in as many steps as
    there are runs of hidden entries in the way (usually none or one). The caller checks
    the copy holds more than `visible` entries in the bucket."""
    at = visible
    while True:
        then = visible + hidden_through(at)
        if then == at:
            return at
        at = then
