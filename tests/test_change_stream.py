"""The durable change stream (docs/rules.md, The change stream): ScoreChanged rows written with the ledger, and
score_changes_after, which must never skip a committed change, also when concurrent
transactions commit out of sequence order."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection

from leaderboard.core.events import events_parse
from leaderboard.models import ScoreChange
from leaderboard.selectors import ChangeCursor, ChangeRow, score_changes_after
from leaderboard.services import score_events_apply
from seasons.models import Season
from tests.conftest import requires_postgres


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


def read_until(season: Season, cursor: ChangeCursor, count: int, timeout: float = 10.0) -> list[ChangeRow]:
    """Read from `cursor` until `count` rows came back. On PostgreSQL the reader only returns
    changes below the oldest running transaction of the whole cluster, so an unrelated
    session's transaction may hold them back for a moment: wait for it, with a bound."""
    deadline = time.monotonic() + timeout
    while True:
        rows = read_all(season, cursor)
        if len(rows) >= count or time.monotonic() > deadline:
            return rows
        time.sleep(0.05)


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


def test_change_rows_carry_season_commit_time_and_writer_txid(
    season: Season
) -> None:
    before = datetime.now(UTC)
    apply(season, ev("e", "p", 1))
    change = ScoreChange.objects.get()
    assert change.season_id == season.pk
    assert before <= change.committed_at <= datetime.now(UTC)
    if connection.vendor == "postgresql":
        with connection.cursor() as db:
            db.execute("SELECT pg_current_xact_id()::text::bigint")
            (current,) = db.fetchone()
        # written by this test's (still open) transaction
        assert change.txid == current
    else:
        assert change.txid == 0


# --- reading the stream ------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_committed_changes_are_read_in_cursor_order(
    season_factory: Callable[..., Season]
) -> None:
    season = season_factory(slug="stream")
    other = season_factory(slug="other")
    apply(season, ev("e1", "a", best_score=1),
          ev("e2", "b", best_score=2))
    apply(other, ev("x1", "a", best_score=50))
    apply(season, ev("e3", "a", best_score=3, score_version=10))
    apply(season, ev("e4", "b", best_score=1, score_version=10))  # unchanged
    apply(season, ev("e5", "c", best_score=4, score_version=5))

    rows = read_until(season, ChangeCursor(), 4)
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
    assert [as_tuple(r) for r in read_until(other, ChangeCursor(), 1)] == [("a", None, 50, 1, "x1")]


@pytest.mark.django_db(transaction=True)
def test_pages_with_limit_resume_from_the_cursor(
    season_factory: Callable[..., Season]
) -> None:
    season = season_factory(slug="paged")
    for batch in range(3):
        apply(season, *[
            ev(f"b{batch}-{i}", f"p{i}", best_score=batch * 10 + i,
                          score_version=batch + 1)
            for i in range(3)
        ])
    everything = read_until(season, ChangeCursor(), 9)
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


# --- concurrent writers committing out of sequence order (PostgreSQL) -----------------------


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
    """Insert one ScoreChanged row as the write path does; returns (id, txid)."""
    row = conn.execute(
        "INSERT INTO leaderboard_scorechange "
        "(season_id, player_id, old_score, new_score, score_version, event_id, committed_at, txid) "
        "VALUES (%s, %s, NULL, %s, 1, %s, now(), pg_current_xact_id()::text::bigint) "
        "RETURNING id, txid",
        [season.pk, player_id, new_score, f"evt-{player_id}"],
    ).fetchone()
    assert row is not None
    return row[0], row[1]


def assign_xid(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()
    assert row is not None
    return int(row[0])


def naive_read(season: Season, last_id: int) -> list[int]:
    """The reader the selector must NOT be: "every id above the last one I saw"."""
    with connection.cursor() as db:
        db.execute(
            "SELECT id FROM leaderboard_scorechange WHERE season_id = %s AND id > %s ORDER BY id",
            [season.pk, last_id],
        )
        return [row[0] for row in db.fetchall()]


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

    def poll_until(self, expected_total: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.seen) < expected_total and time.monotonic() < deadline:
            self.poll()
            if len(self.seen) < expected_total:
                time.sleep(0.05)


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_lower_id_committing_last_is_not_skipped(
    season_factory: Callable[..., Season], pg_connections: Callable[[], psycopg.Connection[Any]]
) -> None:
    season = season_factory(slug="race")
    tx_a, tx_b = pg_connections(), pg_connections()
    id_a, txid_a = insert_change(tx_a, season, "A", 10)  # lower id, lower txid
    id_b, txid_b = insert_change(tx_b, season, "B", 20)  # higher id, higher txid
    assert id_a < id_b and txid_a < txid_b
    tx_b.commit()

    consumer = StreamConsumer(season)
    assert consumer.poll() == []  # B is committed, but A (older) can still commit below it
    assert consumer.poll() == []

    tx_a.commit()
    consumer.poll_until(2)
    assert consumer.seen == [id_a, id_b]
    assert consumer.poll() == []


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_naive_id_reader_would_skip_the_late_committer(
    season_factory: Callable[..., Season], pg_connections: Callable[[], psycopg.Connection[Any]]
) -> None:
    """The same race read with "id > last id": A's change is lost. Shows the scenario is real."""
    season = season_factory(slug="naive")
    tx_a, tx_b = pg_connections(), pg_connections()
    id_a, _ = insert_change(tx_a, season, "A", 10)
    id_b, _ = insert_change(tx_b, season, "B", 20)
    tx_b.commit()

    seen = naive_read(season, 0)
    assert seen == [id_b]  # B already visible, A not yet committed
    last_id = seen[-1]
    tx_a.commit()
    assert naive_read(season, last_id) == []  # A is below last_id: skipped forever
    assert naive_read(season, 0) == [id_a, id_b]  # although it is committed


@requires_postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("first_commit", ["older_txid", "younger_txid"])
def test_txid_order_differs_from_id_order(
    first_commit: str,
    season_factory: Callable[..., Season],
    pg_connections: Callable[[], psycopg.Connection[Any]],
) -> None:
    """X takes its transaction id first but inserts last: X has the lower txid and the higher
    row id. Whichever commits first, every change is delivered exactly once."""
    season = season_factory(slug=f"xid-{first_commit}".replace("_", "-"))
    tx_x, tx_y = pg_connections(), pg_connections()
    xid_x = assign_xid(tx_x)
    id_y, txid_y = insert_change(tx_y, season, "Y", 20)
    id_x, txid_x = insert_change(tx_x, season, "X", 10)
    assert txid_x == xid_x < txid_y and id_y < id_x

    consumer = StreamConsumer(season)
    naive_last = 0
    naive_seen: list[int] = []
    first, second = (tx_x, tx_y) if first_commit == "older_txid" else (tx_y, tx_x)
    first.commit()
    if first is tx_x:
        consumer.poll_until(1)
        assert consumer.seen == [id_x]
    else:
        assert consumer.poll() == []  # Y must wait for the older X
    naive_seen += naive_read(season, naive_last)
    naive_last = max([naive_last, *naive_seen])

    second.commit()
    consumer.poll_until(2)
    assert sorted(consumer.seen) == sorted([id_x, id_y])
    assert consumer.seen == [id_x, id_y]  # cursor order: by txid, then id
    assert len(consumer.seen) == len(set(consumer.seen))
    assert consumer.poll() == []

    naive_seen += naive_read(season, naive_last)
    if first is tx_x:
        assert id_y not in naive_seen  # the naive reader lost Y


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_many_interleaved_writers_never_lose_a_change(
    season_factory: Callable[..., Season], pg_connections: Callable[[], psycopg.Connection[Any]]
) -> None:
    """Five open transactions, committed in reverse order, read between every commit."""
    season = season_factory(slug="many")
    txs = [pg_connections() for _ in range(5)]
    ids = [insert_change(tx, season, f"P{i}", i)[0] for i, tx in enumerate(txs)]
    consumer = StreamConsumer(season)
    for tx in reversed(txs[1:]):
        tx.commit()
        assert consumer.poll() == []  # the oldest writer is still open: nothing may pass it
    txs[0].commit()
    consumer.poll_until(5)
    assert consumer.seen == ids
