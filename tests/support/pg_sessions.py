"""Sessions of a test's own on the test database, beside the service's: to hold a lock a
write must wait behind, or count what the server's sessions are doing."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from django.db import connection

from leaderboard.models import PlayerScore


def pg_session(**overrides: Any) -> psycopg.Connection[Any]:
    """A connection of the test's own to the test database (autocommit unless overridden)."""
    params = connection.get_connection_params()
    params = {k: v for k, v in params.items() if k in {"dbname", "user", "host", "port", "password"}}
    return psycopg.connect(**{**params, "autocommit": True, **overrides})


@contextmanager
def current_scores_locked(*, release_after: float) -> Iterator[Callable[[], None]]:
    """A session holding ACCESS EXCLUSIVE on the current scores (as a migration or a stray
    maintenance statement would) until the test calls the function yielded, or
    `release_after` seconds pass: a write path that never gives up then fails the test on
    the time taken instead of hanging it."""
    other = pg_session(autocommit=False)
    other.execute(f"LOCK TABLE {PlayerScore._meta.db_table} IN ACCESS EXCLUSIVE MODE")
    guard = threading.Lock()
    released = threading.Event()

    def unlock() -> None:
        with guard:
            if not released.is_set():
                released.set()
                other.rollback()

    timer = threading.Timer(release_after, unlock)
    timer.start()
    try:
        yield unlock
    finally:
        timer.cancel()
        unlock()
        other.close()
