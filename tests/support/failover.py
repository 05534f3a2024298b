"""A master of the rank views' Redis Cluster killed under load: what the failover suites
(tests/test_cluster_failover.py, tests/test_cluster_failover_jobs.py) share. A plugin
module for its fixtures (`pytest_plugins = ["tests.support.failover"]`), imported for the
rest.

`replicated` starts a module's own cluster of 3 masters with a replica each (only in a
session whose rank views are on a cluster), `on_replicated` puts this process's rank
views and the children it starts on it. `Scene` is a season of PLAYERS read through the
fast read path and written through the write API while a master dies, every read checked
against the ledger afterwards; `EpochLoop` runs epochs in a thread as the beat would."""

from __future__ import annotations

import os
import random
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import pytest
import redis
from django.db import connections

from leaderboard.models import RebuildJob
from leaderboard.recovery.rebuild import rebuild_run
from leaderboard.redis_client import redis_get
from leaderboard.views import rankview
from leaderboard.views.rankview.wire import slot_map_refresh
from seasons.models import Season
from tests.support.cluster import FailoverCluster, cluster_start, cluster_stop, rank_views_on
from tests.support.failure import recovery_jobs
from tests.support.publication import assert_matches_ledger, current_manifest, epoch, keys_of, publish
from tests.support.readload import LedgerWriter, VersionedReadLoad
from tests.support.writes import Events, apply_events

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
    """The module's own cluster of 3 masters with a replica each. Started only in a session
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


def child_settings(**more: str) -> dict[str, str]:
    """The settings a child process (an epoch, a rebuild, a server) runs with beside these
    tests: a short lease, and this module's grace period and read deadline."""
    return {"EPOCH_LEASE_SECONDS": "2", "REDIS_CLUSTER": "true", "COPY_GRACE_SECONDS": str(COPY_GRACE_SECONDS),
            "READ_DEADLINE_SECONDS": str(READ_DEADLINE_SECONDS), **more}


def slot_map_refreshed() -> None:
    """This process's cluster client reads the slot map afresh. It learns of a failover from
    a command that fails on the dead master; a step that must not fail on the old map (an
    epoch expected to publish or find a loss, a scan of every master) comes after this."""
    slot_map_refresh(cast(redis.RedisCluster, redis_get()))


def cluster_said(cluster: FailoverCluster, season: Season) -> str:
    """For a failure's message: the master each living node's CLUSTER SLOTS names for each
    range, and the node this process's client sends the season's control slot to."""
    said = []
    for port in cluster.live_ports():
        try:
            slots = cluster.node(port).execute_command("CLUSTER SLOTS")
            said.append(f"{port}: " + ", ".join(f"{s[0]}-{s[1]} on {s[2][1]}" for s in slots))
        except Exception as exc:  # noqa: BLE001 - what it said is the finding
            said.append(f"{port}: {exc!r}")
    client = cast(redis.RedisCluster, redis_get())
    control = client.nodes_manager.get_node_from_slot(client.keyslot(keys_of(season).ptr))
    return f"CLUSTER SLOTS of {'; '.join(said)}; this process sends the control slot to {control.name}"


def group_masters(cluster: FailoverCluster, season: Season, index: str, groups: int) -> set[int]:
    """The masters serving the slot groups of the season's index `index`."""
    keys = keys_of(season)
    return {cluster.key_master(keys.fence(index, g)) for g in range(groups)}


def victim(cluster: FailoverCluster, season: Season, target: str, *, index: str | None = None,
           groups: int | None = None) -> int:
    """The master to kill: the control slot's ("control"), or one that serves slot groups
    of the season's index `index` (the current version's by default) and not the control
    slot ("groups")."""
    control = cluster.key_master(keys_of(season).ptr)
    if target == "control":
        return control
    if index is None:
        manifest = current_manifest(season)
        index, groups = manifest.copy, manifest.groups
    assert groups is not None
    return min(group_masters(cluster, season, index, groups) - {control})


def epoch_underway(season: Season, before: dict[str, tuple[Any, ...]]) -> bool:
    """Whether a copy's meta changed since `before` (the child's epoch is writing)."""
    return copy_states(season) != before


def copy_states(season: Season) -> dict[str, tuple[Any, ...]]:
    r, keys = redis_get(), keys_of(season)
    out = {}
    for copy in rankview.copies_get(r, keys):
        meta = rankview.copy_meta_load(r, keys, copy)
        out[copy] = (None,) if meta is None else (meta.gen, meta.state, meta.counts)
    return out


def failure(exc: BaseException) -> str:
    """An exception and the product's frame it came out of, in a line."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/leaderboard/" in f.filename]
    if not frames:
        return f"error {type(exc).__name__}: {exc}"[:300]
    last = frames[-1]
    where = f"{last.filename.split('/leaderboard/')[-1]}:{last.lineno} {last.name}"
    return f"error {type(exc).__name__}: {exc} at {where}"[:300]


def recoveries_run(season: Season) -> list[tuple[str, int | None]]:
    """Run the season's queued recovery jobs here (no worker takes them in these tests):
    how each ended, and the version it published (None: none)."""
    ran: list[tuple[str, int | None]] = []
    for job in recovery_jobs(season):
        if job.status == RebuildJob.Status.QUEUED:
            try:
                job = rebuild_run(job_id=job.pk)
            except Exception as exc:  # noqa: BLE001 - a failed recovery is started again by the next epoch
                ran.append((f"recovery {failure(exc)}", None))
                continue
            ran.append((f"recovery {job.status} v{job.published_version} {job.error or ''}".strip(),
                        job.published_version if job.status == RebuildJob.Status.PUBLISHED else None))
    return ran


def publish_after_failover(season: Season, *, timeout: float = 60) -> list[str]:
    """Epochs until one publishes, a lost view recovered on the way; the outcomes."""
    outcomes: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            result = epoch(season)
        except Exception as exc:  # noqa: BLE001 - a failed epoch is retried, as the beat would
            outcomes.append(failure(exc))
            time.sleep(0.5)
            continue
        outcomes.append(f"{result.status} {result.detail or ''}".strip())
        if result.status == "published":
            return outcomes
        if result.status == "lost":
            outcomes.extend(text for text, _ in recoveries_run(season))
            if any(job.status == RebuildJob.Status.PUBLISHED for job in recovery_jobs(season)):
                return outcomes
        time.sleep(0.3)
    raise AssertionError(f"no version published within {timeout:.0f}s after the failover: {outcomes}")


def players_published(season: Season, events: Events, rnd: random.Random) -> int:
    """PLAYERS with random scores in two versions, so that both copies are built and
    current; the second version's number."""
    apply_events(season, [events.result(p, rnd.randint(0, 1_000_000)) for p in PLAYERS])
    publish(season)
    apply_events(season, [events.result(p, rnd.randint(0, 1_000_000)) for p in PLAYERS[::7]])
    return publish(season)


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
        first = players_published(season, events, rnd)
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
        outcomes = publish_after_failover(self.season)
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


class EpochLoop:
    """Epochs of a season in a thread of their own, as the beat runs them: `interval`
    seconds after the last one ended, `changes()` (when given) commits a few events, then
    an epoch runs; a failed epoch is retried at the next tick, and with `recover` a view
    found lost is recovered on the way (`recoveries_run`). `outcomes` holds (when it
    ended, what it said, the version it published or None); `stop()` returns once the
    thread has ended (at once if it never started)."""

    def __init__(self, season: Season, *, interval: float = 0.5, changes: Callable[[Season], None] | None = None,
                 recover: bool = True):
        self.season_pk = season.pk
        self.interval = interval
        self.changes = changes
        self.recover = recover
        self.outcomes: list[tuple[float, str, int | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="epoch-loop", daemon=True)

    def start(self) -> EpochLoop:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=120)
        assert not self._thread.is_alive(), "the epoch loop did not stop"

    def _run(self) -> None:
        try:
            season = Season.objects.get(pk=self.season_pk)  # this thread's own, on its own connection
            while not self._stop.wait(self.interval):
                try:
                    if self.changes is not None:
                        self.changes(season)
                    result = epoch(season)
                except Exception as exc:  # noqa: BLE001 - a failed epoch is retried, as the beat would
                    self.outcomes.append((time.monotonic(), failure(exc), None))
                    continue
                self.outcomes.append((time.monotonic(), f"{result.status} {result.detail or ''}".strip(),
                                      result.version if result.status == "published" else None))
                if result.status == "lost" and self.recover:
                    self.outcomes.extend((time.monotonic(), text, version) for text, version in recoveries_run(season))
        finally:
            connections.close_all()

    def published(self, *, since: float = 0.0) -> list[int]:
        """The versions the loop's epochs published (after `since`), in order."""
        return [version for at, _, version in self.outcomes if version is not None and at >= since]

    def said(self, *, since: float = 0.0) -> list[str]:
        """The outcomes after `since`, consecutive repeats counted ("published x3")."""
        out: list[tuple[str, int]] = []
        for at, text, _ in self.outcomes:
            if at < since:
                continue
            if out and out[-1][0] == text:
                out[-1] = (text, out[-1][1] + 1)
            else:
                out.append((text, 1))
        return [text if n == 1 else f"{text} x{n}" for text, n in out]
