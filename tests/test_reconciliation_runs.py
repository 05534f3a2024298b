"""Continuous reconciliation (leaderboard/recovery/reconcile.py reconciliation_run): each run is recorded,
a correct version passes while the ledger moves on, a corrupted copy is caught with the
failing check named, and the failure counters of /metrics go up."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from leaderboard.metrics.render import metrics_render
from leaderboard.models import ReconciliationRun
from leaderboard.recovery.reconcile import reconciliation_run
from leaderboard.redis_client import redis_get
from leaderboard.tasks import season_reconcile
from seasons.models import Season
from tests.support import NARROW, Events, assert_matches_ledger, current_manifest, keys_of, post_ok, publish

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]

Post = Callable[..., Any]


def seeded(season_factory: Callable[..., Season], post_scores: Post, slug: str) -> tuple[Season, Events]:
    season = season_factory(slug=slug, layout=NARROW)
    ev = Events(tag=slug)
    post_ok(post_scores, season, [ev.result(f"p{i:03d}", (i * 37) % 1000) for i in range(80)])
    publish(season)
    post_ok(post_scores, season, [ev.result("p001", 999)])
    publish(season)
    return season, ev


def failures(run: ReconciliationRun) -> set[str]:
    return {f["check"] for f in run.findings if not f["ok"]}


def metric(text: str, name: str, **labels: str) -> float | None:
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{{wanted}}} "):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_runs_are_recorded_and_pass_while_the_ledger_moves_on(season_factory: Callable[..., Season],
                                                              post_scores: Post) -> None:
    season, ev = seeded(season_factory, post_scores, "recon-ok")
    run = reconciliation_run(season=season, full=False, sample=1000)
    assert (run.ok, run.version, run.mode) == (True, 2, "sampled")
    checks = {f["check"] for f in run.findings}
    assert {"bucket_counts", "total_players", "sampled_ranks", "ledger_scores"} <= checks
    assert "80 players compared" in next(f["detail"] for f in run.findings if f["check"] == "ledger_scores")
    assert run.duration_ms > 0 and run.started_at is not None

    # Scores committed after the version: those players are not compared (the version
    # does not claim to have them yet), the others still are.
    post_ok(post_scores, season, [ev.correction("p002", 1), ev.result("p003", 998), ev.result("new", 5)])
    run = reconciliation_run(season=season, full=True, sample=1000)
    assert (run.ok, run.version, run.mode) == (True, 2, "full"), run.findings
    assert {"players_once", "bucket_checksums", "lookup_equals_index"} <= {f["check"] for f in run.findings}
    assert "78 players compared" in next(f["detail"] for f in run.findings if f["check"] == "ledger_scores")
    assert publish(season) == 3
    assert season_reconcile(season.pk) is True
    assert list(ReconciliationRun.objects.filter(season=season).values_list("version", "ok")) == [
        (3, True), (2, True), (2, True)]
    text = metrics_render()
    assert metric(text, "leaderboard_reconciliation_runs_total", season=season.slug, ok="true") == 3
    assert metric(text, "leaderboard_failures_total", season=season.slug, kind="reconciliation") is None
    assert_matches_ledger(season)


@pytest.mark.parametrize(("corruption", "full", "named", "checksum_failure"), [
    # A stray member: the bucket sizes disagree with the manifest, even in a sampled run,
    # and the ranks recomputed as 1 + count(higher) over every bucket count it.
    ("stray", False, {"bucket_counts", "total_players", "sampled_ranks"}, False),
    ("stray", True, {"bucket_counts", "total_players", "bucket_checksums", "lookup_equals_index", "sampled_ranks"},
     True),
    # A score rewritten in the index and the lookup alike, in its bucket: the copy is
    # self-consistent, the sizes are right; the ledger comparison and the checksums catch it.
    ("rewritten", False, {"ledger_scores"}, False),
    ("rewritten", True, {"bucket_checksums"}, True),
])
def test_a_corrupted_copy_is_detected_and_counted(season_factory: Callable[..., Season], post_scores: Post,
                                                  corruption: str, full: bool, named: set[str],
                                                  checksum_failure: bool) -> None:
    season, _ = seeded(season_factory, post_scores, f"recon-{corruption}-{'full' if full else 'sampled'}")
    r = redis_get()
    keys = keys_of(season)
    manifest = current_manifest(season)
    assert manifest is not None
    before = metrics_render()
    # The version's data is in its index, whose two sides (the two copies) the catch-up
    # made agree: a member written into a bucket is seen by both, as is a lookup value.
    bucket = keys.bucket(manifest.index, manifest.layout.layout_id, 3, groups=manifest.groups)
    if corruption == "stray":
        r.zadd(bucket, {"stray": -350})
    else:
        victim, score = "p010", (10 * 37) % 1000  # 370, in bucket 3
        lookup = keys.lookup_of(manifest.index, victim, manifest.lookup_shards, groups=manifest.groups)
        # One entry named by the player's id and one value, which both sides see.
        assert (r.zscore(bucket, victim), r.hget(lookup, victim)) == (-score, str(score).encode())
        r.zadd(bucket, {victim: -(score + 5)}, xx=True)
        r.hset(lookup, victim, score + 5)
    run = reconciliation_run(season=season, full=full, sample=1000)
    assert run.ok is False and run.version == 2
    assert failures(run) == named, run.findings
    if corruption == "rewritten" and not full:
        detail = next(f["detail"] for f in run.findings if f["check"] == "ledger_scores")
        assert "p010: version 375, ledger 370" in detail
    assert ReconciliationRun.objects.get(pk=run.pk).findings == run.findings

    after = metrics_render()
    slug = season.slug
    assert metric(before, "leaderboard_failures_total", season=slug, kind="reconciliation") is None
    assert metric(after, "leaderboard_failures_total", season=slug, kind="reconciliation") == 1
    assert metric(after, "leaderboard_failures_total", season=slug, kind="checksum") == (
        1 if checksum_failure else None)
    assert metric(after, "leaderboard_reconciliation_runs_total", season=slug, ok="false") == 1
    # A second failing run counts again.
    assert season_reconcile(season.pk) is False
    assert metric(metrics_render(), "leaderboard_failures_total", season=slug, kind="reconciliation") == 2


def test_a_season_whose_views_are_lost_fails_its_reconciliation(season_factory: Callable[..., Season],
                                                                post_scores: Post) -> None:
    season, _ = seeded(season_factory, post_scores, "recon-lost")
    redis_get().flushdb()
    run = reconciliation_run(season=season, full=False, sample=100)
    assert (run.ok, run.version) == (False, None)
    assert failures(run) == {"published"}
    assert metric(metrics_render(), "leaderboard_failures_total", season=season.slug, kind="reconciliation") == 1


def test_a_batch_committing_during_the_spot_check_is_not_a_mismatch(
        season_factory: Callable[..., Season], post_scores: Post, monkeypatch: pytest.MonkeyPatch) -> None:
    from leaderboard.recovery import reconcile

    season = season_factory(slug="spot-race", partitions=8)
    ev = Events(tag="spot-race")
    post_ok(post_scores, season, [ev.result(f"p{i:03d}", 100 + i) for i in range(20)])
    publish(season)
    real = reconcile.PlayerScore
    fired: list[str] = []

    class Objects:
        def using(self, alias: str) -> Any:
            if not fired:
                # Another client's batch commits while the spot check reads the ledger.
                fired.append(alias)
                post_ok(post_scores, season, [ev.result("p005", 999)])
            return real.objects.using(alias)

    class PlayerScores:
        objects = Objects()

    monkeypatch.setattr(reconcile, "PlayerScore", PlayerScores)
    run = reconciliation_run(season=season, full=False, sample=1000)
    assert fired
    assert run.ok, [f for f in run.findings if not f["ok"]]
