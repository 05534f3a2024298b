"""A master of the rank views' Redis Cluster killed (SIGKILL) during an epoch under read and
write load, on a cluster of 3 masters with one replica each that this module starts.

Readers hit the public read URLs through the fast read path the whole time; every answer
is checked afterwards against the ledger's standings at the version it names: a 200 is
exactly that version's board, a 503 is allowed, anything else fails. The epoch runs in a
child process, as a worker runs it, and a master dies under it: the one holding the
season's control slot (pointer, lease, copy metas, manifests), or one holding only slot
groups of the copies' data. Once a replica has taken its slots over, epochs run until one
publishes (a copy the failover left incomplete is rebuilt, a lost view recovered), the
views answer as the ledger and pass the invariant checker, and the ledger holds every
event the write API accepted. The window of 503s (first to last) is printed and bounded."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from leaderboard.models import ApiClient
from leaderboard.redis_client import redis_get
from leaderboard.views import rankview
from seasons.models import Season
from tests.support import epoch, epoch_child, keys_of, part_worker, publish
from tests.support.cluster import FailoverCluster
from tests.support.failover import (
    WINDOW_BOUND_SECONDS,
    Scene,
    child_settings,
    copy_states,
    epoch_underway,
    slot_map_refreshed,
    victim,
)

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]
# The fixtures `replicated` (this module's cluster) and `on_replicated`.
pytest_plugins = ["tests.support.failover"]


@pytest.mark.parametrize(("target", "parts"), [("control", 1), ("groups", 1), ("groups", 2)])
def test_a_master_killed_during_an_epoch_under_load(
        on_replicated: FailoverCluster, season_factory: Callable[..., Season],
        writer: tuple[ApiClient, str], settings: Any, target: str, parts: int) -> None:
    """With 2 parts (a season of 8 ledger partitions), part 0 runs on a real Celery worker
    and the coordinator runs part 1: the master dies under both."""
    cluster = on_replicated
    env = child_settings(EPOCH_PARTS=str(parts), EPOCH_PART_CLAIM_SECONDS="3")
    settings.EPOCH_PARTS = parts
    scene = Scene.start(season_factory(slug=f"failover-{target}-{parts}", partitions=8 if parts > 1 else 1),
                        writer[1], seed=len(target) + parts)
    season = scene.season
    child = None
    workers = contextlib.ExitStack()
    try:
        if parts > 1:
            workers.enter_context(part_worker(env=env, chunk_players=4, pause=0.0))
        scene.move_everyone()
        killed = victim(cluster, season, target)
        before = copy_states(season)
        child = epoch_child(season, apply_chunk=4, **env)
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        deadline = time.monotonic() + 60
        while not epoch_underway(season, before) and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(scene.rnd.uniform(0.1, 0.4))  # somewhere inside the apply
        assert child.poll() is None, f"the epoch ended before the kill: {child.communicate()}"
        killed_at = time.monotonic()
        cluster.master_kill(killed)
        child_out, child_err = child.communicate(timeout=120)
        promoted = cluster.failover_wait(killed, timeout=60)
        promoted_at = time.monotonic()
        outcomes, final = scene.converge()
    finally:
        workers.close()
        scene.stop()
        if child is not None and child.poll() is None:
            child.kill()
            child.wait(timeout=10)

    seconds, window = scene.window(killed_at)
    print(f"\nfailover of the {target} master (port {killed} -> {promoted}): promoted "
          f"{promoted_at - killed_at:.1f}s after the kill; {window}; the child's epoch: exit {child.returncode} "
          f"{child_out.strip()!r} {child_err.strip().splitlines()[-1:]!r}; after: {outcomes}; "
          f"versions read {scene.load.versions()}")
    assert scene.load.check(season) == []
    assert seconds < WINDOW_BOUND_SECONDS, f"503s for {seconds:.1f}s"
    assert scene.load.versions(since=promoted_at), "no read answered after the failover"
    scene.assert_ledger_kept(final)


def _replica_of(cluster: FailoverCluster, master: int) -> int:
    nodes = cluster.nodes()
    master_id = next(node.node_id for node in nodes if node.port == master)
    return next(node.port for node in nodes if node.master_id == master_id and not node.failed)


@pytest.mark.parametrize("replicas_wait", [0, 1])
def test_a_failover_that_loses_acknowledged_writes(
        on_replicated: FailoverCluster, season_factory: Callable[..., Season], writer: tuple[ApiClient, str],
        settings: Any, replicas_wait: int) -> None:
    """Redis replicates asynchronously: a master acknowledges writes its replica never
    receives, and a failover loses them. Made certain here: the replica of a master that
    holds slot groups (not the control slot) is paused (SIGSTOP) and cut off while an
    epoch publishes and catches the other copy up, then the master is killed and the
    replica resumed, so it is promoted with the groups as they were before the epoch.
    No read may answer from a copy that lost writes (503s allowed).

    replicas_wait 1 (VIEW_REPLICAS_WAIT): the epoch waits for each master's replica to
    acknowledge the copy's writes, gets no acknowledgement from the cut-off one, and
    publishes nothing; readers keep the previous version. 0: the epoch publishes, the
    failover takes the version's writes from one master, readers answer 503, and the next
    epoch finds the current copy's groups short of its generation: lost, recovered by a
    rebuild (not idle, with or without new writes)."""
    cluster = on_replicated
    settings.VIEW_REPLICAS_WAIT, settings.VIEW_REPLICAS_WAIT_MS = replicas_wait, 500
    scene = Scene.start(season_factory(slug=f"failover-lost-{replicas_wait}"), writer[1], seed=20)
    season = scene.season
    killed = victim(cluster, season, "groups")
    paused = cluster.processes[_replica_of(cluster, killed)]
    after_failover = None
    try:
        paused.send_signal(signal.SIGSTOP)
        # Whatever the master sends from now on never reaches the replica (a stopped
        # process still takes bytes into its socket buffer: the link is cut as well).
        cluster.node(killed).client_kill_filter(_type="replica")
        try:
            scene.move_everyone()
            if replicas_wait:
                with pytest.raises(rankview.ReplicasBehind):
                    epoch(season)
                assert rankview.pointer_get(redis_get(), keys_of(season)) == scene.first
            else:
                lost = publish(season)  # and the other copy caught up: both written on the victim
                scene.load.wait(version=lost, answers=50, timeout=60)
            killed_at = time.monotonic()
            cluster.master_kill(killed)
        finally:
            paused.send_signal(signal.SIGCONT)
        promoted = cluster.failover_wait(killed, timeout=60)
        promoted_at = time.monotonic()
        # Reads of the cluster as the failover left it, before an epoch runs.
        scene.load.wait(answers=200, since=promoted_at, timeout=60)
        if replicas_wait:
            # The promoted master has no replica until the killed one rejoins as its replica:
            # until then no copy it serves can be acknowledged, so nothing is published.
            cluster.node_restart(killed)
        else:
            slot_map_refreshed()  # not failing once on the old map: nothing here met the dead master
            after_failover = epoch(season)
        outcomes, final = scene.converge()
    finally:
        scene.stop()

    if after_failover is not None:
        assert after_failover.status == "lost", after_failover
    _, window = scene.window(killed_at)
    print(f"\nfailover with lost writes (port {killed} -> {promoted}): promoted {promoted_at - killed_at:.1f}s "
          f"after the kill; {window}; after: {outcomes}; versions read {scene.load.versions()}, after the "
          f"promotion {scene.load.versions(since=promoted_at)}")
    # The loss is found and repaired: the views converge on the ledger.
    scene.assert_ledger_kept(final)
    problems = scene.load.check(season)
    print(f"{len(problems)} answers wrong: {problems[:3]}")
    assert problems == []
