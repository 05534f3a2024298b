"""Rate limits: token buckets in Redis shared by every process, and the client's address.

One bucket is one small hash; taking a token is one Lua script in one round trip on the
reading thread's own connection (rankview.round_trip), the time coming from Redis so
processes on different hosts agree. The limits fail open: if Redis cannot be reached the
request goes on (the read itself then answers 503; a sign-in still checks its password).

Live sockets are counted per process instead (no Redis on the handshake): a process
holds at most LIVE_SOCKETS_PER_PROCESS, and LIVE_SOCKETS_PER_ADDRESS from one address.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
from collections import Counter
from collections.abc import Mapping
from typing import Any

import redis
from django.conf import settings
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle
from rest_framework.views import APIView

from leaderboard.api.errors import ApiError
from leaderboard.redis_client import redis_cluster_of, redis_get, redis_reads_get
from leaderboard.redis_errors import REDIS_OUTAGES
from leaderboard.views.rankview import Rider, round_trip

log = logging.getLogger(__name__)

# KEYS[1] the bucket; ARGV tokens per second, bucket size. Returns 0 when a token was
# taken, else the milliseconds until one is available. An idle bucket is full, so it
# expires once it would have refilled: memory only for clients seen recently.
_TAKE = """
local rate, size = tonumber(ARGV[1]), tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local held = redis.call('HMGET', KEYS[1], 'n', 't')
local tokens = tonumber(held[1]) or size
local since = tonumber(held[2]) or now
tokens = math.min(size, tokens + math.max(0, now - since) * rate)
local wait = 0
if tokens >= 1 then tokens = tokens - 1 else wait = math.ceil((1 - tokens) / rate * 1000) end
redis.call('HSET', KEYS[1], 'n', tostring(tokens), 't', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(size / rate * 1000) + 1000)
return wait
"""
_TAKE_SHA = hashlib.sha1(_TAKE.encode()).hexdigest()

Rate = tuple[float, int]  # tokens per second, bucket size (config.env.env_rate)


def _take(r: redis.Redis, key: str, per_second: float, size: int) -> Any:
    """The take script's reply for the bucket `key`. A cluster client runs it on the key's
    master, following redirections; a single Redis on this thread's own connection."""
    cluster = redis_cluster_of(r)
    if cluster is not None:
        try:
            return cluster.evalsha(_TAKE_SHA, 1, key, repr(per_second), size)
        except redis.exceptions.NoScriptError:
            return cluster.eval(_TAKE, 1, key, repr(per_second), size)
    try:
        (reply,) = round_trip(r, [("EVALSHA", _TAKE_SHA, 1, key, repr(per_second), size)])
    except redis.exceptions.NoScriptError:
        (reply,) = round_trip(r, [("EVAL", _TAKE, 1, key, repr(per_second), size)])
    return reply


def _key(kind: str, name: str) -> str:
    # Hashed: a user name or address of any length and alphabet is one short, safe key.
    digest = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()
    return f"{settings.REDIS_KEY_PREFIX}:rl:{kind}:{digest}"


def rate_take(*, kind: str, name: str, rate: Rate | None, r: redis.Redis | None = None,
              key: str | None = None) -> float:
    """Take one token from the bucket `kind`/`name` (or `key`): 0.0 when taken, else the
    seconds to wait. No limit (rate None) or Redis unreachable: 0.0. `r`: the client
    (redis_get())."""
    if rate is None:
        return 0.0
    per_second, size = rate
    key = key or _key(kind, name)
    try:
        reply = _take(r or redis_get(), key, per_second, size)
    except REDIS_OUTAGES:  # the read's own Redis call then answers the outage (503)
        log.warning("rate limit %s not checked: Redis unreachable", kind)
        return 0.0
    if isinstance(reply, Exception):
        raise reply
    return int(reply) / 1000.0


def rate_limited(*, retry_after: float, detail: str) -> ApiError:
    seconds = max(1, math.ceil(retry_after))
    return ApiError(status_code=429, code="rate_limited", detail=detail, extra={"retry_after": seconds},
                    headers={"Retry-After": str(seconds)})


def read_rate_check(*, address: str) -> None:
    """A public read from `address`: raises the 429 when its bucket is empty."""
    wait = rate_take(kind="read", name=address, rate=settings.READ_RATE_LIMIT, r=redis_reads_get())
    if wait:
        raise _read_limited(wait)


def _read_limited(wait: float) -> ApiError:
    return rate_limited(retry_after=wait, detail="too many reads from this address; retry after the given seconds")


class ReadLimit:
    """The read limit of one fast-path read, taken in the read's own first round trip: its
    take script rides along it (rankview.Rider) instead of a round trip of its own, about
    a tenth of a rank read's time. The script runs before the read's commands and is
    settled after them: a read over the limit is answered 429 all the same, and one that
    made no round trip (a 400 before any) takes its token on its own (`settle`)."""

    def __init__(self, address: str, rate: Rate):
        per_second, size = rate
        self.key = _key("read", address)
        self.rate = rate
        # EVAL, not EVALSHA: in a pipelined round trip a NOSCRIPT would fail the read;
        # Redis caches the script by its body.
        self.rider = Rider(("EVAL", _TAKE, 1, self.key, repr(per_second), size))

    def settle(self) -> None:
        """Raises the 429 when the bucket was empty."""
        if self.rider.sent:
            wait = int(self.rider.reply) / 1000.0
        else:
            wait = rate_take(kind="read", name="", rate=self.rate, r=redis_reads_get(), key=self.key)
        if wait:
            raise _read_limited(wait)


def read_limit_for(*, address: str) -> ReadLimit | None:
    """The read limit of a read from `address`, None when reads are not limited."""
    rate = settings.READ_RATE_LIMIT
    return None if rate is None else ReadLimit(address, rate)


class ReadRateThrottle(BaseThrottle):
    """The DRF views' read limit (the fast read path checks the same bucket itself)."""

    def allow_request(self, request: Request, view: APIView) -> bool:
        read_rate_check(address=request_address(request.META))
        return True


def client_address(*, peer: str, forwarded_for: str | None) -> str:
    """The client's address: the peer's, or behind a TLS proxy (BEHIND_TLS_PROXY) the last
    X-Forwarded-For entry, the one the proxy itself appended; earlier entries are whatever
    the client claimed and never trusted."""
    if settings.BEHIND_TLS_PROXY and forwarded_for:
        last = forwarded_for.rsplit(",", 1)[-1].strip()
        if last:
            return last
    return peer


def request_address(meta: Mapping[str, object]) -> str:
    """client_address of a Django request's META."""
    forwarded = meta.get("HTTP_X_FORWARDED_FOR")
    return client_address(peer=str(meta.get("REMOTE_ADDR") or ""),
                          forwarded_for=forwarded if isinstance(forwarded, str) else None)


def scope_address(scope: Mapping[str, object]) -> str:
    """client_address of an ASGI scope (HTTP or websocket)."""
    client = scope.get("client")
    peer = str(client[0]) if isinstance(client, list | tuple) and client else ""
    headers = scope.get("headers") or []
    forwarded = next((v.decode("latin-1") for k, v in headers if k == b"x-forwarded-for"), None)  # type: ignore[attr-defined]
    return client_address(peer=peer, forwarded_for=forwarded)


class SocketCount:
    """The live sockets this process holds, per address and in all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_address: Counter[str] = Counter()
        self._total = 0

    def enter(self, address: str) -> bool:
        """Count one more socket from `address`; False (and nothing counted) over a limit."""
        with self._lock:
            if (self._total >= settings.LIVE_SOCKETS_PER_PROCESS
                    or self._by_address[address] >= settings.LIVE_SOCKETS_PER_ADDRESS):
                return False
            self._by_address[address] += 1
            self._total += 1
            return True

    def leave(self, address: str) -> None:
        with self._lock:
            if self._by_address[address] <= 0:
                return
            self._by_address[address] -= 1
            self._total -= 1
            if not self._by_address[address]:
                del self._by_address[address]


live_sockets = SocketCount()
