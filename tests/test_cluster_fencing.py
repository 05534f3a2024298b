"""Fencing of the rank views' slot groups: a stale coordinator writes nothing into any group
of any master, a coordinator killed between masters leaves a copy the next epoch does not
trust, and a version is published only once every group took its writes.

Runs on a single Redis and, with TEST_REDIS_CLUSTER=1, on a 3-master cluster (then every
test covers every master: a copy's 64 groups spread over all of them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis

from leaderboard.core.slots import bucket_group
from leaderboard.views import epoch as views_epoch
from leaderboard.views import rankview
from leaderboard.views.rankview.wire import node_clients
from seasons.models import Season
from tests.support import (
    Events,
    assert_idle_copy_caught_up,
    assert_matches_ledger,
    board_read,
    builds_counted,
    current_manifest,
    epoch,
    keys_of,
    post_ok,
    publish,
    reader_of,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]

Post = Callable[..., Any]


def _snapshot(r: redis.Redis, prefix: str) -> dict[bytes, bytes | None]:
    """Every key of the prefix with its serialized value, read node by node."""
    out: dict[bytes, bytes | None] = {}
    clients = ([r.get_redis_connection(node) for node in r.get_primaries()]
               if isinstance(r, redis.RedisCluster) else [r])
    for client in clients:
        for key in client.scan_iter(match=f"{prefix}:*", count=1000):
            out[key] = client.dump(key)  # type: ignore[assignment]
    return out


def _season_published(season: Season, post_scores: Post) -> None:
    ev = Events()
    post_ok(post_scores, season, [ev.result(f"p{i:03d}", 10 * i) for i in range(120)])
    publish(season)
    post_ok(post_scores, season, [ev.result(f"p{i:03d}", 5 * i + 1) for i in range(0, 120, 3)])
    publish(season)


def test_a_stale_token_is_refused_by_every_group_on_every_master(season: Season, post_scores: Post) -> None:
    _season_published(season, post_scores)
    r, keys = views_epoch.redis_get(), keys_of(season)
    manifest = current_manifest(season)
    # A coordinator takes the season over: its token is stamped into every group.
    token = views_epoch.season_lease_acquire(season=season, r=r, ttl_ms=2000)
    assert token is not None
    rankview.lease_release(r, keys, token)
    # The copy's data is its index's (both copies' sides of it): fences, buckets, lookup.
    fences = [keys.fence(manifest.index, g) for g in range(manifest.groups)]
    if isinstance(r, redis.RedisCluster):
        assert len(node_clients(r, fences)) == len(r.get_primaries()) == 3
    before = _snapshot(r, keys.prefix)

    # The coordinator before it wakes up and writes a chunk into each group.
    for group, fence in enumerate(fences):
        bucket = next(b for b in range(manifest.layout.size)
                      if bucket_group(bucket=b, groups=manifest.groups) == group)
        call = rankview.fence.group_write_call(fence, token - 1, manifest.gen + 1, [
            ("ZADD", keys.bucket(manifest.index, manifest.layout.layout_id, bucket, groups=manifest.groups),
             [-1, "ghost"]),
            # Lookup shard `group` is in this group (shard k in group k % groups).
            ("HSET", keys.lookup(manifest.index, group, groups=manifest.groups), ["ghost", 1])])
        with pytest.raises(rankview.FenceLost):
            rankview.fence.groups_send(r, [(fence, call)])
    # And a drop of the whole copy.
    meta = rankview.copy_meta_load(r, keys, manifest.copy)
    assert meta is not None
    with pytest.raises(rankview.FenceLost):
        rankview.copy_drop(r, keys, meta, token=token - 1)

    assert _snapshot(r, keys.prefix) == before
    assert_matches_ledger(season)


def test_a_coordinator_killed_between_masters_leaves_a_copy_the_next_epoch_resumes(
        season: Season, post_scores: Post, monkeypatch: pytest.MonkeyPatch) -> None:
    _season_published(season, post_scores)
    r, keys = views_epoch.redis_get(), keys_of(season)
    reader = reader_of(season)
    served = board_read(reader)
    ev = Events()
    # Moves into buckets all over the range: their writes go to many slot groups.
    post_ok(post_scores, season, [ev.correction(f"p{i:03d}", 8_100 * i) for i in range(0, 120, 2)])
    real_send = rankview.apply.groups_send

    def killed(client: redis.Redis, calls: list[tuple[str, tuple[Any, ...]]]) -> list[Any]:
        assert len(calls) > 10
        # The bucket writes reached the first half of their groups (on a cluster, some
        # masters only), then the process died.
        real_send(client, calls[: len(calls) // 2])
        raise RuntimeError("killed between masters")

    monkeypatch.setattr(rankview.apply, "groups_send", killed)
    with pytest.raises(RuntimeError, match="killed between masters"):
        publish(season)
    monkeypatch.setattr(rankview.apply, "groups_send", real_send)

    # The half-written copy is the other side of the serving copy's index, still applying
    # at its watermark (no player's lookup moved: those are written last), while the
    # serving side still answers as before.
    serving = current_manifest(season)
    half = rankview.copy_meta_load(r, keys, "1" if serving.copy == "0" else "0")
    assert half is not None and half.state == rankview.STATE_APPLYING and half.index == serving.index
    assert board_read(reader) == served
    # Every one of those players moves again before the next epoch: it first finishes the
    # range it was cut short in (the writes that landed are the ones it plans again), then
    # applies the new moves. No new index.
    post_ok(post_scores, season, [ev.correction(f"p{i:03d}", (8_100 * i + 431_000) % 1_000_000)
                                  for i in range(0, 120, 2)])
    builds = builds_counted(monkeypatch)
    publish(season)
    resumed = current_manifest(season)
    assert builds["n"] == 0 and resumed.copy == half.copy and resumed.index == serving.index
    assert rankview.copies_get(r, keys) == ["0", "1"]
    assert_matches_ledger(season)
    # The other side, which served meanwhile, caught up to the same version holds the same
    # buckets (no hidden record left behind by the cut-short writes), and serves next.
    assert_idle_copy_caught_up(season)
    post_ok(post_scores, season, [ev.result("p001", 999)])
    publish(season)
    assert current_manifest(season).copy == serving.copy
    assert_matches_ledger(season)


def test_a_version_is_published_only_once_every_group_took_its_writes(season: Season, post_scores: Post) -> None:
    _season_published(season, post_scores)
    r, keys = views_epoch.redis_get(), keys_of(season)
    current = current_manifest(season)
    idle = "1" if current.copy == "0" else "0"
    ev = Events()
    post_ok(post_scores, season, [ev.result(f"p{i:03d}", 9 * i + 2) for i in range(120)])
    # One group of the copy the epoch writes holds a newer token (a coordinator that took
    # over stamped it, and no other yet): that group refuses, the epoch stops unpublished.
    meta = rankview.copy_meta_load(r, keys, idle)
    assert meta is not None
    r.hset(keys.fence(meta.index, meta.groups - 1), "token", 2**62)
    # The epoch's own stamp meets it first: the coordinator stays out and frees the lease.
    result = epoch(season)
    assert result.status == "skipped", result
    assert r.get(keys.lease) is None
    assert rankview.pointer_get(r, keys) == current.version
    assert current_manifest(season) == current
