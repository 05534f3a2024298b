"""A coordinator's own lease renewals never fail its fenced writes.

The fenced chunks WATCH the lease key, and the LeaseKeeper's renewal (PEXPIRE) touches
that key, which makes Redis refuse the EXEC just as a takeover would: the write must then
look again, and go on while the lease still holds its token."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from leaderboard.recovery.rebuild import season_epoch_advance
from leaderboard.redis_client import redis_get
from leaderboard.views import epoch, rankview
from seasons.models import Season
from tests.support import Events, apply_events
from tests.support.cluster import redis_cli_target
from tests.support.publication import assert_matches_ledger, keys_of, publish

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]


@pytest.fixture
def renewing(season: Season) -> Iterator[subprocess.Popen[bytes]]:
    """Extend the season's lease every millisecond (as its holder's keeper does, far more
    often) from another process while a test runs, whatever this process's GIL does."""
    r = redis_get()
    keys = keys_of(season)
    renewer = subprocess.Popen(
        ["redis-cli", *redis_cli_target(r, keys.lease), "-r", "-1", "-i", "0.001", "PEXPIRE", keys.lease, "30000"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    yield renewer
    renewer.kill()
    renewer.wait()


def test_renewals_of_the_holders_own_lease_do_not_fail_an_epochs_chunks(
        season: Season, renewing: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rankview.apply, "CHUNK_PLAYERS", 50)  # many fenced scripts
    monkeypatch.setattr(rankview.apply, "PIECES_PER_SEND", 4)
    monkeypatch.setattr(rankview, "FENCE_ATTEMPTS", 100)  # renewals every 2 ms: retries must win
    events = Events(season.slug)
    apply_events(season, [events.result(f"p{i:04d}", i) for i in range(1500)])
    publish(season)
    apply_events(season, [events.result(f"p{i:04d}", 5000 + i) for i in range(0, 1500, 2)])
    publish(season)
    assert renewing.poll() is None, "the renewer stopped"
    assert_matches_ledger(season, exhaustive=False)


def test_a_takeover_still_stops_a_fenced_write_at_once(season: Season) -> None:
    r = redis_get()
    keys = keys_of(season)
    apply_events(season, [Events(season.slug).result("a", 10)])
    publish(season)
    stale = epoch.season_lease_acquire(season=season, r=r, ttl_ms=30_000)
    assert stale is not None
    r.set(keys.lease, stale + 1)  # another coordinator's token
    with pytest.raises(rankview.FenceLost):
        rankview.manifest_store(r, keys, rankview.manifest_get(r, keys, 1), token=stale)  # type: ignore[arg-type]


def test_a_rebuild_gets_the_lease_from_epochs_running_back_to_back(
        season: Season, monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes keep epochs coming without a pause; the rebuild waiting to compare and publish
    asks for the lease (lease_wanted_mark) and the epochs step aside."""
    from django.db import connections

    from leaderboard.models import RebuildJob
    from leaderboard.recovery import rebuild
    from tests.support import TEST_ACTOR

    monkeypatch.setattr(rebuild, "LEASE_WAIT_SECONDS", 3.0)
    events = Events(season.slug)
    apply_events(season, [events.result(f"p{i:03d}", i) for i in range(100)])
    publish(season)
    stop = threading.Event()
    epochs: list[str] = []

    def writes() -> None:
        # Each write's epoch task finds the lease held and leaves a note, so the holder
        # runs epoch after epoch (for up to EPOCH_HOLD_SECONDS) without letting go.
        try:
            n = 0
            while not stop.is_set():
                n += 1
                apply_events(season, [events.result(f"p{n % 100:03d}", 1000 + n)])
                rankview.epoch_due_mark(redis_get(), keys_of(season), ttl_ms=2000)
        finally:
            connections.close_all()

    def epochs_back_to_back() -> None:
        try:
            while not stop.is_set():
                epochs.append(season_epoch_advance(season=season).status)
                time.sleep(0.02)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=writes), threading.Thread(target=epochs_back_to_back)]
    for thread in threads:
        thread.start()
    try:
        # The rebuild must find the epochs already under way (on a loaded machine its start
        # can otherwise win the lease before the first epoch, and there is nothing to take).
        deadline = time.monotonic() + 30
        while "published" not in epochs and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "published" in epochs, epochs
        job = rebuild.season_rebuild_start(season=season, actor=TEST_ACTOR, reason="drill", enqueue=False)
        job = rebuild.rebuild_run(job_id=job.pk)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert job.status == RebuildJob.Status.PUBLISHED, (job.error, job.report)
    assert "published" in epochs
    assert season_epoch_advance(season=season).status in ("published", "idle")
    assert_matches_ledger(season, exhaustive=False)


def test_a_build_loops_renewal_rides_out_one_redis_error_but_never_renews_a_lost_lease(
        season: Season, monkeypatch: pytest.MonkeyPatch) -> None:
    """LeaseKeeper.renew() from a build's loop: a transient Redis error while the last
    renewal still covers the lease is tolerated (as the keeper thread tolerates it), one
    past that is raised, and a lease lost is never renewed again."""
    import redis

    from leaderboard.views.rankview.fence import FenceLost, LeaseKeeper

    r = redis_get()
    keys = keys_of(season)
    token = epoch.season_lease_acquire(season=season, r=r, ttl_ms=1_000)
    assert token is not None
    keeper = LeaseKeeper(r, keys, token, ttl_ms=1_000, max_seconds=60)  # not started: the loop renews alone
    real_eval = r.eval
    failing = {"n": 0}

    def eval_flaky(*args: object, **kwargs: object) -> object:
        if failing["n"]:
            failing["n"] -= 1
            raise redis.ConnectionError("Connection reset by peer")
        return real_eval(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(r, "eval", eval_flaky)
    keeper.renew()
    failing["n"] = 1
    keeper.renew()  # within the lease's TTL: tried again by the next call
    assert not keeper.lost
    keeper.renew()
    assert 0 < r.pttl(keys.lease) <= 1_000
    time.sleep(1.1)  # the last renewal no longer covers the lease
    failing["n"] = 1
    with pytest.raises(redis.ConnectionError):
        keeper.renew()
    # Expired meanwhile and taken over: lost for good, whatever Redis answers next.
    assert epoch.season_lease_acquire(season=season, r=r, ttl_ms=30_000) is not None
    with pytest.raises(FenceLost):
        keeper.renew()
    failing["n"] = 1
    with pytest.raises(FenceLost):
        keeper.renew()
    assert keeper.lost
