"""The rank views' client on a real local Redis Cluster (config/local_cluster.py): REDIS_CLUSTER
makes redis_get() a cluster client that finds every key's master from one node's URL and
keeps answering across a master's failover; the tests' flush empties every master."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured

from leaderboard.redis_client import redis_cluster_of, redis_get
from tests.conftest import redis_flush
from tests.support.cluster import SLOTS, FailoverCluster, cluster_start, cluster_stop

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def replicated() -> Iterator[FailoverCluster]:
    """3 masters with a replica each; a node silent for 1.5 s is failed over."""
    started = cluster_start(masters=3, replicas=1, node_timeout_ms=1500)
    yield started
    cluster_stop(started)


@pytest.fixture
def on_cluster(replicated: FailoverCluster, settings: Any) -> Iterator[redis.RedisCluster]:
    settings.REDIS_CLUSTER = True
    settings.REDIS_URL = replicated.url
    redis_get.cache_clear()
    client = redis_cluster_of(redis_get())
    assert client is not None
    redis_flush(client)
    yield client
    redis_flush(client)
    redis_get.cache_clear()


def keys_on_every_master(cluster: FailoverCluster) -> dict[int, str]:
    """A key of each master's slots, by master port."""
    found: dict[int, str] = {}
    for n in range(1000):
        found.setdefault(cluster.key_master(f"lb:probe:{n}"), f"lb:probe:{n}")
        if len(found) == len(cluster.master_ports()):
            return found
    raise AssertionError(f"no key for every master: {found}")


def test_the_plain_client_without_redis_cluster(settings: Any) -> None:
    settings.REDIS_CLUSTER = False
    redis_get.cache_clear()
    try:
        assert redis_cluster_of(redis_get()) is None
        assert type(redis_get()) is redis.Redis
    finally:
        redis_get.cache_clear()


def test_the_cluster_of_six_nodes(replicated: FailoverCluster) -> None:
    nodes = replicated.nodes()
    assert len(nodes) == 6 and len(replicated.master_ports()) == 3
    assert sum(last - first + 1 for node in nodes for first, last in node.slots) == SLOTS
    masters = {node.node_id for node in nodes if node.role == "master"}
    assert sorted(str(node.master_id) for node in nodes if node.role == "slave") == sorted(masters)
    assert all(replicated.state_ok(port) for port in replicated.ports)


def test_one_url_reaches_every_master(replicated: FailoverCluster, on_cluster: redis.RedisCluster) -> None:
    keys = keys_on_every_master(replicated)
    for port, key in keys.items():
        on_cluster.set(key, port)
    for port, key in keys.items():
        assert replicated.node(port).get(key) == str(port).encode(), "the key is not on its slot's master"
        assert on_cluster.get(key) == str(port).encode()
    redis_flush(on_cluster)
    assert all(replicated.node(port).dbsize() == 0 for port in replicated.master_ports())


def test_reads_and_writes_go_on_across_a_failover(replicated: FailoverCluster, on_cluster: redis.RedisCluster) -> None:
    keys = keys_on_every_master(replicated)
    for port, key in keys.items():
        # Written on the master's own connection: WAIT counts the replicas that hold the
        # writes of the connection it is sent on.
        replicated.node(port).set(key, f"before-{port}")
        assert replicated.node(port).wait(1, 5000) == 1, "the replica did not acknowledge the write"
        assert on_cluster.get(key) == f"before-{port}".encode()
    victim = replicated.slot_master(replicated.key_slot(keys[min(keys)]))
    replicated.master_kill(victim)
    promoted = replicated.failover_wait(victim)
    assert promoted != victim and promoted in replicated.master_ports()

    # The same client object: it learns the new master from its errors and MOVED replies.
    for port, key in keys.items():
        assert on_cluster.get(key) == f"before-{port}".encode()
    on_cluster.set(keys[victim], "after")
    assert replicated.node(promoted).get(keys[victim]) == b"after"

    replicated.node_restart(victim)
    assert {node.port: node.role for node in replicated.nodes()}[victim] == "slave"
    assert replicated.master_ports() == sorted({*keys} - {victim} | {promoted})


def cluster_client_of(url: str, settings: Any) -> redis.Redis:
    settings.REDIS_CLUSTER = True
    settings.REDIS_URL = url
    redis_get.cache_clear()
    try:
        return redis_get()
    finally:
        redis_get.cache_clear()


def test_no_node_answering_is_a_connection_error(settings: Any) -> None:
    """The outage every caller answers already (503, rate limits failing open), not the
    cluster client's own exception class, which is no RedisError."""
    with pytest.raises(redis.exceptions.ConnectionError, match="Redis Cluster at 127.0.0.1:1"):
        cluster_client_of("redis://127.0.0.1:1", settings)


def test_a_url_no_cluster_can_serve_is_refused(settings: Any) -> None:
    with pytest.raises(ImproperlyConfigured, match="only database 0"):
        cluster_client_of("redis://127.0.0.1:6379/2", settings)
    plain = urlsplit(settings.CHANNEL_LAYER_URLS[0])  # a plain Redis, in a cluster session too
    with pytest.raises(redis.exceptions.RedisClusterException, match="not enabled"):
        cluster_client_of(f"redis://{plain.hostname}:{plain.port}", settings)
