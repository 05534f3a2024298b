"""Reads of the ingest side: the season's change stream in commit order."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import connection, connections
from django.db.models import Q

from leaderboard.core.partitions import (
    Watermark,
    partition_end,
    partition_start,
    stream_heads_watermark,
)
from leaderboard.core.tiebreak import instant_ms
from leaderboard.ledger_databases import ledger_alias_by_id, ledger_databases_by_id
from leaderboard.models import PlayerProfile, ScoreChange, StreamHead
from seasons.models import Season

# Larger than any row id: a watermark at (head, MAX_CURSOR_ID) covers every change of its
# partition numbered at or below head.
MAX_CURSOR_ID = 2**63 - 1

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


def score_changes_after(*, season_id: int, cursor: ChangeCursor | Watermark, limit: int = 10_000) -> list[ChangeRow]:
    """Committed changes after `cursor`, in cursor order, that no later read can precede.

    Sequence ids are handed out before commit, so concurrent writers can commit ids out
    of order: reading "id > last id" would skip the slower one forever. On PostgreSQL
    each change carries its ledger partition's commit number (models.StreamHead), handed
    out in commit order: a transaction that can still commit holds a larger number than
    any committed change of its partition, so it sorts after whatever this read returns
    there. On SQLite writers are serialized (BEGIN IMMEDIATE), so ids are in commit order.
    `cursor`: a watermark (a cursor per partition), or a ChangeCursor of partition 0.
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


def score_change_heads_after(*, season_id: int, cursor: ChangeCursor | Watermark, limit: int = 10_000,
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


def score_change_reached_after(*, season_id: int, cursor: ChangeCursor | Watermark, limit: int = 10_000,
                               regions: bool = False,
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


def stream_range_rows(*, season_id: int, partitions: list[int], after: Watermark, upto: Watermark,
                      reached: bool = False, regions: bool = False) -> list[tuple]:  # type: ignore[type-arg]
    """The changes of `partitions` (ascending) after `after` and at or before `upto`, each
    partition's in cursor order, as (txid, id, player_id, new_score, score_version,
    old_score), then with `reached` reached_at and old_reached_at in ms since 1970 (None:
    not recorded), then with `regions` region and old_region, then hidden and old_hidden
    (booleans), and last committed_at in ms since 1970: what core.epoch.range_values reads
    (with hidden=True), and the publication lag of each.
    One query a partition, in the partition's own database; a part of an epoch reads its
    own partitions with it (views.parts)."""
    rows: list[tuple] = []  # type: ignore[type-arg]
    for partition in sorted(partitions):
        low, high = after.cursor(partition), upto.cursor(partition)
        if high <= low:
            continue
        alias = ledger_alias_by_id(season_id=season_id, partition=partition)
        if connections[alias].vendor == "postgresql":
            columns = ["txid", "id", "player_id", "new_score", "score_version", "old_score"]
            if reached:
                columns += [_EPOCH_MS.format("reached_at"), _EPOCH_MS.format("old_reached_at")]
            columns += [*_regions(regions), "COALESCE(hidden, false)", "COALESCE(old_hidden, false)",
                        _EPOCH_MS.format("committed_at")]
            with connections[alias].cursor() as db:
                db.execute(
                    f"SELECT {', '.join(columns)} FROM leaderboard_scorechange "
                    "WHERE season_id = %s AND (txid, id) > (%s, %s) AND (txid, id) <= (%s, %s) AND txid < %s "
                    "ORDER BY txid, id",
                    [season_id, *low, *high, partition_end(partition)],
                )
                rows += db.fetchall()
            continue
        names = ["txid", "id", "player_id", "new_score", "score_version", "old_score",
                 *(("reached_at", "old_reached_at") if reached else ()), *_regions(regions), "hidden", "old_hidden",
                 "committed_at"]
        found = ScoreChange.objects.using(alias).filter(
            season_id=season_id, txid__gte=partition_start(partition)[0], txid__lt=partition_end(partition)).filter(
            Q(txid__gt=low[0]) | Q(txid=low[0], id__gt=low[1])).filter(
            Q(txid__lt=high[0]) | Q(txid=high[0], id__lte=high[1])).order_by("txid", "id").values_list(*names)
        for row in found:
            out = list(row)
            if reached:
                out[6:8] = [None if t is None else instant_ms(t) for t in row[6:8]]
            out[-3:] = [bool(row[-3]), bool(row[-2]), instant_ms(row[-1])]
            rows.append(tuple(out))
    return rows


def stream_partition_changed(*, season_id: int, partition: int, after: Watermark, upto: Watermark) -> bool:
    """Whether `partition` has a change after `after` and at or before `upto` (one probe of
    the cursor index)."""
    low, high = after.cursor(partition), upto.cursor(partition)
    return ScoreChange.objects.using(ledger_alias_by_id(season_id=season_id, partition=partition)).filter(
        season_id=season_id, txid__gte=partition_start(partition)[0], txid__lt=partition_end(partition)).filter(
        Q(txid__gt=low[0]) | Q(txid=low[0], id__gt=low[1])).filter(
        Q(txid__lt=high[0]) | Q(txid=high[0], id__lte=high[1])).exists()


def stream_committed_cursors(*, season_id: int, alias: str, rows: list[tuple[int, int]] | None = None
                             ) -> dict[int, tuple[int, int]]:
    """stream_committed_watermark's cursors of the partitions in one ledger database, read
    on Django's connection to it (in its current transaction: a build reads them in the
    snapshot it scans the scores in), or from `rows` of (partition, head) a caller read
    from leaderboard_streamhead in such a snapshot itself."""
    if connections[alias].vendor != "postgresql":
        last = ScoreChange.objects.using(alias).filter(season_id=season_id).order_by("-id").values_list(
            "id", flat=True).first()
        partitions = _stream_partitions(season_id=season_id, watermark=Watermark())
        return {p: (partition_start(p)[0], last or 0) for p in partitions}
    heads = dict(rows) if rows is not None else dict(
        StreamHead.objects.using(alias).filter(season_id=season_id).values_list("partition", "head"))
    return {p: (h, MAX_CURSOR_ID) for p, h in heads.items()
            if ledger_alias_by_id(season_id=season_id, partition=p) == alias}


def stream_committed_watermark(*, season_id: int) -> Watermark:
    """Each ledger partition's last committed commit number, as a watermark: every change
    at or below it is committed and visible to any read that starts now. A partition's
    head is in its own database (one query per database of the season)."""
    if connection.vendor != "postgresql":
        # SQLite serializes writers (BEGIN IMMEDIATE): ids are in commit order, and each
        # partition's changes carry its bits alone as their txid.
        last = ScoreChange.objects.filter(season_id=season_id).order_by("-id").values_list("id", flat=True).first()
        partitions = _stream_partitions(season_id=season_id, watermark=Watermark())
        return Watermark.of_partitions({p: (partition_start(p)[0], last or 0) for p in partitions})
    heads: dict[int, int] = {}
    for alias in ledger_databases_by_id(season_id=season_id):
        heads.update(_heads(season_id=season_id, using=alias))
    return stream_heads_watermark(heads, last_id=MAX_CURSOR_ID)


def _heads(*, season_id: int, using: str) -> dict[int, int]:
    """The stream heads of the season's partitions in one database (a split season's
    databases each hold only their own partitions' heads)."""
    heads = dict(StreamHead.objects.using(using).filter(season_id=season_id).values_list("partition", "head"))
    return {p: h for p, h in heads.items() if ledger_alias_by_id(season_id=season_id, partition=p) == using}


def stream_last_watermark(*, season_id: int) -> Watermark:
    """The watermark of the newest change of each partition (one index probe each): under
    the season's write lock, everything the season ever committed and nothing more."""
    last = {}
    for partition in _stream_partitions(season_id=season_id, watermark=Watermark()):
        start = partition_start(partition)
        row = (ScoreChange.objects.using(ledger_alias_by_id(season_id=season_id, partition=partition))
               .filter(season_id=season_id, txid__gte=start[0], txid__lt=partition_end(partition))
               .order_by("-txid", "-id").values_list("txid", "id").first())
        if row is not None:
            last[partition] = row
    return Watermark.of_partitions(last)


def stream_oldest_after(*, season_id: int, watermark: Watermark) -> datetime | None:
    """The commit time of the oldest change after `watermark`: the first change of each
    partition after its cursor (one short scan of the cursor index each)."""
    firsts = [
        ScoreChange.objects.using(ledger_alias_by_id(season_id=season_id, partition=p))
        .filter(season_id=season_id, txid__lt=partition_end(p))
        .filter(Q(txid__gt=txid) | Q(txid=txid, id__gt=ident))
        .order_by("txid", "id").values_list("committed_at", flat=True).first()
        for p in _stream_partitions(season_id=season_id, watermark=watermark)
        for txid, ident in [watermark.cursor(p)]
    ]
    return min((f for f in firsts if f is not None), default=None)


def changes_after_q(watermark: Watermark) -> Q:
    """The season's changes after `watermark` (a filter of ScoreChange rows)."""
    q = Q(txid__gte=partition_start(watermark.partitions)[0])
    for p, (txid, ident) in enumerate(watermark.cursors):
        q |= Q(txid__lt=partition_end(p)) & (Q(txid__gt=txid) | Q(txid=txid, id__gt=ident))
    return q


def changes_covered_q(watermark: Watermark) -> Q:
    """The season's changes at or before `watermark` (a filter of ScoreChange rows)."""
    q = Q(pk__in=[])
    for p, (txid, ident) in enumerate(watermark.cursors):
        q |= Q(txid__gte=partition_start(p)[0]) & (Q(txid__lt=txid) | Q(txid=txid, id__lte=ident))
    return q


def stream_changes_between(*, season_id: int, after: Watermark, upto: Watermark) -> bool:
    """Whether the stream holds a change after `after` and at or before `upto` (in any of
    the season's databases)."""
    return any(
        ScoreChange.objects.using(alias).filter(season_id=season_id).filter(
            changes_after_q(after) & changes_covered_q(upto)).exists()
        for alias in ledger_databases_by_id(season_id=season_id)
    )


def _as_watermark(cursor: ChangeCursor | Watermark) -> Watermark:
    return cursor if isinstance(cursor, Watermark) else Watermark.single(cursor.txid, cursor.id)


def _stream_partitions(*, season_id: int, watermark: Watermark) -> list[int]:
    """The partitions to read: every one the season's stream has (a stream head, in each
    of its databases), and those the watermark names."""
    if connection.vendor == "postgresql":
        heads: set[int] = set()
        for alias in ledger_databases_by_id(season_id=season_id):
            heads |= set(_heads(season_id=season_id, using=alias))
    else:
        # SQLite (one database, no stream heads): the partition ids the season has had
        # (old layouts included: a repartition numbers the new one above them) that hold a
        # change, one index probe each instead of a scan of the season's changes.
        base, count = Season.objects.filter(pk=season_id).values_list(
            "partition_base", "partitions").first() or (0, 0)
        heads = {p for p in range(base + count)
                 if ScoreChange.objects.filter(season_id=season_id, txid__gte=partition_start(p)[0],
                                               txid__lt=partition_end(p)).exists()}
    return sorted(heads | set(range(watermark.partitions)))


def _change_rows(*, season_id: int, cursor: ChangeCursor | Watermark, limit: int,
                 columns: tuple[str, ...]) -> list[tuple]:  # type: ignore[type-arg]
    """Up to `limit` changes after `cursor`, partition after partition (ascending), each
    partition's in (txid, id) order: the next page starts after `cursor.advanced(page)`.
    A player's changes are in one partition, or (after a repartition) in partitions read
    in the order the player's changes were made."""
    watermark = _as_watermark(cursor)
    rows: list[tuple] = []  # type: ignore[type-arg]
    for partition in _stream_partitions(season_id=season_id, watermark=watermark):
        txid, ident = watermark.cursor(partition)
        want = limit - len(rows)
        alias = ledger_alias_by_id(season_id=season_id, partition=partition)
        if connections[alias].vendor == "postgresql":
            with connections[alias].cursor() as db:
                db.execute(
                    f"SELECT {', '.join(columns)} "
                    "FROM leaderboard_scorechange "
                    "WHERE season_id = %s AND (txid, id) > (%s, %s) AND txid < %s "
                    "ORDER BY txid, id LIMIT %s",
                    [season_id, txid, ident, partition_end(partition), want],
                )
                rows += db.fetchall()
        else:
            rows += ScoreChange.objects.using(alias).filter(
                season_id=season_id, txid__lt=partition_end(partition)).filter(
                Q(txid__gt=txid) | Q(txid=txid, id__gt=ident)).order_by("txid", "id").values_list(*columns)[:want]
        if len(rows) >= limit:
            break
    return rows


def player_names_get(*, player_ids: list[str]) -> dict[str, tuple[str | None, str | None]]:
    """The players' current (display_name, country) from their profiles, for answers served
    from the database (the FINAL standings, the staff console); the read path serves the
    same from Redis (leaderboard.views.names). Players without a profile are left out."""
    return {player_id: (name, country) for player_id, name, country in PlayerProfile.objects.filter(
        player_id__in=player_ids).values_list("player_id", "display_name", "country")}
