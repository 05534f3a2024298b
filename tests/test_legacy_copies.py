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

from leaderboard.core.tiebreak import index_key
from leaderboard.models import RebuildJob
from leaderboard.recovery.rebuild import rebuild_run, season_epoch_advance
from leaderboard.redis_client import redis_cluster_of
from leaderboard.views import epoch, rankview
from leaderboard.views.rankview.copies import hidden_keys_of
from leaderboard.views.rankview.keys import legacy_data_keys
from seasons.models import Season
from tests.support import Events, assert_matches_ledger, current_manifest, keys_of, post_ok, publish

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]

Post = Callable[..., Any]


def _make_legacy(r: redis.Redis, keys: rankview.Keys, copies: list[str]) -> dict[str, int]:
    """Leave the copies as an older release did: each with data keys of its own (copies did
    not share an index then) under their names before slot groups, holding what its side of
    today's index sees, and a meta without `groups` (nor `index` and `side`); the index's
    keys gone unless another copy still reads it. The keys each copy got."""
    metas = [meta for copy in copies if (meta := rankview.copy_meta_load(r, keys, copy)) is not None]
    assert len(metas) == len(copies)
    made: dict[str, int] = {}
    for meta in metas:
        layout, shards, where = meta.layout, meta.lookup_shards, {"groups": meta.groups, "side": meta.side}
        # What the copy's side sees: each board's buckets, then its lookup and region shards
        # (legacy_data_keys' order).
        buckets: list[dict[str, int]] = [
            {player: index_key(layout, meta.ties, value)[1] for player, value in rankview.bucket_values_scan(
                r, keys, meta.index, layout, meta.ties, b, board=board, **where)}
            for board in ("", *meta.boards) for b in range(layout.size)]
        fields: list[dict[bytes, str]] = []
        for regions in (False, True):
            by_shard: list[dict[bytes, str]] = [{} for _ in range(shards)]
            for player, value in rankview.copy_shards_scan(r, keys, meta.index, shards, regions=regions, **where):
                by_shard[rankview.lookup_shard(player.decode(), shards)][player] = value
            fields += by_shard
        old = legacy_data_keys(keys, meta.copy, layout.layout_id, layout.size, meta.boards, shards)
        for legacy, members in zip(old[:len(buckets)], buckets, strict=True):
            if members:
                r.zadd(legacy, members)
        for legacy, values in zip(old[len(buckets):], fields, strict=True):
            if values:
                r.hset(legacy, mapping=values)  # type: ignore[arg-type]
        made[meta.copy] = sum(1 for held in [*buckets, *fields] if held)
        r.hdel(keys.copy_meta(meta.copy), "groups", "index", "side")
    still_read = {meta.index for copy in rankview.copies_get(r, keys)
                  if (meta := rankview.copy_meta_load(r, keys, copy)) is not None and meta.groups}
    for meta in metas:
        if meta.index in still_read:
            continue
        layout, groups = meta.layout, meta.groups
        r.unlink(*(keys.bucket(meta.index, layout.layout_id, b, board, groups=groups)
                   for board in ("", *meta.boards) for b in range(layout.size)),
                 *hidden_keys_of(keys, meta.index, layout, meta.boards, groups=groups),
                 *(key_of(meta.index, k, groups=groups) for key_of in (keys.lookup, keys.region)
                   for k in range(meta.lookup_shards)),
                 *(keys.fence(meta.index, g) for g in range(groups)))
    return made


def _legacy_names(r: redis.Redis, keys: rankview.Keys) -> list[bytes]:
    # Data keys named before slot groups end in the hash tag's "}:z" or "}:h"; today's
    # end in their bucket or shard number, or the group fence's ":f".
    return [k for k in r.scan_iter(match=f"{keys.prefix}:*", count=1000) if k.endswith((b"}:z", b"}:h"))]


def test_copies_made_before_slot_groups_are_recovered_rebuilt_and_dropped(season: Season, post_scores: Post
                                                                          ) -> None:
    r, keys = epoch.redis_get(), keys_of(season)
    if redis_cluster_of(r) is not None:
        pytest.skip("a copy with the old key names spans slots: only a single Redis ever held one")
    ev = Events()
    post_ok(post_scores, season, [ev.result(f"p{i:03d}", 10 * i) for i in range(120)])
    publish(season)
    post_ok(post_scores, season, [ev.result(f"p{i:03d}", 5 * i + 1) for i in range(0, 120, 3)])
    publish(season)
    current = current_manifest(season)
    assert all(_make_legacy(r, keys, rankview.copies_get(r, keys)).values())
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
    # The recovery built one index with both copies as its sides and dropped the legacy
    # ones: an epoch with changes brings its second copy up to date.
    post_ok(post_scores, season, [ev.result(f"p{i:03d}", 3 * i + 7) for i in range(0, 120, 2)])
    publish(season)
    assert_matches_ledger(season)
    assert _legacy_names(r, keys) == []
    recovered = rankview.copies_get(r, keys)
    assert recovered == [job.copy, f"{job.copy}b"]

    # A legacy copy beside the serving one (the other side of its index, left by an older
    # release) reads as broken: the next epoch with changes builds a new index from the
    # scores, publishes it and drops both copies it replaced, the legacy one's old names too.
    current = current_manifest(season)
    idle = next(c for c in recovered if c != current.copy)
    assert _make_legacy(r, keys, [idle])[idle]
    assert _legacy_names(r, keys)
    meta = rankview.copy_meta_load(r, keys, idle)
    assert meta is not None and meta.state == rankview.STATE_BROKEN
    assert rankview.copy_holds(r, keys, current)  # the serving copy's index is untouched
    post_ok(post_scores, season, [ev.result(f"p{i:03d}", 4 * i + 9) for i in range(0, 120, 5)])
    publish(season)
    assert_matches_ledger(season)
    rebuilt = current_manifest(season)
    assert rebuilt.copy.startswith("e") and rankview.copies_get(r, keys) == [rebuilt.copy, f"{rebuilt.copy}b"]
    for copy in rankview.copies_get(r, keys):
        built = rankview.copy_meta_load(r, keys, copy)
        assert built is not None and (built.groups, built.index) == (rankview.SLOT_GROUPS, rebuilt.copy)
    assert all(rankview.copy_meta_load(r, keys, copy) is None for copy in recovered)
    assert _legacy_names(r, keys) == []
