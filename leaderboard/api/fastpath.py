"""The fast read path: the public read URLs answered straight from ASGI, before Django.

Through Django a read costs ~2.5 ms of CPU and Redis ~0.1 ms of it (bench/reads.py):
the rest is the framework. Under ASGI each hook of Django's built-in middleware hops to
a thread, and every request gets an executor thread of its own. Here a read is one hop
to a fixed pool of threads that runs the very functions the DRF views call
(leaderboard/api/reads.py), so both answer identically.

What Django would have done and still matters is kept: the Host header is checked
against ALLOWED_HOSTS (a request that fails it, or any other request, goes on to Django
unchanged) and the security headers of SecurityMiddleware / XFrameOptionsMiddleware are
set. Database connections of the pool threads are recycled like Django's per request.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import parse_qsl

import orjson
from django.conf import settings
from django.db import close_old_connections
from django.http.request import split_domain_port, validate_host

from leaderboard.api import reads
from leaderboard.api.errors import OUTAGES, ApiError, api_error_body, outage_error, reads_saturated
from leaderboard.api.params import season_id_param
from leaderboard.core.manifest import Manifest
from leaderboard.live.redis_async import loop_redis, pipeline_raw
from leaderboard.ratelimit import ReadLimit, read_limit_for, scope_address
from leaderboard.redis_errors import REDIS_OUTAGES
from leaderboard.views.names import names_call, top_ids
from leaderboard.views.rankview import Rider, manifest_cached
from leaderboard.views.season_index import season_keys

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
# A route's read: the URL's match, the query, and the read limit's command to carry.
Handler = Callable[[re.Match[str], reads.Query, Rider | None], reads.Answer]

_SEASON = r"/v1/seasons/(?P<season>[^/]+)"
# A board's reads: the global board's URLs, or with /regions/{region} a regional board's
# (the group is then None for the global ones).
_BOARD = rf"{_SEASON}(?:/regions/(?P<region>[^/]+))?"
_PLAYER = r"/players/(?P<player>[^/]+)"
_TOP = re.compile(rf"^{_BOARD}/leaderboard/top$")
ROUTES: list[tuple[re.Pattern[str], Handler]] = [
    (_TOP,
     lambda m, q, rider: reads.top_answer(season_id=m["season"], query=q, region=m["region"], rider=rider)),
    (re.compile(rf"^{_BOARD}/leaderboard$"),
     lambda m, q, rider: reads.window_answer(season_id=m["season"], query=q, region=m["region"], rider=rider)),
    (re.compile(rf"^{_BOARD}{_PLAYER}/rank$"),
     lambda m, q, rider: reads.rank_answer(season_id=m["season"], player_id=m["player"], query=q,
                                           region=m["region"], rider=rider)),
    (re.compile(rf"^{_BOARD}{_PLAYER}/neighbors$"),
     lambda m, q, rider: reads.neighbors_answer(season_id=m["season"], player_id=m["player"], query=q,
                                                region=m["region"], rider=rider)),
    (re.compile(rf"^{_SEASON}{_PLAYER}/friends$"),
     lambda m, q, rider: reads.friends_answer(season_id=m["season"], player_id=m["player"], query=q,
                                              rider=rider)),
]


def _baseline_routes() -> list[tuple[re.Pattern[str], Handler]]:
    from leaderboard.api.baseline_views import baseline_answer

    return [(re.compile(rf"^/bench/baseline/seasons/(?P<season>[^/]+){_PLAYER}/rank$"),
             lambda m, q, rider: baseline_answer(season_id=m["season"], player_id=m["player"],
                                                 lean=q.get("client") == "lean", rider=rider))]


def _security_headers() -> list[tuple[bytes, bytes]]:
    headers = [(b"content-type", b"application/json")]
    if settings.SECURE_CONTENT_TYPE_NOSNIFF:
        headers.append((b"x-content-type-options", b"nosniff"))
    if settings.SECURE_REFERRER_POLICY:
        headers.append((b"referrer-policy", str(settings.SECURE_REFERRER_POLICY).encode()))
    if settings.SECURE_CROSS_ORIGIN_OPENER_POLICY:
        headers.append((b"cross-origin-opener-policy", settings.SECURE_CROSS_ORIGIN_OPENER_POLICY.encode()))
    headers.append((b"x-frame-options", str(settings.X_FRAME_OPTIONS).encode()))
    return headers


class _Outage:
    """Whether the process's reads met a Redis outage in the last moment: then reads answer
    503 at once instead of each waiting out its own timeout on a Redis that does not answer
    (and the requests queued behind them waiting for those). A read is let through every
    PROBE_SECONDS to find out, so the process is back within about that once it answers.
    A database outage is not remembered: the reads go on from Redis without it."""

    PROBE_SECONDS = 1.0

    def __init__(self) -> None:
        self.until = 0.0

    def open(self) -> bool:
        return time.monotonic() < self.until

    def met(self) -> None:
        self.until = time.monotonic() + self.PROBE_SECONDS


def _answer(outage: _Outage, handler: Handler, match: re.Match[str], query: reads.Query,
            address: str, limit: ReadLimit | None) -> reads.Answer:
    """A read in a read thread. `limit`: the read limit, sent already by the event loop's
    attempt at the read (`_top_on_loop`) or still to send with the read's first round trip."""
    if outage.open():  # met while this read waited for a thread
        return _error_answer(outage_error(None))
    close_old_connections()
    try:
        try:
            answer = handler(match, query, limit.rider if limit is not None else None)
        except ApiError as exc:
            answer = _error_answer(exc)
        if limit is not None:
            limit.settle()  # over the limit: the 429, whatever the read found
        return answer
    except ApiError as exc:
        return _error_answer(exc)
    except OUTAGES as exc:  # as DRF's exception handler does for the views
        if isinstance(exc, REDIS_OUTAGES):
            outage.met()
        return _error_answer(outage_error(exc))
    finally:
        close_old_connections()


def _error_answer(error: ApiError) -> reads.Answer:
    return reads.Answer(error.status_code, api_error_body(error), error.headers)


# (prefix, season, region) -> the version whose top this process's event loop served
# last (`ReadFastPath._top_on_loop`): its players' names are read with the next pointer.
_TOPS_SERVED: dict[tuple[str, str, str | None], Manifest] = {}

# Reads a process holds at once, per read thread, running or queued for one: past it a
# read answers 503 at once. Normally a handful wait (a read takes about a millisecond); a
# Redis that stops answering holds each thread up to READ_REDIS_TIMEOUT_SECONDS, and
# without a bound every request arriving meanwhile would queue behind them, answered late
# or after its client gave up, with the process's memory growing.
QUEUED_PER_THREAD = 16


class ReadFastPath:
    """ASGI middleware: serves GET on the read routes, hands everything else to `app`."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], *, threads: int = 8):
        self.app = app
        self.in_flight = 0
        self.in_flight_max = threads * QUEUED_PER_THREAD
        self.outage = _Outage()
        self.routes = ROUTES + (_baseline_routes() if settings.BENCH_BASELINE else [])
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="reads")
        self.headers = _security_headers()
        allowed = list(settings.ALLOWED_HOSTS)
        if settings.DEBUG and not allowed:
            allowed = [".localhost", "127.0.0.1", "[::1]"]  # what Django allows then
        self.allowed_hosts = allowed

    def _route(self, scope: Scope) -> tuple[Handler, re.Match[str]] | None:
        if scope["type"] != "http" or scope["method"] != "GET":
            return None
        path = scope["path"]
        if not path.startswith(("/v1/seasons/", "/bench/baseline/")):
            return None
        for pattern, handler in self.routes:
            match = pattern.match(path)
            if match is not None:
                return handler, match
        return None

    async def _top_on_loop(self, match: re.Match[str], query: reads.Query,
                           limit: ReadLimit | None) -> reads.Answer | None:
        """The current version's top, served on the event loop: the pointer (with the read
        limit's token) in one round trip on the loop's own Redis client, then the answer
        this process encoded once for the version. No read thread, no hop to one and back:
        the top is the one read whose answer needs nothing but the pointer. None when the
        read needs more (a pinned version, a manifest this process has not read yet, an
        unknown season or region, a parameter to refuse, a Redis reply to make sense of):
        the read thread then reads it whole, with `limit` as sent here."""
        if "version" in query:
            return None
        try:
            region, size, _ = reads.top_params(query=query, region=match["region"])
            keys = season_keys(season_id_param(match["season"]))
        except ApiError:
            return None
        commands: list[tuple[Any, ...]] = [("GET", keys.ptr)]
        if limit is not None:
            commands.append(limit.rider.command)
        # The names of the top this process served last for the board, read in the same
        # round trip: right whenever the version has not moved since.
        guess = _TOPS_SERVED.get((keys.prefix, keys.season, region))
        ids = top_ids(guess) if guess is not None else []
        if ids:
            commands.append(names_call(keys.prefix, ids))
        try:
            async with asyncio.timeout(settings.READ_REDIS_TIMEOUT_SECONDS):
                replies = await pipeline_raw(loop_redis(), commands)
        except TimeoutError:  # a Redis that does not answer: as a read thread's timeout
            self.outage.met()
            return _error_answer(outage_error(None))
        except Exception:
            # Refused, redirected, a node gone: the read thread's round trip knows what
            # to send again and when it is an outage.
            return None
        if limit is not None:
            limit.rider.reply, limit.rider.sent = replies[1], True
            try:
                limit.settle()
            except ApiError as exc:
                return _error_answer(exc)
        manifest = manifest_cached(keys, int(replies[0])) if replies[0] is not None else None
        if manifest is not None and region is not None:
            manifest = manifest.board_of(region)
        if manifest is None:
            return None
        _TOPS_SERVED[(keys.prefix, keys.season, region)] = manifest
        if manifest is not guess or not ids:
            return None  # a new version: its names with the read thread's top
        return reads.top_of(manifest, region=region, limit=size, names=replies[-1])

    def _host_ok(self, scope: Scope) -> bool:
        host = next((value for name, value in scope["headers"] if name == b"host"), b"").decode("latin-1")
        domain, _port = split_domain_port(host)
        return bool(domain) and validate_host(domain, self.allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        routed = self._route(scope)
        if routed is None or not self._host_ok(scope):
            await self.app(scope, receive, send)
            return
        handler, match = routed
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True))
        loop = asyncio.get_running_loop()
        address = scope_address(scope)
        limit = read_limit_for(address=address)
        answer: reads.Answer | None = None
        if self.in_flight >= self.in_flight_max:
            answer = _error_answer(reads_saturated())
        elif self.outage.open():
            answer = _error_answer(outage_error(None))
        elif match.re is _TOP:
            answer = await self._top_on_loop(match, query, limit)
        if answer is None:
            self.in_flight += 1
            try:
                answer = await loop.run_in_executor(self.pool, _answer, self.outage, handler, match, query,
                                                    address, limit)
            except Exception:
                log.exception("read %s failed", scope["path"])
                answer = reads.Answer(500, {"error": "internal_error", "detail": "the read failed; retry"})
            finally:
                self.in_flight -= 1
        body = answer.raw if answer.raw is not None else orjson.dumps(answer.body)
        headers = [*self.headers, (b"content-length", str(len(body)).encode())]
        headers += [(name.lower().encode(), value.encode()) for name, value in answer.headers.items()]
        await send({"type": "http.response.start", "status": answer.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
