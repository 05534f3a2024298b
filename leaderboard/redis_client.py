from __future__ import annotations

from functools import lru_cache
from typing import cast

import redis
from django.conf import settings

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
        # health_check_interval is not among the options a cluster client passes to its
        # node connections; a broken one is replaced when a command fails on it.
        cluster = redis.RedisCluster.from_url(
            settings.REDIS_URL, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=SOCKET_CONNECT_TIMEOUT
        )
        return cast(redis.Redis, cluster)
    return redis.Redis.from_url(
        settings.REDIS_URL, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=SOCKET_CONNECT_TIMEOUT,
        health_check_interval=30,
    )


def redis_cluster_of(r: redis.Redis) -> redis.RedisCluster | None:
    """`r` as the cluster client it is, or None for a plain client."""
    return r if isinstance(r, redis.RedisCluster) else None
