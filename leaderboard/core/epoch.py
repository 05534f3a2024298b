"""Epoch planning: what one epoch must do to bring a copy of the index up to date.

Pure: given the copy's bucket counts and checksums, its current score for each changed
player and the newest score from the change stream, produce the sorted-set and lookup
operations and the new counts and checksums. Work is proportional to the changes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from leaderboard.core.buckets import BucketLayout
from leaderboard.core.checksum import MODULUS, checksum_add, checksum_remove, pair_hash
from leaderboard.core.tiebreak import IndexValue, lookup_text, value_score, value_token

V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class StreamChange:
    player_id: str
    new_score: int
    score_version: int


def changes_newest(changes: Iterable[StreamChange]) -> dict[str, int]:
    """The newest score per player: the highest score_version wins, whatever the order."""
    return newest_scores((c.player_id, c.new_score, c.score_version) for c in changes)


def newest_scores(changes: Iterable[tuple[str, V, int]]) -> dict[str, V]:
    """`changes_newest` on plain (player_id, new_score, score_version) tuples (the "score"
    may be a first_reached (score, reached_ms) value).

    The epoch reads tens of thousands of changes per run; tuples spare an object each.
    """
    versions: dict[str, int] = {}
    scores: dict[str, V] = {}
    for player_id, score, version in changes:
        seen = versions.get(player_id)
        if seen is None or version >= seen:
            versions[player_id] = version
            scores[player_id] = score
    return scores


@dataclass(slots=True)
class EpochPlan:
    # (bucket, player_id) members to remove; (bucket, player_id, value) members to add.
    removals: list[tuple[int, str]] = field(default_factory=list)
    additions: list[tuple[int, str, IndexValue]] = field(default_factory=list)
    # The lookup player -> value after the epoch, for every player that moved.
    lookups: dict[str, IndexValue] = field(default_factory=dict)
    counts: list[int] = field(default_factory=list)
    checksums: list[int] = field(default_factory=list)
    touched: set[int] = field(default_factory=set)
    # Players new to the copy (no old score): what ZADD and the lookup HSET must report
    # as inserted, with the moves across buckets for ZADD; a check that the copy held
    # the old scores the plan assumed.
    arrivals: int = 0
    # Players who leave the board (a regional board a player moved out of): their members
    # are removed, not re-added.
    departures: list[str] = field(default_factory=list)


def epoch_plan(
    *,
    layout: BucketLayout,
    counts: list[int],
    checksums: list[int],
    old_scores: Mapping[str, IndexValue | None],
    new_scores: Mapping[str, IndexValue],
) -> EpochPlan:
    """Operations that move each changed player from its old score to its new one.

    Values are scores, or (score, reached_ms) in a first_reached season: a player moves
    when either changes, and the checksums hash both (core.tiebreak.value_token).
    Absolute and idempotent: re-planning from the copy's actual state after a partial
    apply yields only what is still missing.
    """
    plan = EpochPlan(counts=list(counts), checksums=list(checksums))
    if any(not isinstance(v, int) for v in itertools.islice(new_scores.values(), 1)):
        _first_reached_moves(plan, layout, old_scores, new_scores)  # type: ignore[arg-type]
        return plan
    # A shared board: the loop it always ran, with nothing per player added.
    for player_id, new in new_scores.items():
        old = old_scores.get(player_id)
        if old == new:
            continue
        new_bucket = layout.bucket_of(new)  # type: ignore[arg-type]
        if old is None:
            plan.arrivals += 1
        else:
            old_bucket = layout.bucket_of(old)  # type: ignore[arg-type]
            plan.counts[old_bucket] -= 1
            plan.checksums[old_bucket] = checksum_remove(plan.checksums[old_bucket], player_id, old)  # type: ignore[arg-type]
            plan.touched.add(old_bucket)
            if old_bucket != new_bucket:
                plan.removals.append((old_bucket, player_id))
        plan.counts[new_bucket] += 1
        plan.checksums[new_bucket] = checksum_add(plan.checksums[new_bucket], player_id, new)  # type: ignore[arg-type]
        plan.touched.add(new_bucket)
        # ZADD to the same bucket just rescores the member.
        plan.additions.append((new_bucket, player_id, new))
        plan.lookups[player_id] = new
    return plan


def _first_reached_moves(plan: EpochPlan, layout: BucketLayout, old_scores: Mapping[str, tuple[int, int] | None],
                         new_scores: Mapping[str, tuple[int, int]]) -> None:
    """`epoch_plan`'s moves on a first_reached board: values (score, reached_ms), bucketed by
    the score, hashed as "score:reached_ms" (core.tiebreak.value_token)."""
    for player_id, new in new_scores.items():
        old = old_scores.get(player_id)
        if old == new:
            continue
        new_bucket = layout.bucket_of(new[0])
        if old is None:
            plan.arrivals += 1
        else:
            old_bucket = layout.bucket_of(old[0])
            plan.counts[old_bucket] -= 1
            plan.checksums[old_bucket] = checksum_remove(plan.checksums[old_bucket], player_id, lookup_text(*old))
            plan.touched.add(old_bucket)
            if old_bucket != new_bucket:
                plan.removals.append((old_bucket, player_id))
        plan.counts[new_bucket] += 1
        plan.checksums[new_bucket] = checksum_add(plan.checksums[new_bucket], player_id, lookup_text(*new))
        plan.touched.add(new_bucket)
        plan.additions.append((new_bucket, player_id, new))
        plan.lookups[player_id] = new


def board_plan(
    *,
    layout: BucketLayout,
    counts: list[int],
    checksums: list[int],
    old_values: Mapping[str, IndexValue | None],
    new_values: Mapping[str, IndexValue | None],
) -> EpochPlan:
    """`epoch_plan` for a board players can also leave (a regional board): a new value of
    None removes the player. Values are scores or first_reached (score, reached_ms), hashed
    as the global board hashes them (value_token), so a regional bucket's checksum is the
    one a scan of its members computes."""
    plan = EpochPlan(counts=list(counts), checksums=list(checksums))
    for player_id, new in new_values.items():
        old = old_values.get(player_id)
        if old == new:
            continue
        new_bucket = None if new is None else layout.bucket_of(value_score(new))
        if old is None:
            plan.arrivals += 1
        else:
            old_bucket = layout.bucket_of(value_score(old))
            plan.counts[old_bucket] -= 1
            plan.checksums[old_bucket] = checksum_remove(plan.checksums[old_bucket], player_id, value_token(old))
            plan.touched.add(old_bucket)
            if old_bucket != new_bucket:
                plan.removals.append((old_bucket, player_id))
        if new is None:
            plan.departures.append(player_id)
            continue
        assert new_bucket is not None
        plan.counts[new_bucket] += 1
        plan.checksums[new_bucket] = checksum_add(plan.checksums[new_bucket], player_id, value_token(new))
        plan.touched.add(new_bucket)
        plan.additions.append((new_bucket, player_id, new))
        plan.lookups[player_id] = new
    return plan


def regional_values(
    *,
    regions: Iterable[str],
    old_values: Mapping[str, IndexValue | None],
    new_values: Mapping[str, IndexValue | None],
    old_regions: Mapping[str, str],
    new_regions: Mapping[str, str],
) -> dict[str, tuple[dict[str, IndexValue | None], dict[str, IndexValue | None]]]:
    """Per regional board, (old values, new values) of the changed players it concerns, for
    `board_plan`: a player who changed region leaves the old board (new value None) and
    arrives on the new one (old value None) in the same epoch, so no version holds them on
    two boards or on none. A region not among `regions` ("" included) has no board."""
    boards: dict[str, tuple[dict[str, IndexValue | None], dict[str, IndexValue | None]]] = {
        region: ({}, {}) for region in regions}
    for player_id, new in new_values.items():
        was = old_regions.get(player_id, "")
        now = new_regions.get(player_id, was)
        old = old_values.get(player_id)
        if was in boards:
            olds, news = boards[was]
            olds[player_id] = old
            news[player_id] = new if now == was else None
        if now != was and now in boards:
            olds, news = boards[now]
            olds[player_id] = None
            news[player_id] = new
    return boards


def higher_counts(counts: list[int]) -> list[int]:
    """higher[b] = players in buckets above b (buckets are ordered by score, ascending)."""
    out = [0] * len(counts)
    running = 0
    for bucket in range(len(counts) - 1, -1, -1):
        out[bucket] = running
        running += counts[bucket]
    return out


def locate_position(counts: Sequence[int], position: int) -> tuple[int, int] | None:
    """The bucket holding display position `position` (1-based) and the 0-based index in it."""
    remaining = position - 1
    for bucket in range(len(counts) - 1, -1, -1):
        if remaining < counts[bucket]:
            return bucket, remaining
        remaining -= counts[bucket]
    return None


def bucket_ranges(counts: Sequence[int], first: int, limit: int) -> list[tuple[int, int, int]]:
    """(bucket, start, stop) index ranges holding display positions first..first+limit-1:
    the walk down the buckets from the one holding `first` (a range read of each)."""
    located = locate_position(counts, first)
    if located is None or limit <= 0:
        return []
    bucket, index = located
    out: list[tuple[int, int, int]] = []
    remaining = limit
    while remaining > 0 and bucket >= 0:
        available = counts[bucket] - index
        if available > 0:
            take = min(available, remaining)
            out.append((bucket, index, index + take - 1))
            remaining -= take
        bucket -= 1
        index = 0
    return out


def rank_after(ahead: int) -> int:
    """Competition rank of a value with `ahead` players ranked strictly ahead of it
    (docs/rules.md, Ranking)."""
    return ahead + 1


def bucket_place(higher: Sequence[int], bucket: int, *, index: int, ahead: int) -> tuple[int, int]:
    """(position, rank) of the member at 0-based `index` of `bucket`, `ahead` of the
    bucket's members ranked strictly ahead of it: every player of the buckets above
    (`higher`, from higher_counts) precedes it in both."""
    before = higher[bucket]
    return before + index + 1, rank_after(before + ahead)


def bucket_rank(higher: Sequence[int], bucket: int, ahead: int) -> int:
    """The rank of a value in `bucket` with `ahead` of the bucket's members strictly ahead."""
    return rank_after(higher[bucket] + ahead)


# --- a range of the change stream, applied by parts ---------------------------------------


@dataclass(slots=True)
class RangeValues:
    """What one range of the change stream does to its players: each one's value before
    the range (`old`, None: not on the board) and after it (`new`), and in a season with
    regions their region before and after ("" none). Derived from the stream rows alone,
    so it is the same whatever part of it a copy already holds: the counts and checksums
    a copy gains from the range (`range_deltas`) never depend on a half-applied write."""

    new: dict[str, IndexValue | None] = field(default_factory=dict)
    old: dict[str, IndexValue | None] = field(default_factory=dict)
    new_region: dict[str, str] | None = None
    old_region: dict[str, str] | None = None
    # Every value each player took within the range, oldest first (a copy resumed after
    # a crash may hold any of them: what it holds is checked against these).
    taken: dict[str, list[IndexValue | None]] = field(default_factory=dict)


def _row_flipped(row: Sequence[Any], flip: int) -> tuple[Any, ...]:
    """A stream row with its scores as an asc board's values (old_score may be None)."""
    return (*row[:3], flip - row[3], row[4], None if row[5] is None else flip - row[5], *row[6:])


def range_values(rows: Iterable[Sequence[Any]], *, reached_origin: int | None = None,
                 regional: bool = False, flip: int | None = None, hidden: bool = False) -> RangeValues:
    """RangeValues of stream rows in cursor order: (txid, id, player_id, new_score,
    score_version, old_score), then with `reached_origin` (a first_reached board: values
    are (score, reached_ms - origin)) reached_at and old_reached_at in ms since 1970
    (None: before it was recorded, read as the season's start), then with `regional`
    the row's region and old region; columns after those are not read. A player's first
    row gives their value before the range; the row of their highest score_version (the
    later one of equal versions: a region move repeats its score's version) their value
    after it. `flip`: an asc board's max_score, its values max_score - score
    (core.season_options.BoardKind.flipped). With `hidden`, the next two columns say
    whether the player was hidden after and before the row: a hidden player's value is
    None (on no board), so a hide takes them off and a restore puts them back."""
    if flip is not None:
        rows = [_row_flipped(row, flip) for row in rows]
    out = RangeValues(new_region={} if regional else None, old_region={} if regional else None)
    at = 6 if reached_origin is None else 8  # the region's column
    off = at + 2 if regional else at  # the hidden mark's
    versions: dict[str, int] = {}
    new, old, taken = out.new, out.old, out.taken
    new_region, old_region = out.new_region, out.old_region
    for row in rows:
        player_id = row[2]
        value: IndexValue | None
        before: IndexValue | None
        if reached_origin is None:
            value, before = row[3], row[5]
        else:
            reached, was = row[6], row[7]
            value = (row[3], 0 if reached is None else reached - reached_origin)
            before = None if row[5] is None else (row[5], 0 if was is None else was - reached_origin)
        if hidden:
            if row[off]:
                value = None
            if row[off + 1]:
                before = None
        seen = versions.get(player_id)
        if seen is None:
            old[player_id] = before
            taken[player_id] = [value]
            if old_region is not None:
                old_region[player_id] = row[at + 1]
        else:
            taken[player_id].append(value)
        if seen is None or row[4] >= seen:
            versions[player_id] = row[4]
            new[player_id] = value
            if new_region is not None:
                new_region[player_id] = row[at]
    return out


@dataclass(slots=True)
class BoardDeltas:
    """What a range adds to one board's per-bucket counts and checksums (counts may be
    negative; checksums modulo 2**64), and the buckets it touches."""

    counts: list[int]
    checksums: list[int]
    touched: set[int] = field(default_factory=set)

    @classmethod
    def zero(cls, size: int) -> BoardDeltas:
        return cls(counts=[0] * size, checksums=[0] * size)

    def add(self, other: BoardDeltas) -> None:
        for b, (n, s) in enumerate(zip(other.counts, other.checksums, strict=True)):
            if n or s:
                self.counts[b] += n
                self.checksums[b] = (self.checksums[b] + s) % MODULUS
        self.touched |= other.touched

    def applied_to(self, counts: Sequence[int], checksums: Sequence[int]) -> tuple[list[int], list[int]]:
        """Base counts and checksums with these deltas added."""
        return ([c + d for c, d in zip(counts, self.counts, strict=True)],
                [(c + d) % MODULUS for c, d in zip(checksums, self.checksums, strict=True)])

    def as_json(self) -> dict[str, object]:
        return {"counts": self.counts, "checksums": [f"{c:016x}" for c in self.checksums],
                "touched": sorted(self.touched)}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> BoardDeltas:
        return cls(counts=[int(n) for n in data["counts"]],  # type: ignore[attr-defined]
                   checksums=[int(c, 16) for c in data["checksums"]],  # type: ignore[attr-defined]
                   touched={int(b) for b in data["touched"]})  # type: ignore[attr-defined]


def range_deltas(values: RangeValues, *, layout: BucketLayout, regions: Iterable[str] = ()
                 ) -> dict[str, BoardDeltas]:
    """Each board's deltas ("" the global one, then each of `regions`) for moving every
    player of the range from their old value (and region) to their new one: what
    `epoch_plan` and `board_plan` compute, from zero, once for both copies."""
    size = layout.size
    bucket_of = layout.bucket_of
    out = {"": BoardDeltas.zero(size)}
    boards = {region: BoardDeltas.zero(size) for region in regions}
    out.update(boards)
    glob = out[""]
    counts, sums, touched = glob.counts, glob.checksums, glob.touched
    old_region, new_region = values.old_region or {}, values.new_region or {}
    for player_id, new in values.new.items():
        old = values.old[player_id]
        # None: not on the board (a hidden player, or none yet).
        new_bucket = new_hash = old_bucket = old_hash = None
        if new is not None:
            new_bucket = bucket_of(value_score(new))
            new_hash = pair_hash(player_id, value_token(new))
        if old is not None:
            old_bucket = bucket_of(value_score(old))
            old_hash = pair_hash(player_id, value_token(old))
        if old != new:
            if old_bucket is not None:
                counts[old_bucket] -= 1
                sums[old_bucket] -= old_hash  # type: ignore[operator]
                touched.add(old_bucket)
            if new_bucket is not None:
                counts[new_bucket] += 1
                sums[new_bucket] += new_hash  # type: ignore[operator]
                touched.add(new_bucket)
        if not boards:
            continue
        was = old_region.get(player_id, "")
        now = new_region.get(player_id, was)
        if was == now and old == new:
            continue
        if was in boards and old_bucket is not None:
            board = boards[was]
            board.counts[old_bucket] -= 1
            board.checksums[old_bucket] -= old_hash  # type: ignore[operator]
            board.touched.add(old_bucket)
        if now in boards and new_bucket is not None:
            board = boards[now]
            board.counts[new_bucket] += 1
            board.checksums[new_bucket] += new_hash  # type: ignore[operator]
            board.touched.add(new_bucket)
    for deltas in out.values():
        deltas.checksums = [s % MODULUS for s in deltas.checksums]
    return out


def parts_of(partitions: Sequence[int], parts: int) -> list[list[int]]:
    """`partitions` dealt round robin into at most `parts` non-empty parts (each a list in
    ascending order): each part owns its partitions' players, disjoint from every other's."""
    ordered = sorted(set(partitions))
    count = max(1, min(parts, len(ordered)))
    return [ordered[i::count] for i in range(count)] if ordered else [[]]
