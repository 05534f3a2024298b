"""Rank views on a Redis Cluster whose slots moved under a running process: a manual failover
(CLUSTER FAILOVER on a replica: its master steps down, nothing is lost) between two
epochs. The process's client still routes the moved slots to the old master, which now
answers MOVED: the group writes, the fenced transactions of the control slot and the reads
refresh the slot map and send what was refused once more, so the next epoch publishes
without an error and the views answer as the ledger."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from leaderboard.redis_client import redis_cluster_of, redis_get
from leaderboard.views import rankview
from leaderboard.views.rankview import fence
from seasons.models import Season
from tests.support import Events, apply_events, assert_matches_ledger, current_manifest, epoch, keys_of, publish
from tests.support.cluster import FailoverCluster, cluster_start, cluster_stop, rank_views_on

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PLAYERS = [f"m{i:03d}" for i in range(300)]


@pytest.fixture(scope="module")
def replicated() -> Iterator[FailoverCluster]:
    """This module's own cluster: 3 masters with a replica each (a manual failover needs one)."""
    cluster = cluster_start(masters=3, replicas=1)
    yield cluster
    cluster_stop(cluster)


@pytest.fixture
def on_replicated(replicated: FailoverCluster, settings: Any) -> Iterator[FailoverCluster]:
    with rank_views_on(replicated, settings):
        yield replicated


def _manual_failover(cluster: FailoverCluster, master: int) -> int:
    """CLUSTER FAILOVER on a replica of `master`; returns once the replica serves its slots."""
    master_id = next(node.node_id for node in cluster.nodes() if node.port == master)
    replica = next(node.port for node in cluster.nodes() if node.master_id == master_id)
    slot = next(first for node in cluster.nodes() if node.port == master for first, _ in node.slots)
    cluster.node(replica).execute_command("CLUSTER FAILOVER")
    deadline = time.monotonic() + 30
    while cluster.slot_master(slot) != replica:
        assert time.monotonic() < deadline, f"replica {replica} did not take slot {slot} over from {master}"
        time.sleep(0.1)
    cluster.ready_wait()
    return replica


@pytest.mark.parametrize("target", ["control", "groups"])
def test_an_epoch_after_a_manual_failover_publishes(
        on_replicated: FailoverCluster, season_factory: Callable[..., Season], target: str) -> None:
    cluster = on_replicated
    season = season_factory(slug=f"moved-{target}")
    rnd = random.Random(target)
    events = Events(tag=f"mv-{target}")
    apply_events(season, [events.result(p, rnd.randint(0, 100_000)) for p in PLAYERS])
    publish(season)
    apply_events(season, [events.result(p, rnd.randint(0, 100_000)) for p in PLAYERS[::3]])
    publish(season)  # both copies written: the next epoch mutates one in every slot group
    client = redis_cluster_of(redis_get())
    assert client is not None

    keys = keys_of(season)
    manifest = current_manifest(season)
    control = cluster.key_master(keys.ptr)
    if target == "control":
        victim = control
    else:
        victim = min({cluster.key_master(keys.fence(manifest.copy, g)) for g in range(manifest.groups)} - {control})
    promoted = _manual_failover(cluster, victim)
    # The process's slot map still names the old master for the slots it served.
    stale = [slot for slot, nodes in client.nodes_manager.slots_cache.items() if nodes[0].port == victim]
    assert stale, "the client's slot map already knew of the failover: nothing tested"

    apply_events(season, [events.correction(p, rnd.randint(0, 100_000)) for p in PLAYERS])
    result = epoch(season)
    assert result.status == "published", result
    assert all(nodes[0].port != victim for nodes in client.nodes_manager.slots_cache.values())
    assert promoted in {node.port for node in client.get_primaries()}
    assert assert_matches_ledger(season) == result.version


def test_a_group_write_refused_with_moved_is_sent_again_on_a_fresh_map(on_replicated: FailoverCluster) -> None:
    """The write path alone: fenced group writes routed by a stale map (a master's slots
    moved to its replica) land once each, every reply a script's, none an error."""
    cluster = on_replicated
    client = redis_cluster_of(redis_get())
    assert client is not None
    keys = rankview.Keys(prefix="lbt", season="redirect")
    fences = [keys.fence("0", group) for group in range(24)]
    moved = cluster.key_master(fences[0])
    _manual_failover(cluster, moved)
    calls = [(fence, rankview.group_write_call(fence, 7, 3, [("SADD", f"{fence}:s", ["x"])])) for fence in fences]
    replies = rankview.groups_send(redis_get(), calls)
    assert replies == [[1]] * len(fences)
    assert [client.hget(fence, "token") for fence in fences] == [b"7"] * len(fences)


def test_a_fenced_transaction_refused_with_moved_is_sent_again_on_a_fresh_map(on_replicated: FailoverCluster) -> None:
    """The control slot's fenced MULTI/EXEC on a stale map: the WATCH of the lease meets
    MOVED on the old master, nothing of the transaction runs there, and it runs once on
    the promoted replica."""
    cluster = on_replicated
    client = redis_cluster_of(redis_get())
    assert client is not None
    keys = rankview.Keys(prefix="lbt", season="redirect-control")
    client.set(keys.copies, "before")  # the map knows the control slot's master
    promoted = _manual_failover(cluster, cluster.key_master(keys.lease))
    cluster.node(promoted).set(keys.lease, 11)  # around the client, whose map stays stale
    assert fence._fenced(redis_get(), keys, 11, [("INCR", keys.due), ("SET", keys.copies, "after")]) == [1, b"OK"]
    assert cluster.node(promoted).get(keys.copies) == b"after"
    assert cluster.node(promoted).get(keys.due) == b"1"
