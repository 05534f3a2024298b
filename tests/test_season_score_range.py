"""A season's score range (docs/rules.md, Board kinds): `create_season --max-score N` (at
most 2^40), the buckets following the range, writes refused outside it, reads, a split
at 2^40 and a FINAL exact at the top of the range."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.management import CommandError
from rest_framework.test import APIClient

from audit.services import SYSTEM
from leaderboard.core.buckets import MAX_SCORE_LIMIT, BucketLayout, LayoutError
from leaderboard.models import Manifest
from leaderboard.recovery.rebuild import rebuild_publish, rebuild_run, season_split_propose
from seasons.models import Season
from seasons.services import SeasonError, season_create
from tests.support import (
    TEST_ACTOR,
    Events,
    assert_board_equals,
    canonical_sha256,
    closing_season,
    create_season_command,
    current_manifest,
    db_standings,
    final_rows,
    finalize,
    in_season,
    post_ok,
    publish,
    statuses,
)
from tests.support.publication import fast_get, reader_of

Post = Callable[..., Any]
TOP = MAX_SCORE_LIMIT  # 2^40 = 1,099,511,627,776
NOW = datetime.now(UTC)




@pytest.mark.django_db
def test_create_season_takes_a_range_and_the_buckets_follow_it() -> None:
    out = create_season_command("wide", "--max-score", str(TOP))
    assert out.splitlines()[-1] == f"regions: none; tie-break: shared; mode: best; scores: 0..{TOP}, desc"
    layout = Season.objects.get(slug="wide").bucket_layout
    assert (layout.size, layout.max_score, layout.range_of(layout.size - 1)[1]) == (100, TOP, TOP)
    assert layout.range_of(0) == (0, -(-TOP // 100) - 1)
    create_season_command("tiny", "--max-score", "100", "--bucket-width", "10")
    tiny = Season.objects.get(slug="tiny")
    assert (tiny.max_score, tiny.bucket_layout.lower_bounds) == (100, tuple(range(0, 101, 10)))
    # The default range keeps the layout every season had.
    create_season_command("plain")
    assert Season.objects.get(slug="plain").layout == BucketLayout.uniform().as_dict() == {
        "layout_id": 1, "lower_bounds": list(range(0, 1_000_001, 10_000))}
    for bad in ("0", str(TOP + 1)):
        with pytest.raises(CommandError, match=rf"the highest score must be in 1..{TOP} \(2\^40\), got {bad}"):
            create_season_command(f"bad-{bad}", "--max-score", bad)
    with pytest.raises(LayoutError, match="split points must be in 1..100"):
        tiny.bucket_layout.split(at=[101], layout_id=2)


@pytest.mark.django_db
def test_a_first_reached_season_over_a_wide_range_is_refused_with_what_fits() -> None:
    with pytest.raises(SeasonError, match="a first_reached season's sort keys must fit in 53 bits"):
        season_create(slug="fr-wide", name="x", starts_at=NOW, cutoff=NOW + timedelta(days=30), actor=SYSTEM,
                      layout=BucketLayout.uniform(max_score=TOP), tie_break="first_reached")
    season_create(slug="fr-narrow", name="x", starts_at=NOW, cutoff=NOW + timedelta(days=30), actor=SYSTEM,
                  layout=BucketLayout.uniform(width=100, max_score=1_000), tie_break="first_reached")


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_scores_up_to_two_to_the_forty_are_written_ranked_split_and_finalized_exactly(
        season_factory: Callable[..., Season], post_scores: Post) -> None:
    season = closing_season(season_factory, "range-top")
    Season.objects.filter(pk=season.pk).update(layout=BucketLayout.uniform(max_score=TOP).as_dict())
    season.refresh_from_db()
    ev = Events("rt", in_season(season))
    scores = {"top": TOP, "near": TOP - 1, "tie-a": TOP - 1, "mid": 2**39 + 1, "low": 1, "zero": 0}
    post_ok(post_scores, season, [ev.result(p, s) for p, s in scores.items()])
    # One above the range: a 400 naming it, nothing written.
    response = post_scores(season.slug, {"events": [ev.result("over", TOP + 1)]})
    assert response.status_code == 400
    assert response.json()["fields"] == {"events[0].best_score": [f"out of range: must be in 0..{TOP}"]}
    publish(season)
    rank = fast_get("/v1/seasons/range-top/players/near/rank").json()
    assert (rank["rank"], rank["score"]) == (2, TOP - 1)
    top = fast_get("/v1/seasons/range-top/leaderboard/top").json()
    assert [(e["player_id"], e["rank"], e["score"]) for e in top["entries"][:3]] == [
        ("top", 1, TOP), ("near", 2, TOP - 1), ("tie-a", 2, TOP - 1)]
    assert_board_equals(reader_of(season), db_standings(season))

    # A split at the very top: the highest score gets a bucket of its own.
    job = rebuild_run(job_id=season_split_propose(season=season, actor=TEST_ACTOR, split_points=[TOP]).pk)
    assert job.status == "ready", job.report
    rebuild_publish(job=job, actor=TEST_ACTOR)
    layout = current_manifest(season).layout
    assert (layout.size, layout.range_of(layout.size - 1), layout.max_score) == (101, (TOP, TOP), TOP)
    assert_board_equals(reader_of(season), db_standings(season))

    assert finalize(season).state == "FINAL"
    rows = final_rows(season)
    assert rows[:3] == [(1, 1, "top", TOP), (2, 2, "near", TOP - 1), (3, 2, "tie-a", TOP - 1)]
    assert APIClient().get("/v1/seasons/range-top/final/players/top").json()["score"] == TOP
    assert Manifest.objects.get(season=season, is_final=True).content_hash == canonical_sha256(rows)


@pytest.mark.django_db
def test_a_sum_beyond_a_narrow_range_is_out_of_range(season_factory: Callable[..., Season],
                                                     post_scores: Post) -> None:
    season = season_factory(slug="sum-100", mode="sum", layout=BucketLayout.uniform(width=10, max_score=100))
    event = {"match_id": "m", "player_id": "ann", "completed_at": "2026-11-15T12:00:00Z"}
    out = post_ok(post_scores, season, [{**event, "event_id": "a", "points": 60},
                                        {**event, "event_id": "b", "points": 41},
                                        {**event, "event_id": "c", "points": 40}])
    assert statuses(out) == [("applied", ""), ("rejected", "out_of_range"), ("applied", "")]
    assert [r["score"] for r in out] == [60, 60, 100]
