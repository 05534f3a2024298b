"""Pure unit tests of the ranking core (docs/rules.md, Ranking and Publication): bucket layouts, checksums,
epoch planning, position arithmetic, the brute-force Standings reference and sampling.
No database, no Redis."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from leaderboard.core.buckets import DEFAULT_BUCKET_WIDTH, BucketLayout, LayoutError
from leaderboard.core.checksum import MODULUS, checksum_add, checksum_of, checksum_remove, pair_hash
from leaderboard.core.epoch import (
    StreamChange,
    bucket_place,
    bucket_ranges,
    bucket_rank,
    changes_newest,
    epoch_plan,
    higher_counts,
    locate_position,
    rank_after,
)
from leaderboard.core.events import MAX_SCORE
from leaderboard.core.manifest import Manifest
from leaderboard.core.partitions import Watermark
from leaderboard.core.ranking import Entry, Standings, display_key, ranked
from leaderboard.core.reconciliation import Report, first_mismatch, stratified_positions

# Every character a player id may hold (docs/rules.md, Ranking), in UTF-8 byte order.
ID_ALPHABET = "-.0123456789:ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz"
player_ids = st.text(alphabet=ID_ALPHABET, min_size=1, max_size=8)


# --- bucket layouts --------------------------------------------------------------------------


def test_uniform_default_layout_has_101_buckets_of_10000() -> None:
    layout = BucketLayout.uniform()
    assert DEFAULT_BUCKET_WIDTH == 10_000
    assert layout.size == 101
    assert layout.lower_bounds[:3] == (0, 10_000, 20_000)
    assert layout.lower_bounds[-1] == 1_000_000
    assert layout.range_of(0) == (0, 9_999)
    assert layout.range_of(99) == (990_000, 999_999)
    # The last bucket holds only the maximum score.
    assert layout.range_of(100) == (1_000_000, 1_000_000)


@pytest.mark.parametrize(
    ("score", "bucket"),
    [(0, 0), (1, 0), (9_999, 0), (10_000, 1), (10_001, 1), (35_000, 3), (55_000, 5), (999_999, 99),
     (1_000_000, 100)],
)
def test_bucket_of_edges(score: int, bucket: int) -> None:
    assert BucketLayout.uniform().bucket_of(score) == bucket


def test_every_score_is_in_exactly_the_bucket_whose_range_holds_it() -> None:
    layout = BucketLayout.uniform(width=250_000)
    assert layout.lower_bounds == (0, 250_000, 500_000, 750_000, 1_000_000)
    covered = [layout.range_of(b) for b in range(layout.size)]
    # Ranges tile 0..MAX_SCORE without gaps or overlaps.
    assert covered[0][0] == 0
    assert covered[-1][1] == MAX_SCORE
    for (_, high), (low, _) in itertools.pairwise(covered):
        assert low == high + 1
    for score in (0, 249_999, 250_000, 499_999, 500_000, 999_999, 1_000_000):
        low, high = layout.range_of(layout.bucket_of(score))
        assert low <= score <= high


def test_single_layout_holds_everything_in_one_bucket() -> None:
    layout = BucketLayout.single(layout_id=7)
    assert layout.size == 1
    assert layout.layout_id == 7
    assert layout.range_of(0) == (0, MAX_SCORE)
    assert {layout.bucket_of(s) for s in (0, 1, 500_000, MAX_SCORE)} == {0}


def test_uniform_refuses_a_width_below_one() -> None:
    with pytest.raises(LayoutError):
        BucketLayout.uniform(width=0)


@pytest.mark.parametrize(
    "bounds",
    [(), (1,), (0, 10, 10), (0, 20, 10), (0, MAX_SCORE + 1)],
    ids=["empty", "not-from-zero", "repeated", "decreasing", "beyond-max"],
)
def test_layout_refuses_bad_bounds(bounds: tuple[int, ...]) -> None:
    with pytest.raises(LayoutError):
        BucketLayout(layout_id=1, lower_bounds=bounds)


def test_split_adds_boundaries_and_keeps_the_old_ones() -> None:
    layout = BucketLayout.uniform(width=250_000)
    split = layout.split(at=[260_000, 255_000, 260_000, 250_000], layout_id=2)
    assert split.layout_id == 2
    assert split.lower_bounds == (0, 250_000, 255_000, 260_000, 500_000, 750_000, 1_000_000)
    assert split.range_of(1) == (250_000, 254_999)
    assert split.bucket_of(259_999) == 2
    # The original is unchanged (frozen).
    assert layout.size == 5


@pytest.mark.parametrize("point", [0, -1, MAX_SCORE + 1])
def test_split_refuses_points_outside_1_to_max(point: int) -> None:
    with pytest.raises(LayoutError):
        BucketLayout.uniform().split(at=[point], layout_id=2)


def test_split_at_max_score_is_allowed() -> None:
    split = BucketLayout.single().split(at=[MAX_SCORE], layout_id=2)
    assert split.lower_bounds == (0, MAX_SCORE)
    assert split.bucket_of(MAX_SCORE) == 1
    assert split.bucket_of(MAX_SCORE - 1) == 0


@pytest.mark.parametrize(
    "layout",
    [BucketLayout.uniform(), BucketLayout.single(layout_id=3), BucketLayout.uniform(width=100).split(at=[150],
                                                                                                      layout_id=9)],
)
def test_layout_dict_round_trip(layout: BucketLayout) -> None:
    data = layout.as_dict()
    assert data["layout_id"] == layout.layout_id
    assert data["lower_bounds"] == list(layout.lower_bounds)
    assert BucketLayout.from_dict(data) == layout


# --- checksums --------------------------------------------------------------------------------


def test_checksum_is_order_independent_and_incremental() -> None:
    pairs = [(f"p{i}", i * 37 % 1000) for i in range(50)]
    shuffled = pairs[:]
    random.Random(1).shuffle(shuffled)
    assert checksum_of(pairs) == checksum_of(shuffled)

    running = 0
    for player_id, score in shuffled:
        running = checksum_add(running, player_id, score)
    assert running == checksum_of(pairs)

    # Removing pairs in another order leaves the checksum of what remains.
    for player_id, score in pairs[:20]:
        running = checksum_remove(running, player_id, score)
    assert running == checksum_of(pairs[20:])
    for player_id, score in pairs[20:]:
        running = checksum_remove(running, player_id, score)
    assert running == 0 == checksum_of([])


def test_checksum_distinguishes_missing_extra_and_wrong_score_members() -> None:
    pairs = [("a", 1), ("b", 2), ("c", 3)]
    base = checksum_of(pairs)
    assert checksum_of(pairs[:2]) != base
    assert checksum_of([*pairs, ("d", 4)]) != base
    assert checksum_of([("a", 1), ("b", 2), ("c", 4)]) != base
    # A swapped score between two players is a different set of pairs.
    assert checksum_of([("a", 2), ("b", 1), ("c", 3)]) != base
    assert 0 <= pair_hash("a", 1) < MODULUS
    # Removing from zero wraps modulo 2**64 instead of going negative.
    assert checksum_remove(0, "a", 1) == MODULUS - pair_hash("a", 1)
    assert checksum_add(checksum_remove(0, "a", 1), "a", 1) == 0


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(player_ids, st.integers(0, MAX_SCORE)), unique_by=lambda p: p[0], max_size=30),
       st.randoms(use_true_random=False))
def test_checksum_order_independence_property(pairs: list[tuple[str, int]], rnd: random.Random) -> None:
    shuffled = pairs[:]
    rnd.shuffle(shuffled)
    assert checksum_of(pairs) == checksum_of(shuffled)


# --- epoch planning ------------------------------------------------------------------------------

LAYOUT = BucketLayout.uniform()


def _state(scores: dict[str, int], layout: BucketLayout = LAYOUT) -> tuple[list[int], list[int]]:
    counts = [0] * layout.size
    sums = [0] * layout.size
    for player_id, score in scores.items():
        b = layout.bucket_of(score)
        counts[b] += 1
        sums[b] = checksum_add(sums[b], player_id, score)
    return counts, sums


def _apply_plan(buckets: dict[int, dict[str, int]], lookup: dict[str, int], plan: object) -> None:
    """What copy_apply does to Redis, on plain dicts."""
    for bucket, player_id in plan.removals:  # type: ignore[attr-defined]
        buckets.setdefault(bucket, {}).pop(player_id, None)
    for bucket, player_id, score in plan.additions:  # type: ignore[attr-defined]
        buckets.setdefault(bucket, {})[player_id] = score
    lookup.update(plan.lookups)  # type: ignore[attr-defined]


def test_epoch_plan_moves_up_across_buckets() -> None:
    old = {"mover": 35_000, "stay": 35_500, "top": 90_000}
    counts, sums = _state(old)
    plan = epoch_plan(layout=LAYOUT, counts=counts, checksums=sums, old_scores={"mover": 35_000},
                      new_scores={"mover": 55_000})
    assert plan.removals == [(3, "mover")]
    assert plan.additions == [(5, "mover", 55_000)]
    assert plan.lookups == {"mover": 55_000}
    assert plan.touched == {3, 5}
    expected = {**old, "mover": 55_000}
    assert (plan.counts, plan.checksums) == _state(expected)
    assert plan.counts[3] == 1 and plan.counts[5] == 1
    # The inputs are not mutated.
    assert (counts, sums) == _state(old)


def test_epoch_plan_moves_down_across_buckets_on_a_correction() -> None:
    old = {"mover": 55_000, "other": 55_001}
    counts, sums = _state(old)
    plan = epoch_plan(layout=LAYOUT, counts=counts, checksums=sums, old_scores={"mover": 55_000},
                      new_scores={"mover": 35_000})
    assert plan.removals == [(5, "mover")]
    assert plan.additions == [(3, "mover", 35_000)]
    assert plan.touched == {3, 5}
    assert (plan.counts, plan.checksums) == _state({"mover": 35_000, "other": 55_001})


def test_epoch_plan_rescores_within_a_bucket_without_removal() -> None:
    old = {"p": 35_000, "q": 36_000}
    counts, sums = _state(old)
    plan = epoch_plan(layout=LAYOUT, counts=counts, checksums=sums, old_scores={"p": 35_000},
                      new_scores={"p": 39_999})
    assert plan.removals == []
    assert plan.additions == [(3, "p", 39_999)]
    assert plan.touched == {3}
    assert plan.counts == counts
    assert plan.checksums == _state({"p": 39_999, "q": 36_000})[1]
    assert plan.checksums != sums


def test_epoch_plan_adds_a_new_player() -> None:
    counts, sums = _state({"p": 1})
    plan = epoch_plan(layout=LAYOUT, counts=counts, checksums=sums, old_scores={"new": None},
                      new_scores={"new": MAX_SCORE})
    assert plan.removals == []
    assert plan.additions == [(100, "new", MAX_SCORE)]
    assert plan.counts[100] == 1 and sum(plan.counts) == 2
    assert (plan.counts, plan.checksums) == _state({"p": 1, "new": MAX_SCORE})
    # A player missing from old_scores altogether is new too.
    plan2 = epoch_plan(layout=LAYOUT, counts=counts, checksums=sums, old_scores={}, new_scores={"new": MAX_SCORE})
    assert plan2.additions == plan.additions and plan2.counts == plan.counts


def test_epoch_plan_skips_players_already_at_their_new_score() -> None:
    counts, sums = _state({"p": 10, "q": 20})
    plan = epoch_plan(layout=LAYOUT, counts=counts, checksums=sums, old_scores={"p": 10, "q": 20},
                      new_scores={"p": 10, "q": 20})
    assert plan.removals == [] and plan.additions == [] and plan.lookups == {} and plan.touched == set()
    assert plan.counts == counts and plan.checksums == sums


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from([BucketLayout.uniform(width=100), BucketLayout.single(), BucketLayout.uniform(width=333)]),
    st.dictionaries(player_ids, st.integers(0, 1000), max_size=15),
    st.dictionaries(player_ids, st.integers(0, 1000), max_size=15),
    st.integers(1, 4),
)
def test_epoch_plan_property_applied_in_chunks_reaches_the_new_state(
    layout: BucketLayout, before: dict[str, int], changes: dict[str, int], chunk: int
) -> None:
    """Chunked plans (as copy_apply runs them), applied to a model copy, give exactly the
    new state, and the carried counts and checksums equal a recomputation."""
    buckets: dict[int, dict[str, int]] = {}
    for player_id, score in before.items():
        buckets.setdefault(layout.bucket_of(score), {})[player_id] = score
    lookup = dict(before)
    counts, sums = _state(before, layout)
    players = list(changes)
    for start in range(0, len(players), chunk):
        part = players[start : start + chunk]
        plan = epoch_plan(layout=layout, counts=counts, checksums=sums,
                          old_scores={p: lookup.get(p) for p in part}, new_scores={p: changes[p] for p in part})
        _apply_plan(buckets, lookup, plan)
        counts, sums = plan.counts, plan.checksums
    after = {**before, **changes}
    assert lookup == after
    members = Counter(p for b in buckets.values() for p in b)
    assert all(n == 1 for n in members.values()), "a player is in several buckets"
    for bucket, content in buckets.items():
        low, high = layout.range_of(bucket)
        assert all(low <= s <= high for s in content.values())
        assert {p: s for p, s in content.items()} == {p: s for p, s in after.items() if layout.bucket_of(s) == bucket}
    assert (counts, sums) == _state(after, layout)

    # Idempotent: planning again from the reached state changes nothing.
    again = epoch_plan(layout=layout, counts=counts, checksums=sums, old_scores=lookup, new_scores=changes)
    assert not again.additions and not again.removals and again.counts == counts


def test_changes_newest_takes_the_highest_score_version_in_any_order() -> None:
    changes = [
        StreamChange("a", 100, 1),
        StreamChange("a", 300, 5),
        StreamChange("b", 50, 2),
        StreamChange("a", 200, 3),  # older than 5, arrives later
        StreamChange("b", 10, 9),  # a correction down, newest
        StreamChange("c", 7, 1),
    ]
    expected = {"a": 300, "b": 10, "c": 7}
    for order in itertools.permutations(changes):
        assert changes_newest(order) == expected
    assert changes_newest([]) == {}


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 100)), max_size=20), st.randoms())
def test_changes_newest_property(raw: list[tuple[str, int]], rnd: random.Random) -> None:
    changes = [StreamChange(p, s, version) for version, (p, s) in enumerate(raw, start=1)]
    expected = {}
    for change in changes:  # in version order the last one wins
        expected[change.player_id] = change.new_score
    shuffled = changes[:]
    rnd.shuffle(shuffled)
    assert changes_newest(shuffled) == expected


# --- position arithmetic ---------------------------------------------------------------------------


def test_epoch_plan_counts_the_players_new_to_the_copy() -> None:
    layout = BucketLayout(layout_id=1, lower_bounds=(0, 100, 200))
    plan = epoch_plan(layout=layout, counts=[1, 1, 0], checksums=[0, 0, 0],
                      old_scores={"old": 50, "moved": 150}, new_scores={"old": 60, "moved": 250, "new": 10})
    assert plan.arrivals == 1
    assert plan.removals == [(1, "moved")]


def test_higher_counts() -> None:
    # Buckets are indexed by ascending score: bucket 2 holds the highest scores.
    assert higher_counts([2, 0, 3]) == [3, 3, 0]
    assert higher_counts([5]) == [0]
    assert higher_counts([0, 0, 0]) == [0, 0, 0]
    assert higher_counts([1, 2, 3, 4]) == [9, 7, 4, 0]


def test_locate_position_walks_buckets_from_the_highest() -> None:
    counts = [2, 0, 3]
    assert locate_position(counts, 1) == (2, 0)
    assert locate_position(counts, 3) == (2, 2)
    assert locate_position(counts, 4) == (0, 0)  # the empty bucket 1 is skipped
    assert locate_position(counts, 5) == (0, 1)
    assert locate_position(counts, 6) is None
    assert locate_position([0, 0], 1) is None


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=8))
def test_locate_position_agrees_with_a_flattened_board(counts: list[int]) -> None:
    flat = [(bucket, index) for bucket in range(len(counts) - 1, -1, -1) for index in range(counts[bucket])]
    for position, expected in enumerate(flat, start=1):
        assert locate_position(counts, position) == expected
    assert locate_position(counts, len(flat) + 1) is None
    higher = higher_counts(counts)
    for position, (bucket, index) in enumerate(flat, start=1):
        assert higher[bucket] + index + 1 == position


# --- ranked() -----------------------------------------------------------------------------------------


def test_ranked_shares_ranks_between_ties() -> None:
    entries = ranked([("a", 50), ("b", 40), ("c", 40), ("d", 30)])
    assert [(e.position, e.rank) for e in entries] == [(1, 1), (2, 2), (3, 2), (4, 4)]
    assert entries[0] == Entry(position=1, rank=1, player_id="a", score=50)
    assert entries[0].as_dict() == {"position": 1, "rank": 1, "player_id": "a", "score": 50}


def test_ranked_window_inside_a_tie_takes_rank_of_first() -> None:
    # Positions 5..8; players at positions 3 and 4 share the first score, so its rank is 3.
    entries = ranked([("e", 40), ("f", 40), ("g", 30), ("h", 30)], first_position=5, rank_of_first=3)
    assert [(e.position, e.rank) for e in entries] == [(5, 3), (6, 3), (7, 7), (8, 7)]
    # Without rank_of_first the first entry ranks at its position.
    assert ranked([("e", 40)], first_position=5)[0].rank == 5
    assert ranked([]) == []


# --- Standings: the reference of docs/rules.md, Ranking --------------------------------------------------


def test_standings_display_order_is_by_utf8_bytes_of_player_id() -> None:
    # Uppercase sorts before lowercase and "Z" before "_" in UTF-8 bytes; a case-folding or
    # locale collation would get these wrong.
    board = Standings({"a": 10, "B": 10, "_": 10, "Z": 10, "-": 10, ".": 10, "9": 10, ":": 10})
    assert [e.player_id for e in board.top(100)] == ["-", ".", "9", ":", "B", "Z", "_", "a"]
    assert {e.rank for e in board.top(100)} == {1}
    assert display_key("B", 10) < display_key("a", 10)
    assert display_key("Z", 10) < display_key("_", 10)
    # Score beats id.
    assert display_key("z", 11) < display_key("A", 10)
    # A prefix sorts before its extensions.
    assert [e.player_id for e in Standings({"ab": 1, "a": 1, "a.": 1}).top(3)] == ["a", "a.", "ab"]


def test_standings_competition_ranks_and_positions() -> None:
    board = Standings({"w": 100, "x": 90, "y": 90, "z": 80, "v": 0})
    assert [(e.player_id, e.position, e.rank) for e in board.top(10)] == [
        ("w", 1, 1), ("x", 2, 2), ("y", 3, 2), ("z", 4, 4), ("v", 5, 5)]
    assert board.entry("y") == Entry(position=3, rank=2, player_id="y", score=90)
    assert board.entry("nobody") is None
    assert len(board) == 5
    assert board.rank_of_score(95) == 2
    assert board.rank_of_score(90) == 2
    assert board.rank_of_score(1_000_000) == 1
    assert board.rank_of_score(-1) == 6


def test_standings_tie_straddling_positions_100_and_101() -> None:
    scores = {f"hi{i:03d}": 1000 + i for i in range(60)}
    scores.update({f"tie{i:03d}": 500 for i in range(150)})
    scores.update({f"lo{i:03d}": 10 for i in range(5)})
    board = Standings(scores)
    top = board.top(100)
    assert len(top) == 100
    assert [e.position for e in top] == list(range(1, 101))
    assert top[59].player_id == "hi000" and top[59].rank == 60
    assert top[60].player_id == "tie000" and top[60].rank == 61
    assert top[99].player_id == "tie039" and top[99].rank == 61
    nxt = board.window(from_position=101, limit=100)
    assert nxt[0].position == 101 and nxt[0].player_id == "tie040" and nxt[0].rank == 61
    assert all(e.rank == 61 for e in nxt[:110])
    tail = board.window(from_position=211, limit=100)
    assert [(e.player_id, e.rank) for e in tail] == [(f"lo{i:03d}", 211) for i in range(5)]
    # Past the end: nothing; from_position below 1 starts at 1.
    assert board.window(from_position=216, limit=10) == []
    assert board.window(from_position=0, limit=1)[0].position == 1


def test_standings_neighbors_clip_at_the_edges() -> None:
    board = Standings({f"p{i:02d}": 100 - i for i in range(30)})
    middle = board.neighbors("p15", 10)
    assert [e.position for e in middle] == list(range(6, 27))
    assert middle[10].player_id == "p15"
    first = board.neighbors("p00", 10)
    assert [e.position for e in first] == list(range(1, 12))
    last = board.neighbors("p29", 10)
    assert [e.position for e in last] == list(range(20, 31))
    assert [e.player_id for e in board.neighbors("p05", 0)] == ["p05"]
    assert board.neighbors("nobody", 10) == []


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(player_ids, st.one_of(st.integers(0, 5), st.integers(0, MAX_SCORE)), max_size=60))
def test_standings_property_rank_is_one_plus_count_higher(scores: dict[str, int]) -> None:
    board = Standings(scores)
    everything = board.window(from_position=1, limit=len(scores) + 5)
    assert len(everything) == len(scores) == len(board)
    # Position order is score descending, then player_id ascending by UTF-8 bytes, checked
    # pairwise (independently of display_key).
    for a, b in itertools.pairwise(everything):
        assert a.score > b.score or (a.score == b.score and a.player_id.encode() < b.player_id.encode())
    assert [e.position for e in everything] == list(range(1, len(scores) + 1))
    for entry in everything:
        higher = sum(1 for s in scores.values() if s > entry.score)
        assert entry.rank == 1 + higher
        assert scores[entry.player_id] == entry.score
        assert board.entry(entry.player_id) == entry
    # Windows and neighbours are slices of the same order; ranked() over a slice with the
    # first entry's rank reproduces them (what the Redis reader relies on).
    for start in range(1, len(scores) + 1):
        window = board.window(from_position=start, limit=7)
        assert window == everything[start - 1 : start + 6]
        pairs = [(e.player_id, e.score) for e in window]
        assert ranked(pairs, first_position=start, rank_of_first=window[0].rank) == window
    for player_id in scores:
        me = board.entry(player_id)
        assert me is not None
        around = board.neighbors(player_id, 3)
        assert around == everything[max(0, me.position - 4) : me.position + 3]
        assert me in around


# --- manifest, reports, sampling -----------------------------------------------------------------------


def test_manifest_json_round_trip() -> None:
    layout = BucketLayout.uniform(width=250_000)
    manifest = Manifest(
        season="s", version=4, as_of="2026-11-30T00:00:00.000+00:00", watermark=Watermark.single(12, 345), copy="1",
        gen=7,
        layout=layout, counts=[1, 0, 2, 0, 1], checksums=[1, 0, 2**64 - 1, 0, 5],
        top=[{"position": 1, "rank": 1, "player_id": "a", "score": 1_000_000}],
    )
    again = Manifest.from_json(manifest.to_json())
    assert again == manifest
    assert again.total == 4
    assert again.higher == [3, 3, 1, 1, 0]
    buckets = manifest.to_dict()["buckets"]
    assert buckets[2] == {"bucket": 2, "low": 500_000, "high": 749_999, "count": 2, "checksum": "ffffffffffffffff"}
    assert manifest.to_dict()["total_players"] == 4


def test_stratified_positions_cover_the_board() -> None:
    assert stratified_positions(0, 10) == []
    assert stratified_positions(10, 0) == []
    assert stratified_positions(5, 10) == [1, 2, 3, 4, 5]
    assert stratified_positions(5, 5) == [1, 2, 3, 4, 5]
    picks = stratified_positions(1_000_000, 100, seed=3)
    assert picks == sorted(set(picks))
    assert len(picks) == 100  # strata are disjoint, so no pick repeats
    assert all(1 <= p <= 1_000_000 for p in picks)
    # One pick in each stratum: the top and the tail are both looked at.
    for i, p in enumerate(picks):
        assert 1 + i * 10_000 <= p <= (i + 1) * 10_000
    assert picks[0] <= 10_000 and picks[-1] > 990_000
    assert stratified_positions(1_000_000, 100, seed=3) == picks


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 5000), st.integers(1, 200), st.integers(0, 2**32))
def test_stratified_positions_property(total: int, size: int, seed: int) -> None:
    picks = stratified_positions(total, size, seed=seed)
    assert picks == sorted(set(picks))
    assert all(1 <= p <= total for p in picks)
    assert len(picks) == min(total, size)
    if size < total:
        # One pick per stratum: the first and the last strata are always looked at.
        assert picks[0] <= total // size
        assert picks[-1] >= 1 + ((size - 1) * total) // size


def test_report_and_first_mismatch() -> None:
    report = Report(version=3)
    report.add("a", True)
    assert report.ok
    report.add("b", False, "broken")
    assert not report.ok
    assert [f.check for f in report.failures()] == ["b"]
    assert report.as_dict()["findings"][1] == {"check": "b", "ok": False, "detail": "broken"}
    assert first_mismatch([1, 2, 3], [1, 2, 3]) == ""
    assert "index 1" in first_mismatch([1, 2, 3], [1, 5, 3])
    assert "length" in first_mismatch([1, 2], [1, 2, 3])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=8), st.integers(1, 45), st.integers(0, 45))
def test_bucket_ranges_and_places_agree_with_a_flattened_board(counts: list[int], first: int, limit: int) -> None:
    flat = [(bucket, index) for bucket in range(len(counts) - 1, -1, -1) for index in range(counts[bucket])]
    spans = bucket_ranges(counts, first, limit)
    read = [(bucket, index) for bucket, start, stop in spans for index in range(start, stop + 1)]
    assert read == flat[first - 1:first - 1 + limit]
    higher = higher_counts(counts)
    for position, (bucket, index) in enumerate(flat, start=1):
        # Every member of a bucket with `index` members ahead of it in the bucket (all
        # distinct values): its rank is its position.
        assert bucket_place(higher, bucket, index=index, ahead=index) == (position, position)
        assert bucket_rank(higher, bucket, 0) == position - index
    assert rank_after(0) == 1
