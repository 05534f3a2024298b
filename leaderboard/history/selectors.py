"""A player's rank in past snapshots (docs/api.md, Movement and history): their score from
the ledger as of each snapshot's version, their rank from the snapshot's histogram."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime

from django.db import connection

from leaderboard.core.history import HistogramChunk, midnights, value_at
from leaderboard.ledger_reads import ledger_queryset_of_player
from leaderboard.models import ScoreEvent, SeasonSnapshot
from seasons.models import Season


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


def snapshot_places(*, season: Season, player_id: str, snapshots: Sequence[tuple[int, datetime, int, int]]
                    ) -> list[SnapshotPlace]:
    """The player's place in each of `snapshots` ((id, taken_for, version, total_players),
    oldest first) where they were ranked: one read of their applied events, one of the
    chunks holding their values."""
    if not snapshots:
        return []
    newest = max(version for _, _, version, _ in snapshots)
    changes = [(published, after) for published, after in ledger_queryset_of_player(
        season=season, player_id=player_id,
        queryset=ScoreEvent.objects.filter(season=season, player_id=player_id, status="applied",
                                           pending_version__lte=newest)
        .order_by("id").values_list("pending_version", "score_after"))
        if published is not None and after is not None]
    flip = season.board_kind.flip
    wanted: list[tuple[int, datetime, int, int, int, int]] = []
    for pk, taken_for, version, total in snapshots:
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
    one = ("SELECT * FROM (SELECT snapshot_id, above, chunk_values, chunk_counts FROM leaderboard_snapshotchunk "
           "WHERE snapshot_id = %s AND low <= %s ORDER BY low DESC LIMIT 1) AS c{}")
    sql = " UNION ALL ".join(one.format(i) for i in range(len(wanted)))
    with connection.cursor() as cursor:
        cursor.execute(sql, [x for pair in wanted for x in pair])
        rows = cursor.fetchall()
    return {pk: HistogramChunk.decoded(bytes(values), bytes(counts), above=above)
            for pk, above, values, counts in rows}


def player_history_get(*, season: Season, player_id: str, days: int, today: date) -> list[SnapshotPlace]:
    """The player's place at 00:00 UTC of each of the `days` days ending `today`, oldest
    first, for the days they were ranked (and a snapshot was taken)."""
    snapshots = list(SeasonSnapshot.objects.filter(season=season, taken_for__in=midnights(today=today, days=days))
                     .order_by("taken_for").values_list("pk", "taken_for", "version", "total_players"))
    return snapshot_places(season=season, player_id=player_id, snapshots=snapshots)
