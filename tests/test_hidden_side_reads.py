"""Every reader of a copy reads one side of its buckets (docs/architecture.md, The shared
index): a second side written into the same buckets beside a published version (its
entries hidden from the version's side, and the version's own entries hidden from it) must
change nothing the version answers, through the rank reads, windows, friends boards, the
live hub's batch reads and the invariant checker. A manifest naming the second side must
answer exactly that side's board."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import Any

import pytest

from leaderboard.core.checksum import checksum_of
from leaderboard.core.manifest import Manifest
from leaderboard.core.ranking import Standings
from leaderboard.core.shared_index import change_plan, lookup_decode, lookup_encode
from leaderboard.core.slots import bucket_group, shard_group
from leaderboard.core.tiebreak import index_key
from leaderboard.live.players import players_read
from leaderboard.redis_client import redis_get
from leaderboard.views import rankview
from leaderboard.views.invariants import version_check
from leaderboard.views.rankview.shared import bucket_writes
from seasons.models import Season
from tests.support import (
    INVARIANT_CHECKS,
    NARROW,
    Events,
    assert_board_equals,
    current_manifest,
    db_standings,
    keys_of,
    post_ok,
    publish,
    reader_of,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]

Post = Callable[..., Any]
PLAYERS = [f"p{i:02d}" for i in range(40)]


@pytest.fixture
def published(season_factory: Callable[..., Season], post_scores: Post) -> tuple[Season, Manifest]:
    """A published version of 40 players with ties, over buckets of 100 points."""
    season = season_factory(slug="sides", layout=NARROW)
    rng = random.Random(7)
    events = Events("sides")
    post_ok(post_scores, season, [events.result(p, rng.choice([50, 150, 150, 420, 420, 420, rng.randrange(1000)]))
                                  for p in PLAYERS])
    publish(season)
    return season, current_manifest(season)


def other_side_write(manifest: Manifest, changes: dict[str, int | None]) -> dict[str, int]:
    """Side 1 of the version's copy given the version's board with `changes` (None: the
    player leaves it), planned by core.shared_index and written as the views' bucket
    writes and lookup fields; side 1's board."""
    r = redis_get()
    keys = keys_of_manifest(manifest)
    copy, groups, layout = manifest.copy, manifest.groups, manifest.layout

    def place(value: str) -> tuple[int, int]:
        return index_key(layout, None, int(value))

    ops = []
    fields: dict[str, str | None] = {}
    board: dict[str, int] = {}
    for player_id in PLAYERS + ["new-a", "new-b"]:
        shard = rankview.lookup_shard(player_id, manifest.lookup_shards)
        raw = r.hget(keys.lookup(copy, shard, groups=groups), player_id)
        views = lookup_decode(raw) if raw is not None else (None, None)
        value = changes.get(player_id, int(views[0].value) if views[0] is not None else None)
        planned, after = change_plan(copy=1, player_id=player_id, views=views,
                                     value=None if value is None else str(value), place=place)
        ops += planned
        fields[player_id] = lookup_encode(after)
        if value is not None:
            board[player_id] = value
    writes = bucket_writes(ops, bucket_key=lambda b: keys.bucket(copy, layout.layout_id, b, groups=groups),
                           hidden_key=lambda side, b: keys.hidden(copy, side, layout.layout_id, b, groups=groups))
    by_group: dict[int, list[rankview.GroupOp]] = {}
    for bucket, bucket_ops in writes.items():
        by_group.setdefault(bucket_group(bucket=bucket, groups=groups), []).extend(bucket_ops)
    for player_id, text in fields.items():
        shard = rankview.lookup_shard(player_id, manifest.lookup_shards)
        key = keys.lookup(copy, shard, groups=groups)
        op: rankview.GroupOp = ("HSET", key, [player_id, text]) if text is not None else ("HDEL", key, [player_id])
        by_group.setdefault(shard_group(shard=shard, groups=groups), []).append(op)
    # Unfenced, and the generation kept: the version's seqlock must still hold.
    rankview.groups_send(r, [(keys.fence(copy, group), rankview.group_write_call(keys.fence(copy, group), None,
                                                                                 None, group_ops))
                             for group, group_ops in by_group.items()])
    return board


def keys_of_manifest(manifest: Manifest) -> rankview.Keys:
    season = Season.objects.get(slug=manifest.season)
    return keys_of(season)


def side_manifest(manifest: Manifest, board: dict[str, int]) -> Manifest:
    """The version read on side 1: its counts and checksums are side 1's board's, and its
    top the copy's side 1 read by copy_top."""
    layout = manifest.layout
    counts = [0] * layout.size
    pairs: list[list[tuple[str, int]]] = [[] for _ in range(layout.size)]
    for player_id, score in board.items():
        counts[layout.bucket_of(score)] += 1
        pairs[layout.bucket_of(score)].append((player_id, score))
    side = dataclasses.replace(manifest, side=1, counts=counts, checksums=[checksum_of(p) for p in pairs], top=[])
    r = redis_get()
    keys = keys_of_manifest(manifest)
    meta = rankview.copy_meta_load(r, keys, manifest.copy)
    assert meta is not None
    meta.side, meta.counts = 1, counts
    return dataclasses.replace(side, top=rankview.copy_top(r, keys, meta, limit=100))


def manifest_publish(season: Season, manifest: Manifest) -> None:
    """Point the season at `manifest` as its next version (by hand: no epoch writes a side 1 yet)."""
    r = redis_get()
    keys = keys_of(season)
    version = manifest.version + 1
    # Side 1's generation in every slot group, as finishing a copy on that side stamps it.
    rankview.copy_groups_stamp(r, keys, manifest.index, manifest.groups, token=None, gen=manifest.gen,
                               side=manifest.side)
    r.set(keys.manifest(version), dataclasses.replace(manifest, version=version).to_json())
    r.hset(keys.copy_meta(manifest.copy), "version", version)
    r.set(keys.ptr, version)


CHANGES: dict[str, int | None] = {
    "p00": 999, "p01": 0, "p02": 420, "p03": None, "p04": 150, "p05": 151, "new-a": 420, "new-b": 5}


def test_a_second_side_changes_nothing_the_version_answers(published: tuple[Season, Manifest]) -> None:
    season, manifest = published
    expected = db_standings(season)
    reader = reader_of(season)
    friends_before = reader.players(PLAYERS + ["new-a"], manifest.version)
    live_before, _ = players_read(redis_get(), keys_of(season), manifest, dict.fromkeys(PLAYERS, 3))

    other_side_write(manifest, CHANGES)

    assert assert_board_equals(reader, expected, players=PLAYERS, absent=["new-a", "new-b"]) == manifest.version
    friends = reader.players(PLAYERS + ["new-a"], manifest.version)
    assert (friends.scores, friends.ranks) == (friends_before.scores, friends_before.ranks)
    live, _ = players_read(redis_get(), keys_of(season), manifest, dict.fromkeys(PLAYERS, 3))
    assert live == live_before
    report = version_check(r=redis_get(), keys=keys_of(season), version=manifest.version, full=True)
    assert report.ok, report.failures()
    assert {finding.check for finding in report.findings} >= INVARIANT_CHECKS


def test_a_version_on_the_second_side_answers_that_sides_board(published: tuple[Season, Manifest]) -> None:
    season, manifest = published
    board = other_side_write(manifest, CHANGES)
    assert board != {p: e.score for p, e in ((p, db_standings(season).entry(p)) for p in PLAYERS) if e}
    side = side_manifest(manifest, board)
    manifest_publish(season, side)
    rankview.manifest_cache_clear()

    expected = Standings(board)
    reader = reader_of(season)
    assert_board_equals(reader, expected, players=board, absent=["p03"])
    friends = reader.players(list(board) + ["p03"])
    assert friends.scores == board
    assert friends.ranks == {p: expected.rank_of(p) for p in board}
    current = current_manifest(season)
    live, _ = players_read(redis_get(), keys_of(season), current, dict.fromkeys(board, 2))
    for player_id, read in live.items():
        assert read.entry == expected.entry(player_id)
        assert list(read.window) == expected.neighbors(player_id, 2)
    report = version_check(r=redis_get(), keys=keys_of(season), version=current.version, full=True)
    assert report.ok, report.failures()
