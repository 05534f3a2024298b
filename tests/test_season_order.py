"""A season's order (docs/rules.md, How a result sets the score): `create_season --order
asc`, a lower score is better (race times). Every read, the regional and friends boards,
first_reached ties, the live board, reconciliation, rebuild, a split and the FINAL with
its hash follow it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from django.core.management import CommandError
from rest_framework.test import APIClient

from audit.models import AuditEntry
from leaderboard.core.buckets import BucketLayout
from leaderboard.core.live import Subscription
from leaderboard.live.messages import snapshot_message, snapshot_read
from leaderboard.models import FriendList, Manifest
from leaderboard.recovery.rebuild import rebuild_publish, rebuild_run, season_rebuild_start, season_split_propose
from leaderboard.recovery.reconcile import version_reconcile
from leaderboard.redis_client import redis_get
from seasons.models import Season
from seasons.services import final_standings_hash
from tests.support import (
    DEFAULT_KIND,
    TEST_ACTOR,
    Events,
    Profiles,
    closing_season,
    create_season_command,
    current_manifest,
    final_rows,
    finalize,
    in_season,
    keys_of,
    post_ok,
    publish,
)
from tests.support.publication import fast_get
from tests.support.reference import answer_entry

Post = Callable[..., Any]
Row = tuple[int, int, str, int]
NOW = datetime.now(UTC)


def asc_rows(scores: dict[str, int]) -> list[Row]:
    """The standings written out by hand: lower first, then player id bytes; rank = 1 +
    players with a strictly lower score."""
    ordered = sorted(scores.items(), key=lambda item: (item[1], item[0].encode()))
    return [(position, 1 + sum(1 for s in scores.values() if s < score), player, score)
            for position, (player, score) in enumerate(ordered, start=1)]


def entries(rows: list[Row]) -> list[dict[str, Any]]:
    return [answer_entry({"position": p, "rank": r, "player_id": i, "score": s}) for p, r, i, s in rows]


def read(path: str) -> Any:
    response = fast_get(path)
    assert response.status_code == 200, (path, response.content)
    return response.json()


def assert_reads(slug: str, scores: dict[str, int], *, region: str = "") -> None:
    """Every read of the board against the standings written out by hand."""
    rows = asc_rows(scores)
    base = f"/v1/seasons/{slug}" + (f"/regions/{region}" if region else "")
    top = read(f"{base}/leaderboard/top")
    assert top["entries"] == entries(rows) and top["kind"]["order"] == "asc"
    assert read(f"{base}/leaderboard?from_position=2&limit=3")["entries"] == entries(rows[1:4])
    for i, (position, rank, player, score) in enumerate(rows):
        rank_body = read(f"{base}/players/{player}/rank")
        assert (rank_body["position"], rank_body["rank"], rank_body["score"]) == (position, rank, score)
        around = read(f"{base}/players/{player}/neighbors?radius=1")
        assert around["player"] == entries([rows[i]])[0]
        assert around["entries"] == entries(rows[max(0, i - 1):i + 2])




@pytest.mark.django_db
def test_create_season_takes_an_order_prints_and_audits_it() -> None:
    out = create_season_command("race", "--order", "asc")
    assert out.splitlines()[-1] == "regions: none; tie-break: shared; mode: best; scores: 0..1000000, asc"
    assert Season.objects.get(slug="race").board_kind.as_dict() == {**DEFAULT_KIND, "order": "asc"}
    entry = AuditEntry.objects.get(action="season.created", season_slug="race")
    assert entry.after is not None and entry.after["order"] == "asc"
    with pytest.raises(CommandError, match="invalid choice: 'up'"):
        create_season_command("bad", "--order", "up")


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_an_asc_season_ranks_lower_scores_first_everywhere_through_a_final(
        season_factory: Callable[..., Season], post_scores: Post) -> None:
    season = closing_season(season_factory, "race-final")
    Season.objects.filter(pk=season.pk).update(order="asc", regions=["na", "eu"],
                                               layout=BucketLayout.uniform(width=100_000).as_dict())
    season.refresh_from_db()
    Profiles().set(ann="na", bob="na", cy="eu", dee="eu", eve="na")
    ev = Events("race", in_season(season))
    # Race times in ms; each player's best is the lowest, whatever the order it comes in.
    times = {"ann": [71_000, 61_250, 64_000], "bob": [59_900], "cy": [80_000, 59_900], "dee": [999_999, 75_000],
             "eve": [0], "fay": [1_000_000, 1_000_000], "gus": [250_000, 300_000]}
    results = post_ok(post_scores, season, [ev.result(p, t) for p, ts in times.items() for t in ts])
    assert [r["status"] for r in results[:3]] == ["applied", "applied", "unchanged"]
    scores = {p: min(ts) for p, ts in times.items()}
    publish(season)
    assert_reads(season.slug, scores)
    assert_reads(season.slug, {p: scores[p] for p in ("ann", "bob", "eve")}, region="na")

    # Friends: ranked among themselves, lower first.
    FriendList.objects.create(player_id="gus", friends=["ann", "dee", "fay"], graph_version=1, updated_at=NOW)
    friends = read(f"/v1/seasons/{season.slug}/players/gus/friends")["entries"]
    assert [(e["player_id"], e["score"], e["rank"], e["global_rank"]) for e in friends] == [
        ("ann", 61_250, 1, 4), ("dee", 75_000, 2, 5), ("gus", 250_000, 3, 6), ("fay", 1_000_000, 4, 7)]
    # A better time not published yet is pending, and shown as a time.
    post_ok(post_scores, season, [ev.result("gus", 50_000)])
    pending = read(f"/v1/seasons/{season.slug}/players/gus/rank?include_pending=true")
    assert (pending["score"], pending["pending"]["score"]) == (250_000, 50_000)
    # A correction to a worse time is taken (a revocation of a match).
    post_ok(post_scores, season, [ev.correction("bob", 90_000)])
    scores.update(gus=50_000, bob=90_000)
    publish(season)
    assert_reads(season.slug, scores)

    # The live board's first message: the top and the player's window as times.
    subscription = Subscription(player_id="gus", radius=1, region=None)
    snapshot = snapshot_read(season.slug, subscription)
    assert snapshot is not None
    message = snapshot_message(season.slug, season.state, None, snapshot, subscription)
    assert message["top"] == entries(asc_rows(scores)) and message["kind"]["order"] == "asc"
    assert message["player"]["entry"] == entries(asc_rows(scores))[1]
    assert message["player"]["neighbors"] == entries(asc_rows(scores))[:3]

    # Reconciliation, a rebuild and a split see the ledger the same way.
    r = redis_get()
    report = version_reconcile(r=r, keys=keys_of(season), season_id=season.pk,
                               version=current_manifest(season).version)
    assert report.ok, [f for f in report.as_dict()["findings"] if not f["ok"]]
    job = rebuild_run(job_id=season_rebuild_start(season=season, actor=TEST_ACTOR, enqueue=False).pk)
    assert job.status == "published", job.report
    assert_reads(season.slug, scores)
    # Split points are the board's values (max_score - score): 940,001 parts times up to 59,999 ms.
    job = rebuild_run(job_id=season_split_propose(season=season, actor=TEST_ACTOR, split_points=[940_001]).pk)
    assert job.status == "ready", job.report
    rebuild_publish(job=job, actor=TEST_ACTOR)
    assert current_manifest(season).layout.size == 12
    assert_reads(season.slug, scores)

    final = finalize(season)
    assert final.state == "FINAL"
    rows = final_rows(season)
    assert rows == asc_rows(scores)
    # The hash of those rows (with their regional places: the season has regions).
    content_hash = Manifest.objects.get(season=season, is_final=True).content_hash
    assert final_standings_hash(season_id=season.pk) == (content_hash, len(rows))
    body = APIClient().get(f"/v1/seasons/{season.slug}/final/standings").json()
    assert body["entries"][0]["player_id"] == "eve" and body["kind"]["order"] == "asc"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_equal_times_go_to_who_set_them_first_in_an_asc_first_reached_season(
        season_factory: Callable[..., Season], post_scores: Post) -> None:
    season = season_factory(slug="race-fr", order="asc", tie_break="first_reached",
                            layout=BucketLayout.uniform(width=100))
    ev = Events("fr")
    post_ok(post_scores, season, [ev.result("late", 5_000, reached_at="2026-11-15T10:00:02Z"),
                                  ev.result("early", 5_000, reached_at="2026-11-15T10:00:01Z"),
                                  ev.result("slow", 9_000), ev.result("fast", 10)])
    publish(season)
    top = read("/v1/seasons/race-fr/leaderboard/top")["entries"]
    assert [(e["player_id"], e["rank"], e["score"]) for e in top] == [
        ("fast", 1, 10), ("early", 2, 5_000), ("late", 3, 5_000), ("slow", 4, 9_000)]
    report = version_reconcile(r=redis_get(), keys=keys_of(season), season_id=season.pk,
                               version=current_manifest(season).version)
    assert report.ok, [f for f in report.as_dict()["findings"] if not f["ok"]]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_a_sum_season_of_order_asc_ranks_the_lowest_total_first(
        season_factory: Callable[..., Season], post_scores: Post) -> None:
    season = season_factory(slug="golf", order="asc", mode="sum")
    event = {"match_id": "round-1", "completed_at": "2026-11-15T12:00:00Z"}
    post_ok(post_scores, season, [{**event, "event_id": f"{p}-{i}", "player_id": p, "points": n}
                                  for p, strokes in {"ann": [72, 70], "bob": [68, 71], "cy": [75, 64]}.items()
                                  for i, n in enumerate(strokes)])
    publish(season)
    assert read("/v1/seasons/golf/leaderboard/top")["entries"] == entries(asc_rows({"ann": 142, "bob": 139,
                                                                                    "cy": 139}))
