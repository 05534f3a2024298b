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
import os
import random
import signal
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from leaderboard.models import ApiClient, RebuildJob
from leaderboard.recovery.rebuild import rebuild_run
from leaderboard.redis_client import redis_get
from leaderboard.views import rankview
from seasons.models import Season
from tests.support import (
    Events,
    apply_events,
    assert_matches_ledger,
    current_manifest,
    epoch,
    epoch_child,
    keys_of,
    part_worker,
    publish,
    recovery_jobs,
)
from tests.support.cluster import FailoverCluster, cluster_start, cluster_stop, rank_views_on
from tests.support.readload import LedgerWriter, VersionedReadLoad

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PLAYERS = [f"f{i:05d}" for i in range(2000)]
# A node silent this long is failed over: short, so the window is seconds, but well over
# the pauses of a loaded 2-core machine. bench/failover.py sets others (production's
# cluster-node-timeout is 15 s by default) through TEST_FAILOVER_NODE_TIMEOUT_MS.
NODE_TIMEOUT_MS = int(os.environ.get("TEST_FAILOVER_NODE_TIMEOUT_MS", "2000"))
# What the readers may see as 503s, first to last: the failover itself (node timeout,
# election, the clients' new slot map) with room for a loaded machine; 30 s at 2 s.
WINDOW_BOUND_SECONDS = NODE_TIMEOUT_MS / 1000 + 28.0
# Readers overlap the copies' mutations here, unlike the rank_views fixture's tests: a
# real grace period, longer than a read's deadline on a loaded machine.
READ_DEADLINE_SECONDS = 1.0
COPY_GRACE_SECONDS = 1.5


@pytest.fixture(scope="module")
def replicated() -> Iterator[FailoverCluster]:
    """This module's own cluster of 3 masters with a replica each. Started only in a session
    whose rank views are on a cluster (.ci/run has a step for it): a single-Redis session
    skips the test rather than spend its minute and a half twice in a CI run."""
    from django.conf import settings

    if not settings.REDIS_CLUSTER:
        pytest.skip("a Redis Cluster session's test: TEST_REDIS_CLUSTER=1 pytest tests/test_cluster_failover.py")
    cluster = cluster_start(masters=3, replicas=1, node_timeout_ms=NODE_TIMEOUT_MS)
    yield cluster
    cluster_stop(cluster)


@pytest.fixture
def on_replicated(replicated: FailoverCluster, settings: Any,
                  monkeypatch: pytest.MonkeyPatch) -> Iterator[FailoverCluster]:
    """The rank views on the replicated cluster, for this process and the children it
    starts (broker and channel layer stay on the plain Redis); every node running, each
    master with its replica, when the test starts."""
    for port in replicated.ports:
        if port not in replicated.live_ports():
            replicated.node_restart(port)  # a master an earlier test killed: back as a replica
    monkeypatch.setenv("REDIS_CLUSTER", "true")
    monkeypatch.setenv("REDIS_URL", replicated.url)
    monkeypatch.setenv("CELERY_BROKER_URL", settings.CELERY_BROKER_URL)
    monkeypatch.setenv("CHANNEL_LAYER_URL", ",".join(settings.CHANNEL_LAYER_URLS))
    settings.READ_DEADLINE_SECONDS = READ_DEADLINE_SECONDS
    settings.COPY_GRACE_SECONDS = COPY_GRACE_SECONDS
    with rank_views_on(replicated, settings):
        yield replicated


def _victim(cluster: FailoverCluster, season: Season, target: str) -> int:
    """The master to kill: the control slot's, or one that serves slot groups of the
    season's copies and not the control slot."""
    control = cluster.key_master(keys_of(season).ptr)
    if target == "control":
        return control
    manifest = current_manifest(season)
    keys = keys_of(season)
    group_masters = {cluster.key_master(keys.fence(manifest.copy, g)) for g in range(manifest.groups)}
    return min(group_masters - {control})


def _epoch_underway(season: Season, before: dict[str, tuple[Any, ...]]) -> bool:
    """Whether a copy's meta changed since `before` (the child's epoch is writing)."""
    return _copy_states(season) != before


def _copy_states(season: Season) -> dict[str, tuple[Any, ...]]:
    r, keys = redis_get(), keys_of(season)
    out = {}
    for copy in rankview.copies_get(r, keys):
        meta = rankview.copy_meta_load(r, keys, copy)
        out[copy] = (None,) if meta is None else (meta.gen, meta.state, meta.counts)
    return out


def _failure(exc: BaseException) -> str:
    """An exception and the product's frame it came out of, in a line."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/leaderboard/" in f.filename]
    if not frames:
        return f"error {type(exc).__name__}: {exc}"[:300]
    last = frames[-1]
    where = f"{last.filename.split('/leaderboard/')[-1]}:{last.lineno} {last.name}"
    return f"error {type(exc).__name__}: {exc} at {where}"[:300]


def _publish_after_failover(season: Season, *, timeout: float = 60) -> list[str]:
    """Epochs until one publishes, a lost view recovered on the way; the outcomes."""
    outcomes: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            result = epoch(season)
        except Exception as exc:  # noqa: BLE001 - a failed epoch is retried, as the beat would
            outcomes.append(_failure(exc))
            time.sleep(0.5)
            continue
        outcomes.append(f"{result.status} {result.detail or ''}".strip())
        if result.status == "published":
            return outcomes
        if result.status == "lost":
            for job in recovery_jobs(season):
                if job.status == RebuildJob.Status.QUEUED:
                    job = rebuild_run(job_id=job.pk)
                    outcomes.append(f"recovery {job.status} v{job.published_version} {job.error or ''}".strip())
            if any(job.status == RebuildJob.Status.PUBLISHED for job in recovery_jobs(season)):
                return outcomes
        time.sleep(0.3)
    raise AssertionError(f"no version published within {timeout:.0f}s after the failover: {outcomes}")


@dataclass
class Scene:
    """A season of PLAYERS with both copies built and current, version `first`, read by
    VersionedReadLoad and written by LedgerWriter (started; `stop()` stops both)."""

    season: Season
    events: Events
    rnd: random.Random
    load: VersionedReadLoad
    writes: LedgerWriter
    first: int

    @classmethod
    def start(cls, season: Season, token: str, *, seed: int) -> Scene:
        rnd = random.Random(seed)
        events = Events(tag=f"fo-{season.slug}")
        apply_events(season, [events.result(p, rnd.randint(0, 1_000_000)) for p in PLAYERS])
        publish(season)
        apply_events(season, [events.result(p, rnd.randint(0, 1_000_000)) for p in PLAYERS[::7]])
        first = publish(season)
        scene = cls(season=season, events=events, rnd=rnd, first=first,
                    load=VersionedReadLoad(season.slug, PLAYERS, clients=4, threads=4, seed=seed),
                    writes=LedgerWriter(season.slug, PLAYERS, token, seed=seed + 1))
        scene.load.start()
        scene.writes.start()
        try:
            scene.load.wait(version=first, answers=50, timeout=60)
        except BaseException:
            scene.stop()
            raise
        return scene

    def move_everyone(self) -> None:
        """Every player to another score: the next epoch applies hundreds of small chunks
        to every slot group."""
        apply_events(self.season, [self.events.correction(p, self.rnd.randint(0, 1_000_000)) for p in PLAYERS])

    def converge(self) -> tuple[list[str], int]:
        """After the failover: epochs until one publishes, then the writes stop and one
        more version covers all of them, read by the readers; (the outcomes, that version)."""
        # A change of its own, so that an epoch has something to publish whatever the writer did.
        apply_events(self.season, [self.events.correction(PLAYERS[0], self.rnd.randint(0, 1_000_000))])
        outcomes = _publish_after_failover(self.season)
        self.writes.stop()
        result = epoch(self.season)
        assert result.status in ("published", "idle"), result
        final = current_manifest(self.season).version
        self.load.wait(version=final, answers=50, timeout=60)
        return outcomes, final

    def stop(self) -> None:
        self.writes.stop()
        self.load.stop()

    def window(self, killed_at: float) -> tuple[float, str]:
        """The 503s' window in seconds, and a line saying it."""
        window = self.load.unavailable_window()
        seconds = 0.0 if window is None else window[1] - window[0]
        text = (f"503 window {seconds:.2f}s ({self.load.count(503)} 503s of {len(self.load.answers)} answers"
                + ("" if window is None else f", from {window[0] - killed_at:+.2f}s to {window[1] - killed_at:+.2f}s "
                   "after the kill") + ")")
        return seconds, text

    def assert_ledger_kept(self, final: int) -> None:
        """Every write the API accepted is in the ledger, and the views answer as it does."""
        assert self.writes.refused == []
        assert self.writes.accepted, "the writer wrote nothing"
        assert self.writes.missing(self.season) == []
        assert assert_matches_ledger(self.season, exhaustive=False) == final


@pytest.mark.parametrize(("target", "parts"), [("control", 1), ("groups", 1), ("groups", 2)])
def test_a_master_killed_during_an_epoch_under_load(
        on_replicated: FailoverCluster, season_factory: Callable[..., Season],
        writer: tuple[ApiClient, str], settings: Any, target: str, parts: int) -> None:
    """With 2 parts (a season of 8 ledger partitions), part 0 runs on a real Celery worker
    and the coordinator runs part 1: the master dies under both."""
    cluster = on_replicated
    env = {"EPOCH_LEASE_SECONDS": "2", "REDIS_CLUSTER": "true", "COPY_GRACE_SECONDS": str(COPY_GRACE_SECONDS),
           "READ_DEADLINE_SECONDS": str(READ_DEADLINE_SECONDS), "EPOCH_PARTS": str(parts),
           "EPOCH_PART_CLAIM_SECONDS": "3"}
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
        victim = _victim(cluster, season, target)
        before = _copy_states(season)
        child = epoch_child(season, apply_chunk=4, **env)
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        deadline = time.monotonic() + 60
        while not _epoch_underway(season, before) and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(scene.rnd.uniform(0.1, 0.4))  # somewhere inside the apply
        assert child.poll() is None, f"the epoch ended before the kill: {child.communicate()}"
        killed_at = time.monotonic()
        cluster.master_kill(victim)
        child_out, child_err = child.communicate(timeout=120)
        promoted = cluster.failover_wait(victim, timeout=60)
        promoted_at = time.monotonic()
        outcomes, final = scene.converge()
    finally:
        workers.close()
        scene.stop()
        if child is not None and child.poll() is None:
            child.kill()
            child.wait(timeout=10)

    seconds, window = scene.window(killed_at)
    print(f"\nfailover of the {target} master (port {victim} -> {promoted}): promoted "
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
    victim = _victim(cluster, season, "groups")
    paused = cluster.processes[_replica_of(cluster, victim)]
    after_failover = None
    try:
        paused.send_signal(signal.SIGSTOP)
        # Whatever the master sends from now on never reaches the replica (a stopped
        # process still takes bytes into its socket buffer: the link is cut as well).
        cluster.node(victim).client_kill_filter(_type="replica")
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
            cluster.master_kill(victim)
        finally:
            paused.send_signal(signal.SIGCONT)
        promoted = cluster.failover_wait(victim, timeout=60)
        promoted_at = time.monotonic()
        # Reads of the cluster as the failover left it, before an epoch runs.
        scene.load.wait(answers=200, since=promoted_at, timeout=60)
        if replicas_wait:
            # The promoted master has no replica until the killed one rejoins as its replica:
            # until then no copy it serves can be acknowledged, so nothing is published.
            cluster.node_restart(victim)
        else:
            after_failover = epoch(season)
        outcomes, final = scene.converge()
    finally:
        scene.stop()

    if after_failover is not None:
        assert after_failover.status == "lost", after_failover
    _, window = scene.window(killed_at)
    print(f"\nfailover with lost writes (port {victim} -> {promoted}): promoted {promoted_at - killed_at:.1f}s "
          f"after the kill; {window}; after: {outcomes}; versions read {scene.load.versions()}, after the "
          f"promotion {scene.load.versions(since=promoted_at)}")
    # The loss is found and repaired: the views converge on the ledger.
    scene.assert_ledger_kept(final)
    problems = scene.load.check(season)
    print(f"{len(problems)} answers wrong: {problems[:3]}")
    assert problems == []
