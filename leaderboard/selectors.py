"""Reads of the leaderboard app."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import connection
from django.db.models import Q

from leaderboard.core.errors import ReadUnavailable, retry_after_seconds
from leaderboard.core.ranking import Entry
from leaderboard.core.tiebreak import instant_ms
from leaderboard.models import ApiClient, FriendList, PlayerScore, ScoreChange, StreamHead
from leaderboard.rankview import Keys, RankReader
from leaderboard.redis_client import redis_get
from leaderboard.services import api_token_hash


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


# reached_at is stored to the millisecond, so the product is a whole number.
_EPOCH_MS = "(extract(epoch FROM {0}) * 1000)::bigint"


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


def api_client_by_token(*, token: str) -> ApiClient | None:
    return ApiClient.objects.filter(token_hash=api_token_hash(token), active=True).first()


# ------------------------------------------------------------------ leaderboard reads


def leaderboard_reader(*, season_slug: str, region: str | None = None) -> RankReader:
    """A reader of the season's global board, or with `region` of that region's board."""
    return RankReader(
        redis_get(), Keys(settings.REDIS_KEY_PREFIX, season_slug), deadline=settings.READ_DEADLINE_SECONDS,
        region=region,
    )


def read_unavailable() -> ReadUnavailable:
    """Why a read of a season with no complete version fails, for the read API and the live
    boards alike: the next version may come one epoch later."""
    return ReadUnavailable(retry_after=retry_after_seconds(settings.EPOCH_SECONDS))


@dataclass(frozen=True, slots=True)
class PendingScore:
    score: int
    score_version: int
    pending_version: int


def player_pending_score(*, season_slug: str, player_id: str, published: Entry | None,
                         version: int, region: str | None = None) -> PendingScore | None:
    """The ledger's committed score when the published version does not have it yet.

    `region`: on that region's board, so only while the ledger has the player in it (a
    player the ledger has moved elsewhere has nothing pending on this board)."""
    scores = PlayerScore.objects.filter(season__slug=season_slug, player_id=player_id)
    if region is not None:
        scores = scores.filter(region=region)
    row = (
        scores
        .values_list("score", "score_version", "season__published_version")
        .first()
    )
    if row is None:
        return None
    score, score_version, published_version = row
    if published is not None and published.score == score:
        return None
    return PendingScore(score=score, score_version=score_version,
                        pending_version=max(version, published_version) + 1)


@dataclass(frozen=True, slots=True)
class Friends:
    player_ids: list[str]
    # 0: the social service never wrote a list for this player (its versions start at 1).
    graph_version: int


def player_friends_get(*, player_id: str) -> Friends:
    """A player's friend list as the social service last wrote it: one primary-key row."""
    row = FriendList.objects.filter(player_id=player_id).values_list("friends", "graph_version").first()
    if row is None:
        return Friends(player_ids=[], graph_version=0)
    friends, graph_version = row
    # The social service's writes keep it distinct and without the player; a read relies on neither.
    return Friends(player_ids=[f for f in dict.fromkeys(map(str, friends)) if f != player_id],
                   graph_version=graph_version)
