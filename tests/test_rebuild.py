"""Shadow rebuilds from the ledger (leaderboard/recovery/rebuild.py): persisted progress, one job per
season, an idempotent task, the foreground command, hot-bucket split proposals, publishing
and discarding a split. Every published result is checked exactly against the ledger."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from leaderboard.core.buckets import BucketLayout
from leaderboard.core.ranking import Standings
from leaderboard.core.shared_index import Seen, entry_name, lookup_decode, lookup_encode
from leaderboard.models import Manifest as ManifestRow
from leaderboard.models import RebuildJob
from leaderboard.recovery.rebuild import (
    RebuildError,
    rebuild_discard,
    rebuild_publish,
    rebuild_run,
    season_epoch_advance,
    season_rebuild_start,
    season_split_propose,
    season_split_recommendations,
)
from leaderboard.redis_client import redis_get
from leaderboard.tasks import rebuild_run_task
from leaderboard.views import build, rankview, season_index
from seasons.models import Season
from tests.support import (
    NARROW,
    TEST_ACTOR,
    Events,
    assert_matches_ledger,
    board_read,
    board_snapshot,
    builds_counted,
    current_manifest,
    epoch,
    full_check,
    is_postgres,
    keys_of,
    post_ok,
    publish,
    reader_of,
    scores_at_watermark,
    season_data_keys,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]

Post = Callable[..., Any]


def seeded(season_factory: Callable[..., Season], post_scores: Post, slug: str, *, players: int = 60,
           layout: BucketLayout = NARROW) -> tuple[Season, Events]:
    """A season with two published versions (both copies built)."""
    season = season_factory(slug=slug, layout=layout)
    ev = Events(tag=slug)
    post_ok(post_scores, season, [ev.result(f"p{i:03d}", (i * 37) % 1000) for i in range(players)])
    publish(season)
    post_ok(post_scores, season, [ev.result("p001", 999)])
    publish(season)
    return season, ev


# --- progress, one job per season, the task ------------------------------------------------------


def test_progress_is_persisted_with_rate_and_eta(season_factory: Callable[..., Season], post_scores: Post,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    season, _ = seeded(season_factory, post_scores, "progress", players=120)
    monkeypatch.setattr(build, "BUILD_BATCH", 25)  # several progress steps per copy
    monkeypatch.setattr(build, "BUILD_SHARD_FILL", 0)  # not 4 x the 16 shards
    job = season_rebuild_start(season=season, actor=TEST_ACTOR, reason="drill", enqueue=False)
    assert (job.status, job.done, job.total, job.percent, job.copy) == ("queued", 0, 0, 0.0, "")
    seen: list[tuple[str, int, int, float, float | None]] = []
    rows: list[tuple[str, int, int]] = []

    def on_progress(update: RebuildJob) -> None:
        seen.append((update.status, update.done, update.total, update.rate, update.eta_seconds))
        row = RebuildJob.objects.get(pk=job.pk)
        rows.append((row.status, row.done, row.total))

    job = rebuild_run(job_id=job.pk, on_progress=on_progress)
    assert job.status == RebuildJob.Status.PUBLISHED, (job.error, job.report)

    # Both shadow copies are filled from one read: 120 players written into both, in steps of 25.
    statuses = [s for s, *_ in seen]
    assert statuses[0] == "building" and statuses[-1] == "comparing"
    assert statuses == sorted(statuses, key=["building", "comparing"].index)
    building = [(done, total, rate, eta) for status, done, total, rate, eta in seen if status == "building"]
    assert {total for _, total, _, _ in building} == {120}
    dones = [done for done, *_ in building]
    assert dones == sorted(dones) and dones[0] == 0 and dones[-1] == 120 and len(set(dones)) >= 5
    assert all(rate > 0 and eta is not None and eta >= 0 for done, _, rate, eta in building if done)
    assert building[-1][3] == 0
    # The row is what the console polls: the start and the end are saved at once, and it
    # never runs ahead of the build.
    assert rows[0] == ("building", 0, 120)
    assert all(row_done <= done for (_, row_done, _), (_, done, *_) in zip(rows, seen, strict=True))
    assert ("building", 120, 120) in rows and rows[-1][0] == "comparing"

    row = RebuildJob.objects.get(pk=job.pk)
    assert (row.status, row.done, row.total, row.percent, row.eta_seconds) == ("published", 120, 120, 100.0, 0)
    assert row.rate > 0 and row.started_at is not None and row.finished_at >= row.started_at  # type: ignore[operator]
    assert row.copy == f"r{job.pk}" and row.compared_version == 2 and row.published_version == 3
    assert row.watermark_id is not None and row.report["ok"] is True  # type: ignore[index]
    checks = {f["check"] for f in row.report["findings"]}  # type: ignore[index]
    assert {"same_watermark", "player_count", "bucket_counts_and_checksums", "shadow_index_counts", "top_100",
            "sampled_ranks", "neighbor_windows"} <= checks
    assert assert_matches_ledger(season) == 3
    assert set(rankview.copies_get(redis_get(), keys_of(season))) == {row.copy, f"{row.copy}b"}
    assert ManifestRow.objects.get(season=season, version=3).copy == row.copy


def test_one_active_job_per_season(season_factory: Callable[..., Season], post_scores: Post) -> None:
    season, _ = seeded(season_factory, post_scores, "one-job")
    other, _ = seeded(season_factory, post_scores, "other-job")
    first = season_rebuild_start(season=season, actor=TEST_ACTOR, enqueue=False)
    with pytest.raises(RebuildError, match="already running"):
        season_rebuild_start(season=season, actor=TEST_ACTOR, enqueue=False)
    with pytest.raises(RebuildError, match="already running"):
        season_split_propose(season=season, actor=TEST_ACTOR, split_points=[150])
    # A lost view would start a recovery: it finds the slot taken and waits for it.
    r, ptr = redis_get(), season_index.season_keys(season).ptr
    current = r.getdel(ptr)
    assert current is not None
    assert season_epoch_advance(season=season).detail == "views lost; a rebuild is in flight"
    r.set(ptr, current)
    assert RebuildJob.objects.filter(season=season).count() == 1
    # Another season is independent.
    assert season_rebuild_start(season=other, actor=TEST_ACTOR, enqueue=False).status == "queued"
    # Once the first has finished, the slot is free again.
    assert rebuild_run(job_id=first.pk).status == "published"
    second = season_rebuild_start(season=season, actor=TEST_ACTOR, enqueue=False)
    assert rebuild_run(job_id=second.pk).status == "published"
    assert assert_matches_ledger(season) == 4


def test_the_task_is_idempotent_and_queued_on_commit(season_factory: Callable[..., Season], post_scores: Post,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    season, _ = seeded(season_factory, post_scores, "idempotent")
    queued: list[int] = []
    monkeypatch.setattr(rebuild_run_task, "delay", lambda job_id: queued.append(job_id))
    job = season_rebuild_start(season=season, actor=TEST_ACTOR)
    assert queued == [job.pk]  # after the commit of the claim

    # Another worker claimed it first: this delivery returns without touching anything.
    RebuildJob.objects.filter(pk=job.pk).update(status=RebuildJob.Status.BUILDING)
    before = board_snapshot(season)
    again = rebuild_run(job_id=job.pk)
    assert (again.status, again.copy, again.done) == ("building", "", 0)
    assert season_data_keys(season, f"r{job.pk}") == []
    RebuildJob.objects.filter(pk=job.pk).update(status=RebuildJob.Status.QUEUED)

    assert rebuild_run_task(job.pk) == "published"
    # A redelivery of the finished task does nothing either: no new version, same job.
    finished = RebuildJob.objects.get(pk=job.pk)
    assert rebuild_run_task(job.pk) == "published"
    assert RebuildJob.objects.get(pk=job.pk).finished_at == finished.finished_at
    assert rankview.pointer_get(redis_get(), keys_of(season)) == 3
    assert board_snapshot(season)[1:] == before[1:]
    assert assert_matches_ledger(season) == 3


# --- what the comparison and the catch-up see ----------------------------------------------------


def test_a_rebuild_catches_up_with_writes_before_and_after_its_snapshot(
    season_factory: Callable[..., Season], post_scores: Post
) -> None:
    season, ev = seeded(season_factory, post_scores, "catch-up")

    def writes_while_comparing(events: list[dict[str, Any]]) -> Callable[[RebuildJob], None]:
        def on_progress(update: RebuildJob) -> None:
            if update.status == "comparing" and events:
                post_ok(post_scores, season, events)
                events.clear()
        return on_progress

    # Committed before the build but never published: the live version is brought up to
    # the shadow's snapshot first (by an epoch under the rebuild's lease), and both are
    # compared at one watermark; what was committed after the snapshot, before the
    # comparison, is caught up into the shadow too.
    post_ok(post_scores, season, [ev.result("p002", 998), ev.correction("p003", 0), ev.result("fresh", 500)])
    job = season_rebuild_start(season=season, actor=TEST_ACTOR, enqueue=False)
    job = rebuild_run(job_id=job.pk, on_progress=writes_while_comparing([ev.result("p004", 997),
                                                                       ev.result("after", 1)]))
    assert job.status == "published", (job.error, job.report)
    job.refresh_from_db()
    assert (job.compared_version, job.published_version) == (3, 4)
    assert ManifestRow.objects.get(season=season, version=3).copy in ("0", "1")  # the epoch it ran first
    assert_exact_at_watermark(season, 4)
    if not is_postgres():
        # Serialized writers: the epoch under the lease saw the writes made after the
        # snapshot, and the shadow was caught up with them. (On PostgreSQL they become
        # visible only once older transactions of the server have ended.)
        assert assert_matches_ledger(season) == 4
        assert epoch(season).status == "idle"
    assert epoch(season).status in ("idle", "published")
    assert_matches_ledger(season)

    # Writes made during the build or just before the comparison: the live version is
    # brought up to everything committed and the shadow caught up to the same point.
    job = season_rebuild_start(season=season, actor=TEST_ACTOR, enqueue=False)
    job = rebuild_run(job_id=job.pk, on_progress=writes_while_comparing([ev.result("p005", 996),
                                                                       ev.correction("p004", 3)]))
    assert job.status == "published", (job.error, job.report)
    job.refresh_from_db()
    version = rankview.pointer_get(redis_get(), keys_of(season))
    assert job.published_version == version
    assert_exact_at_watermark(season, version)  # type: ignore[arg-type]
    if not is_postgres():
        assert job.compared_version == version - 1  # type: ignore[operator]  # an epoch published them first
        assert reader_of(season).rank("p004").entry.score == 3  # type: ignore[union-attr]
    assert epoch(season).status in ("idle", "published")
    assert_matches_ledger(season)


def assert_exact_at_watermark(season: Season, version: int) -> None:
    """The version's whole board is the change stream replayed up to its watermark."""
    manifest = current_manifest(season)
    assert manifest is not None and manifest.version == version
    expected = Standings(scores_at_watermark(season, manifest.watermark))
    assert board_read(reader_of(season))[1] == expected.window(from_position=1, limit=len(expected))
    full_check(season, version)


def test_a_rebuild_compared_with_a_drifted_live_version_is_refused(season_factory: Callable[..., Season],
                                                                    post_scores: Post) -> None:
    season, _ = seeded(season_factory, post_scores, "drifted")
    r = redis_get()
    keys = keys_of(season)
    live = current_manifest(season)
    assert live is not None
    # The live copy's bookkeeping disagrees with the ledger: a player's score was changed
    # in its index and lookup behind the materializer's back. Both sides of the index
    # agree on p001 (the catch-up made them), so its one entry (named by its id or its
    # second name) and its one lookup value are changed, for both.
    bucket = live.layout.bucket_of(999)
    lookup = keys.lookup_of(live.index, "p001", live.lookup_shards, groups=live.groups)
    raw = r.hget(lookup, "p001")
    assert raw is not None
    views = lookup_decode(raw)
    seen = views[live.side]
    assert seen is not None and seen.value == "999" and views[0] == views[1], views
    assert r.zadd(keys.bucket(live.index, live.layout.layout_id, bucket, groups=live.groups),
                  {entry_name("p001", seen.second): -950}, xx=True, ch=True) == 1
    drifted = Seen("950", second=seen.second)
    r.hset(lookup, "p001", lookup_encode((drifted, drifted)))
    served = board_snapshot(season)
    job = rebuild_run(job_id=season_rebuild_start(season=season, actor=TEST_ACTOR, enqueue=False).pk)
    assert job.status == "failed"
    failed = {f["check"] for f in job.report["findings"] if not f["ok"]}  # type: ignore[index]
    # Its bookkeeping (counts, checksums, the stored top 100) still agrees; the reads do not.
    assert failed == {"sampled_ranks", "neighbor_windows"}, failed
    assert "p001: live (score, position, rank) (950, " in next(
        f["detail"] for f in job.report["findings"] if f["check"] == "sampled_ranks")  # type: ignore[index]
    assert job.error == "shadow comparison failed: sampled_ranks, neighbor_windows"
    assert rankview.pointer_get(r, keys) == live.version and board_snapshot(season) == served
    assert season_data_keys(season, job.copy) == [] and season_data_keys(season, f"{job.copy}b") == []


def test_a_failed_recovery_does_not_poison_the_next_one(season_factory: Callable[..., Season], post_scores: Post,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A recovery reconciles a candidate manifest before publishing it; when that fails, the
    next recovery reuses the version number and must be judged on its own manifest."""
    season, _ = seeded(season_factory, post_scores, "recover-twice")
    r = redis_get()
    keys = keys_of(season)
    served = board_snapshot(season)
    r.flushdb()
    assert season_epoch_advance(season=season).status == "lost"
    job = RebuildJob.objects.get(season=season, kind="recovery")
    real_catch_up = __import__("leaderboard.recovery.rebuild", fromlist=["_catch_up"])._catch_up

    def corrupting(**kwargs: Any) -> Any:
        shadow, replayed = real_catch_up(**kwargs)
        r.zadd(keys.bucket(shadow.copy, shadow.layout.layout_id, 0, groups=shadow.groups), {"stray": 0})
        return shadow, replayed

    monkeypatch.setattr("leaderboard.recovery.rebuild._catch_up", corrupting)
    failed = rebuild_run(job_id=job.pk)
    assert failed.status == "failed" and "bucket_counts" in failed.error, failed.error
    assert rankview.pointer_get(r, keys) is None
    monkeypatch.undo()
    with pytest.raises(rankview.Unavailable):
        reader_of(season).rank("p001")
    assert season_epoch_advance(season=season).status == "lost"
    second = RebuildJob.objects.filter(season=season, kind="recovery").exclude(pk=job.pk).get()
    second = rebuild_run(job_id=second.pk)
    assert second.status == "published", (second.error, second.report)
    assert second.published_version == failed.report["version"] == 3  # type: ignore[index]
    assert board_snapshot(season) == (3, served[1], served[2])
    assert assert_matches_ledger(season) == 3
    assert season_epoch_advance(season=season).status == "idle"


# --- the command ---------------------------------------------------------------------------------


def test_the_command_rebuilds_in_the_foreground_with_a_progress_bar(season_factory: Callable[..., Season],
                                                                     post_scores: Post,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    season, _ = seeded(season_factory, post_scores, "cmd")
    call_command("rebuild_views", season.slug, "--reason", "drill")
    out = capsys.readouterr().out
    assert re.search(r"\[#{40}\] 100\.0%\s+60/60 ", out), out
    assert "  ok   player_count: live 60, shadow 60 (difference 0)" in out
    assert "  ok   top_100" in out and "FAIL" not in out
    job = RebuildJob.objects.get(season=season)
    assert f"rebuild {job.pk}: published, version 3" in out
    assert job.reason == "drill" and job.requested_by_label == "manage.py rebuild_views"
    assert assert_matches_ledger(season) == 3

    with pytest.raises(CommandError, match="falls inside one score value"):
        call_command("rebuild_views", season.slug, "--split", "5.5")
    with pytest.raises(CommandError, match="already a bucket boundary"):
        call_command("rebuild_views", season.slug, "--split", "100")
    with pytest.raises(CommandError, match="no season"):
        call_command("rebuild_views", "nope")
    assert RebuildJob.objects.filter(season=season).count() == 1

    call_command("rebuild_views", season.slug, "--split", "50,150")
    out = capsys.readouterr().out
    split = RebuildJob.objects.get(season=season, kind="split")
    assert f"split shadow {split.pk} is ready; publish it from the console" in out
    assert split.status == "ready" and rankview.pointer_get(redis_get(), keys_of(season)) == 3


# --- hot-bucket splits ---------------------------------------------------------------------------


def test_split_recommendations_flag_a_hot_bucket(season_factory: Callable[..., Season], post_scores: Post) -> None:
    season = season_factory(slug="hot-rec", layout=NARROW)
    ev = Events(tag="hotrec")
    # 80 of 100 players in bucket 2 [200..299]; the rest spread thinly.
    crowd = [ev.result(f"c{i:03d}", 200 + i) for i in range(80)]
    spread = [ev.result(f"s{i:03d}", 500 + 20 * i) for i in range(20)]
    post_ok(post_scores, season, crowd + spread)
    publish(season)
    [rec] = season_split_recommendations(season=season)
    assert (rec.bucket, rec.low, rec.high, rec.players) == (2, 200, 299, 80)
    assert "holds 80% of players" in rec.why
    # Boundaries go just above score quantiles of the bucket, inside it.
    assert rec.split_points == (220, 240, 260)  # 20 players in each new bucket

    # A bucket that takes most of the recent changes is hot too, however few it holds.
    since = time.monotonic()
    time.sleep(0.05)
    post_ok(post_scores, season, [ev.result(f"s{i:03d}", 701 + i) for i in range(5)])  # into [700..799]
    publish(season)
    recs = {r.bucket: r for r in season_split_recommendations(season=season,
                                                               window_seconds=time.monotonic() - since)}
    assert set(recs) == {2, 7}
    assert recs[7].why == "takes 100% of recent changes" and recs[7].players == 10
    # Every recommended point is accepted as a split.
    for rec in recs.values():
        for point in rec.split_points:
            assert rec.low < point <= rec.high


def test_split_points_inside_one_score_value_are_refused(season_factory: Callable[..., Season],
                                                         post_scores: Post) -> None:
    season, _ = seeded(season_factory, post_scores, "refused")
    cases: list[tuple[list[object], str]] = [
        ([5.5], "falls inside one score value"), (["250.5"], "falls inside one score value"),
        ([100], "already a bucket boundary"), ([], "no split points"), ([1_000_001], "split points must be in"),
        (["x"], "is not a score"), ([True], "is not a score"),
    ]
    for points, message in cases:
        with pytest.raises(RebuildError, match=message):
            season_split_propose(season=season, actor=TEST_ACTOR, split_points=points)
    assert not RebuildJob.objects.filter(season=season).exists()
    # "150" and 150.0 are whole scores.
    job = season_split_propose(season=season, actor=TEST_ACTOR, split_points=["150", 250.0])
    assert BucketLayout.from_dict(job.layout).lower_bounds == tuple(sorted({*NARROW.lower_bounds, 150, 250}))


def test_a_published_split_changes_the_layout_readers_use(season_factory: Callable[..., Season],
                                                           post_scores: Post) -> None:
    season, ev = seeded(season_factory, post_scores, "split-pub", players=150)
    r = redis_get()
    keys = keys_of(season)
    job = season_split_propose(season=season, actor=TEST_ACTOR, split_points=[150, 250, 975], reason="hot")
    assert job.kind == "split" and job.reason == "hot"
    with pytest.raises(RebuildError, match="only a ready shadow can be published"):
        rebuild_publish(job=job, actor=TEST_ACTOR)
    job = rebuild_run(job_id=job.pk)
    assert job.status == "ready" and job.published_version is None, (job.error, job.report)
    assert rankview.pointer_get(r, keys) == 2

    # Epochs go on with the old layout; the shadow is caught up again at publication.
    post_ok(post_scores, season, [ev.correction("p010", 260), ev.correction("p011", 140), ev.result("new", 976)])
    assert publish(season) == 3
    job = rebuild_publish(job=job, actor=TEST_ACTOR, reason="approved")
    assert job.status == "published" and job.published_version == 4, (job.error, job.report)
    new_layout = BucketLayout.from_dict(job.layout)
    assert new_layout.layout_id == 2 and {150, 250, 975} <= set(new_layout.lower_bounds)
    season.refresh_from_db()
    assert season.layout == new_layout.as_dict()
    manifest = current_manifest(season)
    assert manifest is not None and manifest.layout == new_layout and manifest.copy == job.copy
    assert ManifestRow.objects.get(season=season, version=4).layout == new_layout.as_dict()
    # Readers use the new layout: the rank path reads the new copy's buckets.
    view = reader_of(season).rank("p010")
    assert view.manifest.layout.layout_id == 2 and view.entry is not None and view.entry.score == 260
    assert assert_matches_ledger(season) == 4
    # The old copies are gone, and epochs go on in the new layout with the two new copies.
    assert season_data_keys(season, "0") == [] and season_data_keys(season, "1") == []
    post_ok(post_scores, season, [ev.result("p012", 151), ev.result("p013", 999)])
    assert publish(season) == 5
    assert current_manifest(season).copy == f"{job.copy}b"
    assert assert_matches_ledger(season) == 5
    post_ok(post_scores, season, [ev.correction("p012", 1)])
    assert publish(season) == 6 and current_manifest(season).copy == job.copy
    assert_matches_ledger(season)
    # A later rebuild keeps the split layout.
    again = rebuild_run(job_id=season_rebuild_start(season=season, actor=TEST_ACTOR, enqueue=False).pk)
    assert again.status == "published" and current_manifest(season).layout == new_layout
    assert_matches_ledger(season)


def test_discarding_a_split_drops_its_shadow(season_factory: Callable[..., Season], post_scores: Post) -> None:
    season, _ = seeded(season_factory, post_scores, "discard")
    served = board_snapshot(season)
    job = rebuild_run(job_id=season_split_propose(season=season, actor=TEST_ACTOR, split_points=[50]).pk)
    assert job.status == "ready"
    assert season_data_keys(season, job.copy) and season_data_keys(season, f"{job.copy}b")
    job = rebuild_discard(job=job, actor=TEST_ACTOR, reason="not needed")
    assert job.status == "discarded"
    assert season_data_keys(season, job.copy) == [] and season_data_keys(season, f"{job.copy}b") == []
    with pytest.raises(RebuildError):
        rebuild_discard(job=job, actor=TEST_ACTOR)
    with pytest.raises(RebuildError):
        rebuild_publish(job=job, actor=TEST_ACTOR)
    assert board_snapshot(season) == served
    season.refresh_from_db()
    assert season.layout == NARROW.as_dict()
    assert assert_matches_ledger(season) == 2
    # The slot is free for the next proposal.
    assert season_split_propose(season=season, actor=TEST_ACTOR, split_points=[50]).status == "queued"


# --- work under the lease that outlasts its TTL -------------------------------------------------


@pytest.mark.parametrize("kind", ["rebuild", "recovery"])
def test_a_comparison_longer_than_the_lease_ttl_still_publishes(season_factory: Callable[..., Season],
                                                                post_scores: Post, settings: Any,
                                                                monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """The comparison (or, after a flush, the reconciliation against the ledger, a full scan
    of the season) runs under the season's lease; at 1M players it takes longer than the
    default 30 s lease. The rebuild keeps its lease alive while it works."""
    season, _ = seeded(season_factory, post_scores, f"long-{kind}")
    r = redis_get()
    keys = keys_of(season)
    settings.EPOCH_LEASE_SECONDS = 1.0
    import leaderboard.recovery.rebuild as rebuild_module

    name = "shadow_compare" if kind == "rebuild" else "recovery_reconcile"
    real = getattr(rebuild_module, name)

    def slow(**kwargs: Any) -> Any:
        time.sleep(2.5)  # well past the lease's TTL
        return real(**kwargs)

    monkeypatch.setattr(rebuild_module, name, slow)
    if kind == "recovery":
        r.flushdb()
        assert season_epoch_advance(season=season).status == "lost"
        job = RebuildJob.objects.get(season=season, kind="recovery")
    else:
        job = season_rebuild_start(season=season, actor=TEST_ACTOR, enqueue=False)
    job = rebuild_run(job_id=job.pk)
    assert job.status == "published", (job.error, job.report)
    assert r.get(keys.lease) is None  # released at the end
    assert assert_matches_ledger(season) == 3
    # Nobody else could take the season meanwhile; afterwards epochs go on.
    assert season_epoch_advance(season=season).status == "idle"


def test_a_score_the_build_saw_change_after_its_watermark_does_not_fail_the_comparison(
    season_factory: Callable[..., Season], post_scores: Post
) -> None:
    """The build takes its watermark, then scans the current scores in pages while writes go
    on: a page can hold a score newer than the watermark. The shadow must still be compared
    with the live version at one state, not fail on what the scan saw early."""
    season, ev = seeded(season_factory, post_scores, "scan-race")

    def write_once_the_scan_started(update: RebuildJob) -> None:
        if update.status == "building" and update.done == 0 and not getattr(write_once_the_scan_started, "done", 0):
            write_once_the_scan_started.done = 1  # type: ignore[attr-defined]
            post_ok(post_scores, season, [ev.result("p002", 998), ev.correction("p003", 4), ev.result("joined", 7)])

    job = rebuild_run(job_id=season_rebuild_start(season=season, actor=TEST_ACTOR, enqueue=False).pk,
                      on_progress=write_once_the_scan_started)
    assert job.status == "published", (job.error, job.report)
    assert epoch(season).status in ("idle", "published")
    assert_matches_ledger(season)


def test_a_recovery_under_writes_publishes(season_factory: Callable[..., Season], post_scores: Post,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    season, ev = seeded(season_factory, post_scores, "recover-busy")
    redis_get().flushdb()
    assert season_epoch_advance(season=season).status == "lost"
    job = RebuildJob.objects.get(season=season, kind="recovery")
    import leaderboard.recovery.rebuild as rebuild_module

    real = rebuild_module.recovery_reconcile

    def writes_meanwhile(**kwargs: Any) -> Any:
        post_ok(post_scores, season, [ev.result("p002", 998), ev.result("busy", 5)])
        return real(**kwargs)

    monkeypatch.setattr(rebuild_module, "recovery_reconcile", writes_meanwhile)
    job = rebuild_run(job_id=job.pk)
    assert job.status == "published", job.error


def test_a_recovery_publishes_from_one_copy_and_the_next_epoch_brings_the_other_up_to_date(
    season_factory: Callable[..., Season], post_scores: Post, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reads answer 503 until a recovery publishes, so it publishes from one copy of the
    index it built; the other copy is that index's other side, built with it and left
    "applying" at the build's watermark. The next epoch with changes brings it up to
    date (nothing is built again) and publishes from it."""
    season, ev = seeded(season_factory, post_scores, "recover-one-copy")
    r = redis_get()
    keys = keys_of(season)
    r.flushdb()
    assert season_epoch_advance(season=season).status == "lost"
    job = rebuild_run(job_id=RebuildJob.objects.get(season=season, kind="recovery").pk)
    assert job.status == "published", (job.error, job.report)
    assert job.total == job.done == 60
    assert rankview.copies_get(r, keys) == [job.copy, f"{job.copy}b"]
    published = rankview.copy_meta_load(r, keys, job.copy)
    other = rankview.copy_meta_load(r, keys, f"{job.copy}b")
    assert published is not None and other is not None
    assert (published.index, published.side, published.state) == (job.copy, 0, rankview.STATE_READY)
    assert (other.index, other.side, other.state) == (job.copy, 1, rankview.STATE_APPLYING)
    assert other.watermark <= published.watermark and other.version == 0
    assert assert_matches_ledger(season) == 3  # answered from the one copy
    builds = builds_counted(monkeypatch)
    assert season_epoch_advance(season=season).status == "idle"  # nothing new, nothing touched
    assert rankview.copy_meta_load(r, keys, f"{job.copy}b") == other
    post_ok(post_scores, season, [ev.result("p004", 996)])
    assert season_epoch_advance(season=season).status == "published"
    assert current_manifest(season).copy == f"{job.copy}b"
    assert builds["n"] == 0, "the epoch built the other copy instead of bringing it up to date"
    assert assert_matches_ledger(season) == 4
    assert season_epoch_advance(season=season).status == "idle"
