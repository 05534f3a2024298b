"""A player's rank in past snapshots (docs/api.md, Movement and history): their score from
the ledger as of each snapshot's version, their rank from the snapshot's histogram."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

import redis
from django.db import DatabaseError, connection

from leaderboard.core.history import HistogramChunk, midnights, value_at
from leaderboard.ledger_reads import ledger_queryset_of_player
from leaderboard.models import ScoreEvent, SeasonSnapshot
from leaderboard.views.rankview.keys import Keys
from leaderboard.views.rankview.reads import RankReader
from leaderboard.views.rankview.wire import round_trip
from seasons.models import Season

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SnapshotPlace:
    """A player's place in one snapshot."""

    taken_for: datetime
    rank: int
    score: int
    total_players: int
    version: int

    def as_point(self) -> dict[str, object]:
        return {"date": self.taken_for.date().isoformat(), "rank": self.rank, "score": self.score,
                "total_players": self.total_players, "leaderboard_version": self.version}


# A snapshot as its places are read: (id, taken_for, version, total_players, hidden players).
Snapshot = tuple[int, datetime, int, int, list[str]]
SNAPSHOT_FIELDS = ("pk", "taken_for", "version", "total_players", "hidden")


def snapshot_places(*, season: Season, player_id: str, snapshots: Sequence[Snapshot]) -> list[SnapshotPlace]:
    """The player's place in each of `snapshots` (oldest first) where they were ranked (not
    before their first score, nor while staff had them hidden): one read of their applied
    events, one of the chunks holding their values."""
    snapshots = [s for s in snapshots if player_id not in s[4]]
    if not snapshots:
        return []
    newest = max(version for _, _, version, _, _ in snapshots)
    changes = [(published, after) for published, after in ledger_queryset_of_player(
        season=season, player_id=player_id,
        queryset=ScoreEvent.objects.filter(season=season, player_id=player_id, status="applied",
                                           pending_version__lte=newest)
        .order_by("id").values_list("pending_version", "score_after"))
        if published is not None and after is not None]
    flip = season.board_kind.flip
    wanted: list[tuple[int, datetime, int, int, int, int]] = []
    for pk, taken_for, version, total, _ in snapshots:
        score = value_at(changes, version)
        if score is not None:
            wanted.append((pk, taken_for, version, total, score, score if flip is None else flip - score))
    chunks = _chunks_holding([(pk, value) for pk, _, _, _, _, value in wanted])
    places = []
    for pk, taken_for, version, total, score, value in wanted:
        chunk = chunks.get(pk)
        if chunk is not None:
            places.append(SnapshotPlace(taken_for=taken_for, rank=chunk.ahead_of(value) + 1, score=score,
                                        total_players=total, version=version))
    return places


def _chunks_holding(wanted: Sequence[tuple[int, int]]) -> dict[int, HistogramChunk]:
    """For each (snapshot id, value), the snapshot's chunk holding the value: the one with
    the greatest lowest value at or below it, all in one statement."""
    if not wanted:
        return {}
    if connection.vendor == "postgresql":
        # One plan for any number of days (a UNION of 30 subqueries takes longer to plan
        # than to run).
        sql = ("SELECT w.sid, c.above, c.chunk_values, c.chunk_counts FROM unnest(%s::bigint[], %s::bigint[]) "
               "AS w(sid, v) CROSS JOIN LATERAL (SELECT above, chunk_values, chunk_counts "
               "FROM leaderboard_snapshotchunk WHERE snapshot_id = w.sid AND low <= w.v "
               "ORDER BY low DESC LIMIT 1) AS c")
        params: list[Any] = [[pk for pk, _ in wanted], [value for _, value in wanted]]
    else:
        one = ("SELECT * FROM (SELECT snapshot_id, above, chunk_values, chunk_counts FROM leaderboard_snapshotchunk "
               "WHERE snapshot_id = %s AND low <= %s ORDER BY low DESC LIMIT 1) AS c{}")
        sql = " UNION ALL ".join(one.format(i) for i in range(len(wanted)))
        params = [x for pair in wanted for x in pair]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return {pk: HistogramChunk.decoded(bytes(values), bytes(counts), above=above)
            for pk, above, values, counts in rows}


def player_history_get(*, season: Season, player_id: str, days: int, today: date) -> list[SnapshotPlace]:
    """The player's place at 00:00 UTC of each of the `days` days ending `today`, oldest
    first, for the days they were ranked (and a snapshot was taken)."""
    snapshots = list(SeasonSnapshot.objects.filter(season=season, taken_for__in=midnights(today=today, days=days))
                     .order_by("taken_for").values_list(*SNAPSHOT_FIELDS))
    return snapshot_places(season=season, player_id=player_id, snapshots=snapshots)


# --- rank_24h_ago: the rank answer's movement -----------------------------------------------------
# The snapshot it reads is named in a Redis hash beside the season's pointer, which also
# keeps each rank once computed: a player's first rank read of the hour reads their ledger
# rows and one chunk (as a history point does), later ones ride the read's first round trip.
# When the snapshot 24 hours before the latest one changes (hourly), the hash starts over.


def movement_call(keys: Keys, player_id: str) -> tuple[str, ...]:
    """The one command, sent in the rank read's first round trip, that reads the snapshot
    rank_24h_ago comes from and the player's rank in it when known."""
    return movements_call(keys, [player_id])


def movements_call(keys: Keys, player_ids: Sequence[str]) -> tuple[str, ...]:
    """movement_call for many players (the live board's followed players)."""
    return ("HMGET", keys.moved, "", *player_ids)


def movements_of(player_ids: Sequence[str], reply: Sequence[bytes | None]) -> tuple[dict[str, int | None], list[str]]:
    """The players' rank_24h_ago kept in Redis, from a movements_call reply, and the players
    whose rank in the named snapshot is not kept yet (rank_24h_ago_of computes those)."""
    of, *cached = reply
    if of is None:
        return dict.fromkeys(player_ids), []
    snapshot_id = of.decode()
    ranks: dict[str, int | None] = {}
    missing: list[str] = []
    for player_id, raw in zip(player_ids, cached, strict=True):
        seen, _, rank = (raw.decode() if raw is not None else "").partition(":")
        if seen == snapshot_id:
            ranks[player_id] = int(rank) if rank else None
        else:
            ranks[player_id] = None
            missing.append(player_id)
    return ranks, missing


def rank_24h_ago_of(r: redis.Redis, *, keys: Keys, player_id: str, reply: Sequence[bytes | None]) -> int | None:
    """The player's rank in the snapshot taken 24 hours before the latest one, from a
    movement_call reply; null when there is no such snapshot or it did not rank them."""
    ranks, missing = movements_of([player_id], reply)
    if not missing:
        return ranks[player_id]
    of = reply[0]
    assert of is not None
    snapshot_id = of.decode()
    try:
        snapshot = SeasonSnapshot.objects.select_related("season").filter(pk=int(snapshot_id)).first()
        if snapshot is None:  # pruned since: the next snapshot names another
            return None
        places = snapshot_places(season=snapshot.season, player_id=player_id, snapshots=[
            (snapshot.pk, snapshot.taken_for, snapshot.version, snapshot.total_players, snapshot.hidden)])
    except DatabaseError:
        # The rank is Redis's: a database that cannot answer costs the movement (null,
        # not kept), never the read.
        log.warning("rank_24h_ago of %s left out: the database did not answer", player_id, exc_info=True)
        return None
    found = places[0].rank if places else None
    r.hset(keys.moved, player_id, f"{snapshot_id}:{'' if found is None else found}")
    return found


def rank_24h_ago_riding(reader: RankReader, *, player_id: str, at: int) -> int | None:
    """rank_24h_ago_of the movement_call a read sent as its `at`-th `also` command (in its
    first round trip); in a round trip of its own when the read needed none."""
    reply = (reader.also_replies[at] if reader.also_replies is not None
             else round_trip(reader.r, [movement_call(reader.keys, player_id)])[0])
    return rank_24h_ago_of(reader.r, keys=reader.keys, player_id=player_id, reply=reply)


def movements_fill(r: redis.Redis, *, keys: Keys, player_ids: Sequence[str]) -> int:
    """Compute and keep the rank_24h_ago of players whose rank is not kept yet (the live
    board's followers, after the hourly change of snapshot); how many it computed."""
    (reply,) = round_trip(r, [movements_call(keys, player_ids)])
    _, missing = movements_of(player_ids, reply)
    for player_id in missing:
        rank_24h_ago_of(r, keys=keys, player_id=player_id, reply=[reply[0], None])
    return len(missing)
