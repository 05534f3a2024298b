"""Every role on its own servers: the Celery broker (CELERY_BROKER_URL, a plain Redis or
RabbitMQ) and the channel layer (CHANNEL_LAYER_URL, one or several plain Redis servers)
default to REDIS_URL, must be named when REDIS_CLUSTER is true, and are really used: an
epoch task sent through RabbitMQ publishes a version, and the live boards' layer keeps
its groups on the CHANNEL_LAYER_URL servers. Real child processes, real servers."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from django.conf import settings
from kombu import Connection

from seasons.models import Season
from tests.support import ROOT, Events, apply_events, assert_matches_ledger, child_env, process_stop

RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672//"

SETTINGS_CHILD = """
import json
import django

django.setup()
from django.conf import settings

print(json.dumps({"broker": settings.CELERY_BROKER_URL,
                  "layer": [host["address"] for host in settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"]]}))
"""


def settings_in_child(**env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", SETTINGS_CHILD], cwd=ROOT, env=child_env(**env),
                          capture_output=True, text=True, timeout=60)


def roles_of(**env: str) -> dict[str, object]:
    done = settings_in_child(**env)
    assert done.returncode == 0, done.stderr
    answer: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


def redis_db_url(db: int) -> str:
    """REDIS_URL's server with another database number: another server as far as a
    configuration can tell."""
    return str(urlunsplit(urlsplit(settings.REDIS_URL)._replace(path=f"/{db}")))


def other_dbs(count: int) -> list[int]:
    own = int(urlsplit(settings.REDIS_URL).path.lstrip("/") or 0)
    return [(own + offset) % 16 for offset in range(1, count + 1)]


# ------------------------------------------------------------------------------- settings


@pytest.mark.django_db
def test_broker_and_channel_layer_default_to_redis_url() -> None:
    assert roles_of(CELERY_BROKER_URL="", CHANNEL_LAYER_URL="", REDIS_CLUSTER="") == {
        "broker": settings.REDIS_URL, "layer": [settings.REDIS_URL],
    }


@pytest.mark.django_db
def test_broker_and_channel_layer_take_their_own_urls_several_layer_hosts_in_order() -> None:
    first, second = (redis_db_url(db) for db in other_dbs(2))
    assert roles_of(CELERY_BROKER_URL=RABBITMQ_URL, CHANNEL_LAYER_URL=f"{first}, {second}") == {
        "broker": RABBITMQ_URL, "layer": [first, second],
    }


@pytest.mark.django_db
@pytest.mark.parametrize(("unset", "named"), [
    (("CELERY_BROKER_URL", "CHANNEL_LAYER_URL"), "CELERY_BROKER_URL and CHANNEL_LAYER_URL are unset"),
    (("CHANNEL_LAYER_URL",), "CHANNEL_LAYER_URL is unset"),
    (("CELERY_BROKER_URL",), "CELERY_BROKER_URL is unset"),
])
def test_a_cluster_refuses_to_start_without_a_broker_and_a_channel_layer_of_their_own(
        unset: tuple[str, ...], named: str) -> None:
    env = {"CELERY_BROKER_URL": RABBITMQ_URL, "CHANNEL_LAYER_URL": redis_db_url(other_dbs(1)[0])}
    env.update(dict.fromkeys(unset, ""))
    done = settings_in_child(REDIS_CLUSTER="true", **env)
    assert done.returncode != 0
    assert "ConfigError" in done.stderr and named in done.stderr, done.stderr
    assert "a Redis Cluster cannot be the Celery broker or the channel layer" in done.stderr


@pytest.mark.django_db
def test_a_cluster_starts_with_both_roles_named() -> None:
    layer = redis_db_url(other_dbs(1)[0])
    assert roles_of(REDIS_CLUSTER="true", CELERY_BROKER_URL=RABBITMQ_URL, CHANNEL_LAYER_URL=layer) == {
        "broker": RABBITMQ_URL, "layer": [layer],
    }


@pytest.mark.django_db
@pytest.mark.parametrize(("name", "value"), [
    ("CELERY_BROKER_URL", "http://127.0.0.1:5672/"),
    ("CELERY_BROKER_URL", f"{RABBITMQ_URL},{RABBITMQ_URL}"),
    ("CHANNEL_LAYER_URL", "127.0.0.1:6379"),
    ("CHANNEL_LAYER_URL", RABBITMQ_URL),
])
def test_a_broker_or_layer_url_of_the_wrong_kind_refuses_to_start(name: str, value: str) -> None:
    done = settings_in_child(**{name: value})
    assert done.returncode != 0
    assert "ConfigError" in done.stderr and name in done.stderr, done.stderr


# -------------------------------------------------------------------------- channel layer

# The live boards' layer, as a web process gets it: join a season's group, announce a
# version to it, receive the announcement.
LAYER_CHILD = """
import asyncio
import json
import sys
import django

django.setup()
from channels.layers import get_channel_layer
from leaderboard.live.announce import season_group

async def main() -> None:
    layer = get_channel_layer()
    channel = await layer.new_channel(prefix="live")
    await layer.group_add(season_group(sys.argv[1]), channel)
    await layer.group_send(season_group(sys.argv[1]), {"type": "probe", "version": 7})
    print(json.dumps(await asyncio.wait_for(layer.receive(channel), 10)), flush=True)

asyncio.run(main())
"""


def layer_keys(client: redis.Redis, prefix: str) -> list[bytes]:
    return list(client.scan_iter(match=f"{prefix}:asgi*", count=1000))


@pytest.mark.django_db
def test_the_live_layer_keeps_its_groups_on_the_channel_layer_url_servers() -> None:
    prefix = f"lbt{uuid.uuid4().hex[:10]}"
    dbs = other_dbs(2)
    layer_servers = [redis.Redis.from_url(redis_db_url(db)) for db in dbs]
    views = redis.Redis.from_url(settings.REDIS_URL)
    try:
        # Several seasons, so that channels-redis' sharding has groups to spread over both servers.
        for slug in ("alpha", "beta", "gamma", "delta"):
            done = subprocess.run(
                [sys.executable, "-c", LAYER_CHILD, slug], cwd=ROOT, capture_output=True, text=True, timeout=60,
                env=child_env(REDIS_KEY_PREFIX=prefix, CHANNEL_LAYER_URL=",".join(redis_db_url(db) for db in dbs)),
            )
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout.strip().splitlines()[-1]) == {"type": "probe", "version": 7}
        assert layer_keys(views, prefix) == [], "the layer wrote to REDIS_URL's server"
        groups = [[key for key in layer_keys(server, prefix) if b":group:" in key] for server in layer_servers]
        assert sum(len(keys) for keys in groups) == 4, groups
        assert all(groups), f"one layer server holds every group: {groups}"
    finally:
        for client in [*layer_servers, views]:
            for key in layer_keys(client, prefix):
                client.delete(key)


# ------------------------------------------------------------------------ broker: RabbitMQ


@pytest.fixture
def rabbitmq() -> Iterator[str]:
    """A queue of this test's own on the local RabbitMQ (deleted afterwards), so that no
    other worker on the broker takes its messages."""
    try:
        socket.create_connection(("127.0.0.1", 5672), timeout=1).close()
    except OSError:
        pytest.skip("RabbitMQ is not running on 127.0.0.1:5672 (.ci/run starts it: rabbitmq-server -detached)")
    queue = f"lbtest-{uuid.uuid4().hex[:12]}"
    yield queue
    with Connection(RABBITMQ_URL, connect_timeout=5) as conn:
        channel = conn.channel()
        channel.queue_delete(queue)


# Sends one season's epoch task as the beat's dispatch does, with the broker the settings name.
SEND_CHILD = """
import sys
import django

django.setup()
from leaderboard.tasks import season_epoch

season_epoch.apply_async(args=[int(sys.argv[1])], queue=sys.argv[2])
"""


def queue_exists_on_rabbitmq(queue: str) -> bool:
    with Connection(RABBITMQ_URL, connect_timeout=5) as conn:
        try:
            conn.channel().queue_declare(queue, passive=True)
        except Exception:
            return False
        return True


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_an_epoch_task_sent_through_rabbitmq_publishes_a_version(season: Season, rabbitmq: str) -> None:
    ev = Events()
    apply_events(season, [ev.result(f"p{i}", i * 10) for i in range(50)])
    env = child_env(CELERY_BROKER_URL=RABBITMQ_URL)
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "config", "--quiet", "worker", "--pool", "solo", "-Q", rabbitmq,
         "--without-mingle", "--without-gossip", "--without-heartbeat", "--loglevel", "WARNING"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        sent = subprocess.run([sys.executable, "-c", SEND_CHILD, str(season.pk), rabbitmq], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60)
        assert sent.returncode == 0, sent.stderr
        deadline = time.monotonic() + 60
        while Season.objects.get(pk=season.pk).published_version == 0:
            assert worker.poll() is None, worker.stderr.read() if worker.stderr else ""
            assert time.monotonic() < deadline, "no version published within 60 s"
            time.sleep(0.2)
    finally:
        process_stop(worker, timeout=15)
    # The message went through RabbitMQ, where the worker's queue was declared.
    assert queue_exists_on_rabbitmq(rabbitmq)
    season.refresh_from_db()
    assert assert_matches_ledger(season) == season.published_version == 1
