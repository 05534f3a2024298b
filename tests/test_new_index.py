"""A copy an epoch cannot bring up to date gets a new index beside the serving one
(docs/architecture.md, How versions are published): built under the lease, published
under names of its own, the replaced copies dropped after their grace period; and a
coordinator that dies on the way leaves nothing behind that the next epoch does not drop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from leaderboard.redis_client import redis_get
from leaderboard.views import epoch as views_epoch
from leaderboard.views import rankview
from seasons.models import Season
from tests.support import (
    NARROW,
    Events,
    assert_matches_ledger,
    board_read,
    current_manifest,
    epoch,
    keys_of,
    post_ok,
    publish,
    reader_of,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]

Post = Callable[..., Any]


def index_keys(season: Season, index: str) -> list[bytes]:
    """Every data key of an index (its slot groups' hash tags name it)."""
    return list(redis_get().scan_iter(match=f"*{{{season.slug}:{index}:*"))


@pytest.fixture
def broken(season_factory: Callable[..., Season], post_scores: Post) -> tuple[Season, Events]:
    """A season of two published versions whose idle copy is marked broken."""
    season = season_factory(slug="fresh-index", layout=NARROW)
    ev = Events()
    post_ok(post_scores, season, [ev.result(f"p{i:02d}", (i * 37) % 1000) for i in range(30)])
    publish(season)
    post_ok(post_scores, season, [ev.result("p01", 999)])
    publish(season)
    r = redis_get()
    keys = keys_of(season)
    idle = next(c for c in rankview.copies_get(r, keys) if c != current_manifest(season).copy)
    r.hset(keys.copy_meta(idle), "state", rankview.STATE_BROKEN)
    post_ok(post_scores, season, [ev.result("p02", 998), ev.result("new", 5)])
    return season, ev


def test_a_broken_copy_gets_a_new_index_and_the_replaced_copies_are_dropped(
        broken: tuple[Season, Events]) -> None:
    season, _ = broken
    before = current_manifest(season)
    assert publish(season) == before.version + 1
    now = current_manifest(season)
    assert now.copy.startswith("e") and now.index == now.copy and now.side == 0
    assert rankview.copies_get(redis_get(), keys_of(season)) == [now.copy, now.copy + "b"]
    assert not index_keys(season, before.index), "the replaced index's keys are dropped"
    assert not redis_get().exists(keys_of(season).copy_meta("0"), keys_of(season).copy_meta("1"))
    assert not redis_get().smembers(keys_of(season).retiring)
    assert_matches_ledger(season)
    with pytest.raises(rankview.VersionExpired):
        reader_of(season).rank("p01", before.version)


def test_a_coordinator_that_dies_before_publishing_a_new_index_leaves_it_to_the_next_epoch(
        broken: tuple[Season, Events], monkeypatch: pytest.MonkeyPatch) -> None:
    season, _ = broken
    before = current_manifest(season)
    _, board = board_read(reader_of(season), before.version)

    def dies(**_: Any) -> int:
        raise RuntimeError("killed after the build")

    monkeypatch.setattr(views_epoch, "copy_side_apply", dies)
    with pytest.raises(RuntimeError, match="killed after the build"):
        epoch(season)
    monkeypatch.undo()
    left = [name for name in rankview.copies_retiring(redis_get(), keys_of(season)) if name.startswith("e")]
    assert len(left) == 2 and index_keys(season, left[0]), "the unpublished index is recorded, its keys still there"
    # The version before still serves, from the copies it always had.
    assert board_read(reader_of(season), before.version) == (before.version, board)

    assert publish(season) == before.version + 1
    assert not index_keys(season, left[0]), "the next epoch drops the index the dead coordinator built"
    assert not redis_get().exists(*(keys_of(season).copy_meta(name) for name in left))
    assert current_manifest(season).copy not in left
    assert_matches_ledger(season)


def test_a_coordinator_that_dies_after_publishing_leaves_the_replaced_copies_to_the_next_epoch(
        broken: tuple[Season, Events], post_scores: Post, monkeypatch: pytest.MonkeyPatch) -> None:
    season, ev = broken
    before = current_manifest(season)
    monkeypatch.setattr(views_epoch, "_copies_retire", lambda **_: None)
    assert publish(season) == before.version + 1
    monkeypatch.undo()
    assert index_keys(season, before.index), "the replaced copies are still there"
    assert sorted(rankview.copies_retiring(redis_get(), keys_of(season))) == ["0", "1"]

    post_ok(post_scores, season, [ev.result("p03", 997)])
    assert publish(season) == before.version + 2
    assert not index_keys(season, before.index)
    assert not redis_get().exists(keys_of(season).copy_meta("0"), keys_of(season).copy_meta("1"))
    assert_matches_ledger(season)


def test_one_coordinator_building_two_new_indexes_gives_each_names_of_its_own(
        broken: tuple[Season, Events], post_scores: Post) -> None:
    """Several epochs run under one fencing token (a coordinator keeps the season while
    epochs come due): a second new index must not take the names of the first, which by
    then serves."""
    season, ev = broken
    r = redis_get()
    keys = keys_of(season)
    token = views_epoch.season_lease_acquire(season=season, r=r, ttl_ms=60_000)
    assert token is not None
    try:
        def run() -> None:
            result = views_epoch.season_epoch_run_locked(season=season, r=r, keys=keys, token=token)
            assert result.status == "published", result

        run()  # the broken idle copy: a new index
        first = current_manifest(season)
        post_ok(post_scores, season, [ev.result("p04", 996)])
        run()  # its other side
        serving = current_manifest(season)
        assert serving.index == first.index and serving.side == 1
        other = next(c for c in rankview.copies_get(r, keys) if c != serving.copy)
        r.hset(keys.copy_meta(other), "state", rankview.STATE_BROKEN)
        post_ok(post_scores, season, [ev.result("p05", 995)])
        run()  # another new index, under the same token
    finally:
        rankview.lease_release(r, keys, token)
    now = current_manifest(season)
    assert now.index not in (first.index,) and now.copy not in (first.copy, serving.copy)
    assert rankview.copies_get(r, keys) == [now.copy, now.copy + "b"]
    assert_matches_ledger(season)


def test_dropping_an_index_moves_both_copies_generations_before_any_key_goes(
        broken: tuple[Season, Events], monkeypatch: pytest.MonkeyPatch) -> None:
    """Both copies read the index: a reader of either must see its copy move before the
    data under it starts to go, or its seqlock passes over half-dropped buckets."""
    season, _ = broken
    r = redis_get()
    keys = keys_of(season)
    serving = current_manifest(season)
    metas = [meta for name in rankview.copies_get(r, keys) if (meta := rankview.copy_meta_load(r, keys, name))]
    assert len({meta.index for meta in metas}) == 1 and len(metas) == 2
    held_at_first_drop: list[bool] = []
    real_send = rankview.copies.groups_send

    def spying(*args: Any, **kwargs: Any) -> Any:
        if not held_at_first_drop:
            held_at_first_drop.append(rankview.copy_holds(r, keys, serving))
        return real_send(*args, **kwargs)

    monkeypatch.setattr(rankview.copies, "groups_send", spying)
    # The copy that does not serve is dropped first, as a caller may list it.
    rankview.copies_drop(r, keys, sorted(metas, key=lambda meta: meta.copy != serving.copy, reverse=True),
                         retire=True)
    assert held_at_first_drop == [False]
    assert not index_keys(season, serving.index)
