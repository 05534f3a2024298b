"""Batched player reads: rank and neighbours of every player subscribed in a process, in
one version, in at most four pipelined round trips whatever their number.

The live boards' counterpart of `RankReader`'s reads of one player
(views/rankview/reads.py), under the same seqlock. One plan (`players_plan`) yields each
round trip's commands, so the hub's asyncio client drives it in the event loop
(`players_read_async`) and a sync client drives the same reads (`players_read`). Apart
from the hub because it is a read of the published views (keys, manifests, buckets) and
knows nothing of sockets or rounds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio

from leaderboard.core.epoch import bucket_place, bucket_ranges, bucket_rank
from leaderboard.core.manifest import Manifest
from leaderboard.core.ranking import Entry, entry_shown, ranked_values
from leaderboard.core.slots import bucket_group, shard_group
from leaderboard.core.tiebreak import IndexValue, index_key, lookup_value, value_score
from leaderboard.core.tiers import percentile
from leaderboard.history.selectors import movements_call, movements_of
from leaderboard.live.redis_async import REDIS_READ_TIMEOUT_SECONDS, Call, pipeline_raw
from leaderboard.views import rankview
from leaderboard.views.names import Name, entry_dict, names_call, names_of
from leaderboard.views.rankview.reads import board_entry, seqlock_commands, seqlock_holds
from leaderboard.views.rankview.shared import ahead_call, place_call, window_call, window_values


@dataclass(frozen=True, slots=True)
class PlayerRead:
    """A player in one version: its entry (None: not ranked) and the entries around it
    within the widest radius any socket of the process asked for."""

    entry: Entry | None
    window: tuple[Entry, ...] = ()
    radius: int = 0
    # The players sharing the entry's rank, the player among them (its percentile).
    tied: int = 0
    # Names and countries of the window's players (views.names), read with the window.
    names: Mapping[str, Name] = field(default_factory=dict)
    # The player's rank in the snapshot a day before the latest (the global board's;
    # leaderboard.history), and whether it is not kept in Redis yet (None meanwhile).
    rank_24h_ago: int | None = None
    movement_missing: bool = False


Plan = Generator[list[Call], list[Any], dict[str, "PlayerRead"]]


def players_read(r: redis.Redis, keys: rankview.Keys, manifest: Manifest,
                 wanted: Mapping[str, int]) -> tuple[dict[str, PlayerRead], int]:
    """`players_plan` on a sync client: (reads, round trips). Raises rankview.Torn."""
    plan = players_plan(keys, manifest, wanted)
    trips = 0
    try:
        calls = next(plan)
        while True:
            replies = rankview.round_trip(r, calls)
            trips += 1
            calls = plan.send(replies)
    except StopIteration as done:
        return done.value, trips


async def players_read_async(r: redis.asyncio.Redis, keys: rankview.Keys, manifest: Manifest,
                             wanted: Mapping[str, int]) -> tuple[dict[str, PlayerRead], int]:
    """`players_plan` on an asyncio client, in the event loop: no worker thread to contend
    for the GIL with the loop that is sending the same version to other sockets. Each
    round trip is bounded by REDIS_READ_TIMEOUT_SECONDS as a whole (the process's client
    has no per-reply timeout: that was a timer per reply, thousands per round)."""
    plan = players_plan(keys, manifest, wanted)
    trips = 0
    try:
        calls = next(plan)
        while True:
            async with asyncio.timeout(REDIS_READ_TIMEOUT_SECONDS):
                replies = await pipeline_raw(r, calls)
            trips += 1
            calls = plan.send(replies)
    except StopIteration as done:
        return done.value, trips


def players_plan(keys: rankview.Keys, manifest: Manifest, wanted: Mapping[str, int]) -> Plan:
    """Rank and neighbours of many players in one version, in at most four pipelined round trips.

    A generator that yields the commands of each round trip and receives their replies (so
    the sync and the asyncio drivers share it). `wanted` maps player_id -> radius.
    Raises rankview.Torn when the manifest's copy no longer holds the version after the
    reads (it was superseded and its grace period passed): nothing read is then trusted.
    The last round trip re-reads the copy's generation and version after every data read
    (Redis runs one command at a time, and each round trip starts after the previous one
    answered), the same seqlock the single-player reads of RankReader use.
    On a region's board (`Manifest.board_of`) the reads are that board's, and a player
    whose region-shard entry names another board (or none) is not ranked on it.
    """
    out = {player_id: PlayerRead(entry=None, radius=radius) for player_id, radius in wanted.items()}
    if not wanted:
        return out
    layout = manifest.layout
    index_name = manifest.index
    groups = manifest.groups
    # The slot groups read, whose `gen` the last round trip checks (the seqlock).
    touched: set[int] = set()

    def bucket_key(bucket: int) -> str:
        touched.add(bucket_group(bucket=bucket, groups=groups, board=manifest.board))
        return keys.bucket(index_name, layout.layout_id, bucket, manifest.board, groups=groups)

    def hidden_key(bucket: int) -> str:
        return keys.hidden(index_name, manifest.side, layout.layout_id, bucket, manifest.board, groups=groups)

    # 1. Scores from the copy's lookup: one HMGET per lookup shard (the copy's count).
    shards = list(rankview.shards_of(wanted, manifest.lookup_shards).items())
    touched.update(shard_group(shard=shard, groups=groups) for shard, _ in shards)
    lookups: list[Call] = [("HMGET", keys.lookup(index_name, shard, groups=groups), *players)
                           for shard, players in shards]
    if manifest.board:
        # The players' regions in the same round trip; the global board never asks.
        lookups += [("HMGET", keys.region(index_name, shard, groups=groups), *players) for shard, players in shards]
    # rank_24h_ago of the global board's players rides the first round trip.
    followed = list(wanted)
    if not manifest.board:
        lookups.append(movements_call(keys, followed))
    replies = yield lookups
    moved, missing = movements_of(followed, replies[-1]) if not manifest.board else ({}, [])
    gone = set(missing)
    homes = (replies[len(shards):len(lookups)] if manifest.board
             else [[None] * len(players) for _, players in shards])
    # Values: scores, or (score, reached_ms) on a first_reached board (core.tiebreak), as
    # the version's side sees them, with the name of the entry that holds each; on a
    # region's board only the players whose region entry names it.
    ties = manifest.ties
    found: list[tuple[str, IndexValue, str]] = []
    for (_, players), values, regions in zip(shards, replies[:len(shards)], homes, strict=True):
        for player_id, value, region in zip(players, values, regions, strict=True):
            _, on_board = board_entry(manifest, player_id, value, region)
            if on_board is not None:
                found.append((player_id, lookup_value(ties, on_board[0]), on_board[1]))

    # 2. Players ranked ahead and the index of each found player in its bucket.
    located: dict[str, Entry] = {}
    value_of: dict[str, IndexValue] = {}
    if found:
        calls: list[Call] = []
        buckets: list[int] = []
        for _, value, name in found:
            bucket, sort_key = index_key(layout, ties, value)
            buckets.append(bucket)
            calls.append(place_call(bucket=bucket_key(bucket), hidden=hidden_key(bucket), key=sort_key, name=name,
                                    tied=True))
        replies = yield calls
        tied_of: dict[str, int] = {}
        for i, (player_id, value, _) in enumerate(found):
            higher, index, tied = replies[i]
            tied_of[player_id] = int(tied)
            if index is None:
                raise rankview.Torn()  # the lookup and the index disagree: mid-mutation
            position, rank = bucket_place(manifest.higher, buckets[i], index=int(index), ahead=int(higher))
            value_of[player_id] = value
            located[player_id] = Entry(position=position, rank=rank, player_id=player_id, score=value_score(value))

    # 3. Each player's window of positions, as ranges of buckets; identical ranges (players
    #    near each other) are read once.
    windows: dict[str, tuple[int, int, list[tuple[int, int, int]]]] = {}
    ranges: dict[tuple[int, int, int], int] = {}
    for player_id, me in located.items():
        radius = wanted[player_id]
        first = max(1, me.position - radius)
        last = min(manifest.total, me.position + radius)
        spans = bucket_ranges(manifest.counts, first, last - first + 1)
        windows[player_id] = (first, last, spans)
        for span in spans:
            ranges.setdefault(span, len(ranges))
    pairs_of: list[list[tuple[str, IndexValue]]] = []
    if ranges:
        # The entries the version's side sees (entry names back to players).
        replies = yield [window_call(bucket=bucket_key(bucket), hidden=hidden_key(bucket), start=start,
                                     count=stop - start + 1) for bucket, start, stop in ranges]
        pairs_of = [window_values(reply, layout=layout, ties=ties, bucket=bucket)
                    for (bucket, _, _), reply in zip(ranges, replies, strict=True)]

    # 4. The rank of each window's first entry when it is not known already (it is for
    #    position 1 and when it shares the player's score), then the seqlock check.
    pending: dict[str, tuple[int, list[tuple[str, IndexValue]]]] = {}
    rank_queries: dict[IndexValue, int] = {}
    for player_id, (first, last, spans) in windows.items():
        pairs = [pair for span in spans for pair in pairs_of[ranges[span]]]
        me = located[player_id]
        if len(pairs) != last - first + 1 or pairs[me.position - first] != (player_id, value_of[player_id]):
            raise rankview.Torn()  # a bucket holds other members than the manifest counted
        pending[player_id] = (first, pairs)
        first_score = pairs[0][1]
        if first != 1 and first_score != value_of[player_id]:
            rank_queries.setdefault(first_score, len(rank_queries))
    keyed = {value: index_key(layout, ties, value) for value in rank_queries}
    counts: list[Call] = [ahead_call(bucket=bucket_key(keyed[value][0]), hidden=hidden_key(keyed[value][0]),
                                     key=keyed[value][1]) for value in rank_queries]
    # The names of every window's players ride along: not versioned, so not under the seqlock.
    named = list(dict.fromkeys(player for _, pairs in pending.values() for player, _ in pairs))
    names_calls: list[Call] = [names_call(keys.prefix, named)] if named else []
    # The seqlock's reads after every data read (the earlier round trips answered before
    # this one was sent).
    replies = yield [*counts, *names_calls, *seqlock_commands(keys, manifest, sorted(touched))]
    if not seqlock_holds(manifest, replies[len(counts) + len(names_calls):]):
        raise rankview.Torn()
    names = names_of(named, replies[len(counts)]) if named else {}
    rank_of_score = {
        value: bucket_rank(manifest.higher, keyed[value][0], int(replies[index][0]))
        for value, index in rank_queries.items()
    }

    for player_id, (first, pairs) in pending.items():
        me = located[player_id]
        first_score = pairs[0][1]
        if first == 1:
            rank_first = 1
        elif first_score == value_of[player_id]:
            rank_first = me.rank
        else:
            rank_first = rank_of_score[first_score]
        window = ranked_values(pairs, first_position=first, rank_of_first=rank_first)
        # Scores as players see them from here on (an asc board's views hold max_score - score).
        out[player_id] = PlayerRead(entry=entry_shown(manifest.kind, me),
                                    window=tuple(entry_shown(manifest.kind, e) for e in window),
                                    radius=wanted[player_id], tied=tied_of[player_id], names=names,
                                    rank_24h_ago=moved.get(player_id), movement_missing=player_id in gone)
    return out


def player_shown(manifest: Manifest, read: PlayerRead) -> dict[str, Any]:
    """How a player read goes out (core.live.version_text's `shown` and `percentile`):
    entries with names and tiers, and the player's percentile on the board."""
    names = read.names
    return {"shown": lambda entry: entry_dict(manifest, entry, names),
            "percentile": None if read.entry is None else percentile(rank=read.entry.rank, tied=read.tied,
                                                                        total=manifest.total),
            "rank_24h_ago": read.rank_24h_ago}
