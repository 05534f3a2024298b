"""The durable change stream (docs/rules.md, The change stream): ScoreChanged rows written with the ledger, and
score_changes_after, which must never skip a committed change, also when concurrent
transactions commit out of sequence order.

The stream of one ledger partition: every season here has one, whatever the suite's
TEST_SEASON_PARTITIONS (test_partitions and test_ledger_databases read many)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection

from leaderboard.core.events import events_parse
from leaderboard.ingest.selectors import ChangeCursor, ChangeRow, score_changes_after
from leaderboard.ingest.services import score_events_apply
from leaderboard.models import ScoreChange, StreamHead
from seasons.models import Season
from tests.support import materialize


@pytest.fixture
def season(season_factory: Callable[..., Season]) -> Season:
    return season_factory(slug="s1", partitions=1)


def ev(event_id: str, player_id: str, best_score: int, score_version: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "event_id": event_id, "match_id": f"m-{event_id}", "player_id": player_id,
        "best_score": best_score, "score_version": score_version,
        "completed_at": "2026-11-15T12:00:00Z", **extra,
    }


def apply(season: Season, *events: dict[str, Any]) -> list[str]:
    result = score_events_apply(season=season, events=events_parse({"events": list(events)}), client=None)
    return [o.status for o in result.outcomes]


def as_tuple(row: ChangeRow) -> tuple[Any, ...]:
    return (row.player_id, row.old_score, row.new_score, row.score_version, row.event_id)


START = ChangeCursor()


def read_all(season: Season, cursor: ChangeCursor = START, limit: int = 10_000) -> list[ChangeRow]:
    """Page through the stream from `cursor` until it answers nothing new."""
    out: list[ChangeRow] = []
    while True:
        page = score_changes_after(season_id=season.pk, cursor=cursor, limit=limit)
        if not page:
            return out
        assert len(page) <= limit
        out.extend(page)
        cursor = page[-1].cursor


# --- what the write path emits -------------------------------------------------------------


def test_one_change_per_score_change_with_old_and_new_chained(
    season: Season
) -> None:
    statuses = apply(
        season,
        ev("a1", "alice", best_score=100, score_version=1),
        ev("b1", "bob", best_score=7, score_version=1),
        ev("a2", "alice", best_score=80, score_version=2),  # unchanged
        ev("a3", "alice", best_score=500, score_version=2),  # stale
        ev("a4", "alice", best_score=300, score_version=3),
        ev("a1", "alice", best_score=100, score_version=1),  # duplicate
        ev("b1", "bob", best_score=8, score_version=1),  # conflict
        ev("late", "bob", best_score=999, score_version=9,
                      completed_at=(season.cutoff + timedelta(days=1)).isoformat()),  # rejected
    )
    assert statuses == [
        "applied", "applied", "unchanged", "stale", "applied", "duplicate", "conflict", "rejected",
    ]
    statuses = apply(
        season,
        ev("a5", "alice", best_score=20, score_version=4,
                      kind="correction", reason="revoked"),
        ev("a6", "alice", best_score=20, score_version=5,
                      kind="correction", reason="confirmed"),  # applied, same score: no change
        ev("b2", "bob", best_score=9, score_version=2),
    )
    assert statuses == ["applied", "applied", "applied"]
    rows = list(
        ScoreChange.objects.filter(season=season).order_by("id").values_list(
            "player_id", "old_score", "new_score", "score_version", "event_id"
        )
    )
    assert rows == [
        ("alice", None, 100, 1, "a1"),
        ("bob", None, 7, 1, "b1"),
        ("alice", 100, 300, 3, "a4"),
        ("alice", 300, 20, 4, "a5"),
        ("bob", 7, 9, 2, "b2"),
    ]
    for player in ("alice", "bob"):
        chain = [(old, new) for p, old, new, *_ in rows if p == player]
        assert chain[0][0] is None
        assert all(prev[1] == nxt[0] for prev, nxt in zip(chain, chain[1:], strict=False))


def test_change_rows_carry_season_commit_time_and_commit_number(
    season: Season
) -> None:
    before = datetime.now(UTC)
    apply(season, ev("e1", "p", 1))
    apply(season, ev("e2", "p", 2, score_version=2), ev("e3", "q", 3))
    changes = list(ScoreChange.objects.order_by("id"))
    assert all(c.season_id == season.pk for c in changes)
    assert all(before <= c.committed_at <= datetime.now(UTC) for c in changes)
    if connection.vendor == "postgresql":
        # One number per writing transaction, in the season's commit order.
        assert [c.txid for c in changes] == [1, 2, 2]
        assert StreamHead.objects.get(season=season).head == 2
    else:
        assert [c.txid for c in changes] == [0, 0, 0]


# --- reading the stream ------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_committed_changes_are_read_in_cursor_order(
    season_factory: Callable[..., Season]
) -> None:
    season = season_factory(slug="stream", partitions=1)
    other = season_factory(slug="other", partitions=1)
    apply(season, ev("e1", "a", best_score=1),
          ev("e2", "b", best_score=2))
    apply(other, ev("x1", "a", best_score=50))
    apply(season, ev("e3", "a", best_score=3, score_version=10))
    apply(season, ev("e4", "b", best_score=1, score_version=10))  # unchanged
    apply(season, ev("e5", "c", best_score=4, score_version=5))

    rows = read_all(season)
    assert [as_tuple(r) for r in rows] == [
        ("a", None, 1, 1, "e1"),
        ("b", None, 2, 1, "e2"),
        ("a", 1, 3, 10, "e3"),
        ("c", None, 4, 5, "e5"),
    ]
    cursors = [r.cursor for r in rows]
    assert cursors == sorted(cursors)
    assert len(set(cursors)) == 4
    assert all(r.committed_at.tzinfo is not None for r in rows)
    # nothing after the last cursor; the other season's change is never in this stream
    assert score_changes_after(season_id=season.pk, cursor=rows[-1].cursor) == []
    assert [as_tuple(r) for r in read_all(other)] == [("a", None, 50, 1, "x1")]


@pytest.mark.django_db(transaction=True)
def test_pages_with_limit_resume_from_the_cursor(
    season_factory: Callable[..., Season]
) -> None:
    season = season_factory(slug="paged", partitions=1)
    for batch in range(3):
        apply(season, *[
            ev(f"b{batch}-{i}", f"p{i}", best_score=batch * 10 + i,
                          score_version=batch + 1)
            for i in range(3)
        ])
    everything = read_all(season)
    assert len(everything) == 9

    pages: list[list[ChangeRow]] = []
    cursor = ChangeCursor()
    while page := score_changes_after(season_id=season.pk, cursor=cursor, limit=2):
        pages.append(page)
        cursor = page[-1].cursor
    assert [len(p) for p in pages] == [2, 2, 2, 2, 1]
    assert [r for p in pages for r in p] == everything
    # starting mid-stream returns exactly the rest
    assert score_changes_after(season_id=season.pk, cursor=everything[4].cursor) == everything[5:]
    assert [r.event_id for r in everything] == [f"b{b}-{i}" for b in range(3) for i in range(3)]


def test_cursor_text_round_trip_and_order() -> None:
    cursor = ChangeCursor(txid=12345, id=67)
    assert str(cursor) == "12345:67"
    assert ChangeCursor.parse("12345:67") == cursor
    assert ChangeCursor(1, 999) < ChangeCursor(2, 1) < ChangeCursor(2, 2)
    assert ChangeCursor() == ChangeCursor(0, 0)


# --- concurrent writers (PostgreSQL) -------------------------------------------------------


@pytest.fixture
def pg_connections() -> Iterator[Callable[[], psycopg.Connection[Any]]]:
    """Independent psycopg connections to the test database (not Django's)."""
    opened: list[psycopg.Connection[Any]] = []
    settings = connection.settings_dict

    def open_one() -> psycopg.Connection[Any]:
        params = {
            "dbname": settings["NAME"], "user": settings["USER"], "password": settings["PASSWORD"],
            "host": settings["HOST"], "port": settings["PORT"],
        }
        conn = psycopg.connect(**{k: str(v) for k, v in params.items() if v}, autocommit=False)  # type: ignore[arg-type]
        opened.append(conn)
        return conn

    yield open_one
    for conn in opened:
        conn.rollback()
        conn.close()


def insert_change(conn: psycopg.Connection[Any], season: Season, player_id: str, new_score: int) -> tuple[int, int]:
    """Insert one ScoreChanged row the way the write path numbers it (partition 0's next
    commit number, taken by updating its StreamHead row); returns (id, txid)."""
    row = conn.execute(
        "WITH head AS (INSERT INTO leaderboard_streamhead (season_id, partition, head) VALUES (%s, 0, 1) "
        "ON CONFLICT (season_id, partition) DO UPDATE SET head = leaderboard_streamhead.head + 1 RETURNING head) "
        "INSERT INTO leaderboard_scorechange "
        "(season_id, player_id, old_score, new_score, score_version, event_id, committed_at, txid) "
        "SELECT %s, %s, NULL, %s, 1, %s, now(), head FROM head RETURNING id, txid",
        [season.pk, season.pk, player_id, new_score, f"evt-{player_id}"],
    ).fetchone()
    assert row is not None
    return row[0], row[1]


class StreamConsumer:
    """A consumer of score_changes_after: remembers its cursor and everything it was given."""

    def __init__(self, season: Season):
        self.season = season
        self.cursor = ChangeCursor()
        self.seen: list[int] = []

    def poll(self) -> list[int]:
        rows = read_all(self.season, self.cursor)
        if rows:
            self.cursor = rows[-1].cursor
        ids = [r.cursor.id for r in rows]
        self.seen.extend(ids)
        return ids


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_later_writer_waits_for_the_earlier_one_so_nothing_commits_below_the_cursor(
    season_factory: Callable[..., Season], pg_connections: Callable[[], psycopg.Connection[Any]]
) -> None:
    """B cannot take a commit number while A holds the one before it: B's change can
    never become visible ahead of A's and be passed by a consumer's cursor."""
    season = season_factory(slug="race", partitions=1)
    tx_a, tx_b = pg_connections(), pg_connections()
    id_a, number_a = insert_change(tx_a, season, "A", 10)
    consumer = StreamConsumer(season)
    with ThreadPoolExecutor(1) as pool:
        b = pool.submit(insert_change, tx_b, season, "B", 20)
        time.sleep(0.3)
        assert not b.done(), "B took a commit number while A's was still open"
        assert consumer.poll() == []
        tx_a.commit()
        id_b, number_b = b.result(timeout=10)
    assert number_b == number_a + 1
    assert consumer.poll() == [id_a]  # B is not committed yet
    tx_b.commit()
    assert consumer.poll() == [id_b]
    assert consumer.seen == [id_a, id_b] and consumer.poll() == []


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_writer_leaves_a_gap_that_is_never_filled(
    season_factory: Callable[..., Season], pg_connections: Callable[[], psycopg.Connection[Any]]
) -> None:
    season = season_factory(slug="gap", partitions=1)
    tx_a = pg_connections()
    insert_change(tx_a, season, "A", 10)
    tx_a.rollback()
    tx_b = pg_connections()
    id_b, _ = insert_change(tx_b, season, "B", 20)
    tx_b.commit()
    consumer = StreamConsumer(season)
    assert consumer.poll() == [id_b] and consumer.poll() == []


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_long_transaction_elsewhere_on_the_server_does_not_hold_back_this_season(
    season_factory: Callable[..., Season], pg_connections: Callable[[], psycopg.Connection[Any]]
) -> None:
    """A writing transaction held open in another season (and one with only an xid, as any
    other database on the same server could hold) must not delay this season's stream:
    the stream used to wait for the server's oldest running transaction."""
    season, other = season_factory(slug="quiet", partitions=1), season_factory(slug="busy", partitions=1)
    other_writer = pg_connections()
    insert_change(other_writer, other, "X", 1)  # open, uncommitted, holds the oldest xid
    bystander = pg_connections()
    bystander.execute("SELECT pg_current_xact_id()")
    apply(season, ev("q1", "alice", 100), ev("q2", "bob", 200))
    started = time.monotonic()
    rows = read_all(season)
    assert [r.player_id for r in rows] == ["alice", "bob"]
    assert time.monotonic() - started < 1.0


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_many_interleaved_writers_never_lose_or_repeat_a_change(season_factory: Callable[..., Season]) -> None:
    """Writers of one season through the real write path, in threads, read while they run."""
    season = season_factory(slug="many", partitions=1)
    writers, per_writer = 4, 25

    def write(w: int) -> None:
        try:
            for i in range(per_writer):
                apply(season, ev(f"w{w}-{i}", f"p{w}-{i}", 10 + i))
        finally:
            connection.close()

    consumer = StreamConsumer(season)
    with ThreadPoolExecutor(writers) as pool:
        futures = [pool.submit(write, w) for w in range(writers)]
        while not all(f.done() for f in futures):
            consumer.poll()
        for f in futures:
            f.result()
    consumer.poll()
    expected = list(ScoreChange.objects.filter(season=season).order_by("txid", "id").values_list("id", flat=True))
    assert consumer.seen == expected and len(expected) == writers * per_writer


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_a_season_publishes_while_another_seasons_writing_transaction_stays_open(
    season_factory: Callable[..., Season], pg_connections: Callable[[], psycopg.Connection[Any]]
) -> None:
    """Freshness, not just the stream: with another season's writer (a FINAL approval's
    INSERT ... SELECT, say) open across it, this season's epoch publishes every change."""
    season, other = season_factory(slug="fresh", partitions=1), season_factory(slug="stalled", partitions=1)
    apply(other, ev("o1", "x", 1))
    held = pg_connections()
    insert_change(held, other, "y", 2)  # open for the whole test, as a long approval would be
    apply(season, ev("f1", "alice", 300), ev("f2", "bob", 200))
    manifest = materialize(season)
    assert manifest.total == 2
    apply(season, ev("f3", "carol", 100))
    assert materialize(season).total == 3
    held.rollback()
