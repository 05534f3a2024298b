"""Redis restarted from an old snapshot (or any restore of older keys): the fencing tokens
and the version floor come from the database, so no token is issued twice and no version
older than one already published keeps serving. Real database, real Redis (DUMP/RESTORE)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from leaderboard.recovery.rebuild import rebuild_run, season_rebuild_start
from leaderboard.redis_client import redis_get
from leaderboard.views import rankview
from leaderboard.views.epoch import season_lease_acquire
from seasons.models import Season
from tests.support import NARROW, TEST_ACTOR, Events, assert_matches_ledger, epoch, keys_of, post_ok, publish

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]
Post = Callable[..., Any]


def season_snapshot(r: Any, season: Season) -> dict[bytes, tuple[bytes, int]]:
    """Every Redis key of the season with its serialized value and remaining TTL, as an RDB snapshot holds it."""
    keys = keys_of(season)
    found: set[bytes] = set()
    for pattern in (f"{keys.prefix}:{{{keys.season}}}:*", f"{keys.prefix}:{{{keys.season}:*"):
        found.update(r.scan_iter(match=pattern, count=1000))
    return {k: (r.dump(k), max(int(r.pttl(k)), 0)) for k in sorted(found)}


def season_restore(r: Any, season: Season, snapshot: dict[bytes, tuple[bytes, int]]) -> None:
    """The season's keys exactly as in `snapshot`, as after a restart from it."""
    for key in season_snapshot(r, season):
        r.delete(key)
    for key, (value, ttl) in snapshot.items():
        r.restore(key, ttl, value)


def test_a_redis_restored_from_an_old_snapshot_reissues_no_token_and_serves_no_older_version(
    season_factory: Callable[..., Season], post_scores: Post,
) -> None:
    season = season_factory(slug="restored", layout=NARROW)
    r, keys = redis_get(), keys_of(season)
    ev = Events(tag="rs")
    post_ok(post_scores, season, [ev.result(f"p{i:02d}", (i * 37) % 1000) for i in range(30)])
    publish(season)
    post_ok(post_scores, season, [ev.result("p01", 999)])
    assert publish(season) == 2
    snapshot = season_snapshot(r, season)

    # After the snapshot: coordinator A takes the lease and stalls past it (its token is
    # still in its hands); others publish two more versions.
    token_a = season_lease_acquire(season=season, r=r, ttl_ms=30_000)
    assert token_a is not None
    r.delete(keys.lease)
    post_ok(post_scores, season, [ev.result("p02", 998)])
    assert publish(season) == 3
    post_ok(post_scores, season, [ev.result("p03", 997), ev.correction("p04", 1)])
    assert publish(season) == 4

    season_restore(r, season, snapshot)  # Redis restarts from the old snapshot
    assert rankview.pointer_get(r, keys) == 2
    rankview.manifest_cache_clear()  # a process started after the restart

    # The next coordinator's token is one A never had: A's writes are all refused.
    token_b = season_lease_acquire(season=season, r=r, ttl_ms=30_000)
    assert token_b is not None and token_b > token_a
    idle = rankview.copy_meta_load(r, keys, next(c for c in rankview.copies_get(r, keys)
                                                 if c != rankview.manifest_get(r, keys, 2).copy))  # type: ignore[union-attr]
    assert idle is not None
    with pytest.raises(rankview.FenceLost):
        rankview.copy_begin_mutation(r, keys, token_a, idle)
    with pytest.raises(rankview.FenceLost):
        rankview.pointer_publish(r, keys, token=token_a, expected=2, version=5)
    rankview.lease_release(r, keys, token_b)
    with pytest.raises(rankview.FenceLost):
        rankview.pointer_publish(r, keys, token=token_a, expected=2, version=5)

    # With nothing new written, the next epoch still publishes, above every version the
    # database recorded, and the board is exactly the ledger's.
    result = epoch(season)
    assert (result.status, result.version) == ("published", 5), result
    assert assert_matches_ledger(season) == 5
    post_ok(post_scores, season, [ev.result("p05", 996)])
    assert publish(season) == 6
    assert_matches_ledger(season)


def test_a_quiet_season_restored_to_an_older_pointer_publishes_above_it(
    season_factory: Callable[..., Season], post_scores: Post,
) -> None:
    season = season_factory(slug="restored-quiet", layout=NARROW)
    r, keys = redis_get(), keys_of(season)
    ev = Events(tag="rq")
    post_ok(post_scores, season, [ev.result(f"q{i:02d}", (i * 41) % 1000) for i in range(30)])
    publish(season)
    post_ok(post_scores, season, [ev.result("q01", 999)])
    assert publish(season) == 2
    snapshot = season_snapshot(r, season)
    # A version with no new change after the snapshot (a rebuild publishing its shadow).
    job = rebuild_run(job_id=season_rebuild_start(season=season, actor=TEST_ACTOR, enqueue=False).pk)
    assert job.published_version == 3

    season_restore(r, season, snapshot)
    rankview.manifest_cache_clear()
    assert rankview.pointer_get(r, keys) == 2
    # Nothing was written since, yet version 2 must not go on serving after 3 was.
    result = epoch(season)
    assert (result.status, result.version) == ("published", 4), result
    assert assert_matches_ledger(season) == 4
