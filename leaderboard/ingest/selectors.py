"""Reads of the ingest side: the season's change stream in commit order."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import connection
from django.db.models import Q

from leaderboard.core.tiebreak import instant_ms
from leaderboard.models import ScoreChange, StreamHead

_EPOCH_MS = "(extract(epoch FROM {0}) * 1000)::bigint"


@dataclass(frozen=True, slots=True, order=True)
class ChangeCursor:
    """A position in a season's change stream: everything at or before it was read."""

    txid: int = 0
    id: int = 0

    def __str__(self) -> str:
        return f"{self.txid}:{self.id}"

    @classmethod
    def parse(cls, text: str) -> ChangeCursor:
        txid, _, ident = text.partition(":")
        return cls(txid=int(txid), id=int(ident))


@dataclass(frozen=True, slots=True)
class ChangeRow:
    cursor: ChangeCursor
    player_id: str
    old_score: int | None
    new_score: int
    score_version: int
    event_id: str
    committed_at: datetime


def score_changes_after(*, season_id: int, cursor: ChangeCursor, limit: int = 10_000) -> list[ChangeRow]:
    """Committed changes after `cursor`, in cursor order, that no later read can precede.

    Sequence ids are handed out before commit, so concurrent writers can commit ids out
    of order: reading "id > last id" would skip the slower one forever. On PostgreSQL
    each change carries its season's commit number (models.StreamHead), handed out in
    commit order: a transaction that can still commit holds a larger number than any
    committed change, so it sorts after whatever this read returns. On SQLite writers
    are serialized (BEGIN IMMEDIATE), so ids are in commit order.
    """
    rows = _change_rows(
        season_id=season_id, cursor=cursor, limit=limit,
        columns=("txid", "id", "player_id", "old_score", "new_score", "score_version", "event_id", "committed_at"),
    )
    return [
        ChangeRow(
            cursor=ChangeCursor(txid=row[0], id=row[1]),
            player_id=row[2],
            old_score=row[3],
            new_score=row[4],
            score_version=row[5],
            event_id=row[6],
            committed_at=row[7],
        )
        for row in rows
    ]


def score_change_heads_after(*, season_id: int, cursor: ChangeCursor, limit: int = 10_000,
                             regions: bool = False) -> list[tuple[int, int, str, int, int, int | None]]:
    """The page `score_changes_after` returns, as (txid, id, player_id, new_score, score_version, old_score).

    Same rows, same order, same visibility rule; only what a materializer needs, as plain
    tuples: an epoch reads tens of thousands of changes and neither parses timestamps nor
    builds an object per change. `regions`: each row ends with its region and old_region
    (a season with regional boards; the others never read the columns).
    """
    return _change_rows(  # type: ignore[return-value]
        season_id=season_id, cursor=cursor, limit=limit,
        columns=("txid", "id", "player_id", "new_score", "score_version", "old_score", *_regions(regions)),
    )


def _regions(regions: bool) -> tuple[str, ...]:
    return ("region", "old_region") if regions else ()


def score_change_reached_after(*, season_id: int, cursor: ChangeCursor, limit: int = 10_000, regions: bool = False,
                               ) -> list[tuple[int, int, str, int, int, int | None, int | None, int | None]]:
    """`score_change_heads_after` for a first_reached season: each row also carries its
    reached_at and old_reached_at as milliseconds since 1970 (None: not recorded), read as
    integers so the epoch parses no timestamp (then region and old_region with `regions`).
    Shared seasons never pay for the columns."""
    if connection.vendor == "postgresql":
        return _change_rows(  # type: ignore[return-value]
            season_id=season_id, cursor=cursor, limit=limit,
            columns=("txid", "id", "player_id", "new_score", "score_version", "old_score",
                     _EPOCH_MS.format("reached_at"), _EPOCH_MS.format("old_reached_at"), *_regions(regions)),
        )
    rows = _change_rows(season_id=season_id, cursor=cursor, limit=limit,
                        columns=("txid", "id", "player_id", "new_score", "score_version", "old_score",
                                 "reached_at", "old_reached_at", *_regions(regions)))
    return [(*row[:6], *(None if t is None else instant_ms(t) for t in row[6:8]), *row[8:]) for row in rows]


def stream_head_committed(*, season_id: int) -> int:
    """The season's last committed commit number: every change numbered at or below it
    is committed and visible to any read that starts now."""
    return StreamHead.objects.filter(season_id=season_id).values_list("head", flat=True).first() or 0


def _change_rows(*, season_id: int, cursor: ChangeCursor, limit: int, columns: tuple[str, ...]) -> list[tuple]:  # type: ignore[type-arg]
    if connection.vendor == "postgresql":
        with connection.cursor() as db:
            db.execute(
                f"SELECT {', '.join(columns)} "
                "FROM leaderboard_scorechange "
                "WHERE season_id = %s AND (txid, id) > (%s, %s) "
                "ORDER BY txid, id LIMIT %s",
                [season_id, cursor.txid, cursor.id, limit],
            )
            return db.fetchall()
    return list(
        ScoreChange.objects.filter(season_id=season_id)
        .filter(Q(txid__gt=cursor.txid) | Q(txid=cursor.txid, id__gt=cursor.id))
        .order_by("txid", "id")
        .values_list(*columns)[:limit]
    )
