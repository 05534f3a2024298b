"""Set-based reads and writes of the ledger tables for one batch.

PostgreSQL gets one round trip per step with arrays (`= ANY`, `unnest`) and the three
inserts fused into one statement; other backends (the embedded SQLite default) use the
ORM's bulk operations. Both write exactly what `core.ledger.batch_plan` decided; the
tests run the same suite on both.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Collection, Iterable, Iterator, Mapping
from datetime import UTC, datetime

from django.db import DatabaseError, connection, connections, transaction

from leaderboard.core.events import KIND_CORRECTION, KIND_RESULT
from leaderboard.core.ledger import APPLIED, UNCHANGED, BatchPlan, Counted, LedgerRow, PlayerState, RecordedEvent
from leaderboard.core.partitions import TXID_PARTITION_SHIFT, layout_partition
from leaderboard.ledger_databases import DEFAULT_ALIAS, ledger_alias
from leaderboard.models import (
    LateResult,
    PlayerProfile,
    PlayerScore,
    ScoreChange,
    ScoreEvent,
    ScoreEventConflict,
    StreamHead,
)
from seasons.models import Season

log = logging.getLogger(__name__)

# Namespaces of the writers' advisory locks (pg_advisory_xact_lock(int, int)), two levels:
# the season's lock, (0x5C11, season), taken shared by every batch and exclusively by a
# season-wide write; and a lock per partition, taken exclusively by the batches writing it.
# Partition 0 is (0x5C0E, season), partition p > 0 (_PARTITION_LOCK_BASE + p, season),
# above every other namespace. A batch holds at most 1 + MAX_PARTITIONS locks, a season-wide
# write one per season: PostgreSQL's shared lock table holds max_locks_per_transaction x
# max_connections (docs/operations.md, Sizing ledger partitions).
_PARTITION_0_LOCK = 0x5C0E
_PARTITION_LOCK_BASE = _PARTITION_0_LOCK << 15
_SEASON_LOCK = 0x5C11
# A FINAL season's correction list, in "default" (final_corrections_lock).
_FINAL_CORRECTIONS_LOCK = 0x5C12


def _text_array(values: Iterable[str | None]) -> str:
    """A PostgreSQL array literal (cast it with ::text[] or ::timestamptz[]).

    psycopg adapts a Python list element by element in pure Python (~1 ms per 1,000
    elements, ~15 ms for one batch's 25 arrays, all of it under the partitions' locks); a
    literal built with str.join is several times cheaper. Every element is quoted and
    backslash-escaped, so any character (quotes, braces, commas, spaces) round-trips.
    """
    return "{" + ",".join(
        [
            "NULL" if v is None else '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
            for v in values
        ]
    ) + "}"


def _int_array(values: Iterable[int | None]) -> str:
    """A PostgreSQL array literal of integers (cast it with ::int[] or ::bigint[])."""
    return "{" + ",".join(["NULL" if v is None else str(int(v)) for v in values]) + "}"


def _utc(instant: datetime | None) -> str | None:
    # Instants go to the database in UTC: RFC 3339 allows offsets up to +-23:59 and
    # PostgreSQL refuses +-16:00 and beyond.
    return None if instant is None else instant.astimezone(UTC).isoformat()


def is_postgres(*, using: str = DEFAULT_ALIAS) -> bool:
    return connections[using].vendor == "postgresql"


def partition_lock_key(partition: int) -> int:
    return _PARTITION_0_LOCK if partition == 0 else _PARTITION_LOCK_BASE + partition


def partition_write_locks(*, season_id: int, partitions: Iterable[int], using: str = DEFAULT_ALIAS) -> None:
    """Serialize the writers of these ledger partitions of one season until the transaction
    ends, and hold off the season-wide writes (season_write_lock) meanwhile.

    Events of a batch take effect in order and a player's version only moves forward; a
    player's rows all live in one partition, so serializing per partition keeps that
    exact without row-lock ordering or retry loops, while batches on disjoint partitions
    commit in parallel. The season's lock is taken first (shared), then the partitions'
    in ascending order, so two batches sharing partitions never deadlock. On SQLite,
    BEGIN IMMEDIATE (settings) already serializes every writer.

    `using`: the partitions' database (their locks are taken there: each database
    serializes its own partitions' writers). The season's lock is always in "default",
    where the season-wide writes take it (in the caller's transaction there; a batch
    spanning databases holds it for its session too: season_lock_shared_hold).
    """
    season_lock_shared(season_id=season_id)
    if is_postgres(using=using):
        keys = [partition_lock_key(p) for p in sorted(set(partitions))]
        with connections[using].cursor() as cursor:
            # A function scan returns the array in order: the locks are taken in that order.
            cursor.execute("SELECT count(pg_advisory_xact_lock(k, %s)) FROM unnest(%s::int[]) AS u(k)",
                           [season_id, _int_array(keys)])


def season_lock_shared(*, season_id: int) -> None:
    """The season's lock, shared, until the transaction on "default" ends: what every
    batch holds, so no season-wide write (season_write_lock) runs between its reads and
    its commit."""
    if is_postgres():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock_shared(%s, %s)", [_SEASON_LOCK, season_id])


@contextlib.contextmanager
def season_lock_shared_hold(*, season_id: int) -> Iterator[None]:
    """The season's lock, shared, held by the "default" connection's session (not a
    transaction) for the block: a batch spanning ledger databases commits one transaction
    per database, and no season-wide write (a lifecycle transition: the seal) may run
    between those commits. Released on the way out, error or not; a connection that dies
    releases it with itself."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock_shared(%s, %s)", [_SEASON_LOCK, season_id])
    try:
        yield
    finally:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock_shared(%s, %s)", [_SEASON_LOCK, season_id])
        except DatabaseError:
            log.warning("season %s: could not release the season's shared lock; ending the session",
                        season_id, exc_info=True)
            _session_end()


def _session_end() -> None:
    """End the "default" connection's session, and its session-level locks with it.
    Django's close() is not enough: it hands a pooled connection back to the pool, session
    and locks included (after a rollback), and inside a transaction it only marks the
    connection. The psycopg connection closed first is one the pool discards."""
    raw = connection.connection
    if raw is not None:
        try:
            raw.close()
        except Exception:
            log.warning("could not close the database connection", exc_info=True)
    connection.close()


def season_write_lock(*, season_id: int) -> None:
    """Serialize every writer of one season until the transaction ends (lifecycle
    transitions, region moves, repartitions): the season's lock, exclusively. It waits for
    the batches holding it shared and holds off every later one, whatever partitions they
    write; one lock however many partitions the season has.
    """
    if is_postgres():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [_SEASON_LOCK, season_id])


def final_corrections_lock(*, season_id: int) -> None:
    """Serialize, until "default" commits, the batches of a FINAL season that list
    corrections while their ledger lives in another database.

    Such a batch commits its partition's database before "default", so a resend of the
    same correction can see the event recorded (a duplicate) while the first sending's
    FinalCorrection is not committed yet, and list it a second time. Taken in "default"
    after the partition's lock and before the partition commits, it makes the resend wait
    for the first sending's "default" commit; nothing waits in the other order.
    """
    if is_postgres():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [_FINAL_CORRECTIONS_LOCK, season_id])


def fence_token_issue(*, season_id: int) -> int:
    """A new fencing token for the season's coordinator lease, larger than every one issued
    before: one statement, committed at once (autocommit), on PostgreSQL and SQLite."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO leaderboard_leasefence (season_id, token) VALUES (%s, 1) "
            "ON CONFLICT (season_id) DO UPDATE SET token = leaderboard_leasefence.token + 1 RETURNING token",
            [season_id],
        )
        return int(cursor.fetchone()[0])


def event_claims_take(*, season_id: int, claims: Iterable[tuple[str, int, str]]) -> dict[str, tuple[int, str]]:
    """Claim event ids in a season split over ledger databases (models.LedgerEventClaim,
    in "default"): `claims` are (event_id, partition, payload_hash); an id claimed before
    keeps its claim. Committed before it returns (the caller writes no partition before):
    a claim outlives a batch that fails afterwards, and its next attempt resumes it.
    Returns every claim of these ids, the earlier ones included: event_id -> (partition,
    payload_hash). Inserted in event-id order, so two batches claiming the same new ids
    wait for each other instead of deadlocking."""
    rows = sorted({c[0]: c for c in reversed(list(claims))}.values())
    ids = [r[0] for r in rows]
    with transaction.atomic(using=DEFAULT_ALIAS), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO leaderboard_ledgereventclaim (season_id, event_id, partition, payload_hash) "
            "SELECT %s, u.e, u.p, u.h FROM unnest(%s::text[], %s::int[], %s::text[]) AS u(e, p, h) "
            "ON CONFLICT (season_id, event_id) DO NOTHING",
            [season_id, _text_array(ids), _int_array([r[1] for r in rows]), _text_array([r[2] for r in rows])],
        )
    # A new statement, a new snapshot: a concurrent claim of one of these ids made the
    # insert above wait for its commit, so it is visible here.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.event_id, c.partition, c.payload_hash FROM unnest(%s::text[]) AS u(event_id) "
            "CROSS JOIN LATERAL (SELECT event_id, partition, payload_hash FROM leaderboard_ledgereventclaim c "
            "WHERE c.season_id = %s AND c.event_id = u.event_id LIMIT 1) AS c",
            [_text_array(ids), season_id],
        )
        return {event_id: (partition, digest) for event_id, partition, digest in cursor.fetchall()}


def recorded_events_fetch(*, season_id: int, event_ids: Iterable[str], using: str) -> dict[str, RecordedEvent]:
    """The ledger rows of these event ids in the database `using` (the partitions there)."""
    ids = list(set(event_ids))
    fields = (
        "event_id", "payload_hash", "status", "status_reason", "player_id",
        "score_after", "version_after", "pending_version",
    )
    if is_postgres(using=using):
        with connections[using].cursor() as cursor:
            # One unique-index probe per id, whatever the statistics say: with `event_id =
            # ANY(...)` a planner that underestimates the season's rows (a new season, stale
            # statistics) scans every ledger row of the season instead, a cost that grows
            # with the season (143 ms per batch at 480k rows, measured).
            cursor.execute(
                f"SELECT {', '.join('e.' + f for f in fields)} FROM unnest(%s::text[]) AS u(event_id) "
                "CROSS JOIN LATERAL (SELECT * FROM leaderboard_scoreevent s "
                "WHERE s.season_id = %s AND s.event_id = u.event_id LIMIT 1) AS e",
                [_text_array(ids), season_id],
            )
            rows = cursor.fetchall()
    else:
        rows = list(
            ScoreEvent.objects.using(using).filter(season_id=season_id, event_id__in=ids).values_list(*fields)
        )
    return {
        row[0]: RecordedEvent(
            payload_hash=row[1], status=row[2], reason=row[3], player_id=row[4],
            score=row[5], score_version=row[6], pending_version=row[7],
        )
        for row in rows
    }


def counted_points_fetch(*, season_id: int, event_ids: Iterable[str], using: str) -> dict[str, Counted]:
    """A sum season's results with these ids as their players' scores count them now: the
    points each was accepted with, or those of its newest applied correction. Results the
    ledger refused (rejected, stale, held) count for nothing and are left out: a
    correction naming one is `unknown_event`."""
    ids = list(set(event_ids))
    if not ids:
        return {}
    results = ScoreEvent.objects.using(using).filter(
        season_id=season_id, event_id__in=ids, kind=KIND_RESULT, status__in=(APPLIED, UNCHANGED),
    ).values_list("event_id", "player_id", "points")
    counted = {event_id: Counted(player_id=player_id, points=points or 0, version=0)
               for event_id, player_id, points in results}
    amended = ScoreEvent.objects.using(using).filter(
        season_id=season_id, corrects__in=list(counted), kind=KIND_CORRECTION, status=APPLIED,
    ).values_list("corrects", "points", "score_version")
    for target, points, version in amended:
        mine = counted[target or ""]
        if version > mine.version:
            counted[target or ""] = Counted(player_id=mine.player_id, points=points or 0, version=version)
    return counted


def player_states_fetch(*, season_id: int, player_ids: Iterable[str], using: str) -> dict[str, PlayerState]:
    ids = list(set(player_ids))
    if is_postgres(using=using):
        with connections[using].cursor() as cursor:
            # Unique-index probes, as for the ledger above (ANY(...) may turn into a scan of
            # the season's current scores).
            cursor.execute(
                "SELECT p.player_id, p.score, p.score_version, p.reached_at, p.revoked_to, p.hidden "
                "FROM unnest(%s::text[]) AS u(player_id) "
                "CROSS JOIN LATERAL (SELECT player_id, score, score_version, reached_at, revoked_to, hidden "
                "FROM leaderboard_playerscore s WHERE s.season_id = %s AND s.player_id = u.player_id LIMIT 1) AS p",
                [_text_array(ids), season_id],
            )
            rows = cursor.fetchall()
    else:
        rows = list(
            PlayerScore.objects.using(using).filter(season_id=season_id, player_id__in=ids).values_list(
                "player_id", "score", "score_version", "reached_at", "revoked_to", "hidden"
            )
        )
    return {row[0]: PlayerState(score=row[1], score_version=row[2], reached_at=row[3], revoked_to=row[4],
                                hidden=bool(row[5])) for row in rows}


def player_regions_fetch(*, season_id: int, season_regions: list[str], player_ids: Iterable[str],
                         using: str) -> dict[str, str]:
    """The batch's players' regions in a season with regions: a player with a score keeps
    the season's record of it; a new one takes the profile's region when the season has
    it. One query, under the batch's locks (a profile move takes the season's lock
    exclusively, so it waits for the batch and the batch for it). `using`: the players'
    ledger database; profiles are in "default" (two queries when that is another one)."""
    ids = list(set(player_ids))
    if using == DEFAULT_ALIAS and is_postgres():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT u.player_id, COALESCE(s.region, CASE WHEN p.region = ANY(%s::text[]) THEN p.region END, '') "
                "FROM unnest(%s::text[]) AS u(player_id) "
                "LEFT JOIN LATERAL (SELECT region FROM leaderboard_playerscore s "
                "WHERE s.season_id = %s AND s.player_id = u.player_id LIMIT 1) AS s ON true "
                "LEFT JOIN leaderboard_playerprofile p ON p.player_id = u.player_id",
                [_text_array(season_regions), _text_array(ids), season_id],
            )
            return dict(cursor.fetchall())
    held = dict(PlayerScore.objects.using(using).filter(season_id=season_id, player_id__in=ids).values_list(
        "player_id", "region"))
    profiles = dict(PlayerProfile.objects.filter(player_id__in=[i for i in ids if i not in held]).values_list(
        "player_id", "region"))
    return {i: held[i] if i in held else (profiles.get(i, "") if profiles.get(i) in season_regions else "")
            for i in ids}


def season_players_region_move(*, season_id: int, season_regions: list[str], moves: Mapping[str, tuple[str, int]],
                               now: datetime) -> int:
    """Move players of one season to their new profile region (`moves`: player ->
    (region, profile_version), region "" for none); returns how many moved. Only players
    with a score in the season move, to the region if the season has it, else to none;
    each move is a change-stream row with the score unchanged and both regions, numbered
    like a score batch in the player's ledger partition. Call under the season's write lock
    (season_write_lock). A season split over ledger databases moves each database's
    players in a transaction there (nested in the caller's on "default"): each database's
    moves are atomic, and a failure after one committed leaves it moved, which a retry of
    the profile write finds done."""
    season = Season.objects.get(pk=season_id)
    wanted = {player_id: region if region in season_regions else "" for player_id, (region, _) in moves.items()}
    partition = {player_id: layout_partition(player_id, base=season.partition_base, partitions=season.partitions)
                 for player_id in wanted}
    by_alias: dict[str, list[str]] = {}
    for player_id, part in partition.items():
        by_alias.setdefault(ledger_alias(season=season, partition=part), []).append(player_id)
    moved = 0
    for alias, players in by_alias.items():
        with transaction.atomic(using=alias):
            moved += _region_moves_write(season_id=season_id, players=players, wanted=wanted, moves=moves,
                                         partition=partition, now=now, using=alias)
    return moved


def _region_moves_write(*, season_id: int, players: list[str], wanted: Mapping[str, str],
                        moves: Mapping[str, tuple[str, int]], partition: Mapping[str, int], now: datetime,
                        using: str) -> int:
    held = list(PlayerScore.objects.using(using).select_for_update().filter(season_id=season_id, player_id__in=players))
    moved = [(score, score.region) for score in held if score.region != wanted[score.player_id]]
    if not moved:
        return 0
    for score, _ in moved:
        score.region, score.updated_at = wanted[score.player_id], now
    PlayerScore.objects.using(using).bulk_update([score for score, _ in moved], ["region", "updated_at"])
    txids = stream_numbers_take(season_id=season_id, partitions={partition[score.player_id] for score, _ in moved},
                                using=using)
    ScoreChange.objects.using(using).bulk_create(
        ScoreChange(
            season_id=season_id, player_id=score.player_id, old_score=score.score, new_score=score.score,
            score_version=score.score_version, reached_at=score.reached_at, old_reached_at=score.reached_at,
            region=score.region, old_region=old_region, hidden=score.hidden, old_hidden=score.hidden,
            event_id=f"region:{moves[score.player_id][1]}",
            committed_at=now, txid=txids[partition[score.player_id]],
        )
        for score, old_region in moved
    )
    return len(moved)


def stream_numbers_take(*, season_id: int, partitions: Iterable[int], using: str) -> dict[int, int]:
    """Each partition's next commit number (models.StreamHead), as the score write
    statement takes them; on SQLite, where writers are serialized and ids are in commit
    order, the partition's bits alone."""
    ids = sorted(set(partitions))
    if not is_postgres(using=using):
        return {p: p << TXID_PARTITION_SHIFT for p in ids}
    with connections[using].cursor() as cursor:
        cursor.execute(f"WITH {_HEADS_TAKE} SELECT partition, head FROM head",
                       {"season": season_id, "parts": _int_array(ids)})
        return dict(cursor.fetchall())


def stream_planned_lock(*, season_id: int, partitions: Iterable[int], using: str) -> int:
    """The newest version an epoch has fixed its range for in any of these partitions (0:
    none), with their stream heads locked until the batch commits (created if missing,
    with no number handed out). An epoch fixes its range on the same rows
    (`stream_range_plan`), so it either waits for this batch, whose changes are then in
    its version, or went first, and they are in the version after it: the batch's
    `pending_version` is max(published, planned) + 1, exactly. On SQLite writers and the
    epoch's plan are serialized by the database's write lock."""
    ids = sorted(set(partitions))
    if not ids:
        return 0
    if not is_postgres(using=using):
        planned = StreamHead.objects.using(using).filter(season_id=season_id, partition__in=ids)
        return max(planned.values_list("planned_version", flat=True), default=0)
    with connections[using].cursor() as cursor:
        cursor.execute(_PLANNED_LOCK, {"season": season_id, "parts": _int_array(ids)})
        return max((row[0] for row in cursor.fetchall()), default=0)


# The heads locked in ascending partition order, as the partitions' advisory locks are.
_PLANNED_LOCK = """
INSERT INTO leaderboard_streamhead (season_id, partition, head, planned_version)
SELECT %(season)s, p, p::bigint << 48, 0 FROM unnest(%(parts)s::int[]) AS u(p)
ON CONFLICT (season_id, partition) DO UPDATE SET head = leaderboard_streamhead.head
RETURNING planned_version
"""


def stream_range_plan(*, season_id: int, partitions: Iterable[int], version: int, using: str) -> dict[int, int]:
    """Mark `version` as planned on these partitions' stream heads and return each head in
    the same statement: the end of the version's range. A writer holding a head's row
    lock is waited for, and one after it reads the mark (`stream_planned_lock`)."""
    ids = sorted(set(partitions))
    if not ids:
        return {}
    with connections[using].cursor() as cursor:
        cursor.execute(_RANGE_PLAN, {"season": season_id, "parts": _int_array(ids), "version": version})
        return dict(cursor.fetchall())


_RANGE_PLAN = """
INSERT INTO leaderboard_streamhead (season_id, partition, head, planned_version)
SELECT %(season)s, p, p::bigint << 48, %(version)s FROM unnest(%(parts)s::int[]) AS u(p)
ON CONFLICT (season_id, partition) DO UPDATE
    SET planned_version = GREATEST(leaderboard_streamhead.planned_version, EXCLUDED.planned_version)
RETURNING partition, head
"""


def season_player_hidden_set(*, season: Season, player_id: str, hidden: bool, event_id: str,
                             now: datetime) -> tuple[PlayerScore | None, bool]:
    """Hide a player of one season, or restore them (docs/rules.md, Hidden players): their
    current-scores row marked, and a change-stream row that keeps the score and flips the
    mark, numbered like a score batch in the player's ledger partition, so the next
    version takes them off every board or puts their current score back. In the player's
    ledger database, in a transaction there; call under the season's write lock
    (season_write_lock). Returns the row (None: no score in the season) and whether it
    changed (not when it already was as asked: nothing written)."""
    part = layout_partition(player_id, base=season.partition_base, partitions=season.partitions)
    alias = ledger_alias(season=season, partition=part)
    with transaction.atomic(using=alias):
        score = PlayerScore.objects.using(alias).select_for_update().filter(
            season_id=season.pk, player_id=player_id).first()
        if score is None or score.hidden == hidden:
            return score, False
        score.hidden, score.updated_at = hidden, now
        score.save(using=alias, update_fields=["hidden", "updated_at"])
        txids = stream_numbers_take(season_id=season.pk, partitions=[part], using=alias)
        ScoreChange.objects.using(alias).create(
            season_id=season.pk, player_id=player_id, old_score=score.score, new_score=score.score,
            score_version=score.score_version, reached_at=score.reached_at, old_reached_at=score.reached_at,
            region=score.region, old_region=score.region, hidden=hidden or None, old_hidden=(not hidden) or None,
            event_id=event_id, committed_at=now, txid=txids[part],
        )
    return score, True


# Partition p's first number is p << 48 | 1 (core.partitions): partition 0's are the plain
# numbers of a season without partitions.
_HEADS_TAKE = """head AS (
    INSERT INTO leaderboard_streamhead (season_id, partition, head)
    SELECT %(season)s, p, (p::bigint << 48) + 1 FROM unnest(%(parts)s::int[]) AS u(p)
    ON CONFLICT (season_id, partition) DO UPDATE SET head = leaderboard_streamhead.head + 1
    RETURNING partition, head
)"""


_PG_WRITE = f"""
WITH ledger AS (
    INSERT INTO leaderboard_scoreevent (
        season_id, client_id, received_at, event_id, match_id, player_id, best_score,
        score_version, completed_at, kind, reason, payload_hash, status, status_reason,
        score_after, version_after, pending_version, reached_at, points, corrects)
    SELECT %(season)s, %(client)s, %(now)s, e.*
    FROM unnest(%(e_id)s::text[], %(e_match)s::text[], %(e_player)s::text[], %(e_best)s::bigint[],
                %(e_version)s::bigint[], %(e_completed)s::timestamptz[], %(e_kind)s::text[],
                %(e_reason)s::text[], %(e_hash)s::text[], %(e_status)s::text[],
                %(e_status_reason)s::text[], %(e_score_after)s::bigint[],
                %(e_version_after)s::bigint[], %(e_pending)s::bigint[],
                %(e_reached)s::timestamptz[], %(e_points)s::bigint[], %(e_corrects)s::text[]) AS e
), scores AS (
    INSERT INTO leaderboard_playerscore (
        season_id, updated_at, player_id, score, score_version, reached_at, region, revoked_to)
    SELECT %(season)s, %(now)s, s.*
    FROM unnest(%(s_player)s::text[], %(s_score)s::bigint[], %(s_version)s::bigint[],
                %(s_reached)s::timestamptz[], %(s_region)s::text[], %(s_revoked)s::bigint[]) AS s
    ON CONFLICT (season_id, player_id) DO UPDATE
        SET score = EXCLUDED.score, score_version = EXCLUDED.score_version,
            reached_at = EXCLUDED.reached_at, updated_at = EXCLUDED.updated_at,
            revoked_to = EXCLUDED.revoked_to
), {_HEADS_TAKE}, changes AS (
    INSERT INTO leaderboard_scorechange (
        season_id, committed_at, txid, player_id, old_score, new_score, score_version, event_id,
        reached_at, old_reached_at, region, old_region, hidden, old_hidden)
    -- A subquery, not a join: the rows keep the arrays' order, so a player's changes
    -- within the batch take ids in the order they happened.
    SELECT %(season)s, %(now)s, (SELECT h.head FROM head h WHERE h.partition = c.part),
           c.player_id, c.o, c.n, c.v, c.e, c.r, c.orr, c.region, c.region, c.hidden, c.hidden
    FROM unnest(%(c_player)s::text[], %(c_old)s::bigint[], %(c_new)s::bigint[],
                %(c_version)s::bigint[], %(c_event)s::text[], %(c_reached)s::timestamptz[],
                %(c_old_reached)s::timestamptz[], %(c_region)s::text[], %(c_part)s::int[],
                %(c_hidden)s::boolean[])
         AS c(player_id, o, n, v, e, r, orr, region, part, hidden)
)
SELECT 1
"""


def batch_plan_write(*, season_id: int, plan: BatchPlan, client_id: int | None, now: datetime,
                     partitions: Mapping[str, int], using: str, regions: Mapping[str, str] | None = None,
                     hidden: Collection[str] = ()) -> None:
    """Write the plan; `regions` are the batch's players' regions in the season
    (player_regions_fetch; none for a season without regions). A score write never moves
    a player's region: a new player takes it, an existing one keeps its own. `partitions`:
    every player of the batch's ledger partition (the one whose lock the batch holds);
    each partition's changes take that partition's next commit number. `using`: the
    database of those partitions (the conflicts are kept there, beside the event). `hidden`:
    the batch's players staff hid (PlayerState.hidden): their changes are marked so."""
    regions = regions or {}
    if plan.conflicts:
        ScoreEventConflict.objects.using(using).bulk_create(
            ScoreEventConflict(
                season_id=season_id,
                event_id=event.event_id,
                payload_hash=digest,
                payload={
                    "event_id": event.event_id, "match_id": event.match_id,
                    "player_id": event.player_id, "best_score": event.best_score,
                    "score_version": event.score_version,
                    "completed_at": event.completed_at.isoformat(), "kind": event.kind,
                    "reason": event.reason,
                    **({} if event.reached_at is None else {"reached_at": event.reached_at.isoformat()}),
                },
                client_id=client_id,
                received_at=now,
            )
            for event, digest in plan.conflicts
        )
    if not plan.ledger_rows:
        return
    if is_postgres(using=using):
        _pg_write(season_id=season_id, plan=plan, client_id=client_id, now=now, regions=regions,
                  partitions=partitions, using=using, hidden=hidden)
    else:
        _orm_write(season_id=season_id, plan=plan, client_id=client_id, now=now, regions=regions,
                   partitions=partitions, using=using, hidden=hidden)


def _pg_write(*, season_id: int, plan: BatchPlan, client_id: int | None, now: datetime,
              regions: Mapping[str, str], partitions: Mapping[str, int], using: str, hidden: Collection[str]) -> None:
    rows = plan.ledger_rows
    states = plan.player_states
    changes = plan.changes
    # One text per distinct instant: a batch's events mostly share one reached_at (their
    # completed_at), and each appears up to four times (event, score, change old and new);
    # formatting each anew cost ~3.5 ms per 1,000 events inside the partitions' locks.
    texts: dict[datetime | None, str | None] = {None: None}

    def utc(instant: datetime | None) -> str | None:
        text = texts.get(instant)
        if text is None and instant is not None:
            text = texts[instant] = _utc(instant)
        return text

    params = {
        "season": season_id,
        "client": client_id,
        "now": now,
        "e_id": _text_array([r.event.event_id for r in rows]),
        "e_match": _text_array([r.event.match_id for r in rows]),
        "e_player": _text_array([r.event.player_id for r in rows]),
        "e_best": _int_array([r.event.best_score for r in rows]),
        "e_version": _int_array([r.event.score_version for r in rows]),
        # Instants go to the database in UTC: RFC 3339 allows offsets up to +-23:59 and
        # PostgreSQL refuses +-16:00 and beyond.
        "e_completed": _text_array([r.event.completed_at.astimezone(UTC).isoformat() for r in rows]),
        "e_kind": _text_array([r.event.kind for r in rows]),
        "e_reason": _text_array([r.event.reason for r in rows]),
        "e_hash": _text_array([r.payload_hash for r in rows]),
        "e_status": _text_array([r.status for r in rows]),
        "e_status_reason": _text_array([r.reason for r in rows]),
        "e_score_after": _int_array([r.score for r in rows]),
        "e_version_after": _int_array([r.score_version for r in rows]),
        "e_pending": _int_array([r.pending_version for r in rows]),
        "e_reached": _text_array([utc(r.event.reached) for r in rows]),
        "e_points": _int_array([r.event.points for r in rows]),
        "e_corrects": _text_array([r.event.corrects for r in rows]),
        "s_player": _text_array(list(states)),
        "s_score": _int_array([s.score for s in states.values()]),
        "s_version": _int_array([s.score_version for s in states.values()]),
        "s_reached": _text_array([utc(s.reached_at) for s in states.values()]),
        "s_region": _text_array([regions.get(player_id, "") for player_id in states]),
        "s_revoked": _int_array([s.revoked_to for s in states.values()]),
        "c_player": _text_array([c.player_id for c in changes]),
        "c_old": _int_array([c.old_score for c in changes]),
        "c_new": _int_array([c.new_score for c in changes]),
        "c_version": _int_array([c.score_version for c in changes]),
        "c_event": _text_array([c.event_id for c in changes]),
        "c_reached": _text_array([utc(c.reached_at) for c in changes]),
        "c_old_reached": _text_array([utc(c.old_reached_at) for c in changes]),
        "c_region": _text_array([regions.get(c.player_id, "") for c in changes]),
        "c_part": _int_array(change_parts := [partitions[c.player_id] for c in changes]),
        # Null for a player not hidden, as the rows written before the column; without a
        # hidden player, an empty array (unnest pads it with nulls): nothing per change.
        "c_hidden": "{" + ",".join("t" if c.player_id in hidden else "NULL" for c in changes) + "}" if hidden else "{}",
        "parts": _int_array(sorted(set(change_parts))),
    }
    with connections[using].cursor() as cursor:
        cursor.execute(_PG_WRITE, params)


def _orm_write(*, season_id: int, plan: BatchPlan, client_id: int | None, now: datetime,
               regions: Mapping[str, str], partitions: Mapping[str, int], using: str, hidden: Collection[str]) -> None:
    ScoreEvent.objects.using(using).bulk_create(
        ScoreEvent(
            season_id=season_id,
            event_id=r.event.event_id,
            match_id=r.event.match_id,
            player_id=r.event.player_id,
            best_score=r.event.best_score,
            score_version=r.event.score_version,
            completed_at=r.event.completed_at.astimezone(UTC),
            reached_at=r.event.reached.astimezone(UTC),
            kind=r.event.kind,
            reason=r.event.reason,
            payload_hash=r.payload_hash,
            status=r.status,
            status_reason=r.reason,
            score_after=r.score,
            version_after=r.score_version,
            pending_version=r.pending_version,
            points=r.event.points,
            corrects=r.event.corrects,
            client_id=client_id,
            received_at=now,
        )
        for r in plan.ledger_rows
    )
    if plan.player_states:
        PlayerScore.objects.using(using).bulk_create(
            [
                PlayerScore(
                    season_id=season_id, player_id=player_id, score=state.score,
                    score_version=state.score_version, reached_at=state.reached_at,
                    region=regions.get(player_id, ""), updated_at=now, revoked_to=state.revoked_to,
                )
                for player_id, state in plan.player_states.items()
            ],
            update_conflicts=True,
            unique_fields=["season", "player_id"],
            update_fields=["score", "score_version", "reached_at", "updated_at", "revoked_to"],
        )
    if plan.changes:
        ScoreChange.objects.using(using).bulk_create(
            ScoreChange(
                season_id=season_id, player_id=c.player_id, old_score=c.old_score,
                new_score=c.new_score, score_version=c.score_version, event_id=c.event_id,
                reached_at=c.reached_at, old_reached_at=c.old_reached_at, committed_at=now,
                txid=partitions[c.player_id] << TXID_PARTITION_SHIFT,
                region=regions.get(c.player_id, ""), old_region=regions.get(c.player_id, ""),
                hidden=True if c.player_id in hidden else None, old_hidden=True if c.player_id in hidden else None,
            )
            for c in plan.changes
        )


def late_results_record(*, season_id: int, rows: list[LedgerRow], now: datetime, using: str) -> None:
    """Queue pre-cutoff results that arrived after the seal, next to their ledger rows (in
    their database, `using`)."""
    ledger_ids = dict(
        ScoreEvent.objects.using(using).filter(
            season_id=season_id, event_id__in=[r.event.event_id for r in rows]).values_list("event_id", "id")
    )
    LateResult.objects.using(using).bulk_create(
        LateResult(
            season_id=season_id, ledger_event_id=ledger_ids[r.event.event_id], player_id=r.event.player_id,
            best_score=r.event.best_score, completed_at=r.event.completed_at.astimezone(UTC), received_at=now,
            reason=r.reason,
        )
        for r in rows
    )
