"""A build from the scores reads the season in batches of at most BUILD_BATCH_MAX rows, however
many lookup shards the copy has (a 50M-player copy has 1,048,576: four rows a shard would be
4.2M rows a batch, held twice in Python)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from leaderboard.models import RebuildJob
from leaderboard.recovery.rebuild import rebuild_run, season_rebuild_start
from leaderboard.views import build
from seasons.models import Season
from tests.support import NARROW, TEST_ACTOR, Events, assert_matches_ledger, post_ok, publish

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]


def test_build_batches_are_capped_whatever_the_shard_fill(season_factory: Callable[..., Season],
                                                          post_scores: Callable[..., Any],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    season = season_factory(slug="batch-cap", layout=NARROW)
    ev = Events(tag="batch-cap")
    post_ok(post_scores, season, [ev.result(f"p{i:03d}", (i * 37) % 1000) for i in range(150)])
    publish(season)
    # 16 shards x 4 = 64 rows a batch by the fill; the cap makes it 25.
    monkeypatch.setattr(build, "BUILD_BATCH", 10)
    monkeypatch.setattr(build, "BUILD_SHARD_FILL", 4)
    monkeypatch.setattr(build, "BUILD_BATCH_MAX", 25)
    job = season_rebuild_start(season=season, actor=TEST_ACTOR, reason="batch cap", enqueue=False)
    dones: list[int] = []

    def on_progress(update: RebuildJob) -> None:
        if update.status == "building":
            dones.append(update.done)

    job = rebuild_run(job_id=job.pk, on_progress=on_progress)
    assert job.status == RebuildJob.Status.PUBLISHED, (job.error, job.report)
    steps = [b - a for a, b in zip(dones, dones[1:], strict=False) if b > a]
    assert dones[-1] == 150 and steps and max(steps) <= 25, dones
    assert_matches_ledger(season)
