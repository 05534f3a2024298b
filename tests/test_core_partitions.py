"""core.partitions: the player -> partition hash and the vector watermark (pure, no database)."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from leaderboard.core.partitions import (
    MAX_PARTITIONS,
    TXID_PARTITION_SHIFT,
    Watermark,
    layout_check,
    layout_partition,
    partition_of,
    partition_start,
    stream_heads_watermark,
    txid_partition,
)

ROOT = Path(__file__).resolve().parent.parent
players = st.text(min_size=1, max_size=64)


def _cursor(partition: int, n: int, ident: int) -> tuple[int, int]:
    return (partition << TXID_PARTITION_SHIFT | n, ident)


# A watermark of up to 5 partitions; each cursor at its start or somewhere in its range.
watermarks = st.lists(
    st.tuples(st.integers(0, 6), st.integers(0, 50)), max_size=5
).map(lambda cs: Watermark([_cursor(p, n, i) if n else partition_start(p) for p, (n, i) in enumerate(cs)]))
# Changes (txid, id) anywhere in the first 5 partitions.
rows = st.tuples(st.integers(0, 4), st.integers(1, 7), st.integers(0, 60)).map(lambda r: _cursor(*r))


@given(players, st.integers(1, 64))
def test_partition_of_is_in_range_and_stable(player_id: str, partitions: int) -> None:
    p = partition_of(player_id, partitions)
    assert 0 <= p < partitions
    assert partition_of(player_id, partitions) == p
    assert layout_partition(player_id, base=3, partitions=partitions) == 3 + p


def test_partition_of_known_values_never_change() -> None:
    # The hash is stored implicitly in every partitioned season's stream: it must never change.
    assert partition_of("anything", 1) == 0
    assert [partition_of(f"p{i}", 8) for i in range(12)] == [0, 5, 6, 7, 4, 5, 1, 5, 6, 7, 5, 1]
    assert [partition_of(f"p{i}", 3) for i in range(12)] == [0, 0, 2, 0, 2, 1, 2, 0, 1, 0, 1, 2]


def test_partition_of_spreads_players_and_does_not_follow_the_lookup_shards() -> None:
    ids = [f"player-{i}" for i in range(40_000)]
    counts = Counter(partition_of(i, 8) for i in ids)
    assert len(counts) == 8 and max(counts.values()) < 1.1 * min(counts.values())
    # Within one partition, the players still fill every lookup shard (crc32 % 64).
    shards = {zlib.crc32(i.encode()) % 64 for i in ids if partition_of(i, 8) == 0}
    assert len(shards) == 64


def test_layout_check() -> None:
    layout_check(base=0, partitions=1)
    layout_check(base=8, partitions=16)
    with pytest.raises(ValueError):
        layout_check(base=0, partitions=0)
    with pytest.raises(ValueError):
        layout_check(base=0, partitions=65)


def test_single_partition_watermark_is_the_old_cursor() -> None:
    w = Watermark.single(12, 345)
    assert w.dump() == "12:345" and str(w) == "12:345"
    assert w.as_json() == [12, 345]
    assert w.columns() == (12, 345, None)
    assert Watermark.parse("12:345") == w == Watermark.from_json([12, 345]) == Watermark.from_columns(12, 345)
    assert Watermark.from_columns(None, None) == Watermark() == Watermark.single(0, 0)
    assert w.covers(12, 345) and not w.covers(12, 346) and w.covers(11, 10**9)


def test_trailing_partitions_at_their_start_are_dropped() -> None:
    w = Watermark([(5, 9), partition_start(1), (0, 0)])
    assert w.cursors == ((5, 9),) and w == Watermark.single(5, 9)
    with pytest.raises(ValueError):
        Watermark([(5, 9), (7, 1)])  # partition 1's cursor must carry partition 1's bits


@given(watermarks)
def test_dump_parse_json_and_columns_round_trip(w: Watermark) -> None:
    assert Watermark.parse(w.dump()) == w
    assert Watermark.from_json(w.as_json()) == w
    assert Watermark.from_columns(*w.columns()) == w


@given(watermarks, watermarks)
def test_order_is_the_vector_order(a: Watermark, b: Watermark) -> None:
    size = max(a.partitions, b.partitions)
    le = all(a.cursor(p) <= b.cursor(p) for p in range(size))
    assert (a <= b) == le
    assert (b >= a) == le
    assert (a < b) == (le and a != b)
    assert (a == b) == (le and b <= a)


@given(watermarks, watermarks, st.lists(rows, max_size=20))
def test_merge_is_the_least_upper_bound(a: Watermark, b: Watermark, changes: list[tuple[int, int]]) -> None:
    m = a.merge(b)
    assert a <= m and b <= m
    assert m == b.merge(a)
    # Least: a change covered by the merge is covered by one of them.
    for txid, ident in changes:
        assert m.covers(txid, ident) == (a.covers(txid, ident) or b.covers(txid, ident))


@given(watermarks, st.lists(rows, max_size=30))
def test_advanced_past_changes_covers_exactly_them_and_what_it_covered(
        w: Watermark, changes: list[tuple[int, int]]) -> None:
    after = sorted(c for c in set(changes) if not w.covers(*c))
    moved = w.advanced(after)
    assert w <= moved
    for c in after:
        assert moved.covers(*c)
    for c in changes:
        # Nothing beyond the last change read of its partition is covered.
        last = max((x for x in after if txid_partition(x[0]) == txid_partition(c[0])), default=None)
        assert moved.covers(*c) == (w.covers(*c) or (last is not None and c <= last))


def test_stream_heads_watermark_covers_every_id_at_or_below_each_head() -> None:
    heads = {0: 7, 2: _cursor(2, 3, 0)[0]}
    w = stream_heads_watermark(heads, last_id=2**63 - 1)
    assert w.covers(7, 10**12) and not w.covers(8, 1)
    assert not w.covers(*_cursor(1, 1, 1))  # partition 1: nothing committed yet
    assert w.covers(*_cursor(2, 3, 99)) and not w.covers(*_cursor(2, 4, 1))


def test_season_partitions_above_the_maximum_stop_the_process_at_start() -> None:
    """SEASON_PARTITIONS is bounded like a season's count (layout_check): a value above
    MAX_PARTITIONS is refused when the settings load, not at the first season created."""
    env = {**os.environ, "SEASON_PARTITIONS": str(MAX_PARTITIONS + 1), "SECRET_KEY": "x"}
    refused = subprocess.run([sys.executable, "-c", "import config.settings"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and f"SEASON_PARTITIONS must be <= {MAX_PARTITIONS}" in refused.stderr
    env["SEASON_PARTITIONS"] = str(MAX_PARTITIONS)
    accepted = subprocess.run([sys.executable, "-c", "import config.settings"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60)
    assert accepted.returncode == 0, accepted.stderr
