"""Seasons whose ties go to whoever reached the score first (docs/rules.md, Ties decided by who got there first).

Order is (score desc, reached_at asc, player_id asc by bytes); two players share a rank
only when both their score and their reached_at (to the millisecond) are equal.

A Redis sorted set orders members by a double, then by member bytes. A first_reached
season gives each member one exact integer key below 2**53 (every such integer is a
double exactly; a float mixing a score and a timestamp would not be):

    key = (bucket_high - score) << bits | reached_ms

`reached_ms` is reached_at in milliseconds since the season's start (0..span, where the
ledger admits reached_at only inside [starts_at, cutoff]), `bits` the width of the span,
and `bucket_high` the highest score of the member's bucket. Ascending keys are then
score descending, then reached_at ascending, and member bytes break equal keys: the
display order in one ZRANGE, and ZCOUNT(-inf, (key) counts exactly the players ahead
that do not share the rank. Keys are relative to the bucket, so a bucket (score
range) only has to be narrow enough that width << bits stays within 2**53: checked when
the season is created and whenever its layout changes (first_reached_problem).

Pure: no Django, no Redis. Shared seasons never get here: their key stays -score.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from leaderboard.core.season_options import TIE_BREAK_FIRST_REACHED

if TYPE_CHECKING:  # buckets imports events, which imports this module
    from leaderboard.core.buckets import BucketLayout

REJECT_REACHED_BEFORE_START = "reached_before_season_start"
REJECT_REACHED_AFTER_CUTOFF = "reached_after_cutoff"

# The largest integer every smaller one of which is exactly a double.
KEY_LIMIT = 2**53
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


def instant_ms(instant: datetime) -> int:
    """Milliseconds since 1970 of an aware instant, sub-millisecond digits truncated."""
    return (instant - _EPOCH) // _MS


def truncate_ms(instant: datetime) -> datetime:
    """The instant with its sub-millisecond digits dropped (reached_at's precision)."""
    return instant.replace(microsecond=instant.microsecond - instant.microsecond % 1000)


def reached_text(reached_at: datetime | None) -> str:
    """reached_at as the API and the FINAL hash write it: RFC 3339 in UTC, to the
    millisecond ("" for a row from before it was recorded)."""
    if reached_at is None:
        return ""
    return reached_at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def sort_key_encode(score: int, reached_ms: int, *, high: int, bits: int) -> int:
    """The sorted-set score of (score, reached_ms) in a bucket whose highest score is `high`."""
    return ((high - score) << bits) | reached_ms


def sort_key_decode(key: int, *, high: int, bits: int) -> tuple[int, int]:
    """(score, reached_ms) back from `sort_key_encode`'s key."""
    return high - (key >> bits), key & ((1 << bits) - 1)


@dataclass(frozen=True, slots=True)
class FirstReached:
    """A first_reached board's encoding: published in its manifest and copy metadata, so
    a reader decodes keys from the version alone, with no database read."""

    origin_ms: int  # the season's starts_at, ms since 1970
    bits: int

    def reached_ms(self, reached_at: datetime | None) -> int:
        # None: a ledger row from before reached_at existed; it counts as reached at the start.
        return 0 if reached_at is None else instant_ms(reached_at) - self.origin_ms

    def reached_at(self, reached_ms: int) -> datetime:
        return _EPOCH + (self.origin_ms + reached_ms) * _MS

    def key(self, score: int, reached_ms: int, high: int) -> int:
        return sort_key_encode(score, reached_ms, high=high, bits=self.bits)

    def decode(self, key: int, high: int) -> tuple[int, int]:
        return sort_key_decode(key, high=high, bits=self.bits)

    def as_dict(self) -> dict[str, Any]:
        return {"rule": TIE_BREAK_FIRST_REACHED, "origin_ms": self.origin_ms, "bits": self.bits}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FirstReached:
        return cls(origin_ms=int(data["origin_ms"]), bits=int(data["bits"]))


# A player's value in a board's index: the score (a shared season), or (score, reached_ms)
# (a first_reached one). The epoch planner, the copy builds and the readers carry either.
IndexValue = int | tuple[int, int]


def value_score(value: IndexValue) -> int:
    return value if isinstance(value, int) else value[0]


def value_token(value: IndexValue) -> int | str:
    """What the lookup hash holds and the bucket checksum hashes for this value: the score
    itself in a shared season (as always), "score:reached_ms" in a first_reached one."""
    return value if isinstance(value, int) else lookup_text(*value)


def lookup_text(score: int, reached_ms: int) -> str:
    """A first_reached player's entry in the lookup hash, and its checksum token: all a
    reader needs to compute the player's key (a shared season's entry is the bare score)."""
    return f"{score}:{reached_ms}"


def lookup_parse(raw: bytes | str) -> tuple[int, int]:
    text = raw.decode() if isinstance(raw, bytes) else raw
    score, _, reached = text.partition(":")
    return int(score), int(reached)


def first_reached_of(*, starts_at: datetime, cutoff: datetime) -> FirstReached:
    """The encoding of a season: reached_ms spans 0..cutoff - starts_at."""
    span = instant_ms(cutoff) - instant_ms(starts_at)
    return FirstReached(origin_ms=instant_ms(starts_at), bits=max(1, span.bit_length()))


def reached_rejection(*, reached_at: datetime, starts_at: datetime, cutoff: datetime) -> str | None:
    """Why a first_reached season does not admit this reached_at (its key would fall
    outside the season's span), or None. Compared in whole milliseconds, as keys are."""
    if instant_ms(reached_at) < instant_ms(starts_at):
        return REJECT_REACHED_BEFORE_START
    if instant_ms(reached_at) > instant_ms(cutoff):
        return REJECT_REACHED_AFTER_CUTOFF
    return None


def first_reached_problem(*, layout: BucketLayout, starts_at: datetime, cutoff: datetime) -> str | None:
    """None when every key of the season fits below 2**53, else a sentence saying why not.

    A bucket of width w needs w << bits <= 2**53. Splits only narrow buckets, but every
    layout a first_reached season is given is checked here all the same.
    """
    ties = first_reached_of(starts_at=starts_at, cutoff=cutoff)
    widest = max(high - low + 1 for low, high in (layout.range_of(b) for b in range(layout.size)))
    if widest << ties.bits <= KEY_LIMIT:
        return None
    allowed = KEY_LIMIT >> ties.bits
    longest = timedelta(milliseconds=(1 << ((KEY_LIMIT // widest).bit_length() - 1)) - 1)
    return (f"a first_reached season's sort keys must fit in 53 bits: with {ties.bits} bits of milliseconds "
            f"for a season of {cutoff - starts_at}, buckets may be at most {allowed} points wide, and the "
            f"widest is {widest}; use narrower buckets or a season of at most {longest}")


def index_key(layout: BucketLayout, ties: FirstReached | None, value: IndexValue) -> tuple[int, int]:
    """(bucket, sorted-set score) of a player's index value: -score on a shared board (its
    key since the start), the encoded key on a first_reached one. ZCOUNT(-inf, (key) in
    that bucket counts the players of the bucket who rank ahead."""
    if isinstance(value, int):
        return layout.bucket_of(value), -value
    assert ties is not None, "a (score, reached_ms) value on a board without a first_reached encoding"
    bucket = layout.bucket_of(value[0])
    return bucket, ties.key(value[0], value[1], layout.range_of(bucket)[1])


def index_value(layout: BucketLayout, ties: FirstReached | None, bucket: int, key: float) -> IndexValue:
    """The value back from a member's sorted-set score in `bucket` (index_key's inverse)."""
    if ties is None:
        return -int(key)
    return ties.decode(int(key), layout.range_of(bucket)[1])


def lookup_value(ties: FirstReached | None, raw: bytes | str) -> IndexValue:
    """A lookup hash entry read back (value_token's inverse)."""
    return int(raw) if ties is None else lookup_parse(raw)
