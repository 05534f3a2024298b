"""Races and dead workers around shadow builds (leaderboard/recovery/rebuild.py): two people
publishing one READY split, a discard racing a publish, and a builder SIGKILLed mid-build.
Real PostgreSQL or SQLite, real Redis, real threads and a real child process."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connections

from audit.models import AuditEntry
from leaderboard.models import RebuildJob
from leaderboard.recovery import rebuild
from leaderboard.recovery.rebuild import (
    RebuildError,
    rebuild_discard,
    rebuild_publish,
    rebuild_run,
    season_split_propose,
)
from leaderboard.redis_client import redis_get
from leaderboard.views import rankview
from leaderboard.views.epoch import season_lease_acquire
from seasons.models import Season
from tests.support import (
    CHILD_SETUP,
    NARROW,
    ROOT,
    TEST_ACTOR,
    Events,
    apply_events,
    assert_matches_ledger,
    board_snapshot,
    child_env,
    epoch,
    keys_of,
    post_ok,
    publish,
    recovery_jobs,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]
Post = Callable[..., Any]


def ready_split(season_factory: Callable[..., Season], post_scores: Post, slug: str) -> tuple[Season, RebuildJob]:
    """Two published versions (both copies built) and a split shadow waiting at READY."""
    season = season_factory(slug=slug, layout=NARROW)
    ev = Events(tag=slug)
    post_ok(post_scores, season, [ev.result(f"p{i:03d}", (i * 37) % 1000) for i in range(80)])
    publish(season)
    post_ok(post_scores, season, [ev.result("p001", 999)])
    publish(season)
    job = rebuild_run(job_id=season_split_propose(season=season, actor=TEST_ACTOR, split_points=[150, 550]).pk)
    assert job.status == RebuildJob.Status.READY, (job.error, job.report)
    return season, job


class Readers:
    """Threads reading the whole board of a season that nobody writes to: every answer must
    be complete and the same, whatever version serves it."""

    def __init__(self, season: Season):
        self.season = season
        self.expected = board_snapshot(season)[1:]
        self.stop = threading.Event()
        self.failures: list[str] = []
        self.reads = 0
        self.threads = [threading.Thread(target=self._loop, name=f"reader-{i}") for i in range(2)]

    def __enter__(self) -> Readers:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)

    def _loop(self) -> None:
        try:
            while not self.stop.is_set():
                try:
                    _, board, ranks = board_snapshot(self.season)
                except rankview.VersionExpired:
                    continue  # the version it pinned was replaced meanwhile: an answer, not a failure
                except Exception as exc:  # noqa: BLE001 - every failure is a finding
                    self.failures.append(repr(exc))
                    continue
                if (board, ranks) != self.expected:
                    self.failures.append("a read differed from the board")
                self.reads += 1
        finally:
            connections.close_all()


def race(*calls: Callable[[], Any]) -> list[Any]:
    """Run the calls at the same moment, each in its own thread; their results or exceptions."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = calls[i]()
        except Exception as exc:  # noqa: BLE001 - the outcome under test
            results[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return results


def test_two_approvers_publishing_one_split_at_once_publish_it_once(season_factory: Callable[..., Season],
                                                                      post_scores: Post) -> None:
    season, job = ready_split(season_factory, post_scores, "double-publish")
    r, keys = redis_get(), keys_of(season)
    with Readers(season) as readers:
        time.sleep(0.2)
        outcomes = race(lambda: rebuild_publish(job=job, actor=TEST_ACTOR, reason="first click"),
                        lambda: rebuild_publish(job=job, actor=TEST_ACTOR, reason="second click"))
        time.sleep(0.2)
    published = [o for o in outcomes if isinstance(o, RebuildJob)]
    refused = [o for o in outcomes if isinstance(o, RebuildError)]
    assert len(published) == 1 and len(refused) == 1, outcomes
    assert published[0].status == RebuildJob.Status.PUBLISHED and published[0].published_version == 3
    assert not readers.failures, readers.failures[:5]
    assert readers.reads > 0
    # The split's two copies serve, once: nothing re-mutated or dropped them.
    assert rankview.copies_get(r, keys) == [job.copy, f"{job.copy}b"]
    assert rankview.pointer_get(r, keys) == 3
    assert assert_matches_ledger(season) == 3
    assert publish_after_write(season) == 4


def publish_after_write(season: Season) -> int:
    apply_events(season, [Events(tag=f"{season.slug}-after").result("p002", 998)])
    version = publish(season)
    assert_matches_ledger(season)
    return version


def test_a_discard_while_a_publish_is_in_flight_is_refused(season_factory: Callable[..., Season],
                                                            post_scores: Post) -> None:
    season, job = ready_split(season_factory, post_scores, "discard-race")
    r, keys = redis_get(), keys_of(season)
    with Readers(season) as readers:
        publishing: list[Any] = []
        publisher = threading.Thread(target=lambda: publishing.extend(race(
            lambda: rebuild_publish(job=job, actor=TEST_ACTOR, reason="approved"))))
        publisher.start()
        deadline = time.monotonic() + 30
        while r.get(keys.lease) is None and publisher.is_alive():  # the publisher is comparing now
            assert time.monotonic() < deadline
            time.sleep(0.001)
        with pytest.raises(RebuildError, match="publish"):
            rebuild_discard(job=job, actor=TEST_ACTOR, reason="second thoughts")
        publisher.join(60)
    (published,) = publishing
    assert isinstance(published, RebuildJob) and published.status == RebuildJob.Status.PUBLISHED, published
    assert not readers.failures, readers.failures[:5]
    job.refresh_from_db()
    assert job.status == RebuildJob.Status.PUBLISHED
    assert rankview.copies_get(r, keys) == [job.copy, f"{job.copy}b"]
    assert rankview.pointer_get(r, keys) == 3
    assert_matches_ledger(season)
    publish_after_write(season)
    # A discard that comes first wins the same way: the publish is refused.
    _, other = ready_split(season_factory, post_scores, "discard-first")
    assert rebuild_discard(job=other, actor=TEST_ACTOR).status == RebuildJob.Status.DISCARDED
    with pytest.raises(RebuildError, match="discarded"):
        rebuild_publish(job=other, actor=TEST_ACTOR)


def test_a_publish_that_could_not_get_the_lease_gives_the_split_back(season_factory: Callable[..., Season],
                                                                     post_scores: Post,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    season, job = ready_split(season_factory, post_scores, "publish-busy")
    r, keys = redis_get(), keys_of(season)
    holder = season_lease_acquire(season=season, r=r, ttl_ms=60_000)
    assert holder is not None
    monkeypatch.setattr(rebuild, "LEASE_WAIT_SECONDS", 0.3)
    with pytest.raises(RebuildError, match="lease"):
        rebuild_publish(job=job, actor=TEST_ACTOR)
    job.refresh_from_db()
    assert job.status == RebuildJob.Status.READY
    rankview.lease_release(r, keys, holder)
    assert rebuild_publish(job=job, actor=TEST_ACTOR).status == RebuildJob.Status.PUBLISHED
    assert_matches_ledger(season)


# --- a builder killed mid-build -----------------------------------------------------------------

# A shadow build in a child process, as the Celery worker runs it; only the batch of the
# scan is made small, so the build takes long enough to be killed in the middle of it.
BUILDER_CHILD = CHILD_SETUP + """
import sys
from leaderboard.views import build
from leaderboard.recovery.rebuild import rebuild_run

build.BUILD_BATCH = 10
build.BUILD_SHARD_FILL = 0
rebuild_run(job_id=int(sys.argv[1]))
"""


def builder_killed_mid_build(job: RebuildJob) -> None:
    child = subprocess.Popen([sys.executable, "-c", BUILDER_CHILD, str(job.pk)], cwd=ROOT, env=child_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    try:
        while True:
            assert child.poll() is None, f"the builder ended before it was killed: {child.stderr.read()}"  # type: ignore[union-attr]
            if redis_get().exists(keys_of(job.season).copy_meta(f"r{job.pk}")):
                break  # the first shadow copy is being filled
            assert time.monotonic() < deadline, "the builder never started building"
            time.sleep(0.01)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait(30)
    assert child.returncode == -signal.SIGKILL


def test_a_builder_killed_mid_build_is_failed_as_stale_and_the_next_recovery_publishes(
    season_factory: Callable[..., Season], settings: Any,
) -> None:
    season = season_factory(slug="killed-builder", layout=NARROW)
    rnd = random.Random(4)
    ev = Events(tag="kb")
    apply_events(season, [ev.result(f"k{i:05d}", rnd.randint(0, 999)) for i in range(3000)])
    publish(season)
    apply_events(season, [ev.result("k00001", 1000)])
    before = publish(season)
    r = redis_get()
    r.flushdb()  # the views are lost: the next epoch starts a recovery
    assert epoch(season).status == "lost"
    (job,) = recovery_jobs(season)
    builder_killed_mid_build(job)
    job.refresh_from_db()
    assert job.status == RebuildJob.Status.BUILDING  # what the dead worker left

    # While its heartbeat is recent the job still holds the season...
    assert "in flight" in epoch(season).detail
    assert len(recovery_jobs(season)) == 1
    # ...once it is older than the bound, the next recovery attempt fails it and starts anew.
    settings.REBUILD_STALE_SECONDS = 1.0
    time.sleep(1.1)
    result = epoch(season)
    assert result.status == "lost" and "started" in result.detail, result
    old, new = recovery_jobs(season)
    assert old.status == RebuildJob.Status.FAILED and old.error.startswith("stale"), old.error
    assert rankview.copy_meta_load(r, keys_of(season), old.copy) is None  # its half-built shadow is gone
    stale_rows = AuditEntry.objects.filter(action="views.rebuild.stale_failed", target_id=str(old.pk))
    assert stale_rows.count() == 1
    assert rebuild_run(job_id=new.pk).status == RebuildJob.Status.PUBLISHED
    assert assert_matches_ledger(season, window_limits=(7,)) == before + 1


def test_the_command_fails_stale_jobs_with_an_audit_row(season_factory: Callable[..., Season],
                                                         post_scores: Post, settings: Any) -> None:
    season = season_factory(slug="fail-stale", layout=NARROW)
    post_ok(post_scores, season, [Events(tag="fs").result("a", 10)])
    publish(season)
    job = rebuild.season_rebuild_start(season=season, actor=TEST_ACTOR, enqueue=False)
    out = StringIO()
    call_command("rebuild_views", season.slug, "--fail-stale", stdout=out)
    assert "0 stale job(s)" in out.getvalue()  # its heartbeat is fresh
    job.refresh_from_db()
    assert job.status == RebuildJob.Status.QUEUED
    time.sleep(0.3)
    out = StringIO()
    call_command("rebuild_views", season.slug, "--fail-stale", "--stale-seconds", "0.2", stdout=out)
    assert f"job {job.pk} (rebuild): failed: stale" in out.getvalue()
    job.refresh_from_db()
    assert job.status == RebuildJob.Status.FAILED
    row = AuditEntry.objects.get(action="views.rebuild.stale_failed", target_id=str(job.pk))
    assert row.actor_label == "manage.py rebuild_views" and row.after == {"status": "failed"}
    # The slot is free again.
    assert rebuild_run(job_id=rebuild.season_rebuild_start(season=season, actor=TEST_ACTOR,
                                                           enqueue=False).pk).status == "published"
