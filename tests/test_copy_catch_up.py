"""The older copy's catch-up after a publication (views_epoch.season_idle_copy_catch_up,
EPOCH_CATCH_UP): it waits out the grace period, holds exactly the current version
afterwards, lets the next epoch apply each change once, and is fenced like the epoch.
An epoch that comes due while the lease is held runs when the holder is done."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from leaderboard.recovery.rebuild import season_epoch_advance
from leaderboard.views import epoch as views_epoch
from leaderboard.views import parts as views_parts
from leaderboard.views import rankview
from leaderboard.views.epoch import season_idle_copy_catch_up
from seasons.models import Season
from tests.support import (
    Events,
    assert_board_equals,
    assert_idle_copy_caught_up,
    copy_contents,
    current_manifest,
    db_standings,
    epoch,
    keys_of,
    post_ok,
    publish,
    reader_of,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]

Post = Callable[..., Any]


class EpochInBackground:
    """season_epoch_run on a thread, started with three versions' worth of history (both
    copies built) and a pending change; `published()` waits for its pointer swap."""

    def __init__(self, season: Season, post_scores: Post, ev: Events):
        post_ok(post_scores, season, [ev.result(f"p{i}", i) for i in range(10)])
        publish(season)
        post_ok(post_scores, season, [ev.result("p0", 50)])
        publish(season)
        post_ok(post_scores, season, [ev.result("p0", 60)])
        self.r = views_epoch.redis_get()
        self.keys = keys_of(season)
        before = rankview.pointer_get(self.r, self.keys)
        assert before is not None
        self.before: int = before
        self.results: list[Any] = []
        self.thread = threading.Thread(target=self._run, args=(season,))
        self.thread.start()

    def _run(self, season: Season) -> None:
        try:
            self.results.append(season_epoch_advance(season=season))
        finally:
            connection.close()

    def published(self) -> float:
        deadline = time.monotonic() + 20
        while rankview.pointer_get(self.r, self.keys) == self.before:
            assert time.monotonic() < deadline, "the epoch did not publish"
            time.sleep(0.002)
        return time.monotonic()

    def result(self) -> Any:
        self.thread.join(timeout=30)
        assert self.results, "the epoch did not finish"
        return self.results[0]


def published_twice(season: Season, post_scores: Post) -> tuple[Any, rankview.Keys, int]:
    """Versions 1 and 2 (both copies built), then the season's lease taken: (redis, keys, token)."""
    ev = Events()
    post_ok(post_scores, season, [ev.result("a", 1), ev.result("b", 2)])
    publish(season)
    post_ok(post_scores, season, [ev.result("a", 3)])
    publish(season)
    r = views_epoch.redis_get()
    keys = keys_of(season)
    token = views_epoch.season_lease_acquire(season=season, r=r, ttl_ms=30_000)
    assert token is not None
    return r, keys, token


def idle_copy(season: Season) -> str:
    current = current_manifest(season).copy
    return next(c for c in rankview.copies_get(views_epoch.redis_get(), keys_of(season)) if c != current)


def test_after_a_publication_the_older_copy_holds_the_current_version(season: Season, post_scores: Post) -> None:
    ev = Events()
    post_ok(post_scores, season, [ev.result(f"p{i}", 10 * i) for i in range(40)])
    first = epoch(season)
    assert (first.status, first.catch_up_ms) == ("published", None)  # one copy so far: nothing to catch up
    post_ok(post_scores, season, [ev.result("p1", 5000), ev.correction("p39", 3)])
    second = epoch(season)  # applies to the second copy (the index's other side), then catches the first one up
    assert (second.status, second.version) == ("published", 2) and second.catch_up_ms is not None
    assert_idle_copy_caught_up(season)
    meta, _, _ = copy_contents(season, idle_copy(season))
    assert meta.version == 1  # its own version number; its generation moved on
    with pytest.raises(rankview.VersionExpired):
        reader_of(season).rank("p1", 1)
    assert_board_equals(reader_of(season), db_standings(season))

    post_ok(post_scores, season, [ev.result("p2", 7000), ev.result("new", 1)])
    third = epoch(season)
    assert (third.status, third.version) == ("published", 3) and third.catch_up_ms is not None
    assert_idle_copy_caught_up(season)
    assert_board_equals(reader_of(season), db_standings(season))


@pytest.mark.parametrize("catch_up", [True, False], ids=["catch-up", "no-catch-up"])
def test_the_next_epoch_applies_only_the_changes_since_the_current_version(
    season: Season, post_scores: Post, settings: Any, catch_up: bool
) -> None:
    settings.EPOCH_CATCH_UP = catch_up
    ev = Events()
    post_ok(post_scores, season, [ev.result(f"p{i}", i) for i in range(20)])
    publish(season)
    post_ok(post_scores, season, [ev.result("p0", 100)])
    publish(season)  # both copies exist from here on
    post_ok(post_scores, season, [ev.result("p1", 101), ev.result("p2", 102)])
    result = epoch(season)
    assert (result.status, result.applied) == ("published", 2 if catch_up else 3)
    post_ok(post_scores, season, [ev.result("p3", 103)])
    # Without the catch-up, the target still lacks the previous epoch's two changes.
    result = epoch(season)
    assert (result.status, result.applied) == ("published", 1 if catch_up else 3)
    assert_board_equals(reader_of(season), db_standings(season))


def test_the_epoch_and_its_catch_up_each_read_the_range_once(
    season: Season, post_scores: Post, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both copies apply the same range (the current version's watermark to the stream's
    heads), each in its parts: one read of the range each, nothing before it again."""
    ev = Events()
    post_ok(post_scores, season, [ev.result(f"p{i}", i) for i in range(20)])
    publish(season)
    post_ok(post_scores, season, [ev.result("p0", 100)])
    publish(season)
    before = current_manifest(season).watermark
    reads: list[tuple[Any, Any, tuple[int, ...], int]] = []
    real = views_parts.stream_range_rows

    def counting(**kwargs: Any) -> Any:
        rows = real(**kwargs)
        reads.append((kwargs["after"], kwargs["upto"], tuple(kwargs["partitions"]), len(rows)))
        return rows

    monkeypatch.setattr(views_parts, "stream_range_rows", counting)
    post_ok(post_scores, season, [ev.result("p1", 101), ev.correction("p2", 0), ev.result("new", 7)])
    result = epoch(season)
    assert result.status == "published" and result.catch_up_ms is not None
    upto = current_manifest(season).watermark
    # The range, each of its partitions read once by each copy's apply (in one part or more).
    assert {(after, end) for after, end, _, _ in reads} == {(before, upto)}, reads
    partitions = [p for _, _, parts, _ in reads for p in parts]
    assert sorted(partitions) == sorted(2 * list(range(season.partitions))), reads
    assert sum(n for *_, n in reads) == 2 * 3, reads
    assert_idle_copy_caught_up(season)
    assert_board_equals(reader_of(season), db_standings(season))


def test_the_older_copy_is_touched_only_after_its_grace_period(
    season: Season, post_scores: Post, settings: Any
) -> None:
    settings.COPY_GRACE_SECONDS = 1.5
    settings.READ_DEADLINE_SECONDS = 1.0
    running = EpochInBackground(season, post_scores, Events())
    before = running.before
    swapped = running.published()
    # Within the grace period the version just replaced still answers, from an untouched copy.
    view = reader_of(season).rank("p0", before)
    assert view.manifest.version == before and view.entry is not None and view.entry.score == 50
    assert time.monotonic() - swapped < 1.0, "the machine is too slow for this check to mean anything"
    result = running.result()
    assert time.monotonic() - swapped >= 1.5 - 0.05
    assert result.status == "published" and result.catch_up_ms is not None
    assert_idle_copy_caught_up(season)
    with pytest.raises(rankview.VersionExpired):
        reader_of(season).rank("p0", before)


def test_a_coordinator_that_lost_its_lease_cannot_touch_the_older_copy(season: Season, post_scores: Post,
                                                                        settings: Any) -> None:
    settings.EPOCH_CATCH_UP = False
    r, keys, stale = published_twice(season, post_scores)
    r.delete(keys.lease)  # its lease expired...
    newer = views_epoch.season_lease_acquire(season=season, r=r, ttl_ms=30_000)  # ...and another coordinator took it
    assert newer is not None
    idle = idle_copy(season)
    gen_before = copy_contents(season, idle)[0].gen
    with pytest.raises(rankview.FenceLost):
        season_idle_copy_catch_up(season=season, r=r, keys=keys, token=stale)
    meta, _, _ = copy_contents(season, idle)
    assert (meta.gen, meta.state) == (gen_before, rankview.STATE_READY)
    # The holder of the lease catches it up.
    assert season_idle_copy_catch_up(season=season, r=r, keys=keys, token=newer) is not None
    rankview.lease_release(r, keys, newer)
    assert_idle_copy_caught_up(season)


def test_a_catch_up_with_nothing_to_do_returns_none(season: Season, post_scores: Post) -> None:
    r, keys, token = published_twice(season, post_scores)  # the epochs caught the older copy up
    gen_before = copy_contents(season, idle_copy(season))[0].gen
    assert season_idle_copy_catch_up(season=season, r=r, keys=keys, token=token) is None
    assert copy_contents(season, idle_copy(season))[0].gen == gen_before
    rankview.lease_release(r, keys, token)


def test_an_epoch_due_while_the_lease_is_held_runs_when_the_holder_is_done(
    season: Season, post_scores: Post, settings: Any
) -> None:
    # A grace period keeps the holder busy (waiting to catch up) after its publication.
    settings.COPY_GRACE_SECONDS = 0.6
    settings.READ_DEADLINE_SECONDS = 0.3
    ev = Events()
    running = EpochInBackground(season, post_scores, ev)
    r, keys, before = running.r, running.keys, running.before
    running.published()
    post_ok(post_scores, season, [ev.result("p1", 5)])
    # The next tick finds the season held: it leaves a note instead of waiting a period.
    assert season_epoch_advance(season=season).status == "skipped"
    result = running.result()
    assert result.status == "published"
    assert result.version == before + 2, "the holder ran the epoch that came due"
    assert rankview.pointer_get(r, keys) == before + 2
    view = reader_of(season).rank("p1")
    assert view.entry is not None and view.entry.score == 5
    assert r.get(keys.due) is None and r.get(keys.lease) is None
    assert_idle_copy_caught_up(season)
