"""core.epoch's ranges of the change stream, as parts apply them: the values a range moves
each player between, the count and checksum deltas it adds to each board (the same as the
copy-by-copy plans compute), and partitions dealt into parts."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from leaderboard.core.buckets import BucketLayout
from leaderboard.core.epoch import (
    BoardDeltas,
    board_plan,
    epoch_plan,
    parts_of,
    range_deltas,
    range_values,
    regional_values,
)

LAYOUT = BucketLayout.uniform(width=100, layout_id=3)
PLAYERS = ("a", "b", "c", "d")
REGIONS = ("eu", "na")


@st.composite
def streams(draw: Any, regional: bool, hidden: bool = False) -> list[tuple[Any, ...]]:
    """Rows as a season's stream holds them: per player, versions that grow, each row's old
    value the previous row's new one (None before the first score), regions that move;
    with `hidden`, the hidden marks after and before each row, and hides and restores."""
    rows: list[tuple[Any, ...]] = []
    state: dict[str, tuple[int | None, int, str]] = {
        p: (draw(st.one_of(st.none(), st.integers(0, 1000))), 1, draw(st.sampled_from(("", *REGIONS))))
        for p in PLAYERS}
    off = {p: False for p in PLAYERS}

    def marks(player: str, was: bool) -> tuple[bool, ...]:
        return (off[player], was) if hidden else ()

    for n in range(draw(st.integers(0, 30))):
        player = draw(st.sampled_from(PLAYERS))
        score, version, region = state[player]
        was = off[player]
        if hidden and score is not None and draw(st.integers(0, 3)) == 0:
            off[player] = not was  # a hide or a restore: same score and version
            rows.append((n, n, player, score, version, score, *((region, region) if regional else ()),
                         *marks(player, was)))
            continue
        if regional and score is not None and draw(st.booleans()):
            now = draw(st.sampled_from(("", *REGIONS)))
            rows.append((n, n, player, score, version, score, now, region, *marks(player, was)))  # same version
            state[player] = (score, version, now)
            continue
        new = draw(st.integers(0, 1000))
        rows.append((n, n, player, new, version + 1, score, *((region, region) if regional else ()),
                     *marks(player, was)))
        state[player] = (new, version + 1, region)
    return rows


@settings(max_examples=300, deadline=None)
@given(rows=streams(regional=True))
def test_a_ranges_deltas_are_what_the_copy_plans_add_on_every_board(rows: list[tuple[Any, ...]]) -> None:
    values = range_values(rows, regional=True)
    deltas = range_deltas(values, layout=LAYOUT, regions=REGIONS)
    zero = [0] * LAYOUT.size
    plan = epoch_plan(layout=LAYOUT, counts=zero, checksums=zero, old_scores=values.old,
                      new_scores=values.new)  # type: ignore[arg-type]  # no hidden rows here: no None
    assert (deltas[""].counts, deltas[""].checksums, deltas[""].touched) == (plan.counts, plan.checksums, plan.touched)
    assert values.old_region is not None and values.new_region is not None
    for board, (olds, news) in regional_values(regions=REGIONS, old_values=values.old, new_values=values.new,
                                               old_regions=values.old_region,
                                               new_regions=values.new_region).items():
        expected = board_plan(layout=LAYOUT, counts=zero, checksums=zero, old_values=olds, new_values=news)
        assert deltas[board].counts == expected.counts, board
        assert deltas[board].checksums == expected.checksums, board


@settings(max_examples=300, deadline=None)
@given(rows=streams(regional=True, hidden=True))
def test_hidden_players_leave_every_board_and_come_back_as_the_plans_say(rows: list[tuple[Any, ...]]) -> None:
    """A hidden player's value is none: on the global board and every regional one the
    deltas are a departure's, and a restore's an arrival's."""
    values = range_values(rows, regional=True, hidden=True)
    deltas = range_deltas(values, layout=LAYOUT, regions=REGIONS)
    zero = [0] * LAYOUT.size
    whole = board_plan(layout=LAYOUT, counts=zero, checksums=zero, old_values=values.old, new_values=values.new)
    assert (deltas[""].counts, deltas[""].checksums) == (whole.counts, whole.checksums)
    assert values.old_region is not None and values.new_region is not None
    for board, (olds, news) in regional_values(regions=REGIONS, old_values=values.old, new_values=values.new,
                                               old_regions=values.old_region,
                                               new_regions=values.new_region).items():
        expected = board_plan(layout=LAYOUT, counts=zero, checksums=zero, old_values=olds, new_values=news)
        assert (deltas[board].counts, deltas[board].checksums) == (expected.counts, expected.checksums), board
    # The last row of each player says where they are: hidden ones are on no board.
    last = {row[2]: row for row in rows}
    assert {p for p, v in values.new.items() if v is None} == {p for p, row in last.items() if row[-2]}


def test_a_hide_and_a_restore_in_the_stream() -> None:
    rows = [(1, 1, "a", 10, 2, 10, True, False), (2, 2, "a", 30, 3, 10, True, True),
            (3, 3, "b", 5, 7, 5, False, True)]
    values = range_values(rows, hidden=True)
    assert (values.old, values.new, values.taken) == ({"a": 10, "b": None}, {"a": None, "b": 5},
                                                      {"a": [None, None], "b": [5]})


@settings(max_examples=200, deadline=None)
@given(rows=streams(regional=False), cut=st.integers(0, 30))
def test_deltas_of_two_ranges_add_up_to_the_deltas_of_both(rows: list[tuple[Any, ...]], cut: int) -> None:
    """Parts add up: two ranges (or two disjoint parts) merged give what one gives."""
    whole = range_deltas(range_values(rows), layout=LAYOUT)[""]
    first = range_deltas(range_values(rows[:cut]), layout=LAYOUT)[""]
    first.add(range_deltas(range_values(rows[cut:]), layout=LAYOUT)[""])
    assert (first.counts, first.checksums) == (whole.counts, whole.checksums)
    assert BoardDeltas.from_json(whole.as_json()) == whole


def test_values_before_and_after_a_range_and_every_value_taken_in_between() -> None:
    rows = [(1, 1, "a", 10, 2, None), (2, 2, "b", 5, 7, 3), (3, 3, "a", 30, 3, 10), (4, 4, "a", 20, 4, 30)]
    values = range_values(rows)
    assert (values.old, values.new) == ({"a": None, "b": 3}, {"a": 20, "b": 5})
    assert values.taken == {"a": [10, 30, 20], "b": [5]}
    # A first_reached board: (score, reached_ms since the season's start); None reads as its start.
    reached = range_values([(1, 1, "a", 10, 2, 9, 1_500, None)], reached_origin=1_000)
    assert (reached.old, reached.new) == ({"a": (9, 0)}, {"a": (10, 500)})


def test_partitions_are_dealt_into_disjoint_parts() -> None:
    assert parts_of([3, 0, 1, 2, 4, 5, 6, 7], 2) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert parts_of([0, 1, 2], 8) == [[0], [1], [2]]
    assert parts_of([5], 1) == [[5]] and parts_of([], 4) == [[]]
