"""Django's PostgreSQL backend, its pool (DB_POOL_SIZE) made to answer at once while the
server refuses connections.

psycopg's pool makes a request wait for a connection up to its `timeout`
(DB_POOL_TIMEOUT) and connects in the background, retrying a refused connection after 1,
2, 4, ... seconds. With PostgreSQL out of connections ("too many clients", a role's
CONNECTION LIMIT) or down, a process holding no connection then had every write wait the
whole DB_POOL_TIMEOUT for its 503, and once connections were free again it went on
refusing writes until its next retry (up to minutes after a long outage).

Here, while the server's answer to the pool's last connection attempt (within the last
second) was a refusal and the pool holds no connection (none idle, none lent out that
could come back), a request fails within REFUSED_WAIT_SECONDS with that refusal, an
OperationalError the API answers 503 `unavailable` (leaderboard/api/errors.py, OUTAGES).
A pool with connections lent out still waits up to DB_POOL_TIMEOUT for one to come back.
Requests keep a connection attempt going, so the pool finds the server back by itself:
the settings bound the pool's retrying of one attempt to `reconnect_timeout` (1 s), after
which the next request starts a new one at once (tests/test_db_connections_exhausted.py).

It hooks psycopg_pool's private `_connect` (3.1 to 3.3) and builds the pool as Django
5.2's DatabaseWrapper.pool does: that test fails if an upgrade changes either.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
from django.db.backends.base.base import NO_DB_ALIAS
from django.db.backends.postgresql import base
from psycopg_pool import ConnectionPool, PoolTimeout

# How long a request waits before it checks whether the server refused the pool's
# connection attempt: the delay of a write's 503 while the server refuses connections.
REFUSED_WAIT_SECONDS = 0.1
# A refusal older than this says nothing of the server now (the pool retries about every
# second while requests come): a request then waits for the pool's next attempt.
REFUSAL_FRESH_SECONDS = 1.0


class RefusalAwarePool(ConnectionPool):  # type: ignore[type-arg]
    """psycopg_pool.ConnectionPool whose getconn fails at once, with the server's refusal,
    while the server refuses new connections and the pool holds none."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lent = 0
        self._lent_lock = threading.Lock()
        # (when, what) of the server's answer to the pool's last connection attempt, when
        # it refused it; None once an attempt succeeds.
        self.refusal: tuple[float, str] | None = None

    def _connect(self, timeout: float | None = None) -> Any:
        # The pool's one way to a new connection (its background attempts included).
        try:
            conn = super()._connect(timeout)
        except psycopg.OperationalError as exc:
            self.refusal = (time.monotonic(), str(exc).strip())
            raise
        self.refusal = None
        return conn

    def getconn(self, timeout: float | None = None) -> Any:
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            # In short waits while the pool lends nothing out: a refusal then fails the request.
            # Each wait that finds no connection idle has the pool connect (one attempt at a time).
            wait = min(REFUSED_WAIT_SECONDS, remaining) if self._lent == 0 else remaining
            try:
                conn = super().getconn(max(wait, 0.001))
            except PoolTimeout:
                refusal = self.refusal
                fresh = refusal is not None and time.monotonic() - refusal[0] <= REFUSAL_FRESH_SECONDS
                if refusal is not None and fresh and self._holds_none():
                    raise psycopg.OperationalError(
                        f"the database refuses new connections and this process holds none: {refusal[1]}") from None
                if time.monotonic() >= deadline:
                    raise PoolTimeout(f"couldn't get a connection after {timeout:.2f} sec") from None
                continue
            with self._lent_lock:
                self._lent += 1
            return conn

    def putconn(self, conn: Any) -> None:
        super().putconn(conn)
        with self._lent_lock:
            self._lent -= 1

    def _holds_none(self) -> bool:
        """No connection idle, none lent out (none could come back before the deadline)."""
        return self._lent == 0 and not self.get_stats().get("pool_available", 0)


class DatabaseWrapper(base.DatabaseWrapper):
    """Django's, with RefusalAwarePool as the pool, built as Django builds its own (Django
    5.2's DatabaseWrapper.pool) and put where Django keeps it, before Django looks."""

    @property
    def pool(self) -> ConnectionPool | None:  # type: ignore[type-arg]
        options = self.settings_dict["OPTIONS"].get("pool")
        pools: dict[str, ConnectionPool] = self._connection_pools  # type: ignore[attr-defined,type-arg]
        if (options and self.alias != NO_DB_ALIAS and self.alias not in pools
                and self.settings_dict.get("CONN_MAX_AGE", 0) == 0):
            connect_kwargs = self.get_connection_params()
            connect_kwargs["autocommit"] = True  # as Django's: it sets the mode itself later
            pool = RefusalAwarePool(
                kwargs=connect_kwargs,
                open=False,
                configure=self._configure_connection,  # type: ignore[attr-defined]
                check=ConnectionPool.check_connection if self.settings_dict["CONN_HEALTH_CHECKS"] else None,
                **({} if options is True else options),
            )
            pools.setdefault(self.alias, pool)
        return super().pool  # type: ignore[misc]
