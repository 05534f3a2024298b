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

import random
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from leaderboard.models import ApiClient, RebuildJob
from leaderboard.recovery.rebuild import rebuild_run
from leaderboard.redis_client import redis_get
from leaderboard.views import rankview
from seasons.models import Season
from tests.conftest import redis_flush
from tests.support import (
    Events,
    apply_events,
    assert_matches_ledger,
    current_manifest,
    epoch,
    epoch_child,
    keys_of,
    publish,
    recovery_jobs,
)
from tests.support.cluster import LocalCluster, cluster_start, cluster_stop
from tests.support.readload import LedgerWriter, VersionedReadLoad

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PLAYERS = [f"f{i:05d}" for i in range(2000)]
# A node silent this long is failed over: short, so the window is seconds, but well over
# the pauses of a loaded 2-core machine.
NODE_TIMEOUT_MS = 2000
# What the readers may see as 503s, first to last: the failover itself (node timeout,
# election, the clients' new slot map) with room for a loaded machine.
WINDOW_BOUND_SECONDS = 30.0
# Readers overlap the copies' mutations here, unlike the rank_views fixture's tests: a
# real grace period, longer than a read's deadline on a loaded machine.
READ_DEADLINE_SECONDS = 1.0
COPY_GRACE_SECONDS = 1.5


@pytest.fixture(scope="module")
def replicated() -> Iterator[LocalCluster]:
    """This module's own cluster of 3 masters with a replica each. Started only in a session
    whose rank views are on a cluster (.ci/run's cluster step): a single-Redis session
    skips the test rather than spend its two minutes twice in a CI run."""
    from django.conf import settings

    if not settings.REDIS_CLUSTER:
        pytest.skip("a Redis Cluster session's test: TEST_REDIS_CLUSTER=1 pytest tests/test_cluster_failover.py")
    cluster = cluster_start(masters=3, replicas=1, node_timeout_ms=NODE_TIMEOUT_MS)
    yield cluster
    cluster_stop(cluster)


@pytest.fixture
def on_replicated(replicated: LocalCluster, settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalCluster]:
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
    settings.REDIS_CLUSTER = True
    settings.REDIS_URL = replicated.url
    settings.READ_DEADLINE_SECONDS = READ_DEADLINE_SECONDS
    settings.COPY_GRACE_SECONDS = COPY_GRACE_SECONDS
    redis_get.cache_clear()
    rankview.manifest_cache_clear()
    redis_flush(redis_get())
    yield replicated
    redis_get.cache_clear()
    rankview.manifest_cache_clear()


def _victim(cluster: LocalCluster, season: Season, target: str) -> int:
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


@pytest.mark.parametrize("target", ["control", "groups"])
def test_a_master_killed_during_an_epoch_under_load(
        on_replicated: LocalCluster, season_factory: Callable[..., Season],
        writer: tuple[ApiClient, str], target: str) -> None:
    cluster = on_replicated
    season = season_factory(slug=f"failover-{target}")
    rnd = random.Random(target)
    events = Events(tag=f"fo-{target}")
    apply_events(season, [events.result(p, rnd.randint(0, 1_000_000)) for p in PLAYERS])
    publish(season)
    apply_events(season, [events.result(p, rnd.randint(0, 1_000_000)) for p in PLAYERS[::7]])
    first = publish(season)  # both copies built and current

    load = VersionedReadLoad(season.slug, PLAYERS, clients=4, threads=4, seed=1)
    ledger_writes = LedgerWriter(season.slug, PLAYERS, writer[1], seed=2)
    load.start()
    ledger_writes.start()
    child = None
    try:
        load.wait(version=first, answers=50, timeout=60)
        # Every player moves: the epoch applies hundreds of small chunks to every group.
        apply_events(season, [events.correction(p, rnd.randint(0, 1_000_000)) for p in PLAYERS])
        victim = _victim(cluster, season, target)
        before = _copy_states(season)
        child = epoch_child(season, apply_chunk=4, EPOCH_LEASE_SECONDS="2", REDIS_CLUSTER="true",
                            COPY_GRACE_SECONDS=str(COPY_GRACE_SECONDS),
                            READ_DEADLINE_SECONDS=str(READ_DEADLINE_SECONDS))
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        deadline = time.monotonic() + 60
        while not _epoch_underway(season, before) and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(rnd.uniform(0.1, 0.4))  # somewhere inside the apply
        assert child.poll() is None, f"the epoch ended before the kill: {child.communicate()}"
        killed_at = time.monotonic()
        cluster.master_kill(victim)
        child_out, child_err = child.communicate(timeout=120)
        promoted = cluster.failover_wait(victim, timeout=60)
        promoted_at = time.monotonic()

        outcomes = _publish_after_failover(season)
        ledger_writes.stop()
        # One more version over every accepted write, then reads of it.
        result = epoch(season)
        assert result.status in ("published", "idle"), result
        final = current_manifest(season).version
        load.wait(version=final, answers=50, timeout=60)
    finally:
        ledger_writes.stop()
        load.stop()
        if child is not None and child.poll() is None:
            child.kill()
            child.wait(timeout=10)

    window = load.unavailable_window()
    seconds = 0.0 if window is None else window[1] - window[0]
    print(f"\nfailover of the {target} master (port {victim} -> {promoted}): promoted "
          f"{promoted_at - killed_at:.1f}s after the kill; 503 window {seconds:.2f}s "
          f"({load.count(503)} 503s of {len(load.answers)} answers"
          + ("" if window is None else f", from {window[0] - killed_at:+.2f}s to {window[1] - killed_at:+.2f}s "
             "after the kill") + f"); the child's epoch: exit {child.returncode} {child_out.strip()!r} "
          f"{child_err.strip().splitlines()[-1:]!r}; after: {outcomes}; versions read {load.versions()}")

    assert load.check(season) == []
    assert seconds < WINDOW_BOUND_SECONDS, f"503s for {seconds:.1f}s"
    assert ledger_writes.refused == []
    assert ledger_writes.accepted, "the writer wrote nothing"
    assert ledger_writes.missing(season) == []
    assert load.versions(since=promoted_at), "no read answered after the failover"
    assert assert_matches_ledger(season, exhaustive=False) == final
