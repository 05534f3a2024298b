"""The classes of error a Redis client raises, sorted once for every caller (no Django
here: the rank views' wire layer uses them too)."""

from __future__ import annotations

import redis
from redis.exceptions import RedisClusterException

# Redis not answering, in every class a client raises for it: refused or timed-out
# connections (a server still loading its data after a restart is one: BusyLoadingError),
# a replica answering a write because its master was just demoted (READONLY), and a
# Redis Cluster with no node or no master for a slot between a master's failure and its
# replica's promotion (CLUSTERDOWN, TRYAGAIN, ClusterError, and the cluster client's own
# RedisClusterException, which is no RedisError). The one list: a read answers 503 on it,
# a write that committed counts and logs it, a rate limit fails open, a task retries.
REDIS_OUTAGES: tuple[type[Exception], ...] = (
    redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, redis.exceptions.ReadOnlyError,
    redis.exceptions.ClusterError, redis.exceptions.TryAgainError, RedisClusterException,
)
# Anything a Redis client raises: for best-effort work after a commit (counters, metrics),
# which must never turn a committed write into an error.
REDIS_ERRORS: tuple[type[Exception], ...] = (redis.exceptions.RedisError, RedisClusterException)
