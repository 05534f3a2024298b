"""A recovery's reconciliation without a full read of the season (reconcile.recovery_reconcile,
docs/architecture.md, Reconciling a recovery): what it checks instead of the full scans, and
that it still refuses a wrong candidate when the sample misses the wrong player: a replayed
player with a wrong score or replaced by another member, a player the catch-up never
applied, a player on two regional boards, and a build write that overwrote a member (caught
by the build's reply checks). A FINAL candidate is still reconciled in full."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

import leaderboard.recovery.rebuild as rebuild_module
from leaderboard.core.shared_index import Seen, entry_name, hidden_member, lookup_decode, lookup_encode
from leaderboard.ledger_reads import ledger_queryset_of_player, ledger_rows_count, ledger_rows_list
from leaderboard.models import PlayerScore, RebuildJob
from leaderboard.recovery.rebuild import rebuild_run, season_epoch_advance
from leaderboard.recovery.reconcile import version_reconcile
from leaderboard.redis_client import redis_get
from leaderboard.views import build, rankview, season_index
from leaderboard.views import parts as views_parts
from leaderboard.views.invariants import sampled_reads
from seasons.models import Season
from tests import test_rebuild as rebuild_tests
from tests.support import (
    NARROW,
    Events,
    Post,
    assert_matches_ledger,
    board_snapshot,
    current_manifest,
    full_check,
    keys_of,
    post_ok,
    publish,
)
from tests.test_regional_boards import assert_boards_match_ledger
from tests.test_regional_recovery import REGIONS, Board

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]

PLAYERS = 200
# What the recovery's reconciliation checks on each board, and what only the full one does.
RECOVERY = {"player_count", "bucket_count_sum", "ledger_bucket_counts", "top_100", "ledger_sampled_ranks",
            "ledger_replayed_players", "bucket_counts", "total_players", "sampled_ranks"}
FULL_ONLY = {"ledger_bucket_checksums", "players_once", "bucket_ranges", "bucket_checksums", "lookup_equals_index"}


def seeded(season_factory: Callable[..., Season], post_scores: Post, slug: str) -> tuple[Season, Events]:
    return rebuild_tests.seeded(season_factory, post_scores, slug, players=PLAYERS)


def flushed(season: Season) -> RebuildJob:
    """Redis lost the views; the epoch that notices starts the recovery."""
    redis_get().flushdb()
    rankview.manifest_cache_clear()
    assert season_epoch_advance(season=season).status == "lost"
    return RebuildJob.objects.get(season=season, kind="recovery", status="queued")


def writes_after_the_build(write: Callable[[], object]) -> Callable[[RebuildJob], None]:
    """An on_progress hook writing once the build is over, before the catch-up: those
    writes are what the catch-up replays."""
    def hook(job: RebuildJob) -> None:
        if job.status == "comparing" and not getattr(hook, "done", False):
            hook.done = True  # type: ignore[attr-defined]
            write()
    return hook


def corrupt_catch_up(monkeypatch: pytest.MonkeyPatch, corrupt: Callable[[rankview.CopyMeta, set[str]], None]) -> None:
    real = rebuild_module._catch_up

    def corrupting(**kwargs: Any) -> Any:
        shadow, replayed = real(**kwargs)
        corrupt(shadow, replayed)
        return shadow, replayed

    monkeypatch.setattr(rebuild_module, "_catch_up", corrupting)


def failed_checks(job: RebuildJob) -> set[str]:
    assert job.status == "failed", (job.status, job.report)
    assert job.report is not None
    return {f["check"] for f in job.report["findings"] if not f["ok"]}


def detail(job: RebuildJob, check: str) -> str:
    assert job.report is not None
    return next(f["detail"] for f in job.report["findings"] if f["check"] == check)


def test_a_recovery_is_reconciled_without_reading_the_season_again(season_factory: Callable[..., Season],
                                                                   post_scores: Post) -> None:
    season, ev = seeded(season_factory, post_scores, "rr-clean")
    served = board_snapshot(season)
    job = flushed(season)
    job = rebuild_run(job_id=job.pk, on_progress=writes_after_the_build(
        lambda: post_ok(post_scores, season, [ev.result("p002", 998), ev.result("newcomer", 5)])))
    assert job.status == "published", (job.error, job.report)
    assert job.report is not None
    checks = {f["check"] for f in job.report["findings"]}
    assert checks >= RECOVERY and not checks & FULL_ONLY, checks
    assert detail(job, "ledger_replayed_players").startswith("2 replayed players")
    assert board_snapshot(season)[0] == served[0] + 1
    assert assert_matches_ledger(season) == job.published_version
    # A FINAL candidate's reconciliation (version_reconcile) still reads everything.
    manifest = current_manifest(season)
    report = version_reconcile(r=redis_get(), keys=keys_of(season), season_id=season.pk, version=manifest.version)
    assert report.ok and {f.check for f in report.findings} >= FULL_ONLY


def p010_replayed_and_corrupted(season_factory: Callable[..., Season], post_scores: Post, slug: str,
                                 monkeypatch: pytest.MonkeyPatch,
                                 corrupt: Callable[[rankview.Keys, rankview.CopyMeta], None]) -> RebuildJob:
    """A recovery whose catch-up replays p010 raised to 450 (below the top 100), then the
    shadow corrupted about p010; nothing is published."""
    season, ev = seeded(season_factory, post_scores, slug)
    keys = keys_of(season)

    def corrupt_p010(shadow: rankview.CopyMeta, replayed: set[str]) -> None:
        assert "p010" in replayed
        corrupt(keys, shadow)

    corrupt_catch_up(monkeypatch, corrupt_p010)
    job = rebuild_run(job_id=flushed(season).pk, on_progress=writes_after_the_build(
        lambda: post_ok(post_scores, season, [ev.result("p010", 450)])))
    assert rankview.pointer_get(redis_get(), keys) is None  # reads still answer 503
    return job


def test_a_replayed_player_with_a_wrong_score_is_refused_unsampled(season_factory: Callable[..., Season],
                                                                   post_scores: Post, settings: Any,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The catch-up left p010 at a wrong score in the same bucket: sizes and bookkeeping
    agree, a sample of one position almost surely misses it, its one-by-one check does not."""
    settings.REBUILD_SAMPLE_SIZE = 1
    r = redis_get()

    def wrong_score(keys: rankview.Keys, shadow: rankview.CopyMeta) -> None:
        bucket = shadow.layout.bucket_of(450)
        r.zadd(keys.bucket(shadow.copy, shadow.layout.layout_id, bucket, groups=shadow.groups), {"p010": -440})
        r.hset(keys.lookup_of(shadow.copy, "p010", shadow.lookup_shards, groups=shadow.groups), "p010", 440)

    job = p010_replayed_and_corrupted(season_factory, post_scores, "rr-score", monkeypatch, wrong_score)
    assert "ledger_replayed_players" in failed_checks(job)
    assert "p010: lookup 440, ledger 450" in detail(job, "ledger_replayed_players")


def test_a_replayed_player_replaced_by_another_member_is_refused(season_factory: Callable[..., Season],
                                                                 post_scores: Post, settings: Any,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A stranger in place of a replayed player, same key, same bucket: every size agrees."""
    settings.REBUILD_SAMPLE_SIZE = 1
    r = redis_get()

    def swapped(keys: rankview.Keys, shadow: rankview.CopyMeta) -> None:
        # The catch-up changed p010 on the shadow's side only: it sees p010's second entry
        # (450, bucket 4), hidden from the other side, which still sees p010 at 370 (bucket
        # 3). The stranger takes that entry's place, seen by the shadow's side alone too.
        index, side, other, layout_id = shadow.index, shadow.side, 1 - shadow.side, shadow.layout.layout_id
        bucket_of = shadow.layout.bucket_of(450)
        bucket = keys.bucket(index, layout_id, bucket_of, groups=shadow.groups)
        hidden = keys.hidden(index, other, layout_id, bucket_of, groups=shadow.groups)
        field = keys.lookup_of(index, "p010", shadow.lookup_shards, groups=shadow.groups)
        raw = r.hget(field, "p010")
        assert raw is not None
        views = list(lookup_decode(raw))
        assert views[side] == Seen("450", second=True) and views[other] == Seen("370")
        name = entry_name("p010", True)
        assert r.zrem(bucket, name) == 1 and r.zrem(hidden, hidden_member(-450, name)) == 1
        r.zadd(bucket, {"stranger": -450})
        r.zadd(hidden, {hidden_member(-450, "stranger"): 0})
        views[side] = None
        p010 = lookup_encode((views[0], views[1]))  # the other side's part alone
        stranger = lookup_encode((Seen("450"), None) if side == 0 else (None, Seen("450")))
        assert p010 is not None and stranger is not None
        r.hset(field, "p010", p010)
        r.hset(keys.lookup_of(index, "stranger", shadow.lookup_shards, groups=shadow.groups), "stranger", stranger)

    job = p010_replayed_and_corrupted(season_factory, post_scores, "rr-member", monkeypatch, swapped)
    assert "ledger_replayed_players" in failed_checks(job)
    found = detail(job, "ledger_replayed_players")
    assert "p010: lookup None, ledger 450" in found and "p010: key in bucket 4 None, ledger -450" in found


def test_a_change_the_catch_up_never_applied_is_refused(season_factory: Callable[..., Season], post_scores: Post,
                                                        settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A newcomer's arrival dropped from the stream the catch-up read, a later change applied
    (so the version's watermark is past the arrival): the copy agrees with itself, the
    ledger's count and per-bucket counts do not."""
    settings.REBUILD_SAMPLE_SIZE = 1
    season, ev = seeded(season_factory, post_scores, "rr-missing")
    real = views_parts.stream_range_rows
    monkeypatch.setattr(views_parts, "stream_range_rows",
                        lambda **kwargs: [c for c in real(**kwargs) if c[2] != "newcomer"])

    def write() -> None:
        post_ok(post_scores, season, [ev.result("newcomer", 5)])
        post_ok(post_scores, season, [ev.result("p003", 997)])

    job = rebuild_run(job_id=flushed(season).pk, on_progress=writes_after_the_build(write))
    failed = failed_checks(job)
    assert {"player_count", "ledger_bucket_counts"} <= failed, failed
    assert detail(job, "player_count") == f"ledger {PLAYERS + 1}, version {PLAYERS} (difference -1)"
    low, high = NARROW.range_of(NARROW.bucket_of(5))
    ledger = ledger_rows_count(season=season, queryset=PlayerScore.objects.filter(season=season, score__gte=low,
                                                                                  score__lte=high))
    assert detail(job, "ledger_bucket_counts") == f"bucket 0: ledger {ledger} players, version {ledger - 1}"


def test_a_player_left_on_two_regional_boards_is_refused(season_factory: Callable[..., Season], settings: Any,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The catch-up moved a player to another region but left them on the old board too, its
    bookkeeping counting them there: the index agrees with the counts, the ledger's regional
    counts do not."""
    settings.REBUILD_SAMPLE_SIZE = 1
    board = Board(season_factory(slug="rr-two-boards", regions=REGIONS, layout=NARROW), players=120)
    season = board.season
    publish(season)
    r = redis_get()
    keys = keys_of(season)
    moved: dict[str, str] = {}

    def move() -> None:
        player = next(p for p, (g,) in ((p, (g,)) for p, g in ledger_rows_list(season=season, queryset=PlayerScore
                                                                          .objects.filter(season=season)
                                                                          .values_list("player_id", "region")))
                      if g == "eu")
        board.profiles.set(**{player: "na"})
        board.score([player])  # the region move reaches the stream with the player's next result
        moved["player"] = player

    def also_on_eu(shadow: rankview.CopyMeta, replayed: set[str]) -> None:
        player = moved["player"]
        assert player in replayed
        score = ledger_queryset_of_player(season=season, player_id=player,
                                          queryset=PlayerScore.objects.filter(season=season)).get(player_id=player).score
        bucket = shadow.layout.bucket_of(score)
        r.zadd(keys.bucket(shadow.copy, shadow.layout.layout_id, bucket, "eu", groups=shadow.groups), {player: -score})
        shadow.boards["eu"][0][bucket] += 1

    corrupt_catch_up(monkeypatch, also_on_eu)
    job = rebuild_run(job_id=flushed(season).pk, on_progress=writes_after_the_build(move))
    failed = failed_checks(job)
    assert {"region.eu.player_count", "region.eu.ledger_bucket_counts"} <= failed, failed
    assert not {"region.na.player_count", "player_count", "bucket_counts"} & failed, failed


def test_a_build_write_that_overwrote_a_member_fails_the_build(season_factory: Callable[..., Season],
                                                               post_scores: Post,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A member already in the shadow's bucket (planted at a wrong score before the batch is
    sent): the ZADD updates it instead of adding it, so every bucket's size still adds up;
    the batch's reply says one member fewer was new, and the build stops."""
    season, _ = seeded(season_factory, post_scores, "rr-overwrite")
    r = redis_get()
    keys = keys_of(season)
    real = build._send_build_batch
    layout = current_manifest(season).layout

    def planted_first(r_: Any, keys_: Any, writes: Any, packed: Any, token: Any) -> None:
        copy = writes[0][0]
        meta = rankview.copy_meta_load(r, keys, copy)
        assert meta is not None
        r.zadd(keys.bucket(copy, layout.layout_id, layout.bucket_of(999), groups=meta.groups), {"p001": -1})
        real(r_, keys_, writes, packed, token)

    monkeypatch.setattr(build, "_send_build_batch", planted_first)
    job = flushed(season)
    with pytest.raises(season_index.EpochError, match=r"a build write to .* added \d+ members and fields, not \d+"):
        rebuild_run(job_id=job.pk)
    job.refresh_from_db()
    assert job.status == "failed" and rankview.pointer_get(r, keys) is None
    assert rankview.copy_meta_load(r, keys, job.copy) is None  # the shadows were dropped
    monkeypatch.undo()
    assert season_epoch_advance(season=season).status == "lost"
    again = rebuild_run(job_id=RebuildJob.objects.get(season=season, kind="recovery", status="queued").pk)
    assert again.status == "published", again.report
    assert_matches_ledger(season)


def test_sampled_reads_keep_the_order_and_raise_what_a_read_raised() -> None:
    threads: set[str] = set()
    # The first two reads wait for each other: read one after the other, they would not
    # meet (BrokenBarrierError). A count of the threads seen instead depended on whether
    # the first thread finished every read before the pool started a second.
    together = threading.Barrier(2, timeout=10)

    def read(n: int) -> int:
        threads.add(threading.current_thread().name)
        if n < 2:
            together.wait()
        if n == 13:
            raise ValueError("unlucky")
        return n * n

    assert sampled_reads(read, list(range(12))) == [n * n for n in range(12)]
    assert len(threads) > 1
    with pytest.raises(ValueError, match="unlucky"):
        sampled_reads(read, list(range(20)))


def test_a_build_sent_in_many_small_transactions_is_exact(season_factory: Callable[..., Season],
                                                          monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    """Batches sorted into index order and cut into group scripts of a few members and
    fields (each bucket's ZADD and the shard writes split between them) still build every
    board exactly, each reply checked against its own script."""
    monkeypatch.setattr(build, "BUILD_BATCH", 40)
    settings.VIEW_LOOKUP_SHARDS_MIN = 16
    monkeypatch.setattr(build, "BUILD_SHARD_FILL", 1)  # 16 shards: batches of 40
    monkeypatch.setattr(build, "BUILD_TRANSACTION_WRITES", 7)
    sent: list[int] = []
    real = build._send_build_batch

    def counted(r: Any, keys: Any, writes: Any, packed: Any, token: Any) -> None:
        sent.append(len(writes))
        real(r, keys, writes, packed, token)

    monkeypatch.setattr(build, "_send_build_batch", counted)
    board = Board(season_factory(slug="rr-small-writes", regions=REGIONS, layout=NARROW), players=120)
    season = board.season
    publish(season)
    job = rebuild_run(job_id=flushed(season).pk)
    assert job.status == "published", (job.error, job.report)
    assert len(sent) >= 3 and min(sent) > 1  # several batches, each in several scripts
    assert_boards_match_ledger(season)
    full_check(season)
