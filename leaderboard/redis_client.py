from __future__ import annotations

from functools import lru_cache
from typing import Any, cast
from urllib.parse import urlsplit

import redis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from redis.exceptions import RedisClusterException, SlotNotCoveredError

# A read waits this long for a reply: big-key deletes elsewhere on the server must not fail small reads.
SOCKET_TIMEOUT = 5.0
SOCKET_CONNECT_TIMEOUT = 2.0


@lru_cache(maxsize=1)
def redis_get() -> redis.Redis:
    """The process's client of the rank views' Redis: a `redis.RedisCluster` when
    REDIS_CLUSTER is true (REDIS_URL names any node; the others are discovered, MOVED and
    ASK are followed, a failover is retried), else a plain `redis.Redis`.

    Typed as `redis.Redis` because a cluster client answers the same commands on keys
    of one hash slot; what only a plain client has (its `connection_pool`, transactions
    and scripts over keys of several slots) must check `redis_cluster_of()` first."""
    if settings.REDIS_CLUSTER:
        return cast(redis.Redis, _cluster_connect(settings.REDIS_URL))
    return redis.Redis.from_url(
        settings.REDIS_URL, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=SOCKET_CONNECT_TIMEOUT,
        health_check_interval=30,
    )


def redis_reads_get() -> redis.Redis:
    """The client the public reads and their rate limit use: `redis_get()`'s, with replies
    awaited READ_REDIS_TIMEOUT_SECONDS instead of SOCKET_TIMEOUT, so a Redis that stops
    answering turns a read into a 503 in about a second instead of holding a read thread
    (and every request queued behind it) for five. Each reading thread keeps one
    connection of its own (rankview.wire), so a hang holds no more connections than
    there are read threads. Made once per `redis_get()` client and kept on it, so that
    whatever replaces that client (`redis_get.cache_clear()`) replaces this one too."""
    base = redis_get()
    reads: redis.Redis | None = getattr(base, "_lb_reads", None)
    if reads is None:
        timeout = settings.READ_REDIS_TIMEOUT_SECONDS
        if settings.REDIS_CLUSTER:
            reads = cast(redis.Redis, _cluster_connect(settings.REDIS_URL, socket_timeout=timeout))
        else:
            reads = redis.Redis.from_url(
                settings.REDIS_URL, socket_timeout=timeout,
                socket_connect_timeout=min(timeout, SOCKET_CONNECT_TIMEOUT), health_check_interval=30)
        base._lb_reads = reads  # type: ignore[attr-defined]
    return reads


def _cluster_connect(url: str, *, socket_timeout: float = SOCKET_TIMEOUT) -> redis.RedisCluster:
    parts = urlsplit(url)
    if parts.scheme not in {"redis", "rediss"} or parts.path.strip("/") not in {"", "0"}:
        raise ImproperlyConfigured(
            f"REDIS_CLUSTER is true: REDIS_URL must be redis://host:port or rediss://host:port of a node "
            f"(a cluster has only database 0), not {parts.scheme}://...{parts.path}")
    try:
        # health_check_interval is not among the options a cluster client passes to its
        # node connections; a broken one is replaced when a command fails on it.
        return _OutageRaisingCluster.from_url(
            url, socket_timeout=socket_timeout, socket_connect_timeout=min(socket_timeout, SOCKET_CONNECT_TIMEOUT)
        )
    except RedisClusterException as exc:
        if not cluster_unreachable(exc):
            raise  # the node answered, but is no cluster node: a configuration error
        raise redis.exceptions.ConnectionError(f"Redis Cluster at {parts.hostname}:{parts.port}: {exc}") from exc


# What the cluster client raises, outside RedisError, when it has no node or no slot to send
# to: no node answers its slot map refresh, or a slot has no master (between a master's
# loss and its replica's promotion). Its other RedisClusterExceptions are bugs (a command
# it cannot route) or a configuration error (a node not in cluster mode).
_UNREACHABLE_SAYS = ("Redis Cluster cannot be connected", "All slots are not covered")


def cluster_unreachable(exc: BaseException) -> bool:
    """Whether a cluster client's error means that no node or slot is available now."""
    if isinstance(exc, SlotNotCoveredError):
        return True
    return (isinstance(exc, RedisClusterException) and not isinstance(exc.__cause__, RedisClusterException)
            and str(exc).startswith(_UNREACHABLE_SAYS))


def cluster_outage(exc: BaseException) -> redis.exceptions.ConnectionError:
    """`exc` (see cluster_unreachable) as the redis ConnectionError every caller already
    treats as an outage: 503 with Retry-After, rate limits failing open, a task retried."""
    return redis.exceptions.ConnectionError(f"Redis Cluster unavailable: {exc}")


class _OutageRaisingCluster(redis.RedisCluster):
    """The cluster client, raising an unreachable cluster as a ConnectionError."""

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().execute_command(*args, **kwargs)
        except RedisClusterException as exc:
            if cluster_unreachable(exc):
                raise cluster_outage(exc) from exc
            raise


def redis_cluster_of(r: redis.Redis) -> redis.RedisCluster | None:
    """`r` as the cluster client it is, or None for a plain client."""
    return r if isinstance(r, redis.RedisCluster) else None
