"""The epoch (views.epoch; docs/rules.md, Publication) on a real database and a real Redis: versions
built from the change stream, bucket moves, the fenced lease, crash recovery, rebuilds
and the invariant checker."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from leaderboard.core.buckets import BucketLayout
from leaderboard.core.epoch import RangeValues
from leaderboard.core.manifest import Manifest
from leaderboard.core.partitions import Watermark
from leaderboard.core.shared_index import Seen, entry_name, lookup_decode, lookup_encode
from leaderboard.models import Manifest as ManifestRow
from leaderboard.models import RebuildJob
from leaderboard.recovery.rebuild import rebuild_run, season_epoch_advance
from leaderboard.views import epoch as views_epoch
from leaderboard.views import rankview
from leaderboard.views.invariants import version_check
from leaderboard.views.rankview.shared import seen_key_call
from leaderboard.views.season_index import EpochError
from seasons.models import Season
from tests.support import (
    NARROW,
    Events,
    assert_board_equals,
    assert_matches_ledger,
    board_read,
    builds_counted,
    current_manifest,
    db_scores,
    db_standings,
    epoch,
    full_check,
    keys_of,
    post_ok,
    publish,
    reader_of,
)
from tests.support.failure import recovery_jobs

# Epochs read the change stream below the oldest running transaction (PostgreSQL): the
# test must not hold one open, so every test here commits for real.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]

Post = Callable[..., Any]


# --- publication ---------------------------------------------------------------------------------


def test_first_epoch_of_an_empty_season_publishes_an_empty_version(season: Season) -> None:
    assert rankview.pointer_get(views_epoch.redis_get(), keys_of(season)) is None
    result = epoch(season)
    assert (result.status, result.version, result.changed_players) == ("published", 1, 0)
    manifest, top = reader_of(season).top(100)
    assert (manifest.version, manifest.total, top) == (1, 0, [])
    full_check(season)


def test_version_1_is_built_from_existing_scores(season: Season, post_scores: Post) -> None:
    ev = Events()
    post_ok(post_scores, season, [ev.result(f"p{i}", 1000 * i) for i in range(1, 8)] + [ev.result("tie", 3000)])
    result = epoch(season)
    assert (result.status, result.version) == ("published", 1)
    # Everyone is new to the board in its first version.
    assert result.changed_players == 8
    assert assert_matches_ledger(season, absent=["nobody"]) == 1
    season.refresh_from_db()
    assert season.published_version == 1
    row = ManifestRow.objects.get(season=season, version=1)
    assert (row.total_players, row.changed_players) == (8, 8)


def test_later_versions_apply_only_the_changes(season: Season, post_scores: Post,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    applied: list[set[str]] = []
    real_apply = rankview.copy_range_apply

    def spy(r: Any, keys: Any, token: int, meta: Any, values: RangeValues, **kwargs: Any) -> Any:
        applied.append(set(values.new))
        return real_apply(r, keys, token, meta, values, **kwargs)

    monkeypatch.setattr(rankview, "copy_range_apply", spy)
    ev = Events()
    post_ok(post_scores, season, [ev.result(f"p{i:03d}", 500 * i) for i in range(200)])
    assert publish(season) == 1

    rounds = [
        [ev.result("p001", 99_000), ev.result("new1", 7)],  # a raise and a new player
        [ev.correction("p150", 10)],  # a revocation
        [ev.result("p002", 400), ev.result("p003", 1), ev.result("p004", 50_000)],  # 2 unchanged, 1 raise
        [ev.result("p005", 60_000), ev.result("p005", 61_000), ev.result("p006", 70_000)],  # p005 twice
    ]
    expected_changed = [2, 1, 1, 2]
    for number, (events, changed) in enumerate(zip(rounds, expected_changed, strict=True), start=2):
        post_ok(post_scores, season, events)
        result = epoch(season)
        assert (result.status, result.version) == ("published", number)
        assert result.changed_players == changed, f"v{number}"
        row = ManifestRow.objects.get(season=season, version=number)
        assert row.changed_players == changed
        assert row.total_players == 201
        assert_matches_ledger(season, exhaustive=number == 5)

    # The work of an epoch follows the changes, not the 201 players: each copy replays the
    # changes of the (at most two) versions since it was last current.
    assert applied, "no epoch applied changes to a copy"
    assert max(len(players) for players in applied) <= 4
    assert {"p005", "p006"} <= applied[-1]

    before = ManifestRow.objects.filter(season=season).count()
    idle = epoch(season)
    assert (idle.status, idle.version, idle.changed_players) == ("idle", 5, 0)
    assert rankview.pointer_get(views_epoch.redis_get(), keys_of(season)) == 5
    assert ManifestRow.objects.filter(season=season).count() == before
    season.refresh_from_db()
    assert season.published_version == 5


@pytest.mark.usefixtures("without_catch_up")
def test_idle_epochs_keep_every_copy_complete(season: Season, post_scores: Post) -> None:
    """Idle epochs between versions must not advance the older copy past changes it
    never applied: each later version still holds every committed change."""
    ev = Events()
    post_ok(post_scores, season, [ev.result(f"p{i}", 10 * i) for i in range(10)])
    assert publish(season) == 1
    version = 1
    for step in range(6):
        post_ok(post_scores, season, [ev.result(f"p{step}", 5000 + step), ev.result(f"n{step}", step)])
        version += 1
        assert publish(season) == version
        assert_matches_ledger(season)
        for _ in range(2):
            idle = epoch(season)
            assert (idle.status, idle.version) == ("idle", version)
        # The previous version is still retained: idle epochs did not touch its copy.
        previous = version - 1
        assert reader_of(season).rank("p0", previous).manifest.version == previous
    assert db_scores(season)["p5"] == 5005


@pytest.mark.usefixtures("without_catch_up")
def test_idle_epoch_returns_without_waiting_for_the_grace_period(season: Season, post_scores: Post,
                                                                   settings: Any) -> None:
    settings.COPY_GRACE_SECONDS = 1.0
    ev = Events()
    post_ok(post_scores, season, [ev.result("a", 1)])
    publish(season)
    post_ok(post_scores, season, [ev.result("a", 2)])
    publish(season)  # the second copy is built, nothing to wait for
    released = time.monotonic()
    assert season_epoch_advance(season=season).status == "idle"
    assert time.monotonic() - released < 0.6
    # With a change, the copy that stopped being current is touched only after the grace.
    r = views_epoch.redis_get()
    older = rankview.copy_meta_load(r, keys_of(season), "0")
    assert older is not None and older.version == 1 and older.released_at > 0
    post_ok(post_scores, season, [ev.result("a", 3)])
    assert publish(season) == 3
    assert current_manifest(season).copy == "0"
    assert time.time() - older.released_at >= 0.99
    assert_matches_ledger(season)


@pytest.mark.parametrize("layout", [BucketLayout.uniform(), NARROW], ids=["default", "narrow"])
def test_moves_across_buckets_in_both_directions(season_factory: Callable[..., Season], post_scores: Post,
                                                 layout: BucketLayout) -> None:
    season = season_factory(slug="moves", layout=layout)
    r = views_epoch.redis_get()
    keys = keys_of(season)
    ev = Events()
    low, high = (35_000, 55_000) if layout.size == 101 else (350, 550)
    post_ok(post_scores, season, [ev.result("mover", low), ev.result("anchor", low + 1), ev.result("top", 2 * high)])
    publish(season)
    post_ok(post_scores, season, [ev.result("warm", 1)])
    publish(season)  # both copies exist from here on: later versions are applied changes

    def where(player_id: str) -> list[tuple[int, int]]:
        """Every (bucket, score) of the player's entries that the current version's side
        sees, under either of their two names, in every bucket of its index."""
        manifest = current_manifest(season)
        layout_id = manifest.layout.layout_id
        places = [(bucket, name) for bucket in range(manifest.layout.size)
                  for name in (player_id, entry_name(player_id, True))]
        replies = rankview.round_trip(r, [seen_key_call(
            bucket=keys.bucket(manifest.index, layout_id, bucket, groups=manifest.groups),
            hidden=keys.hidden(manifest.index, manifest.side, layout_id, bucket, groups=manifest.groups),
            name=name) for bucket, name in places])
        return [(bucket, -int(float(key))) for (bucket, _), key in zip(places, replies, strict=True)
                if key is not None]

    steps = [
        [ev.result("mover", high)],  # bucket 3 -> 5
        [ev.correction("mover", low + 500)],  # correction back down, 5 -> 3
        [ev.result("anchor", high + 1)],
        [ev.correction("anchor", low), ev.result("mover", high)],  # both directions in one version
    ]
    for events in steps:
        # Twice: the next epoch publishes the other copy (the other side of the index),
        # which the catch-up brought through the same moves.
        for warm in (False, True):
            post_ok(post_scores, season, [ev.result("warm", len(ev.sent))] if warm else events)
            publish(season)
            for player_id in ("mover", "anchor"):
                score = db_scores(season)[player_id]
                assert where(player_id) == [(layout.bucket_of(score), score)], (player_id, warm)
            assert_matches_ledger(season)


def test_manifest_row_records_each_published_version(season: Season, post_scores: Post) -> None:
    ev = Events()
    post_ok(post_scores, season, [ev.result("a", 15_000), ev.result("b", 25_000), ev.result("c", 25_000)])
    assert publish(season) == 1
    post_ok(post_scores, season, [ev.result("d", 5)])
    assert publish(season) == 2
    rows = list(ManifestRow.objects.filter(season=season).order_by("version"))
    assert [row.version for row in rows] == [1, 2]
    season.refresh_from_db()
    assert season.published_version == 2
    manifest = current_manifest(season)
    row = rows[-1]
    assert row.total_players == 4 == manifest.total
    assert row.copy == manifest.copy
    assert row.watermark == manifest.watermark
    assert row.layout == manifest.layout.as_dict()
    assert row.buckets == manifest.to_dict()["buckets"]
    assert sum(b["count"] for b in row.buckets) == 4
    assert row.buckets[2]["count"] == 2 and row.buckets[2]["low"] == 20_000
    assert row.as_of.isoformat(timespec="milliseconds") == manifest.as_of
    assert row.published_at >= row.as_of
    assert row.epoch_ms >= 0


@pytest.mark.usefixtures("without_catch_up")
def test_pending_version_is_the_first_version_that_includes_the_change(season: Season, post_scores: Post) -> None:
    ev = Events()
    first = post_ok(post_scores, season, [ev.result("a", 100), ev.result("b", 200)])
    assert [r["pending_version"] for r in first] == [1, 1]
    assert publish(season) == 1
    rounds = [
        [ev.result("a", 900)],
        [ev.correction("b", 5), ev.result("c", 50)],
        [ev.result("a", 901), ev.result("a", 902)],
    ]
    for events in rounds:
        response = post_scores(season.slug, {"events": events})
        body = response.json()
        published = body["leaderboard_version"]
        pending = {r["pending_version"] for r in body["results"]}
        assert pending == {published + 1}
        # The next epoch publishes exactly that version, and it holds the new scores.
        assert publish(season) == published + 1
        reader = reader_of(season)
        for result in body["results"]:
            view = reader.rank(result["player_id"], published + 1)
            assert view.entry is not None and view.entry.score == db_scores(season)[result["player_id"]]
            # ...which the version before it did not have.
            old = reader.rank(result["player_id"], published).entry
            assert old is None or old.score != view.entry.score
    unchanged = post_ok(post_scores, season, [ev.result("a", 1)])
    assert unchanged[0]["status"] == "unchanged" and unchanged[0]["pending_version"] is None


# --- the fenced lease ------------------------------------------------------------------------------------


def test_a_second_coordinator_is_refused_while_the_lease_is_held(season: Season, post_scores: Post) -> None:
    r = views_epoch.redis_get()
    keys = keys_of(season)
    post_ok(post_scores, season, [Events().result("a", 1)])
    holder = views_epoch.season_lease_acquire(season=season, r=r, ttl_ms=30_000)
    assert holder is not None
    assert views_epoch.season_lease_acquire(season=season, r=r, ttl_ms=30_000) is None
    result = epoch(season)
    assert result.status == "skipped"
    assert rankview.pointer_get(r, keys) is None
    # The refused coordinator did not release someone else's lease.
    assert int(r.get(keys.lease) or 0) == holder
    rankview.lease_release(r, keys, holder)
    assert publish(season) == 1
    # Released after the epoch: the next coordinator gets a larger token.
    later = views_epoch.season_lease_acquire(season=season, r=r, ttl_ms=30_000)
    assert later is not None and later > holder


def test_an_expired_lease_lets_the_next_coordinator_in(season: Season, post_scores: Post) -> None:
    r = views_epoch.redis_get()
    keys = keys_of(season)
    post_ok(post_scores, season, [Events().result("a", 1)])
    holder = views_epoch.season_lease_acquire(season=season, r=r, ttl_ms=30_000)
    assert holder is not None
    assert 0 < r.pttl(keys.lease) <= 30_000  # the lease expires on its own
    assert epoch(season).status == "skipped"
    r.pexpire(keys.lease, 1)  # the holder died and its lease ran out
    time.sleep(0.01)
    assert publish(season) == 1
    # The dead holder's token is fenced out.
    with pytest.raises(rankview.FenceLost):
        rankview.pointer_publish(r, keys, token=holder, expected=1, version=2)


def _version_one(season: Season, post_scores: Post) -> tuple[Any, rankview.Keys, Manifest, Events]:
    """Version 1 of a and b published: (the client, the season's keys, its manifest, the events)."""
    ev = Events()
    post_ok(post_scores, season, [ev.result("a", 10), ev.result("b", 20)])
    assert publish(season) == 1
    return views_epoch.redis_get(), keys_of(season), current_manifest(season), ev


def test_a_stale_token_can_neither_apply_nor_publish(season: Season, post_scores: Post) -> None:
    r, keys, current, ev = _version_one(season, post_scores)

    stale = views_epoch.season_lease_acquire(season=season, r=r, ttl_ms=30_000)
    assert stale is not None
    r.delete(keys.lease)  # its lease expired...
    fresh = views_epoch.season_lease_acquire(season=season, r=r, ttl_ms=30_000)  # ...and another coordinator took over
    assert fresh is not None and fresh > stale

    # The other side of the serving index: the new holder stamped its groups when it took the season.
    target = rankview.copy_meta_load(r, keys, "1")
    assert target is not None and target.index == current.index
    with pytest.raises(rankview.FenceLost):
        rankview.copy_begin_mutation(r, keys, stale, target)
    with pytest.raises(rankview.FenceLost):
        rankview.copy_range_apply(r, keys, stale, target, RangeValues(new={"x": 5}, old={"x": None}, taken={"x": [5]}))
    assert r.hget(keys.lookup_of(target.index, "x", target.lookup_shards, groups=target.groups), "x") is None
    assert r.zrange(keys.bucket(target.index, current.layout.layout_id, 0, groups=target.groups), 0, -1) == [b"b", b"a"]
    with pytest.raises(rankview.FenceLost):
        rankview.copy_finish(r, keys, stale, target, watermark=Watermark.single(0, 99), version=2)
    with pytest.raises(rankview.FenceLost):
        rankview.pointer_publish(r, keys, token=stale, expected=1, version=2)
    assert rankview.pointer_get(r, keys) == 1
    # Every control-slot write of a copy goes through the lease too: a new copy's meta,
    # marking one broken, the release that starts a grace period.
    before = r.hgetall(keys.copy_meta(current.copy))
    with pytest.raises(rankview.FenceLost):
        rankview.copy_meta_init(r, keys, current.copy, current.layout, groups=current.groups, token=stale)
    with pytest.raises(rankview.FenceLost):
        rankview.copy_broken_mark(r, keys, current.copy, token=stale)
    with pytest.raises(rankview.FenceLost):
        rankview.copy_release(r, keys, current.copy, at=time.time(), token=stale)
    assert r.hgetall(keys.copy_meta(current.copy)) == before
    # The manifest of a version is written only by the lease holder too.
    forged = Manifest.from_dict({**current.to_dict(), "version": 2, "gen": 999})
    with pytest.raises(rankview.FenceLost):
        rankview.manifest_store(r, keys, forged, token=stale)
    assert r.get(keys.manifest(2)) is None

    # The holder is refused too when the current version moved under it.
    with pytest.raises(rankview.FenceLost):
        rankview.pointer_publish(r, keys, token=fresh, expected=0, version=2)
    assert rankview.pointer_get(r, keys) == 1
    # Version 1 still answers.
    assert reader_of(season).rank("b").entry is not None


def test_a_failed_stamp_gives_the_lease_back(season: Season, post_scores: Post) -> None:
    r = views_epoch.redis_get()
    keys = keys_of(season)
    post_ok(post_scores, season, [Events().result("a", 1)])
    assert publish(season) == 1
    fence = keys.fence(current_manifest(season).copy, 0)
    held: dict[Any, Any] = dict(r.hgetall(fence))
    r.delete(fence)
    r.set(fence, "not a hash")  # the stamp's script fails in this group (WRONGTYPE)
    with pytest.raises(redis.ResponseError):
        views_epoch.season_lease_acquire(season=season, r=r, ttl_ms=30_000)
    assert r.get(keys.lease) is None  # not held for a TTL by a coordinator that gave up
    r.delete(fence)
    r.hset(fence, mapping={**held, b"token": 1 << 62})  # a newer coordinator stamped the group first
    assert views_epoch.season_lease_acquire(season=season, r=r, ttl_ms=30_000) is None
    assert r.get(keys.lease) is None
    r.delete(fence)
    r.hset(fence, mapping=held)
    assert views_epoch.season_lease_acquire(season=season, r=r, ttl_ms=30_000) is not None


def test_a_copy_no_replica_acknowledged_is_never_published(season: Season, post_scores: Post,
                                                            settings: Any) -> None:
    r, keys, _, ev = _version_one(season, post_scores)
    post_ok(post_scores, season, [ev.result("a", 30)])
    # The test Redis has no replica: WAIT 1 never gets its acknowledgement.
    settings.VIEW_REPLICAS_WAIT, settings.VIEW_REPLICAS_WAIT_MS = 1, 50
    with pytest.raises(rankview.ReplicasBehind):
        epoch(season)
    assert rankview.pointer_get(r, keys) == 1
    target = rankview.copy_meta_load(r, keys, "1")
    assert target is not None and target.state == rankview.STATE_BROKEN  # rebuilt by the next epoch
    assert r.get(keys.lease) is None
    assert reader_of(season).rank("a").entry.score == 10  # type: ignore[union-attr]
    settings.VIEW_REPLICAS_WAIT = 0
    assert publish(season) == 2
    assert assert_matches_ledger(season) == 2


def test_a_current_copy_whose_slot_group_lost_writes_is_lost_not_idle(season: Season, post_scores: Post) -> None:
    r, keys, current, ev = _version_one(season, post_scores)
    # What a failover leaves when the promoted replica of a group's master never got the
    # version's last writes: the group names an older generation than the version.
    r.hset(keys.fence(current.copy, current.groups - 1), "gen", current.gen - 1)
    result = epoch(season)  # no new change: still not idle
    assert result.status == "lost" and result.rebuild_wanted is not None, result
    # A change meanwhile: the recovery does not take the lost version for a live one to
    # bring up to date before it compares.
    post_ok(post_scores, season, [ev.result("a", 40)])
    job = recovery_jobs(season)[0]
    assert rebuild_run(job_id=job.pk).status == "published"
    assert assert_matches_ledger(season) == current_manifest(season).version > 1


@pytest.mark.parametrize("stolen_at", ["before_apply", "before_manifest", "before_publish"])
def test_a_coordinator_that_loses_its_lease_mid_epoch_publishes_nothing(
    season: Season, post_scores: Post, monkeypatch: pytest.MonkeyPatch, stolen_at: str
) -> None:
    r = views_epoch.redis_get()
    keys = keys_of(season)
    ev = Events()
    post_ok(post_scores, season, [ev.result(f"p{i}", i * 7_000) for i in range(20)])
    publish(season)
    post_ok(post_scores, season, [ev.result("p1", 99_999)])
    publish(season)
    post_ok(post_scores, season, [ev.result("p2", 150_000), ev.correction("p19", 3)])
    served = board_read(reader_of(season))

    thief = {"token": None}

    def steal() -> None:
        r.delete(keys.lease)
        thief["token"] = views_epoch.season_lease_acquire(season=season, r=r, ttl_ms=30_000)  # type: ignore[assignment]

    def stealing(name: str) -> None:
        real = getattr(rankview, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            steal()
            return real(*args, **kwargs)

        monkeypatch.setattr(rankview, name, wrapper)

    stealing({"before_apply": "copy_range_apply", "before_manifest": "manifest_store",
              "before_publish": "pointer_publish"}[stolen_at])
    with pytest.raises(rankview.FenceLost):
        epoch(season)
    monkeypatch.undo()
    assert thief["token"] is not None
    # Nothing was published, the thief's lease is intact, and version 2 answers as before.
    assert rankview.pointer_get(r, keys) == 2
    if stolen_at != "before_publish":
        assert r.get(keys.manifest(3)) is None
    assert int(r.get(keys.lease)) == thief["token"]
    assert board_read(reader_of(season)) == served
    assert epoch(season).status == "skipped"

    rankview.lease_release(r, keys, thief["token"])
    assert publish(season) == 3
    assert_matches_ledger(season)


# --- crashes, rebuilds ------------------------------------------------------------------------------------


def test_a_crash_midway_through_apply_keeps_the_previous_version(season_factory: Callable[..., Season],
                                                                 post_scores: Post,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    season = season_factory(slug="crashy", layout=NARROW)
    r = views_epoch.redis_get()
    keys = keys_of(season)
    ev = Events()
    post_ok(post_scores, season, [ev.result(f"p{i:02d}", (i * 37) % 1000) for i in range(40)])
    publish(season)
    post_ok(post_scores, season, [ev.result("p01", 999)])
    publish(season)
    post_ok(post_scores, season, [ev.result("p02", 998), ev.correction("p03", 0)])
    assert publish(season) == 3
    reader = reader_of(season)
    served = board_read(reader)
    ranks = {p: reader.rank(p).entry for p in db_scores(season)}

    # Twelve changes, moves in both directions and new players, sent a few writes a script.
    changes = [ev.result(f"p{i:02d}", 1000 - i) for i in range(10, 16)]
    changes += [ev.correction(f"p{i:02d}", i) for i in range(30, 34)]
    changes += [ev.result("new1", 500), ev.result("new2", 0)]
    post_ok(post_scores, season, changes)
    monkeypatch.setattr(rankview.apply, "CHUNK_PLAYERS", 3)
    monkeypatch.setattr(rankview.apply, "PIECES_PER_SEND", 2)
    real_send = rankview.apply.groups_send
    calls = {"n": 0}

    def crashing(*args: Any) -> list[Any]:
        calls["n"] += 1
        if calls["n"] == 3:  # two round trips of bucket writes landed, then the process dies
            raise RuntimeError("simulated crash")
        return real_send(*args)

    monkeypatch.setattr(rankview.apply, "groups_send", crashing)
    with pytest.raises(RuntimeError, match="simulated crash"):
        epoch(season)
    monkeypatch.setattr(rankview.apply, "groups_send", real_send)

    # The lease was released, version 3 still serves identical answers and is intact; the
    # half-applied copy is still "applying" at its watermark (version 2, gone now): its
    # players' lookups have not moved, so the next epoch resumes it, with no new index.
    assert r.get(keys.lease) is None
    assert rankview.pointer_get(r, keys) == 3
    assert board_read(reader) == served
    assert {p: reader.rank(p).entry for p in ranks} == ranks
    full_check(season, 3)
    half = rankview.copy_meta_load(r, keys, "1" if current_manifest(season).copy == "0" else "0")
    assert half is not None and half.state == rankview.STATE_APPLYING and half.version == 2
    with pytest.raises(rankview.VersionExpired):
        reader.rank("p01", 2)

    builds = builds_counted(monkeypatch)
    assert publish(season) == 4
    assert builds["n"] == 0
    assert_matches_ledger(season)
    post_ok(post_scores, season, [ev.result("p20", 777)])
    assert publish(season) == 5
    assert_matches_ledger(season)


def test_a_crash_between_pointer_swap_and_db_record_is_recorded_later(season: Season, post_scores: Post,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    ev = Events()
    post_ok(post_scores, season, [ev.result("a", 1)])
    publish(season)
    post_ok(post_scores, season, [ev.result("a", 2)])

    def die(**kwargs: Any) -> None:
        raise RuntimeError("crash after publication")

    monkeypatch.setattr(views_epoch, "manifest_record", die)
    with pytest.raises(RuntimeError):
        epoch(season)
    monkeypatch.undo()
    assert rankview.pointer_get(views_epoch.redis_get(), keys_of(season)) == 2
    season.refresh_from_db()
    assert season.published_version == 1
    assert not ManifestRow.objects.filter(season=season, version=2).exists()

    # The next epoch (even an idle one) records the published version first.
    assert epoch(season).status == "idle"
    season.refresh_from_db()
    assert season.published_version == 2
    assert ManifestRow.objects.get(season=season, version=2).total_players == 1
    post_ok(post_scores, season, [ev.result("b", 3)])
    assert publish(season) == 3
    assert_matches_ledger(season)


def test_a_rebuilt_copy_does_not_revive_an_old_version(season: Season, post_scores: Post) -> None:
    r = views_epoch.redis_get()
    keys = keys_of(season)
    ev = Events()
    post_ok(post_scores, season, [ev.result(f"p{i}", 100 * i) for i in range(10)])
    assert publish(season) == 1
    reader = reader_of(season)
    assert reader.rank("p3", 1).entry is not None  # version 1 is read (and its manifest cached)
    for step in range(3):
        post_ok(post_scores, season, [ev.result(f"p{step}", 5000 + step)])
        publish(season)
    with pytest.raises(rankview.VersionExpired):
        reader.rank("p3", 1)

    # A copy found broken is not rebuilt in place: a new index is built from the current
    # scores beside the serving one, and the copies it replaces ("0" held versions 1 and
    # 3, "1" versions 2 and 4) are dropped.
    r.hset(keys.copy_meta("0"), "state", "broken")
    post_ok(post_scores, season, [ev.result("p9", 9999)])
    assert publish(season) == 5
    manifest = current_manifest(season)
    assert manifest.copy not in ("0", "1") and manifest.index == manifest.copy
    assert rankview.copies_get(r, keys) == [manifest.copy, f"{manifest.copy}b"]
    assert [rankview.copy_meta_load(r, keys, name) for name in ("0", "1")] == [None, None]
    assert_matches_ledger(season)
    for old in (1, 2, 3, 4):
        with pytest.raises(rankview.VersionExpired):
            reader.rank("p3", old)
        with pytest.raises(rankview.VersionExpired):
            reader.window(1, 10, old)


@pytest.mark.usefixtures("without_catch_up")
def test_a_lost_view_is_rebuilt_with_new_version_numbers(season: Season, post_scores: Post) -> None:
    r = views_epoch.redis_get()
    ev = Events()
    post_ok(post_scores, season, [ev.result(f"p{i}", 10 * i) for i in range(30)])
    for step in range(3):
        publish(season)
        post_ok(post_scores, season, [ev.result(f"p{step}", 1000 + step)])
    reader = reader_of(season)
    assert reader.rank("p5", 3).manifest.version == 3  # cached in this process
    assert reader.rank("p5", 2).manifest.version == 2

    r.flushdb()  # Redis lost everything; the database did not
    with pytest.raises(rankview.Unavailable):
        reader.rank("p5")
    with pytest.raises(rankview.Unavailable):
        reader.top(10)
    # The epoch does not publish a board from nothing: it starts one recovery build.
    for _ in range(2):
        assert epoch(season).status == "lost"
    jobs = list(RebuildJob.objects.filter(season=season))
    assert [(job.kind, job.status) for job in jobs] == [("recovery", "queued")]
    with pytest.raises(rankview.Unavailable):
        reader.rank("p5")
    assert rebuild_run(job_id=jobs[0].pk).status == "published"
    # Version numbers go on from the database's record, never reusing one.
    assert current_manifest(season).version == 4
    assert_matches_ledger(season)
    for step in range(3):
        post_ok(post_scores, season, [ev.result(f"p{step + 10}", 2000 + step)])
        assert publish(season) == 5 + step
        assert_matches_ledger(season)
        # Manifests cached before the loss never answer from the rebuilt copies.
        for old in (2, 3):
            with pytest.raises(rankview.VersionExpired):
                reader.window(1, 100, old)


def test_a_copy_that_fails_verification_is_not_published(season: Season, post_scores: Post) -> None:
    r = views_epoch.redis_get()
    keys = keys_of(season)
    ev = Events()
    post_ok(post_scores, season, [ev.result(f"p{i}", 100 * i) for i in range(10)])
    publish(season)
    post_ok(post_scores, season, [ev.result("p1", 5000)])
    publish(season)
    stale_copy = "1" if current_manifest(season).copy == "0" else "0"
    layout = current_manifest(season).layout
    # A stray member in the copy the next epoch brings up to date.
    r.zadd(keys.bucket(stale_copy, layout.layout_id, 0, groups=current_manifest(season).groups), {"ghost": -1})
    post_ok(post_scores, season, [ev.result("p2", 7000), ev.result("p3", 50)])
    with pytest.raises(EpochError, match="bucket 0"):
        epoch(season)
    assert rankview.pointer_get(r, keys) == 2
    assert rankview.copy_meta_load(r, keys, stale_copy).state == "broken"  # type: ignore[union-attr]
    # The next epoch rebuilds it from the scores and publishes a correct version.
    assert publish(season) == 3
    assert_matches_ledger(season)


def test_a_copy_that_does_not_hold_the_assumed_old_scores_is_marked_broken_and_rebuilt(
    season_factory: Callable[..., Season], post_scores: Post
) -> None:
    season = season_factory(slug="drifted", layout=NARROW)
    r = views_epoch.redis_get()
    keys = keys_of(season)
    ev = Events()
    post_ok(post_scores, season, [ev.result(f"p{i:02d}", i * 30) for i in range(30)])
    for step in range(3):
        publish(season)
        post_ok(post_scores, season, [ev.result(f"p{step:02d}", 999)])
    publish(season)
    current = current_manifest(season)
    before = db_standings(season)
    stale = "1" if current.copy == "0" else "0"
    meta = rankview.copy_meta_load(r, keys, stale)
    assert meta is not None and meta.index == current.index and meta.side != current.side
    # Behind the planner's back, the stale side's part of p10's lookup says 850 under the
    # player's second name (p10 is at 300, bucket 3, in both sides' buckets).
    field = keys.lookup_of(meta.index, "p10", meta.lookup_shards, groups=meta.groups)
    raw = r.hget(field, "p10")
    assert raw is not None
    views = list(lookup_decode(raw))
    views[meta.side] = Seen("850", second=True)
    r.hset(field, "p10", lookup_encode((views[0], views[1])))
    post_ok(post_scores, season, [ev.result("p10", 620)])
    with pytest.raises(rankview.CopyMismatch, match=r"player p10: the side holds '850', the stream says 300 "):
        epoch(season)
    assert rankview.copy_meta_load(r, keys, stale).state == "broken"  # type: ignore[union-attr]
    # The version before still serves, untouched; the next epoch builds a new index and publishes.
    assert_board_equals(reader_of(season), before, version=current.version)
    assert publish(season) == current.version + 1
    assert current_manifest(season).index not in (current.index,)
    assert_matches_ledger(season)


def test_a_single_bucket_season_works_end_to_end(season_factory: Callable[..., Season], post_scores: Post) -> None:
    season = season_factory(slug="one-bucket", layout=BucketLayout.single())
    ev = Events()
    post_ok(post_scores, season, [ev.result(f"p{i:03d}", (i * 7919) % 1_000_001) for i in range(120)]
            + [ev.result(f"tie{i}", 500_000) for i in range(30)])
    assert publish(season) == 1
    manifest = current_manifest(season)
    assert manifest.layout.size == 1 and manifest.counts == [150]
    assert_matches_ledger(season, radius=10)
    for step in range(3):
        post_ok(post_scores, season, [ev.result(f"p{step:03d}", 1_000_000), ev.correction("tie1", step),
                                      ev.result(f"late{step}", 500_000)])
        publish(season)
        assert_matches_ledger(season, exhaustive=step == 2)


# --- the invariant checker ----------------------------------------------------------------------------


def _corruptible(season: Season, post_scores: Post) -> tuple[Any, rankview.Keys, Any]:
    ev = Events()
    post_ok(post_scores, season, [ev.result(f"p{i:02d}", 1000 * i + 5) for i in range(30)])
    publish(season)
    post_ok(post_scores, season, [ev.result("p00", 15_005)])
    publish(season)
    full_check(season)
    return views_epoch.redis_get(), keys_of(season), current_manifest(season)


CORRUPTIONS = {
    # name: (what to do, checks that must fail, checks that must pass)
    "stray_member": ({"bucket_counts", "total_players", "bucket_checksums", "lookup_equals_index"},
                     {"players_once", "bucket_ranges"}),
    "lookup_other_bucket": ({"lookup_equals_index", "sampled_ranks"},
                            {"bucket_counts", "total_players", "players_once", "bucket_checksums"}),
    "lookup_same_bucket": ({"lookup_equals_index", "sampled_ranks"},
                           {"bucket_counts", "total_players", "players_once", "bucket_checksums"}),
    "duplicate_player": ({"players_once", "bucket_counts", "total_players"}, {"bucket_ranges"}),
    "misplaced_member": ({"bucket_ranges", "bucket_counts", "bucket_checksums"},
                         {"players_once", "total_players", "lookup_equals_index"}),
    "rescored_member": ({"bucket_checksums", "lookup_equals_index"},
                        {"bucket_counts", "total_players", "players_once", "bucket_ranges"}),
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_the_invariant_checker_names_the_broken_check(season: Season, post_scores: Post, corruption: str) -> None:
    r, keys, m = _corruptible(season, post_scores)

    def bucket(b: int) -> str:
        return keys.bucket(m.index, m.layout.layout_id, b, groups=m.groups)

    def lookup_part_set(player_id: str, value: str) -> None:
        """The version's side's part of the player's lookup field says `value` (the other
        side's part stays as it was)."""
        field = keys.lookup_of(m.index, player_id, m.lookup_shards, groups=m.groups)
        views = list(lookup_decode(r.hget(field, player_id)))
        views[m.side] = Seen(value)
        r.hset(field, player_id, lookup_encode((views[0], views[1])))

    # p12 has score 12005: bucket 1 of the default layout. The catch-up made both sides of
    # the index agree: p12 has one entry named by their id, seen by both, and one value.
    assert r.hget(keys.lookup_of(m.index, "p12", m.lookup_shards, groups=m.groups), "p12") == b"12005"
    if corruption == "stray_member":
        r.zadd(bucket(1), {"ghost": -11_000})
    elif corruption == "lookup_other_bucket":
        lookup_part_set("p12", "77000")
    elif corruption == "lookup_same_bucket":
        lookup_part_set("p12", "19999")
    elif corruption == "duplicate_player":
        r.zadd(bucket(2), {"p12": -22_000})
    elif corruption == "misplaced_member":
        r.zrem(bucket(1), "p12")
        r.zadd(bucket(2), {"p12": -12_005})
    elif corruption == "rescored_member":
        r.zadd(bucket(1), {"p12": -10_001}, xx=True)
    must_fail, must_pass = CORRUPTIONS[corruption]
    report = version_check(r=r, keys=keys, full=True, sample=1000)
    failing = {f.check for f in report.failures()}
    passing = {f.check for f in report.findings if f.ok}
    assert not report.ok
    assert must_fail <= failing, report.as_dict()
    assert must_pass <= passing, report.as_dict()
    assert report.version == m.version


def test_the_invariant_checker_reports_a_missing_manifest_or_mutated_copy(season: Season,
                                                                          post_scores: Post) -> None:
    r, keys, m = _corruptible(season, post_scores)
    r.hincrby(keys.copy_meta(m.copy), "gen", 1)
    report = version_check(r=r, keys=keys, full=True)
    assert [f.check for f in report.failures()] == ["copy"]
    rankview.manifest_cache_clear()
    r.delete(keys.manifest(m.version))
    report = version_check(r=r, keys=keys, version=m.version)
    assert [f.check for f in report.failures()] == ["manifest"]
    r.delete(keys.ptr)
    assert [f.check for f in version_check(r=r, keys=keys).failures()] == ["published"]
