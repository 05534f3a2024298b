"""The local Redis Cluster (config/local_cluster.py) as the tests use it: `cluster_start()`
starts a `FailoverCluster`, whose masters a test can kill: `master_kill()` kills one with
SIGKILL, `failover_wait()` returns once one of its replicas has taken its slots over and
every living node reports cluster_state:ok, `node_restart()` brings the killed node back."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import redis

from config.local_cluster import HOST, SLOTS, LocalCluster, cluster_stop, condition_wait

__all__ = ["SLOTS", "FailoverCluster", "LocalCluster", "cluster_flush", "cluster_start", "cluster_stop",
           "rank_views_on", "redis_cli_target"]


@dataclass
class FailoverCluster(LocalCluster):
    # A killed master's first slot, read before the kill: once its replica is promoted the
    # cluster no longer names any slot of the dead node.
    _killed_slots: dict[int, int] = field(default_factory=dict)

    def master_kill(self, port: int) -> None:
        """SIGKILL to the node on `port` (a master, with a replica to take over, for a failover)."""
        # Asked of the victim itself: another node may be stopped (SIGSTOP) by the test.
        slots = [first for node in self.nodes(port=port) if node.port == port for first, _ in node.slots]
        if slots:
            self._killed_slots[port] = slots[0]
        process = self.processes[port]
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
        client = self._clients.pop(port, None)
        if client is not None:
            client.close()

    def failover_wait(self, killed: int, *, timeout: float = 60) -> int:
        """Once a replica of the master killed on `killed` serves its slots and the living
        nodes are all ok again; returns the promoted node's port."""
        slot = self._killed_slots[killed]

        def promoted() -> bool:
            return self.slot_master(slot) != killed and self._ready()

        condition_wait(promoted, timeout=timeout, what=f"failover of the master on port {killed}")
        return self.slot_master(slot)

    def node_restart(self, port: int) -> None:
        """Starts the killed node on `port` again with its nodes.conf: it rejoins (a former
        master comes back as a replica of the one promoted in its place)."""
        assert self.processes[port].poll() is not None, f"node {port} is running"
        self._node_start(port)
        self._ping_wait(port)
        self.ready_wait()


# A new FailoverCluster, ready to use (config.local_cluster.cluster_start's arguments).
cluster_start = FailoverCluster.start


@contextlib.contextmanager
def rank_views_on(cluster: LocalCluster, settings: Any) -> Iterator[LocalCluster]:
    """This process's rank views on `cluster` for the block (settings.REDIS_CLUSTER and
    REDIS_URL, which pytest-django's `settings` puts back), the cluster flushed; the
    process's client, with its slot map, and its cached manifests forgotten before and
    after, so that neither outlives the cluster it was made for."""
    from leaderboard.redis_client import redis_get
    from leaderboard.views import rankview
    from tests.conftest import redis_flush

    settings.REDIS_CLUSTER, settings.REDIS_URL = True, cluster.url
    rankview.manifest_cache_clear()
    redis_get.cache_clear()
    redis_flush(redis_get())
    try:
        yield cluster
    finally:
        rankview.manifest_cache_clear()
        redis_get.cache_clear()


def cluster_flush(url: str, **client_options: Any) -> None:
    """FLUSHALL on every master of the cluster that `url` names a node of (one this session
    did not start, say TEST_REDIS_CLUSTER_URL's)."""
    client = redis.RedisCluster.from_url(url, **client_options)
    try:
        client.flushall(target_nodes=redis.RedisCluster.PRIMARIES)
    finally:
        client.close()


def redis_cli_target(r: redis.Redis, key: str) -> list[str]:
    """redis-cli's options reaching the server that holds `key` through the client `r`: its
    own server, or the master of the key's slot when `r` is a cluster client."""
    if isinstance(r, redis.RedisCluster):
        node = r.get_node_from_key(key)
        return ["-h", str(node.host), "-p", str(node.port)]
    server = r.connection_pool.connection_kwargs
    return ["-h", str(server.get("host", HOST)), "-p", str(server.get("port", 6379)), "-n", str(server.get("db", 0))]
