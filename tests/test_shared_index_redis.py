"""The shared index on a real Redis (leaderboard.views.rankview.shared): random epochs of
both copies written through the fenced group write, each copy read back through the
place and window scripts and compared with two plain copies of what it should hold, and
the serving copy read between every bucket write of the other's epoch."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from leaderboard.core.buckets import MAX_SCORE, MAX_SCORE_LIMIT
from leaderboard.core.shared_index import Seen, SharedIndexError, change_plan, entry_name, lookup_decode, lookup_encode
from leaderboard.core.tiebreak import KEY_LIMIT
from leaderboard.views.rankview.fence import group_write_call, groups_send
from leaderboard.views.rankview.shared import (
    bucket_writes,
    bucket_writes_expected,
    place_call,
    window_call,
    window_entries,
)
from leaderboard.views.rankview.wire import round_trip
from tests.support import keyed_place, model_apply, plain_place

BUCKETS = 6
PLAYERS = [f"p{i:02d}" for i in range(40)] + ["p0", "p0.", "p0:a"]


def plain_value(rng: random.Random) -> str:
    return str(rng.randrange(10 * BUCKETS))


def keyed_value(rng: random.Random) -> str:
    return f"{rng.randrange(10 * BUCKETS)}:{rng.choice([0, 1, 2**40 - 1])}"


# Sort keys at both ends of the hidden sets' encoding (-MAX_SCORE, 2**53 - 1) and between,
# in three buckets, so the scripts' hex encoding is compared with Python's at its widest.
EDGE_KEYS = [-MAX_SCORE_LIMIT, -MAX_SCORE_LIMIT + 1, -MAX_SCORE, -1, 0, 1, 2**44, KEY_LIMIT - 2, KEY_LIMIT - 1]


def edge_place(value: str) -> tuple[int, int]:
    return int(value) % 3, int(value)


def edge_value(rng: random.Random) -> str:
    return str(rng.choice(EDGE_KEYS))


LAYOUTS: dict[str, tuple[Callable[[str], tuple[int, int]], Callable[[random.Random], str]]] = {
    "plain": (plain_place, plain_value), "keyed": (keyed_place, keyed_value), "edges": (edge_place, edge_value)}


def bucket_key(bucket: int) -> str:
    return f"t:{{b{bucket}}}:z"


def hidden_key(copy: int, bucket: int) -> str:
    return f"t:{{b{bucket}}}:x{copy}"


def fence_key(bucket: int) -> str:
    return f"t:{{b{bucket}}}:f"


LOOKUP = "t:{lookup}:h"


def expected(model: dict[str, str], place: Callable[[str], tuple[int, int]], bucket: int) -> list[tuple[str, int]]:
    """A copy's entries of a bucket in display order: key, then player id bytes."""
    rows = [(player_id, place(value)[1]) for player_id, value in model.items() if place(value)[0] == bucket]
    return sorted(rows, key=lambda row: (row[1], row[0].encode()))


def assert_copy_reads(r: Any, copy: int, model: dict[str, str], place: Callable[[str], tuple[int, int]]) -> None:
    """Every window of the copy and every player's place in it, against the model."""
    for bucket in range(BUCKETS):
        rows = expected(model, place, bucket)
        starts = list(range(len(rows) + 1))
        replies = round_trip(r, [window_call(bucket=bucket_key(bucket), hidden=hidden_key(copy, bucket),
                                             start=start, count=3) for start in starts])
        for start, reply in zip(starts, replies, strict=True):
            assert [(p, int(k)) for p, k in window_entries(reply)] == rows[start:start + 3], (copy, bucket, start)
    views = {p: lookup_decode(raw) for p, raw in zip(PLAYERS, r.hmget(LOOKUP, PLAYERS), strict=True) if raw}
    seen = {p: seen for p, v in views.items() if (seen := v[copy]) is not None}
    assert {p: s.value for p, s in seen.items()} == model
    calls = []
    for player_id, view in seen.items():
        bucket, key = place(view.value)
        calls.append(place_call(bucket=bucket_key(bucket), hidden=hidden_key(copy, bucket), key=key,
                                name=entry_name(player_id, view.second)))
    for (player_id, view), (ahead, position) in zip(seen.items(), round_trip(r, calls), strict=True):
        bucket, key = place(view.value)
        rows = expected(model, place, bucket)
        assert (ahead, position) == (sum(k < key for _, k in rows), rows.index((player_id, key))), player_id


def epoch_write(r: Any, copy: int, changes: dict[str, str | None], place: Callable[[str], tuple[int, int]],
                between: Callable[[], None]) -> None:
    """One copy's epoch: its bucket writes one at a time (`between` after each), then its lookup."""
    raw = dict(zip(changes, r.hmget(LOOKUP, list(changes)), strict=True))
    ops, lookup = [], {}
    for player_id, value in changes.items():
        views = lookup_decode(raw[player_id]) if raw[player_id] else (None, None)
        planned, after = change_plan(copy=copy, player_id=player_id, views=views, value=value, place=place)
        ops += planned
        lookup[player_id] = lookup_encode(after)
    for bucket, writes in bucket_writes(ops, bucket_key=bucket_key, hidden_key=hidden_key).items():
        (replies,) = groups_send(r, [(fence_key(bucket), group_write_call(fence_key(bucket), 1, None, writes))])
        assert replies == bucket_writes_expected(writes)
        between()
    pipe = r.pipeline(transaction=False)
    for player_id, text in lookup.items():
        if text is None:
            pipe.hdel(LOOKUP, player_id)
        else:
            pipe.hset(LOOKUP, player_id, text)
    pipe.execute()


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_epochs_of_both_copies_read_back_exact_and_never_move_the_serving_copy(
        redis_flushed: Any, layout: str, seed: int) -> None:
    place, value_of = LAYOUTS[layout]
    r, rng = redis_flushed, random.Random(seed)
    models: list[dict[str, str]] = [{}, {}]
    for epoch in range(24):
        # Mostly the copies' alternation (each copy applies what the other did, then more),
        # sometimes one copy twice or changes only one copy ever sees.
        copy = epoch % 2 if rng.random() < 0.8 else rng.randrange(2)
        changes: dict[str, str | None] = {}
        for player_id in rng.sample(PLAYERS, rng.randrange(1, 20)):
            changes[player_id] = None if rng.random() < 0.15 else value_of(rng)
        if rng.random() < 0.6:
            changes.update({p: models[1 - copy].get(p) for p in rng.sample(PLAYERS, 10)})
        other = 1 - copy

        def serving_unmoved(other: int = other) -> None:
            assert_copy_reads(r, other, models[other], place)

        epoch_write(r, copy, changes, place, serving_unmoved)
        model_apply(models[copy], changes)
        assert_copy_reads(r, 0, models[0], place)
        assert_copy_reads(r, 1, models[1], place)


def test_a_plan_that_assumed_entries_the_bucket_lacks_shows_in_the_replies(redis_flushed: Any) -> None:
    # The lookup says copy 0 alone sees "a" at 7 (copy 1 sees 9 under the second name),
    # but the bucket never got that entry (a lost write): the change removes nothing and
    # the replies say so.
    ops, _ = change_plan(copy=0, player_id="a", views=(Seen("7"), Seen("9", second=True)), value="23",
                         place=plain_place)
    writes = bucket_writes(ops, bucket_key=bucket_key, hidden_key=hidden_key)[0]
    (replies,) = groups_send(redis_flushed, [(fence_key(0), group_write_call(fence_key(0), 1, None, writes))])
    assert replies != bucket_writes_expected(writes)


def test_two_plans_for_one_player_in_one_bucket_write_are_refused() -> None:
    # Copy 0 hides the shared entry and adds one; copy 1 then removes the old entry and is
    # shown the new one: both touch the old entry's hidden record of copy 0, which one
    # write (removals first) would leave behind.
    first, after = change_plan(copy=0, player_id="a", views=(Seen("7"), Seen("7")), value="8", place=plain_place)
    second, _ = change_plan(copy=1, player_id="a", views=after, value="8", place=plain_place)
    with pytest.raises(SharedIndexError):
        bucket_writes(first + second, bucket_key=bucket_key, hidden_key=hidden_key)
