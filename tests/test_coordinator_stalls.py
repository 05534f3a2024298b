"""A coordinator that lives on while its epoch is stuck: one call of its epoch thread does not
return (a Redis call on a stalled connection, a PostgreSQL query that gets no answer)
while its lease keeper's own connection answers. The keeper renews only while the epoch
makes progress, so the season is free EPOCH_STALL_SECONDS plus one lease after the stall,
another worker publishes, and the stuck coordinator, once its call returns, is refused by
the fences and publishes nothing. Real child processes, real Redis and database; the
stall is made at the network edge (tests/support/stall.py)."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.conf import settings as django_settings
from django.db import connection

from leaderboard.recovery.rebuild import season_epoch_advance
from leaderboard.redis_client import redis_get
from leaderboard.views import rankview
from seasons.models import Season
from tests.support import Events, apply_events, assert_matches_ledger, epoch_child, keys_of, publish
from tests.support.failure import child_database_url
from tests.support.stall import StallProxy, stall_proxy

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views"), pytest.mark.slow]

STALL_SECONDS = 2.0
LEASE_SECONDS = 1.0
# The bound the test holds a publication to after the stall: the stall and one lease, then
# one epoch of the next worker (a resumed or rebuilt side on a 2-core machine under load).
EPOCH_ALLOWANCE_SECONDS = 5.0
PLAYERS = [f"s{i:03d}" for i in range(300)]


@pytest.fixture
def stalling(settings: Any) -> None:
    settings.EPOCH_STALL_SECONDS, settings.EPOCH_LEASE_SECONDS = STALL_SECONDS, LEASE_SECONDS
    if settings.REDIS_CLUSTER:
        pytest.skip("the stall proxy forwards to one server; a cluster redirects past it")


def _port_replaced(url: str, port: int) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{parts.hostname}:{port}"))


def _season_with_backlog(season_factory: Any, slug: str) -> tuple[Season, Events]:
    season = season_factory(slug=slug)
    events = Events(tag=slug)
    apply_events(season, [events.result(p, i * 31 % 9_973) for i, p in enumerate(PLAYERS)])
    publish(season)
    apply_events(season, [events.result(p, 10_000 + i) for i, p in enumerate(PLAYERS)])
    return season, events


def _stalled_coordinator_outrun(season: Season, events: Events, proxy: StallProxy, **child_env: str) -> None:
    """A child coordinator runs one epoch through `proxy` until its epoch thread stalls;
    this process, another worker, writes and runs epochs until one publishes, within the
    bound; then the stalled call returns and the child must publish nothing."""
    r = redis_get()
    keys = keys_of(season)
    before = rankview.pointer_get(r, keys)
    child = epoch_child(season, apply_chunk=2, EPOCH_STALL_SECONDS=str(STALL_SECONDS),
                        EPOCH_LEASE_SECONDS=str(LEASE_SECONDS), **child_env)
    try:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        assert proxy.stalled.wait(60), "the child's epoch never sent what the proxy stalls on"
        stalled_at = time.monotonic()
        assert r.get(keys.lease) is not None, "the child stalled without holding the season"
        published: int | None = None
        round_ = 0
        while published is None and time.monotonic() - stalled_at < 30:
            round_ += 1
            apply_events(season, [events.correction(p, 20_000 + round_ * 7 + i) for i, p in enumerate(PLAYERS[:20])])
            result = season_epoch_advance(season=season)
            if result.status == "published":
                published = result.version
            else:
                time.sleep(0.2)
        gap = time.monotonic() - stalled_at
        print(f"published v{published} {gap:.1f} s after the coordinator stalled")
        assert published is not None and published > (before or 0), "nobody published while the coordinator hung"
        assert gap <= STALL_SECONDS + LEASE_SECONDS + EPOCH_ALLOWANCE_SECONDS, gap
    finally:
        proxy.thaw()
        out, err = child.communicate(timeout=120)
    print(f"the stalled child, once its call returned: exit {child.returncode}, {out.strip()!r}, "
          f"{(err.strip().splitlines() or [''])[-1]}")
    assert "published" not in out, f"the stalled coordinator published after it was replaced: {out} {err}"
    assert rankview.pointer_get(r, keys) == published
    assert_matches_ledger(season)


def test_a_coordinator_stalled_inside_a_redis_call_loses_the_season_in_time(
        stalling: None, season_factory: Any) -> None:
    """The epoch thread's connection stalls on the claim of its first part (the lease is
    held, the copy being applied marked): its keeper's connection goes on."""
    season, events = _season_with_backlog(season_factory, "stall-redis")
    url = urlsplit(django_settings.REDIS_URL)
    claims = keys_of(season).part_claim("EPOCH", 0).split("EPOCH")[0]  # any part's claim key
    with stall_proxy(target_port=url.port or 6379, pattern=claims.encode()) as proxy:
        _stalled_coordinator_outrun(season, events, proxy, REDIS_URL=_port_replaced(django_settings.REDIS_URL,
                                                                                      proxy.port))


@pytest.mark.postgres
def test_a_coordinator_stalled_inside_a_postgresql_query_loses_the_season_in_time(
        stalling: None, season_factory: Any) -> None:
    """The epoch's read of the change stream gets no answer: the coordinator holds the
    lease and waits on PostgreSQL, its keeper renews through Redis."""
    season, events = _season_with_backlog(season_factory, "stall-pg")
    port = int(connection.settings_dict.get("PORT") or 5432)
    with stall_proxy(target_port=port, pattern=b"leaderboard_scorechange") as proxy:
        _stalled_coordinator_outrun(season, events, proxy,
                                    DATABASE_URL=_port_replaced(child_database_url(), proxy.port))


def test_the_keeper_renews_while_the_work_progresses_and_stops_when_it_does_not() -> None:
    r = redis_get()
    keys = rankview.Keys(prefix=django_settings.REDIS_KEY_PREFIX, season="keeper-stall")
    r.set(keys.lease, 7, px=300)
    keeper = rankview.LeaseKeeper(r, keys, 7, ttl_ms=300, max_seconds=60, stall_seconds=0.5).start()
    try:
        for _ in range(15):  # 1.5 s of progress, five TTLs
            keeper.progress()
            time.sleep(0.1)
        assert r.get(keys.lease) == b"7" and not keeper.stalled
        time.sleep(0.5 + 0.3 + 0.3)  # no progress: past the stall, then one TTL
        assert keeper.stalled
        assert r.get(keys.lease) is None, "the keeper renewed a lease whose work made no progress"
    finally:
        keeper.stop()
