"""A PostgreSQL whose connections run out, on a real server process: writes answer 503
`unavailable` with retry_after in bounded time, nothing of them written (a resend applies
each once), the reads go on from Redis, and the server comes back by itself.

1. The server's own pool (DB_POOL_SIZE) exhausted: its connections are busy with writes
   waiting on a lock the test holds on the current scores; the writes beyond them wait
   DB_POOL_TIMEOUT for a connection, then answer 503. (Under ASGI, Django runs each
   request's view in a thread of its own, no ASGI_THREADS bound: every write is in flight.)
2. PostgreSQL itself refusing connections ("too many connections"): the server runs as a
   role of its own with a CONNECTION LIMIT whose every connection the test holds (the
   shared server's max_connections is other suites' too); its writes answer 503 at once
   (config/postgresql/base.py), and soon after the connections are free again, 200.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import pytest
from django.conf import settings
from django.db import connection
from psycopg import sql

from leaderboard.api.errors import OUTAGE_RETRY_AFTER_SECONDS
from leaderboard.models import ApiClient, PlayerScore, ScoreEvent
from seasons.models import Season
from tests.support import Events, apply_events, ledger_rows, publish
from tests.support.browser import asgi_server, database_url
from tests.support.pg_sessions import current_scores_locked, pg_session

pytestmark = [
    pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("rank_views"),
    pytest.mark.skipif(bool(settings.LEDGER_PARTITION_ALIASES),
                       reason="the lock and the role cover the default database only (LEDGER_PARTITION_URLS is set)"),
]

Batch = list[dict[str, Any]]
Answer = tuple[int, dict[str, Any], float]
PLAYERS = 10
# A write's answer beyond the time it must take: a loaded 2-core machine.
MARGIN = 2.0


def _server_url(*, role: tuple[str, str] | None = None, application_name: str) -> str:
    """The test database's URL, as `role` (name, password; default: the test's own user),
    its sessions named."""
    parts = urlsplit(database_url())
    if role is not None:
        parts = parts._replace(netloc=f"{role[0]}:{role[1]}@{parts.netloc.rpartition('@')[2]}")
    return urlunsplit(parts._replace(query=f"application_name={application_name}"))


def _published_board(season_factory: Callable[..., Season], slug: str) -> tuple[Season, list[str]]:
    """A season with PLAYERS players published, and the rank read of each (served from Redis)."""
    season = season_factory(slug=slug)
    board = Events(tag=f"{slug}-board")
    apply_events(season, [board.result(f"r{i:02d}", 100 * (i + 1)) for i in range(PLAYERS)])
    publish(season)
    return season, [f"/v1/seasons/{slug}/players/r{i:02d}/rank" for i in range(PLAYERS)]


def _post(client: httpx.Client, token: str, slug: str, batch: Batch) -> Answer:
    started = time.monotonic()
    response = client.post(f"/internal/v1/seasons/{slug}/scores:apply", json={"events": batch},
                           headers={"Authorization": f"Bearer {token}"})
    json = response.headers.get("content-type", "").startswith("application/json")
    body = response.json() if json else {"text": response.text}  # a 500's page, for the failure message
    return response.status_code, body, time.monotonic() - started


def _assert_unavailable(answer: Answer) -> None:
    status, body, _ = answer
    assert status == 503, answer
    assert body["error"] == "unavailable" and body["retry_after"] == OUTAGE_RETRY_AFTER_SECONDS, body


class _Reader(threading.Thread):
    """Reads the board's ranks over and over until stopped: (status, seconds) of each."""

    def __init__(self, client: httpx.Client, paths: list[str]):
        super().__init__(daemon=True)
        self.client, self.paths = client, paths
        self.answers: list[tuple[int, float]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            for path in self.paths:
                started = time.monotonic()
                status = self.client.get(path).status_code
                self.answers.append((status, time.monotonic() - started))

    def stop(self) -> list[tuple[int, float]]:
        self.halt.set()
        self.join(timeout=30)
        return self.answers


@contextmanager
def _reads_meanwhile(client: httpx.Client, paths: list[str]) -> Iterator[_Reader]:
    reader = _Reader(client, paths)
    reader.start()
    try:
        yield reader
    finally:
        reader.stop()


def _warm_up(client: httpx.Client, slug: str, paths: list[str]) -> None:
    """A new server's first answers, which need no database: the reads, and a write without
    a token (its view refuses it before any query). The timed writes then take only their own time."""
    assert {client.get(path).status_code for path in paths} == {200}
    refused = client.post(f"/internal/v1/seasons/{slug}/scores:apply", json={"events": []})
    assert refused.status_code == 401, refused.text


def _sessions_counter(app: str, request: pytest.FixtureRequest) -> Callable[..., int]:
    """How many sessions named `app` the test database has (waiting on a lock: only those)."""
    monitor = pg_session()
    request.addfinalizer(monitor.close)

    def count(*, waiting_on_a_lock: bool = False) -> int:
        row = monitor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = %s"
            + (" AND wait_event_type = 'Lock'" if waiting_on_a_lock else ""), [app]).fetchone()
        return int(row[0]) if row else 0

    return count


def _wait_until(check: Callable[[], bool], *, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _resent_once(client: httpx.Client, token: str, slug: str, batches: list[Batch],
                 statuses: list[int], season: Season) -> None:
    """Each batch either applied whole (its last answer 200) or not at all (503); sent
    again, every event of a 503'd batch is applied and every one of an applied batch a
    duplicate; the ledger then holds each event once."""
    written = set(ledger_rows(ScoreEvent, season, "event_id"))
    for batch, status in zip(batches, statuses, strict=True):
        ids = {event["event_id"] for event in batch}
        assert ids <= written if status == 200 else not ids & written, (status, sorted(ids), sorted(written))
    for batch, status in zip(batches, statuses, strict=True):
        resent_status, body, _ = _post(client, token, slug, batch)
        assert resent_status == 200, body
        expected = "duplicate" if status == 200 else "applied"
        assert [result["status"] for result in body["results"]] == [expected] * len(batch), body
    event_ids = ledger_rows(ScoreEvent, season, "event_id")
    assert len(event_ids) == len(set(event_ids)) == PLAYERS + sum(len(batch) for batch in batches)
    scores = dict(ledger_rows(PlayerScore, season, "player_id", "score"))
    for batch in batches:
        for event in batch:
            assert scores[event["player_id"]] == event["best_score"]


# --- 1. The server's own pool exhausted ---------------------------------------------------

POOL_SIZE = 2
POOL_TIMEOUT = 1.0
# The writes holding the pool wait on the lock the whole time: longer than the pool's wait.
STATEMENT_TIMEOUT = 20.0
BEYOND_POOL = 4


def test_writes_beyond_a_busy_pool_answer_503_after_the_pool_timeout_and_reads_go_on(
        season_factory: Callable[..., Season], writer: tuple[ApiClient, str], request: pytest.FixtureRequest) -> None:
    slug, token, app = "pooled", writer[1], "lb-pool-exhausted"
    season, paths = _published_board(season_factory, slug)
    events = Events(tag="pooled")
    batches = [[events.result(f"w{n}a", 10 + n), events.result(f"w{n}b", 20 + n)]
               for n in range(POOL_SIZE + BEYOND_POOL)]
    holders, beyond = batches[:POOL_SIZE], batches[POOL_SIZE:]
    server_sessions = _sessions_counter(app, request)
    server = {"DB_POOL_SIZE": str(POOL_SIZE), "DB_POOL_TIMEOUT": str(POOL_TIMEOUT),
              "WRITE_STATEMENT_TIMEOUT_SECONDS": str(STATEMENT_TIMEOUT)}
    with (asgi_server(DATABASE_URL=_server_url(application_name=app), **server) as base,
          httpx.Client(base_url=base, timeout=60) as client,
          ThreadPoolExecutor(max_workers=len(batches)) as pool):
        _warm_up(client, slug, paths)
        with current_scores_locked(release_after=STATEMENT_TIMEOUT + 10) as unlock:
            held = [pool.submit(_post, client, token, slug, batch) for batch in holders]
            _wait_until(lambda: server_sessions(waiting_on_a_lock=True) == POOL_SIZE, seconds=20,
                        what="the pool's connections did not all wait on the lock")
            with _reads_meanwhile(client, paths) as reader:
                started = time.monotonic()
                answers = list(pool.map(lambda batch: _post(client, token, slug, batch), beyond))
                window = time.monotonic() - started
                sessions = server_sessions()
            reads = reader.answers
            unlock()
            held_answers = [future.result() for future in held]
        took = [elapsed for _, _, elapsed in answers]
        print(f"\npool of {POOL_SIZE} busy: {len(answers)} writes beyond it answered "
              f"{sorted({status for status, _, _ in answers})} in {min(took):.2f}-{max(took):.2f} s "
              f"(DB_POOL_TIMEOUT {POOL_TIMEOUT:g} s), the server holding {sessions} connections; "
              f"{len(reads)} rank reads meanwhile ({window:.2f} s), statuses {sorted({s for s, _ in reads})}, "
              f"slowest {max((e for _, e in reads), default=0):.3f} s; the {POOL_SIZE} holding writes answered "
              f"{[status for status, _, _ in held_answers]} once the lock went")
        for answer in answers:
            _assert_unavailable(answer)
        # They waited for a connection (none was refused), and no longer than the pool's timeout.
        assert min(took) >= POOL_TIMEOUT * 0.9 and max(took) <= POOL_TIMEOUT + MARGIN, took
        assert sessions <= POOL_SIZE, sessions
        assert reads and {status for status, _ in reads} == {200}, reads
        assert {status for status, _, _ in held_answers} <= {200, 503}, held_answers
        _resent_once(client, token, slug, batches, [status for status, _, _ in held_answers + answers], season)


# --- 2. PostgreSQL itself out of connections ----------------------------------------------

ROLE_LIMIT = 2


@contextmanager
def _limited_role(limit: int) -> Iterator[tuple[str, str]]:
    """A login role of this test database's own (other suites share the server, each on a
    database of its own) allowed `limit` connections, with the rights the server needs;
    yields (name, password); dropped at the end, its sessions ended."""
    name = f"lb_exhausted_{connection.settings_dict['NAME']}"[:63]
    password = secrets.token_hex(8)
    admin = pg_session()
    names = {"role": sql.Identifier(name), "db": sql.Identifier(connection.settings_dict["NAME"])}

    def drop() -> None:
        if admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [name]).fetchone():
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [name])
            admin.execute(sql.SQL("DROP OWNED BY {role}").format(**names))  # its grants, here and on the database
            admin.execute(sql.SQL("DROP ROLE {role}").format(**names))

    try:
        drop()  # one a killed run left behind
        admin.execute(sql.SQL("CREATE ROLE {role} LOGIN PASSWORD {password} CONNECTION LIMIT {limit}").format(
            password=sql.Literal(password), limit=sql.Literal(limit), **names))
        for grant in ("GRANT CONNECT ON DATABASE {db} TO {role}",
                      "GRANT USAGE ON SCHEMA public TO {role}",
                      "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}",
                      "GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO {role}"):
            admin.execute(sql.SQL(grant).format(**names))
        yield name, password
    finally:
        drop()
        admin.close()


# The pool's own timeout (the default): a write must not wait for it.
REFUSED_POOL_TIMEOUT = 10.0
REFUSED_BOUND = 3.0
REFUSED_WRITES = 4
# How long the connections stay out, the match service resending meanwhile: psycopg's
# pool on its own would retry ~1, 3, 7 and 15 s after its first refusal, and notice the
# end of this outage 5 s or more after it.
OUTAGE_SECONDS = 8.5
RECOVERY_BOUND = 3.0
# A write refused a new connection while the pool's are lent: how long it waits for one.
LENT_WAIT = 1.0


def test_writes_answer_503_at_once_while_postgresql_refuses_connections_and_recover_by_themselves(
        season_factory: Callable[..., Season], writer: tuple[ApiClient, str],
        capfd: pytest.CaptureFixture[str], request: pytest.FixtureRequest) -> None:
    slug, token, app = "refused", writer[1], "lb-refused"
    server_sessions = _sessions_counter(app, request)
    season, paths = _published_board(season_factory, slug)
    events = Events(tag="refused")
    batches = [[events.result(f"x{n}a", 10 + n), events.result(f"x{n}b", 20 + n)] for n in range(REFUSED_WRITES)]
    with _limited_role(ROLE_LIMIT) as role:
        # Before the server starts: its pool opens (and keeps min_size connections) at its
        # first write, and finds the role's every connection taken.
        held = [pg_session(user=role[0], password=role[1]) for _ in range(ROLE_LIMIT)]
        try:
            with pytest.raises(psycopg.OperationalError, match="too many connections"):
                pg_session(user=role[0], password=role[1]).close()
            with (asgi_server(DATABASE_URL=_server_url(role=role, application_name=app),
                              DB_POOL_TIMEOUT=str(REFUSED_POOL_TIMEOUT)) as base,
                  httpx.Client(base_url=base, timeout=60) as client,
                  ThreadPoolExecutor(max_workers=len(batches)) as pool):
                send = lambda batch: _post(client, token, slug, batch)  # noqa: E731
                _warm_up(client, slug, paths)
                with _reads_meanwhile(client, paths) as reader:
                    started = time.monotonic()
                    answers = list(pool.map(send, batches))
                    while time.monotonic() - started < OUTAGE_SECONDS:  # resent, as the match service does
                        answers += pool.map(send, batches)
                        time.sleep(0.2)
                    window = time.monotonic() - started
                reads = reader.answers
                for session in held:
                    session.close()
                held = []
                released = time.monotonic()
                while (back := send(batches[0]))[0] != 200:
                    _assert_unavailable(back)
                    assert time.monotonic() - released < 30, "the server did not find its database back"
                    time.sleep(0.1)
                recovered = time.monotonic() - released
                assert [result["status"] for result in back[1]["results"]] == ["applied", "applied"], back
                logged = capfd.readouterr().err
                took = [elapsed for _, _, elapsed in answers]
                with capfd.disabled():
                    print(f"\nrole out of connections for {window:.1f} s: {len(answers)} writes answered "
                          f"{sorted({status for status, _, _ in answers})} in {min(took):.2f}-{max(took):.2f} s "
                          f"(DB_POOL_TIMEOUT {REFUSED_POOL_TIMEOUT:g} s); {len(reads)} rank reads meanwhile, "
                          f"statuses {sorted({s for s, _ in reads})}, "
                          f"slowest {max((e for _, e in reads), default=0):.3f} s; "
                          f"writes back {recovered:.2f} s after the connections were released")
                for answer in answers:
                    _assert_unavailable(answer)
                assert max(took) <= REFUSED_BOUND, took
                assert reads and {status for status, _ in reads} == {200}, reads
                assert recovered <= RECOVERY_BOUND, recovered
                # The reason, for the operator: PostgreSQL's own refusal in the server's log.
                assert f'too many connections for role "{role[0]}"' in logged, logged[-2000:]
                _resent_once(client, token, slug, batches, [200] + [503] * (len(batches) - 1), season)

                # The server now holds the role's every connection, lent to writes waiting on
                # a lock: one more write is refused a new connection, and waits for a lent one
                # (it would come back within DB_POOL_TIMEOUT) instead of failing at once.
                more = [[events.result(f"y{n}", 30 + n)] for n in range(ROLE_LIMIT + 1)]
                with current_scores_locked(release_after=REFUSED_POOL_TIMEOUT) as unlock:
                    lent = [pool.submit(send, batch) for batch in more[:ROLE_LIMIT]]
                    _wait_until(lambda: server_sessions(waiting_on_a_lock=True) == ROLE_LIMIT, seconds=20,
                                what="the role's connections did not all wait on the lock")
                    waiting = pool.submit(send, more[ROLE_LIMIT])
                    time.sleep(LENT_WAIT)
                    assert not waiting.done(), waiting.result()
                    unlock()
                    last = waiting.result()
                with capfd.disabled():
                    print(f"one more write, refused a connection while the role's {ROLE_LIMIT} were lent: "
                          f"{last[0]} after {last[2]:.2f} s (the lock held {LENT_WAIT:g} s)")
                assert [answer[0] for answer in [*(f.result() for f in lent), last]] == [200] * len(more), last
                assert last[2] >= LENT_WAIT, last
        finally:
            for session in held:
                session.close()
