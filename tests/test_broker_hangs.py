"""A Celery broker that hangs instead of refusing (it accepts connections and answers nothing):
an enqueue gives up within BROKER_ENQUEUE_BOUND_SECONDS (twice BROKER_TIMEOUT_SECONDS,
config/broker.py) and is logged instead of raising (tasks.broker_send). So an epoch whose
parts the broker does not take runs them itself and publishes; a rebuild started from the
staff console meanwhile answers, stays queued and is sent again by beat's
rebuild_jobs_resend once the broker answers, then runs; a real worker consuming through
the hung broker takes tasks again by itself. The hang is a proxy in front of the broker
that stops forwarding (tests/support/stall.py); this process's Celery app is pointed at
it with the settings' own per-transport timeouts, shortened to TIMEOUT."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import kombu.pools
import pytest
import redis
from django.conf import settings as django_settings
from django.db import connections

from config.broker import BrokerTimeouts, broker_timeouts
from leaderboard.models import RebuildJob
from leaderboard.recovery.rebuild import rebuild_jobs_fail_stale, rebuild_jobs_resend_due, season_rebuild_start
from leaderboard.tasks import (
    broker_send,
    epochs_dispatch,
    rebuild_jobs_resend,
    rebuild_run_task,
    season_epoch,
    season_epoch_part,
)
from seasons.models import Season
from tests.support import (
    ROOT,
    TEST_ACTOR,
    Events,
    apply_events,
    assert_matches_ledger,
    child_env,
    epoch,
    process_stop,
    publish,
    season_in_parts,
)
from tests.support.stall import StallProxy

# The staff fixtures (make_staff, client_as).
pytest_plugins = ["tests.support.staff_fixtures"]

# BROKER_TIMEOUT_SECONDS for this process's app (and the worker's): short, so a hang costs
# the tests little; the settings' default is 2 s.
TIMEOUT = 0.5
# What the machine may add to a bound (2 shared cores, other suites running).
SLACK = 3.0
RABBITMQ_PORT = 5672
CELERY_QUEUE = "celery"  # the default queue: its Redis list has the same name


@dataclass
class HungBroker:
    proxy: StallProxy
    url: str  # the broker's URL through the proxy
    timeouts: BrokerTimeouts
    threads: list[threading.Thread]


def url_through(url: str, proxy: StallProxy) -> str:
    parts = urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    return str(urlunsplit(parts._replace(netloc=f"{auth + '@' if auth else ''}127.0.0.1:{proxy.port}")))


def pools_closed() -> None:
    """Every pooled broker connection and producer of this process closed and forgotten, so
    the next enqueue connects to the app's broker_url as it is now."""
    from config.celery import app

    kombu.pools.reset()
    app._pool = None
    app.amqp._producer_pool = None


@contextlib.contextmanager
def celery_through(url: str, *, timeout: float) -> Iterator[BrokerTimeouts]:
    """This process's Celery app sends to `url`, with the settings' timeouts for its
    transport at BROKER_TIMEOUT_SECONDS = `timeout`; restored afterwards."""
    from config.celery import app

    timeouts = broker_timeouts(url, timeout=timeout)
    wanted = {"broker_url": url, **timeouts.celery_settings()}
    saved = {name: app.conf[name] for name in wanted}
    # Celery reads CELERY_BROKER_URL from the environment before its configuration (the
    # Redis Cluster runs set it, tests/conftest.py).
    saved_env = os.environ.get("CELERY_BROKER_URL")
    os.environ["CELERY_BROKER_URL"] = url
    app.conf.update(wanted)
    pools_closed()
    try:
        yield timeouts
    finally:
        if saved_env is None:
            os.environ.pop("CELERY_BROKER_URL", None)
        else:
            os.environ["CELERY_BROKER_URL"] = saved_env
        app.conf.update(saved)
        pools_closed()


@contextlib.contextmanager
def broker_behind_proxy(broker_url: str, *, pattern: bytes = b"") -> Iterator[HungBroker]:
    """The broker at `broker_url` behind a StallProxy (which also stalls the first connection
    that sends `pattern`), and this process's Celery app sending through it."""
    parts = urlsplit(broker_url)
    default_port = RABBITMQ_PORT if parts.scheme.startswith("amqp") else 6379
    proxy = StallProxy(target_port=parts.port or default_port, target_host=parts.hostname or "127.0.0.1",
                       pattern=pattern)
    hung = HungBroker(proxy=proxy, url=url_through(broker_url, proxy),
                      timeouts=broker_timeouts(broker_url, timeout=TIMEOUT), threads=[])
    try:
        with celery_through(hung.url, timeout=TIMEOUT):
            yield hung
    finally:
        # A call still blocked on the hang (the test failed: without the timeouts it waits
        # for ever) is let go before the database is torn down under it.
        proxy.close()
        for thread in hung.threads:
            thread.join(timeout=30)


def redis_broker(settings: Any) -> str:
    """CELERY_BROKER_URL, a plain Redis here (with REDIS_CLUSTER too: the broker is then a
    plain Redis of its own); the test is skipped otherwise."""
    scheme = urlsplit(settings.CELERY_BROKER_URL).scheme
    if scheme != "redis":
        pytest.skip(f"the broker is not a redis:// server ({scheme}://)")
    return str(settings.CELERY_BROKER_URL)


@pytest.fixture
def hung(settings: Any) -> Iterator[HungBroker]:
    """The broker (CELERY_BROKER_URL's plain Redis) behind a proxy this test stalls."""
    with broker_behind_proxy(redis_broker(settings)) as broker:
        yield broker


def timed(hung: HungBroker, call: Callable[[], Any], *, limit: float) -> tuple[Any, float]:
    """call() in a thread of its own: (what it returned, its seconds). Fails once it has not
    returned within `limit` (the hung broker's fixture lets it go at the end)."""
    box: dict[str, Any] = {}

    def run() -> None:
        started = time.monotonic()
        try:
            box["result"] = call()
        except BaseException as exc:
            box["error"] = exc
        finally:
            box["seconds"] = time.monotonic() - started
            connections.close_all()

    thread = threading.Thread(target=run, name="broker-hang-call", daemon=True)
    hung.threads.append(thread)
    thread.start()
    thread.join(limit)
    if thread.is_alive():
        raise AssertionError(f"still waiting on the hung broker after {limit:g} s")
    if "error" in box:
        raise box["error"]
    return box["result"], box["seconds"]


def queued_tasks(broker_url: str, task: str) -> list[list[Any]]:
    """The args of every message of `task` waiting in the broker's default queue (a kombu
    Redis list of JSON envelopes, the task's body base64-encoded JSON [args, kwargs, embed])."""
    client = redis.Redis.from_url(broker_url)
    try:
        found = []
        for raw in client.lrange(CELERY_QUEUE, 0, -1):
            envelope = json.loads(raw)
            if envelope["headers"]["task"] == task:
                found.append(json.loads(base64.b64decode(envelope["body"]))[0])
        return found
    finally:
        client.close()


# ------------------------------------------------------------------------- settings


def test_the_broker_timeouts_are_per_transport() -> None:
    on_redis = broker_timeouts("redis://broker:6379/0", timeout=2.0)
    assert on_redis.transport_options == {"socket_timeout": 2.0, "socket_connect_timeout": 2.0}
    assert on_redis.publish_retry_policy == {"max_retries": 0}  # redis-py replaces a closed connection itself
    on_amqp = broker_timeouts("amqps://u:p@broker:5671/vhost", timeout=2.0)
    assert on_amqp.transport_options == {"read_timeout": 2.0, "write_timeout": 2.0}
    assert on_amqp.publish_retry_policy["max_retries"] == 1  # a restarted RabbitMQ's first publish
    assert on_redis.enqueue_bound_seconds == on_amqp.enqueue_bound_seconds == 4.0
    with pytest.raises(ValueError, match="no broker timeouts"):
        broker_timeouts("sqs://queue", timeout=2.0)


def test_the_celery_app_is_configured_with_the_settings_timeouts() -> None:
    from config.celery import app

    timeouts = broker_timeouts(django_settings.CELERY_BROKER_URL, timeout=django_settings.BROKER_TIMEOUT_SECONDS)
    for name, value in timeouts.celery_settings().items():
        assert app.conf[name] == value, name
    assert django_settings.BROKER_ENQUEUE_BOUND_SECONDS == 2 * django_settings.BROKER_TIMEOUT_SECONDS


# ---------------------------------------------------------------- the resend and the stale


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_a_queued_job_is_either_sent_again_or_failed_as_stale_never_both(
        season_factory: Callable[..., Season]) -> None:
    season = season_factory(slug="resend")
    job = season_rebuild_start(season=season, actor=TEST_ACTOR, layout=season.bucket_layout, enqueue=False)
    assert rebuild_jobs_resend_due(idle_seconds=60) == []  # just queued: its first send may be on its way
    time.sleep(0.3)
    assert rebuild_jobs_resend_due(idle_seconds=0.2) == [job.pk]
    assert rebuild_jobs_resend_due(idle_seconds=0.2) == []  # sent: due again a period later
    # Sent again just now: not stale, though it was queued longer ago than the bound.
    assert rebuild_jobs_fail_stale(season=season, actor=TEST_ACTOR, stale_seconds=0.2) == []
    time.sleep(0.3)
    # Stale and failed first: not sent again.
    assert [j.pk for j in rebuild_jobs_fail_stale(season=season, actor=TEST_ACTOR, stale_seconds=0.2)] == [job.pk]
    assert rebuild_jobs_resend_due(idle_seconds=0.2) == []
    job.refresh_from_db()
    assert job.status == RebuildJob.Status.FAILED


# -------------------------------------------------------------------- the hung broker


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_an_epoch_whose_parts_the_hung_broker_does_not_take_runs_them_itself_and_publishes(
        season_factory: Callable[..., Season], settings: Any, hung: HungBroker) -> None:
    season = season_in_parts(season_factory, settings, slug="bhang", prefix="b", claim_seconds=0.25)
    apply_events(season, [Events("bhang2").correction(f"b{i:03d}", 900_000 + i) for i in range(0, 200, 2)])
    before = Season.objects.get(pk=season.pk).published_version
    connections_before = hung.proxy.accepted
    hung.proxy.stall_all()
    # The epoch sends its parts twice: to apply its changes to the copy it publishes, and,
    # after publishing, to bring the other copy up to date (EPOCH_CATCH_UP). Each waits out
    # one enqueue's bound, then the claim wait, then the coordinator runs the parts.
    bound = hung.timeouts.enqueue_bound_seconds + settings.EPOCH_PART_CLAIM_SECONDS
    started = time.monotonic()
    published: list[float] = []

    def watch() -> None:
        while time.monotonic() - started < 60:
            if Season.objects.get(pk=season.pk).published_version != before:
                published.append(time.monotonic() - started)
                break
            time.sleep(0.01)
        connections.close_all()

    watcher = threading.Thread(target=watch, name="publication-watch", daemon=True)
    watcher.start()
    result, seconds = timed(hung, lambda: epoch(season), limit=2 * bound + SLACK)
    watcher.join()
    opened = hung.proxy.accepted - connections_before
    print(f"\nwhile the broker hung: the epoch published v{result.version} after {published[0]:.2f} s (bound "
          f"{bound:.2f} s + its work) and ended after {seconds:.2f} s (its catch-up sent the parts again), the "
          f"parts run by the coordinator; {opened} broker connection(s) opened")
    assert (result.status, result.parts) == ("published", 2), result
    assert published[0] <= bound + SLACK, published
    assert seconds >= TIMEOUT * 0.9, "the parts' enqueue did not meet the hang"
    assert opened <= 2, opened
    hung.proxy.thaw()
    season.refresh_from_db()
    assert assert_matches_ledger(season) == result.version


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_a_rebuild_started_while_the_broker_hangs_answers_stays_queued_and_is_sent_again_once_it_answers(
        season_factory: Callable[..., Season], settings: Any, hung: HungBroker, client_as: Any) -> None:
    season = season_factory(slug="rhang")
    apply_events(season, [Events("rhang").result(f"r{i:03d}", 1_000 * i) for i in range(60)])
    publish(season)
    reviewer = client_as("reviewer", "rev")
    hung.proxy.stall_all()
    bound = hung.timeouts.enqueue_bound_seconds
    response, seconds = timed(hung, lambda: reviewer.post(f"/staff/seasons/{season.slug}/rebuilds/",
                                                          {"reason": "drill"}), limit=bound + SLACK)
    job = RebuildJob.objects.get(season=season, kind=RebuildJob.Kind.REBUILD)
    print(f"\nwhile the broker hung: the rebuild request answered {response.status_code} in {seconds:.2f} s "
          f"(bound {bound:.2f} s), job {job.pk} {job.status}")
    assert response.status_code == 302 and response["Location"] == f"/staff/seasons/{season.slug}/rebuilds/{job.pk}/"
    assert seconds >= TIMEOUT * 0.9, "the enqueue did not meet the hang"
    assert job.status == RebuildJob.Status.QUEUED
    # While it hangs, the resend's own send gives up in time as well: the job stays due.
    settings.REBUILD_RESEND_SECONDS = 0.2
    time.sleep(0.3)
    resent, seconds = timed(hung, rebuild_jobs_resend, limit=bound + SLACK)
    assert resent == 0

    hung.proxy.thaw()
    # What the proxy held during the hang reaches the broker now: a message the client gave
    # up on may land after all (a second delivery is harmless); count from here.
    time.sleep(0.5)
    task = rebuild_run_task.name
    late = queued_tasks(hung.url, task)
    time.sleep(0.3)
    thawed = time.monotonic()
    assert rebuild_jobs_resend() == 1
    waiting = queued_tasks(hung.url, task)
    print(f"after the thaw: {len(late)} message(s) the hang held landed late, the resend sent 1 more "
          f"in {time.monotonic() - thawed:.2f} s")
    assert waiting == [*late, [job.pk]] or waiting == [[job.pk], *late], waiting
    # A worker's part: each delivery runs the task; the first claims and runs the job, any
    # other finds it claimed.
    for args in waiting:
        rebuild_run_task(*args)
    job.refresh_from_db()
    assert job.status == RebuildJob.Status.PUBLISHED, (job.status, job.error)
    season.refresh_from_db()
    assert assert_matches_ledger(season) == job.published_version


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_a_worker_whose_broker_hangs_mid_epoch_publishes_and_then_takes_tasks_again_by_itself(
        season_factory: Callable[..., Season], settings: Any, tmp_path: Path) -> None:
    """A real worker, the coordinator of an epoch in two parts: the broker hangs as it sends
    the parts (the proxy stalls the connection that sends them, then every connection), so
    it runs them itself and publishes while the broker still hangs; its own ack, its
    consuming connection and its reconnections meet the hang too. Once the broker answers
    again, the worker takes the next epoch by itself."""
    broker_url = redis_broker(settings)
    season = season_factory(slug="whang", partitions=8)
    apply_events(season, [Events("whang").result(f"w{i:03d}", 1_000 * i) for i in range(80)])
    settings.EPOCH_PARTS = 1  # the first version, published here: no parts sent from this process
    publish(season)
    apply_events(season, [Events("whang2").correction(f"w{i:03d}", 500_000 + i) for i in range(0, 80, 2)])
    log = tmp_path / "worker.log"
    # Earlier tests' messages out of the queue (the broker is not flushed with the views on a
    # Redis Cluster): the worker takes no part but its own epoch's, whose send trips the proxy.
    client = redis.Redis.from_url(broker_url)
    client.delete(CELERY_QUEUE)
    client.close()
    with broker_behind_proxy(broker_url, pattern=season_epoch_part.name.encode()) as hung:
        # BROKER_TIMEOUT_SECONDS below the worker's BRPOP poll (1 s): its idle wait is not
        # bound by it (the reply is read once the socket is readable).
        env = child_env(CELERY_BROKER_URL=hung.url, BROKER_TIMEOUT_SECONDS=str(TIMEOUT), EPOCH_PARTS="2",
                        EPOCH_PART_CLAIM_SECONDS="0.25")
        bound = hung.timeouts.enqueue_bound_seconds + 0.25
        with log.open("w") as out:
            worker = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "config", "worker", "--pool", "solo", "--without-mingle",
                 "--without-gossip", "--without-heartbeat", "--loglevel", "WARNING"],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

        def published_past(version: int, *, within: float) -> float:
            started = time.monotonic()
            while Season.objects.get(pk=season.pk).published_version <= version:
                assert worker.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() - started < within, (
                    f"nothing published within {within:g} s: {log.read_text()[-3000:]}")
                time.sleep(0.02)
            return time.monotonic() - started

        try:
            version = Season.objects.get(pk=season.pk).published_version
            assert broker_send("epochs' dispatch", epochs_dispatch.delay)
            # The worker started, took the epoch and sends its parts: the broker hangs now.
            assert hung.proxy.stalled.wait(60), log.read_text()[-3000:]
            hung.proxy.stall_all()
            hang_started = time.monotonic()
            during = published_past(version, within=bound + SLACK)
            time.sleep(max(0.0, 5.0 - (time.monotonic() - hang_started)))
            hung.proxy.thaw()
            thawed = time.monotonic()
            apply_events(season, [Events("whang3").correction(f"w{i:03d}", 700_000 + i) for i in range(1, 80, 2)])
            version = Season.objects.get(pk=season.pk).published_version
            assert broker_send("epochs' dispatch", epochs_dispatch.delay)
            after = published_past(version, within=30)
            text = log.read_text()
            print(f"\nthe broker hung as the worker sent its epoch's parts: it published {during:.2f} s later "
                  f"(bound {bound:.2f} s + its work), the hang lasted {thawed - hang_started:.1f} s; the worker "
                  f"published v{version + 1} {time.monotonic() - thawed:.2f} s after the broker answered again "
                  f"({after:.2f} s after the next dispatch); its log: {text.count('WARNING/')} warning(s), "
                  f"{text.count('ERROR/') + text.count('CRITICAL/')} error(s)")
        finally:
            process_stop(worker, timeout=15)
    season.refresh_from_db()
    assert assert_matches_ledger(season) == season.published_version


def test_an_enqueue_through_a_hung_rabbitmq_gives_up_within_the_bound() -> None:
    """The AMQP transport's timeouts: a new connection's handshake with a RabbitMQ that hangs
    gives up within the bound, and the next enqueue goes through once it answers. (On an
    open connection a publish is written without waiting for the broker: no publisher
    confirms, so nothing there waits on a hang until the socket's send buffer is full.)"""
    try:
        socket.create_connection(("127.0.0.1", RABBITMQ_PORT), timeout=1).close()
    except OSError:
        pytest.skip(f"RabbitMQ is not running on 127.0.0.1:{RABBITMQ_PORT} (.ci/run starts it: rabbitmq-server "
                    "-detached)")
    queue = f"lbtest-{uuid.uuid4().hex[:12]}"
    with broker_behind_proxy(f"amqp://guest:guest@127.0.0.1:{RABBITMQ_PORT}//") as hung:

        def send() -> bool:
            return broker_send("a test epoch", lambda: season_epoch.apply_async(args=[0], queue=queue))

        bound = hung.timeouts.enqueue_bound_seconds
        try:
            hung.proxy.stall_all()
            taken, cold = timed(hung, send, limit=bound + SLACK)
            assert not taken and cold >= TIMEOUT * 0.9
            hung.proxy.thaw()
            assert send()
            print(f"\nRabbitMQ hung: a new connection's enqueue gave up in {cold:.2f} s (bound {bound:.2f} s)")
        finally:
            hung.proxy.thaw()
            from config.celery import app

            with app.connection_for_write() as conn:
                conn.default_channel.queue_delete(queue)
