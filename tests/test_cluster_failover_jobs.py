"""A master of the rank views' Redis Cluster killed (SIGKILL) during a shadow build (a
rebuild, a recovery) and under 1,000 live sockets, on the cluster of 3 masters with one
replica each that this module starts (tests/support/failover.py, as
tests/test_cluster_failover.py does).

Shadow builds: readers hit the public read URLs through the fast read path the whole
time and a writer posts to the write API; every answer is checked afterwards against the
ledger's standings at the version it names (a 200 is exactly that version's board, a 503
is allowed). The job runs in a child process, as a worker runs it (rebuild_run), its
build slowed to a few players a round trip, and the master dies while it builds.
Afterwards the job is published, or failed with a reason and its shadow copies gone; a
failed one is started again and publishes; the epochs publish again, the views answer as
the ledger and pass the invariant checker, and the ledger holds every event the write API
accepted.

Live sockets: 1,000 clients of a real server (tests/support/live_clients.py) while epochs
publish and the control slot's master dies; what each was sent is checked against the
ledger afterwards (the test's docstring)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import pytest

from leaderboard.models import ApiClient, RebuildJob
from leaderboard.models import Manifest as ManifestRow
from leaderboard.recovery.rebuild import RebuildError, rebuild_run, season_rebuild_start
from leaderboard.redis_client import redis_get
from leaderboard.views import rankview
from seasons.models import Season
from tests.conftest import redis_flush
from tests.support import (
    TEST_ACTOR,
    Events,
    apply_events,
    assert_matches_ledger,
    current_manifest,
    epoch,
    keys_of,
    recovery_jobs,
    season_data_keys,
)
from tests.support.browser import LIVE_WS_PROTOCOL, asgi_server
from tests.support.cluster import FailoverCluster
from tests.support.failover import (
    PLAYERS,
    WINDOW_BOUND_SECONDS,
    EpochLoop,
    Scene,
    child_settings,
    cluster_said,
    players_published,
    slot_map_refreshed,
    victim,
)
from tests.support.failure import PartWorker, rebuild_child
from tests.support.live_clients import LiveClients, deliveries_check, fd_limit_raise
from tests.support.readload import version_standings

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]
# The fixtures `replicated` (this module's cluster) and `on_replicated`.
pytest_plugins = ["tests.support.failover"]


def _killed_while_building(cluster: FailoverCluster, scene: Scene, job: RebuildJob, target: str,
                           child: PartWorker) -> tuple[int, float, int]:
    """Start the child's job, and once its build has sent a few batches kill the master
    `target` names (the control slot's, or one serving the shadow's slot groups) while it
    is still building; (the killed master's port, when, the batches sent before)."""
    assert child.proc.stdin is not None
    child.proc.stdin.write("go\n")
    child.proc.stdin.flush()
    child.wait_for(lambda line: line.startswith("sent "))
    meta = rankview.copy_meta_load(redis_get(), keys_of(scene.season), f"r{job.pk}")
    assert meta is not None, "the shadow has no meta while it builds"
    killed = victim(cluster, scene.season, target, index=meta.index, groups=meta.groups)
    time.sleep(scene.rnd.uniform(0.2, 0.8))  # somewhere inside the build
    sent = sum(1 for line in list(child.lines) if line.startswith("sent "))
    assert child.proc.poll() is None and not any(line.startswith("job ") for line in child.lines), (
        f"the job ended before the kill: {child.lines[-3:]} {child.errors[-3:]}")
    assert RebuildJob.objects.get(pk=job.pk).status == RebuildJob.Status.BUILDING
    killed_at = time.monotonic()
    cluster.master_kill(killed)
    return killed, killed_at, sent


def _outcome(job: RebuildJob, child: PartWorker) -> str:
    """How the killed job ended, checked: published, or failed with a reason and nothing of
    its shadow copies left in Redis (they are dropped, not left for ever)."""
    job.refresh_from_db()
    slot_map_refreshed()  # the scan below asks every master
    said = f"job {job.pk} {job.status}: {job.error or ''} (child: exit {child.proc.returncode}, " \
           f"{[line for line in child.lines if line.startswith('job ')] or child.errors[-1:]})"
    assert job.status in (RebuildJob.Status.PUBLISHED, RebuildJob.Status.FAILED), said
    if job.status == RebuildJob.Status.FAILED:
        assert job.error, said
        left = season_data_keys(job.season, job.copy) + season_data_keys(job.season, f"{job.copy}b")
        assert left == [], f"{said}; its shadow copies left {len(left)} keys: {left[:5]}"
    return said


def _rebuild_again(season: Season, *, timeout: float = 60) -> RebuildJob:
    """A new rebuild, started once the season's slot is free (a recovery may hold it), run here."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            job = season_rebuild_start(season=season, actor=TEST_ACTOR, reason="again after the failover",
                                       enqueue=False)
            break
        except RebuildError:
            assert time.monotonic() < deadline, "the season's shadow-build slot stayed taken"
            time.sleep(0.5)
    return rebuild_run(job_id=job.pk)


@pytest.mark.parametrize("target", ["control", "groups"])
def test_a_master_killed_during_a_rebuild(on_replicated: FailoverCluster, season_factory: Callable[..., Season],
                                          writer: tuple[ApiClient, str], target: str) -> None:
    """Epochs run half a second apart meanwhile, as the beat runs them: they fail while the
    master's slots are unserved and publish again once its replica serves them."""
    cluster = on_replicated
    scene = Scene.start(season_factory(slug=f"rebuild-{target}"), writer[1], seed=30 + len(target))
    season = scene.season
    loop = EpochLoop(season, interval=0.5)
    job = season_rebuild_start(season=season, actor=TEST_ACTOR, reason="a failover drill", enqueue=False)
    again: RebuildJob | None = None
    try:
        with rebuild_child(job.pk, env=child_settings()) as child:
            loop.start()
            killed, killed_at, sent = _killed_while_building(cluster, scene, job, target, child)
            child.proc.wait(timeout=120)
        promoted = cluster.failover_wait(killed, timeout=60)
        promoted_at = time.monotonic()
        outcome = _outcome(job, child)
        deadline = time.monotonic() + 60
        while not loop.published(since=promoted_at):
            assert time.monotonic() < deadline, f"no epoch published after the failover: {loop.said()}"
            time.sleep(0.2)
        if job.status == RebuildJob.Status.FAILED:
            again = _rebuild_again(season)
            assert again.status == RebuildJob.Status.PUBLISHED, (again.error, again.report)
        loop.stop()
        outcomes, final = scene.converge()
    finally:
        loop.stop()
        scene.stop()

    seconds, window = scene.window(killed_at)
    print(f"\nrebuild: the {target} master killed after {sent} build batches (port {killed} -> {promoted}, promoted "
          f"{promoted_at - killed_at:.1f}s after the kill); {outcome}; "
          f"{'then ' + f'job {again.pk} {again.status} v{again.published_version}; ' if again else ''}"
          f"{window}; epochs: {loop.said(since=killed_at)}; after: {outcomes}; versions read {scene.load.versions()}")
    assert scene.load.check(season) == []
    assert seconds < WINDOW_BOUND_SECONDS, f"503s for {seconds:.1f}s"
    assert scene.load.versions(since=promoted_at), "no read answered after the failover"
    scene.assert_ledger_kept(final)


def test_a_master_killed_during_a_recovery(on_replicated: FailoverCluster, season_factory: Callable[..., Season],
                                           writer: tuple[ApiClient, str]) -> None:
    """The views are lost (every master flushed, as a Redis restarted empty): the next
    epoch starts a recovery, and the master holding the season's control slot dies while
    it builds. Reads answer 503 while no version can be served, and the next epoch's
    recovery, once the failover is over, publishes."""
    cluster = on_replicated
    scene = Scene.start(season_factory(slug="recovery-killed"), writer[1], seed=40)
    season = scene.season
    try:
        redis_flush(redis_get())
        lost_at = time.monotonic()
        result = epoch(season)
        assert result.status == "lost" and "started" in (result.detail or ""), result
        (job,) = recovery_jobs(season)
        with rebuild_child(job.pk, env=child_settings()) as child:
            killed, killed_at, sent = _killed_while_building(cluster, scene, job, "control", child)
            child.proc.wait(timeout=120)
        promoted = cluster.failover_wait(killed, timeout=60)
        promoted_at = time.monotonic()
        outcome = _outcome(job, child)
        outcomes, final = scene.converge()
    finally:
        scene.stop()

    jobs = recovery_jobs(season)
    window = scene.load.unavailable_window()
    print(f"\nrecovery: the control master killed after {sent} build batches (port {killed} -> {promoted}, "
          f"promoted {promoted_at - killed_at:.1f}s after the kill); {outcome}; after: {outcomes}; "
          f"recoveries {[(j.pk, j.status, j.published_version) for j in jobs]}; 503s from the loss "
          f"{'none' if window is None else f'{window[0] - lost_at:+.2f}s to {window[1] - lost_at:+.2f}s'} "
          f"({scene.load.count(503)} of {len(scene.load.answers)} answers); versions read {scene.load.versions()}")
    assert jobs[-1].status == RebuildJob.Status.PUBLISHED, [(j.pk, j.status, j.error) for j in jobs]
    assert scene.load.check(season) == []
    assert scene.load.versions(since=promoted_at), "no read answered after the failover"
    scene.assert_ledger_kept(final)


# --- live clients ----------------------------------------------------------------------------------

LIVE_CLIENTS = 1000
# Clients that follow a player (their rank and neighbours read from the slot groups every
# version); the others get the shared top only, as most sockets do.
LIVE_SUBSCRIBED = 10


def test_a_master_killed_under_a_thousand_live_clients(on_replicated: FailoverCluster,
                                                       season_factory: Callable[..., Season]) -> None:
    """1,000 websocket clients of a real server process (uvicorn, production's websocket
    protocol, the rank views on the cluster) follow the live board while epochs run half a
    second apart, a few players moving before each, some into the top 100; the master of
    the season's control slot (pointer, manifests: what every round and snapshot reads)
    is killed, and epochs go on until five more versions are published.

    Every client must have been sent, for every version published while it was connected
    (the database's record of them), that version, or a later message that tells it it
    missed it (its previous_version is older, or a whole board after an "unavailable"
    notice), never a message that claims to follow a version it did not get (a gap the
    client would find itself and ask a snapshot for); every board shown (top 100, player
    count, a subscribed player's entry and neighbours) is the ledger's at its version;
    versions only grow; and all of them end on the last one."""
    cluster = on_replicated
    season = season_factory(slug="live-failover")
    rnd = random.Random(50)
    events = Events(tag="live-fo")
    players_published(season, events, rnd)

    def changes(season: Season) -> None:
        moving = rnd.sample(PLAYERS, 5)
        apply_events(season, [events.correction(p, rnd.randint(950_000, 1_000_000) if i < 2 else
                                                rnd.randint(0, 1_000_000)) for i, p in enumerate(moving)])

    fd_limit_raise(4 * LIVE_CLIENTS)
    loop = EpochLoop(season, interval=0.5, changes=changes)
    env = child_settings(LIVE_SOCKETS_PER_ADDRESS=str(2 * LIVE_CLIENTS))
    with asgi_server(ws=LIVE_WS_PROTOCOL, **env) as base:
        url = f"{base.replace('http://', 'ws://')}/ws/v1/seasons/{season.slug}/live"
        clients = LiveClients(url, LIVE_CLIENTS, origin=base, players=PLAYERS[:LIVE_SUBSCRIBED])
        try:
            connect_seconds = clients.start()
            assert not clients.failed, clients.failed[:5]
            shown = current_manifest(season).version  # what their snapshots showed
            loop.start()
            _published_wait(loop, 3, since=0.0, cluster=cluster, season=season)
            time.sleep(rnd.uniform(0, 1.5))  # anywhere in an epoch: its grace period, its writes, its swap
            killed = victim(cluster, season, "control")
            killed_at, killed_wall = time.monotonic(), time.time()
            cluster.master_kill(killed)
            promoted = cluster.failover_wait(killed, timeout=60)
            promoted_at = time.monotonic()
            _published_wait(loop, 5, since=promoted_at, cluster=cluster, season=season)
            loop.stop()
            last = current_manifest(season).version
            took = clients.wait(lambda c: c.held == last and c.top is not None, timeout=30)
        finally:
            loop.stop()
            clients.stop()

    # Every version published while the clients were connected, as the database recorded it.
    published = dict(ManifestRow.objects.filter(season=season, version__gt=shown).values_list(
        "version", "published_at"))
    versions = sorted(published)
    after = [v for v in versions if published[v].timestamp() > killed_wall]
    assert versions and versions[-1] == last, (versions, last)
    problems, deliveries = deliveries_check(clients, versions, last, lambda v: version_standings(season, v))
    messages = sum(len(c.received) for c in clients.clients)
    arrivals: dict[int, list[float]] = {}
    for client in clients.clients:
        for r in client.received:
            if r.kind == "version" and not r.ignored and r.version is not None:
                arrivals.setdefault(r.version, []).append(r.at)
    # A version's fan-out: from its publication (the database's record of it, written after
    # the pointer swap and before the announcement) to the last client that was sent it.
    wall = time.time() - time.monotonic()
    spreads = sorted(max(times) + wall - published[v].timestamp() for v, times in arrivals.items() if v in published)
    first_after = min((t for v in after for t in arrivals.get(v, [])), default=None)
    notices = sum(1 for c in clients.clients if any(r.kind == "unavailable" and r.at >= killed_at for r in c.received))
    print(f"\nlive: {len(clients.clients)} clients connected in {connect_seconds:.1f}s; the control master killed "
          f"(port {killed} -> {promoted}, promoted {promoted_at - killed_at:.1f}s after the kill); "
          f"{notices} clients shown an unavailable notice; the first version published after the kill reached a "
          f"client {'never' if first_after is None else f'{first_after - killed_at:.1f}s after it'}; the last, "
          f"v{last}, held by every client {'never' if took is None else f'{took:.2f}s'} after the epochs stopped; "
          f"{messages} messages ({len(clients.tops)} distinct boards); a version from its publication to the last "
          f"client {1000 * spreads[len(spreads) // 2] if spreads else 0:.0f} ms median, "
          f"{1000 * spreads[-1] if spreads else 0:.0f} ms at most; "
          f"epochs since the kill: {loop.said(since=killed_at)}; versions published since the kill: "
          f"{deliveries.line(after, len(clients.clients))}")
    assert problems == [], f"{len(problems)} problems: {problems[:10]}"
    assert after, "no version published after the kill"
    assert_matches_ledger(season, exhaustive=False)


def _published_wait(loop: EpochLoop, count: int, *, since: float, cluster: FailoverCluster, season: Season,
                    timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while len(loop.published(since=since)) < count:
        assert time.monotonic() < deadline, (f"{count} versions not published within {timeout:.0f}s: {loop.said()}; "
                                             f"{cluster_said(cluster, season)}")
        time.sleep(0.1)
