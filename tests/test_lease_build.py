"""An index built from the scores under the season's lease (the season's first epoch, which
builds it with both copies as its sides): losing the lease part-way must leave nothing a
later epoch trusts, and the next holder must publish a correct version from a clean
rebuild."""

from __future__ import annotations

from typing import Any

import pytest

from leaderboard import tasks
from leaderboard.redis_client import redis_get
from leaderboard.views import build, rankview
from leaderboard.views import epoch as views_epoch
from seasons.models import Season
from tests.support import (
    Events,
    apply_events,
    assert_matches_ledger,
    builds_counted,
    current_manifest,
    epoch,
    keys_of,
    publish,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]


def _season_to_build(season: Season, players: int = 400) -> tuple[Events, str, str]:
    """Scores and no version yet: the next epoch builds the season's index from the scores,
    under the lease, with both copies as its sides. Returns the copy it publishes from and
    the other one (the index's side 1, which the epoch after brings up to date)."""
    events = Events(season.slug)
    apply_events(season, [events.result(f"p{i:04d}", (i * 37) % 5000) for i in range(players)])
    r = redis_get()
    keys = keys_of(season)
    assert rankview.pointer_get(r, keys) is None
    building, other = rankview.copies_get(r, keys)
    assert rankview.copy_meta_load(r, keys, building) is None and rankview.copy_meta_load(r, keys, other) is None
    return events, building, other


def _copies_state(r: Any, keys: rankview.Keys, *names: str) -> set[str]:
    """The states the copies' metas read as (a missing meta fails the test)."""
    metas = [rankview.copy_meta_load(r, keys, name) for name in names]
    assert all(meta is not None for meta in metas), names
    return {meta.state for meta in metas if meta is not None}


def _small_build_batches(monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    monkeypatch.setattr(build, "BUILD_BATCH", size)
    monkeypatch.setattr(build, "BUILD_BATCH_MAX", size)


def test_a_build_that_loses_its_lease_midway_leaves_its_copy_broken_and_the_next_holder_rebuilds_it(
        season: Season, monkeypatch: pytest.MonkeyPatch) -> None:
    r = redis_get()
    keys = keys_of(season)
    events, building, other = _season_to_build(season)
    apply_events(season, [events.result("p0001", 9_999), events.result("late", 4_321)])
    _small_build_batches(monkeypatch, 50)  # 9 batches

    # Another coordinator takes the season while the build is on its fourth batch: its
    # stamps refuse the rest of the build's writes.
    real = build._build_writes
    built = {"batches": 0}
    thief: dict[str, int | None] = {}

    def stealing(*args: Any) -> Any:
        built["batches"] += 1
        if built["batches"] == 4:
            r.delete(keys.lease)
            thief["token"] = views_epoch.season_lease_acquire(season=season, r=r, ttl_ms=30_000)
        return real(*args)

    monkeypatch.setattr(build, "_build_writes", stealing)
    with pytest.raises(rankview.FenceLost):
        epoch(season)
    monkeypatch.setattr(build, "_build_writes", real)
    token = thief["token"]
    assert token is not None and r.get(keys.lease) == str(token).encode()

    # Half a build, its counts and watermark never written: nothing may take either side
    # of the index for a copy that only needs the changes since its watermark.
    assert _copies_state(r, keys, building, other) == {rankview.STATE_BROKEN}
    assert rankview.pointer_get(r, keys) is None

    rankview.lease_release(r, keys, token)
    assert publish(season) == 1
    assert current_manifest(season).copy == building
    assert_matches_ledger(season)
    apply_events(season, [events.result("p0002", 8_888)])
    assert publish(season) == 2
    assert current_manifest(season).copy == other
    assert_matches_ledger(season)


def test_a_lease_that_expires_mid_build_stops_the_build_at_its_next_batch(
        season: Season, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Nobody took the season (its lease just expired): no newer token refuses the build's
    writes, so only the build's own renewal notices, before the next batch."""
    r = redis_get()
    keys = keys_of(season)
    events, building, other = _season_to_build(season)
    apply_events(season, [events.result("p0003", 7_777)])
    _small_build_batches(monkeypatch, 50)
    real = build._build_writes
    built = {"batches": 0}

    def expiring(*args: Any) -> Any:
        built["batches"] += 1
        if built["batches"] == 3:
            r.delete(keys.lease)
        return real(*args)

    monkeypatch.setattr(build, "_build_writes", expiring)
    with caplog.at_level("WARNING"):
        assert tasks.season_epoch(season.pk) == "lease lost"
    monkeypatch.setattr(build, "_build_writes", real)
    assert built["batches"] == 3, "the build went on writing without its lease"
    assert f"lease was lost while building copy {building}, {other}" in caplog.text
    assert "the epoch lost the season's lease and published nothing" in caplog.text
    assert _copies_state(r, keys, building, other) == {rankview.STATE_BROKEN}

    assert publish(season) == 1
    assert_matches_ledger(season)


@pytest.mark.postgres  # the build streams the scores through a server-side cursor there
def test_a_build_that_holds_the_interpreter_longer_than_the_lease_keeps_it(
        season: Season, monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    """The build's fetch holds the interpreter (as psycopg does converting a big fetch's
    rows) for three leases: the keeper thread cannot renew meanwhile, and the build keeps
    the season only because it holds the longer build lease."""
    import ctypes

    import psycopg

    r = redis_get()
    keys = keys_of(season)
    events, building, _ = _season_to_build(season)
    apply_events(season, [events.result("p0004", 6_666)])
    settings.EPOCH_LEASE_SECONDS = 0.5
    _small_build_batches(monkeypatch, 100)
    hold = ctypes.PyDLL(None).usleep  # a C call that keeps the interpreter lock (PyDLL)
    real = psycopg.ServerCursor.fetchmany
    fetches = {"n": 0}

    def converting(self: Any, size: int = 0) -> Any:
        fetches["n"] += 1
        if fetches["n"] == 2:
            hold(1_500_000)
        return real(self, size)

    monkeypatch.setattr(psycopg.ServerCursor, "fetchmany", converting)
    assert publish(season) == 1
    monkeypatch.setattr(psycopg.ServerCursor, "fetchmany", real)
    assert fetches["n"] >= 2, "the build did not read the scores through the server-side cursor"
    assert current_manifest(season).copy == building
    assert r.get(keys.lease) is None  # given back, not left to expire
    assert_matches_ledger(season)


def test_a_lease_lost_after_the_build_landed_leaves_a_copy_the_next_holder_finishes_without_building_again(
        season: Season, monkeypatch: pytest.MonkeyPatch) -> None:
    r = redis_get()
    keys = keys_of(season)
    events, building, other = _season_to_build(season)
    apply_events(season, [events.result("p0005", 5_555)])
    real_finish = rankview.copy_finish

    def stolen_before_finish(*args: Any, **kwargs: Any) -> Any:
        r.delete(keys.lease)
        views_epoch.season_lease_acquire(season=season, r=r, ttl_ms=30_000)
        return real_finish(*args, **kwargs)

    monkeypatch.setattr(rankview, "copy_finish", stolen_before_finish)
    with pytest.raises(rankview.FenceLost):
        epoch(season)
    monkeypatch.setattr(rankview, "copy_finish", real_finish)
    # The build's verified counts and watermark landed on both sides: "applying" from there.
    for name in (building, other):
        meta = rankview.copy_meta_load(r, keys, name)
        assert meta is not None and meta.state == rankview.STATE_APPLYING and sum(meta.counts) == 400, name

    r.delete(keys.lease)  # the other coordinator died: its lease ran out
    builds = builds_counted(monkeypatch)
    apply_events(season, [events.result("p0006", 4_444)])
    assert publish(season) == 1
    assert builds["n"] == 0, "the next holder built the copy again"
    assert current_manifest(season).copy == building
    assert_matches_ledger(season)
    # The other side, applying from the same build, is brought up to date just as well.
    apply_events(season, [events.result("p0007", 3_333)])
    assert publish(season) == 2
    assert builds["n"] == 0, "the other copy was built again"
    assert current_manifest(season).copy == other
    assert_matches_ledger(season)
