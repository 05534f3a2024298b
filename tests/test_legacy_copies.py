"""Copies made before the rank views' data keys were spread over slot groups: their keys
have other names and their metas record no `groups`. Such a copy holds no version (a
current one counts as lost: a recovery rebuilds it from the ledger), reads as broken (the
epoch rebuilds it), and dropping it unlinks its old names, so nothing of it stays behind.

Single Redis only: the old names put one copy's keys in many slots, which no cluster
ever accepted in one transaction, so no cluster holds such a copy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis

from leaderboard.models import RebuildJob
from leaderboard.recovery.rebuild import rebuild_run, season_epoch_advance
from leaderboard.redis_client import redis_cluster_of
from leaderboard.views import materializer, rankview
from leaderboard.views.rankview.keys import legacy_data_keys
from seasons.models import Season
from tests.support import Events, assert_matches_ledger, current_manifest, keys_of, post_ok, publish

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]

Post = Callable[..., Any]


def _make_legacy(r: redis.Redis, keys: rankview.Keys, copy: str) -> int:
    """Move a copy's data keys to their names before slot groups and forget its groups, as
    an older release left it; the keys moved."""
    meta = rankview.copy_meta_load(r, keys, copy)
    assert meta is not None
    size, layout_id, groups = meta.layout.size, meta.layout.layout_id, meta.groups
    new = [keys.bucket(copy, layout_id, b, groups=groups) for b in range(size)]
    for board in meta.boards:
        new += [keys.bucket(copy, layout_id, b, board, groups=groups) for b in range(size)]
    new += [keys.lookup(copy, k, groups=groups) for k in range(meta.lookup_shards)]
    new += [keys.region(copy, k, groups=groups) for k in range(meta.lookup_shards)]
    old = legacy_data_keys(keys, copy, layout_id, size, meta.boards, meta.lookup_shards)
    moved = 0
    for name, legacy in zip(new, old, strict=True):
        if r.exists(name):
            r.rename(name, legacy)
            moved += 1
    r.hdel(keys.copy_meta(copy), "groups")
    r.unlink(*(keys.fence(copy, g) for g in range(groups)))
    return moved


def _legacy_names(r: redis.Redis, keys: rankview.Keys) -> list[bytes]:
    # Data keys named before slot groups end in the hash tag's "}:z" or "}:h"; today's
    # end in their bucket or shard number, or the group fence's ":f".
    return [k for k in r.scan_iter(match=f"{keys.prefix}:*", count=1000) if k.endswith((b"}:z", b"}:h"))]


def test_copies_made_before_slot_groups_are_recovered_rebuilt_and_dropped(season: Season, post_scores: Post
                                                                          ) -> None:
    r, keys = materializer.redis_get(), keys_of(season)
    if redis_cluster_of(r) is not None:
        pytest.skip("a copy with the old key names spans slots: only a single Redis ever held one")
    ev = Events()
    post_ok(post_scores, season, [ev.result(f"p{i:03d}", 10 * i) for i in range(120)])
    publish(season)
    post_ok(post_scores, season, [ev.result(f"p{i:03d}", 5 * i + 1) for i in range(0, 120, 3)])
    publish(season)
    current = current_manifest(season)
    assert all(_make_legacy(r, keys, copy) for copy in rankview.copies_get(r, keys))
    assert _legacy_names(r, keys)

    # The published version's copy is under other names now: it holds nothing.
    assert not rankview.copy_holds(r, keys, current)
    idle = next(c for c in rankview.copies_get(r, keys) if c != current.copy)
    meta = rankview.copy_meta_load(r, keys, idle)
    assert meta is not None and meta.state == rankview.STATE_BROKEN

    assert season_epoch_advance(season=season).status == "lost"
    job = rebuild_run(job_id=RebuildJob.objects.get(season=season, kind="recovery").pk)
    assert job.status == "published", (job.error, job.report)
    assert_matches_ledger(season)
    # Then an epoch with changes builds the second copy (its old one read as broken).
    post_ok(post_scores, season, [ev.result(f"p{i:03d}", 3 * i + 7) for i in range(0, 120, 2)])
    publish(season)
    assert_matches_ledger(season)
    for copy in rankview.copies_get(r, keys):
        built = rankview.copy_meta_load(r, keys, copy)
        assert built is not None and built.groups == rankview.SLOT_GROUPS
    assert _legacy_names(r, keys) == []
