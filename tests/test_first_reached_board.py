"""First-to-reach ties end to end (docs/rules.md, Ties decided by who got there first): random
results and corrections with reached_at through the real write API and real epochs, every
read of each version against the brute-force order of the reference model; the invariant
checker, the ledger reconciliation, the friends board and the FINAL standings of such a
season; and the encoding's bounds refused when the season is created."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from leaderboard.core.buckets import BucketLayout
from leaderboard.core.ranking import Standings
from leaderboard.core.tiebreak import instant_ms
from leaderboard.ledger_reads import ledger_rows_list
from leaderboard.models import PlayerScore
from leaderboard.recovery.rebuild import rebuild_publish, rebuild_run, season_rebuild_start, season_split_propose
from leaderboard.recovery.reconcile import version_reconcile
from leaderboard.redis_client import redis_get
from leaderboard.views import rankview
from leaderboard.views.invariants import version_check
from seasons.models import Season
from seasons.services import SeasonError, final_standings_hash
from tests.support import (
    COMPLETED_AT,
    NARROW,
    TEST_ACTOR,
    Events,
    assert_board_equals,
    current_manifest,
    epoch,
    final_rows,
    finalize,
    in_season,
    iso,
    keys_of,
    post_ok,
    publish,
    reader_of,
)
from tests.support.reference import ReferenceLedger, season_rejection

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]

Post = Callable[..., Any]
SEASONS = itertools.count(1)
BASE = datetime.fromisoformat(COMPLETED_AT.replace("Z", "+00:00"))
PLAYERS = ["a", "B", "b", "_", "a.b", "p5", "p6", "p7"]


@dataclass
class Op:
    kind: str  # result | correction
    player: int
    score: int
    # reached_at = BASE + reached_ms (+ 0.4 ms when `sub_ms`: the same millisecond), or none sent
    reached_ms: int | None
    sub_ms: bool


op_strategy = st.builds(
    Op, kind=st.sampled_from(["result", "result", "result", "correction"]), player=st.integers(0, len(PLAYERS) - 1),
    # Few scores around a bucket edge of NARROW (100): ties and bucket moves are frequent.
    score=st.sampled_from([0, 99, 100, 100, 150, 150, 999, 1000]),
    reached_ms=st.one_of(st.none(), st.integers(-3, 3)), sub_ms=st.booleans(),
)


def as_event(ev: Events, op: Op) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    if op.reached_ms is not None:
        at = BASE + timedelta(milliseconds=op.reached_ms, microseconds=400 if op.sub_ms else 0)
        extra["reached_at"] = at.isoformat().replace("+00:00", "Z")
    player = PLAYERS[op.player]
    if op.kind == "correction":
        return ev.correction(player, op.score, **extra)
    return ev.result(player, op.score, **extra)


def model_event(event: dict[str, Any]) -> dict[str, Any]:
    out = {**event, "completed_at": datetime.fromisoformat(event["completed_at"].replace("Z", "+00:00"))}
    if "reached_at" in event:
        out["reached_at"] = datetime.fromisoformat(event["reached_at"].replace("Z", "+00:00"))
    return out


def expected_standings(model: ReferenceLedger) -> Standings:
    return Standings({p: score for p, (score, _) in model.players.items()},
                     {p: instant_ms(at) for p, at in model.reached.items()})


def check_version(season: Season, model: ReferenceLedger) -> None:
    expected = expected_standings(model)
    db = {p: (score, reached) for p, score, reached in ledger_rows_list(
          season=season, queryset=PlayerScore.objects.filter(season=season).values_list("player_id", "score",
                                                                                           "reached_at"))}
    assert db == {p: (score, model.reached[p]) for p, (score, _) in model.players.items()}
    reader = reader_of(season)
    assert_board_equals(reader, expected, players=PLAYERS, absent=["never-seen"], radius=10, window_limits=(1, 3))
    r, keys = redis_get(), keys_of(season)
    report = version_check(r=r, keys=keys, full=True, sample=50)
    assert report.ok, report.failures()
    report = version_reconcile(r=r, keys=keys, season_id=season.pk, version=current_manifest(season).version,
                               sample=50)
    assert report.ok, report.failures()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(rounds=st.lists(st.tuples(st.lists(op_strategy, min_size=1, max_size=12), st.booleans()),
                       min_size=1, max_size=3),
       layout=st.sampled_from(["narrow", "default"]))
def test_first_reached_versions_match_the_reference_model(
    rounds: list[tuple[list[Op], bool]], layout: str, season_factory: Callable[..., Season], post_scores: Post
) -> None:
    rankview.manifest_cache_clear()
    season = season_factory(slug=f"fr-{next(SEASONS)}", tie_break="first_reached",
                            layout=NARROW if layout == "narrow" else BucketLayout.uniform())
    ev = Events(tag=season.slug)
    model = ReferenceLedger(rejection=season_rejection(starts_at=season.starts_at, cutoff=season.cutoff),
                            reached_orders=True)
    for ops, one_batch in rounds:
        events = [as_event(ev, op) for op in ops]
        season.refresh_from_db(fields=["published_version"])
        expected = [model.apply(model_event(e), published_version=season.published_version) for e in events]
        if one_batch:
            got = post_ok(post_scores, season, events)
        else:
            got = [result for e in events for result in post_ok(post_scores, season, [e])]
        assert got == expected
        result = epoch(season)
        assert result.status in ("published", "idle"), result
        if result.status == "published" or result.version:
            check_version(season, model)


def test_same_millisecond_shares_a_rank_and_earlier_wins(season_factory: Callable[..., Season],
                                                         post_scores: Post) -> None:
    season = season_factory(slug="fr-ms", tie_break="first_reached")
    ev = Events(tag="ms")
    at = "2026-11-15T11:00:00.123"
    post_ok(post_scores, season, [
        ev.result("late", 500, reached_at=f"{at}9Z"),  # .1239 -> .123: same millisecond as "zed"
        ev.result("zed", 500, reached_at=f"{at}Z"),
        ev.result("early", 500, reached_at="2026-11-15T11:00:00.122Z"),
        ev.result("top", 501, reached_at="2026-11-15T11:59:00Z"),
    ])
    publish(season)
    _, top = reader_of(season).top(10)
    assert [(e["player_id"], e["position"], e["rank"]) for e in top] == [
        ("top", 1, 1), ("early", 2, 2), ("late", 3, 3), ("zed", 4, 3)]
    assert reader_of(season).rank("zed").entry.rank == 3  # type: ignore[union-attr]


def test_an_equal_score_later_keeps_reached_at_and_a_correction_moves_it(
        season_factory: Callable[..., Season], post_scores: Post) -> None:
    season = season_factory(slug="fr-keep", tie_break="first_reached")
    ev = Events(tag="keep")
    post_ok(post_scores, season, [ev.result("x", 300, reached_at="2026-11-15T10:00:00Z"),
                                  ev.result("y", 300, reached_at="2026-11-15T10:00:01Z")])
    # x repeats the score later: still first. Then y's reached_at is corrected to earlier.
    (again,) = post_ok(post_scores, season, [ev.result("x", 300, reached_at="2026-11-15T11:00:00Z")])
    assert again["status"] == "unchanged"
    publish(season)
    assert [e["player_id"] for e in reader_of(season).top(2)[1]] == ["x", "y"]
    (fixed,) = post_ok(post_scores, season, [ev.correction("y", 300, reached_at="2026-11-15T09:00:00Z")])
    assert fixed["status"] == "applied" and fixed["pending_version"] is not None
    publish(season)
    assert [(e["player_id"], e["rank"]) for e in reader_of(season).top(2)[1]] == [("y", 1), ("x", 2)]


def test_reached_at_outside_the_season_is_rejected_in_a_first_reached_season(
        season_factory: Callable[..., Season], post_scores: Post) -> None:
    season = season_factory(slug="fr-out", tie_break="first_reached")
    shared = season_factory(slug="shared-out")
    ev = Events(tag="out")
    (result,) = post_ok(post_scores, season, [ev.result("x", 5, reached_at="2020-01-01T00:00:00Z")])
    assert (result["status"], result["reason"]) == ("rejected", "reached_before_season_start")
    (result,) = post_ok(post_scores, shared, [ev.result("x", 5, reached_at="2020-01-01T00:00:00Z")])
    assert result["status"] == "applied"


def test_friends_board_orders_equal_scores_by_who_reached_them_first(
        season_factory: Callable[..., Season], post_scores: Post, api: Any) -> None:
    season = season_factory(slug="fr-friends", tie_break="first_reached")
    ev = Events(tag="fr")
    post_ok(post_scores, season, [ev.result("me", 70, reached_at="2026-11-15T10:00:02Z"),
                                  ev.result("pal", 70, reached_at="2026-11-15T10:00:01Z"),
                                  ev.result("other", 90)])
    publish(season)
    from leaderboard.models import FriendList
    FriendList.objects.create(player_id="me", friends=["pal"], graph_version=1, updated_at=datetime.now(UTC))
    body = api.get(f"/v1/seasons/{season.slug}/players/me/friends").json()
    assert [(e["player_id"], e["rank"], e["global_rank"]) for e in body["entries"]] == [("pal", 1, 2), ("me", 2, 3)]


def test_final_standings_of_a_first_reached_season_rank_and_hash_reached_at(
        season_factory: Callable[..., Season], post_scores: Post) -> None:
    cutoff = datetime.now(UTC) - timedelta(minutes=5)
    season = season_factory(slug="fr-final", tie_break="first_reached", starts_at=cutoff - timedelta(days=10),
                            cutoff=cutoff)
    ev = Events(tag="final", completed_at=in_season(season))
    early, late = season.starts_at + timedelta(hours=1), season.starts_at + timedelta(hours=2, milliseconds=7)
    post_ok(post_scores, season, [ev.result("b-late", 40, reached_at=iso(late)),
                                  ev.result("z-early", 40, reached_at=iso(early)),
                                  ev.result("a-late", 40, reached_at=iso(late)), ev.result("top", 41)])
    publish(season)
    finalize(season)
    rows = final_rows(season)
    assert [(pos, rank, p) for pos, rank, p, _ in rows] == [(1, 1, "top"), (2, 2, "z-early"), (3, 3, "a-late"),
                                                            (4, 3, "b-late")]
    reached = {"top": season.cutoff - timedelta(hours=1), "z-early": early, "a-late": late, "b-late": late}

    def text(at: datetime) -> str:  # RFC 3339, UTC, milliseconds
        return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"

    lines = "".join(f"{pos}\t{rank}\t{p}\t{score}\t{text(reached[p])}\n" for pos, rank, p, score in rows)
    digest, count = final_standings_hash(season_id=season.pk)
    assert count == 4 and digest == hashlib.sha256(lines.encode()).hexdigest()
    season.refresh_from_db()
    body = APIClient().get(f"/v1/seasons/{season.slug}/final/standings").json()
    assert [e.get("reached_at") for e in body["entries"]] == [text(reached[p]) for _, _, p, _ in rows]


def test_a_first_reached_season_whose_keys_would_not_fit_is_refused(season_factory: Callable[..., Season]) -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    with pytest.raises(SeasonError, match="53 bits"):
        season_factory(slug="fr-long", tie_break="first_reached", starts_at=start,
                       cutoff=start + timedelta(days=365), layout=BucketLayout.single())
    # The same dates with the default (narrower) buckets fit; a shared season never checks.
    season_factory(slug="fr-ok", tie_break="first_reached", starts_at=start, cutoff=start + timedelta(days=365))
    season_factory(slug="shared-long", starts_at=start, cutoff=start + timedelta(days=365),
                   layout=BucketLayout.single())


def test_a_rebuild_and_a_split_of_a_first_reached_season_compare_and_publish_the_same_order(
        season_factory: Callable[..., Season], post_scores: Post) -> None:
    season = season_factory(slug="fr-rebuild", tie_break="first_reached", layout=NARROW)
    ev = Events(tag="rb")
    post_ok(post_scores, season, [ev.result(f"p{i}", 150 + i % 2, reached_at=f"2026-11-15T10:00:0{i % 4}.00{i}Z")
                                  for i in range(8)])
    publish(season)
    expected = expected_board(season)
    job = rebuild_run(job_id=season_rebuild_start(season=season, actor=TEST_ACTOR, enqueue=False).pk)
    assert job.status == "published", job.report
    job = rebuild_run(job_id=season_split_propose(season=season, actor=TEST_ACTOR, split_points=[151]).pk)
    assert job.status == "ready", job.report
    rebuild_publish(job=job, actor=TEST_ACTOR)
    assert current_manifest(season).layout.size == NARROW.size + 1
    assert_board_equals(reader_of(season), expected, radius=3)


def test_a_wrong_reached_at_in_the_live_copy_fails_the_checks(season_factory: Callable[..., Season],
                                                              post_scores: Post) -> None:
    season = season_factory(slug="fr-drift", tie_break="first_reached")
    ev = Events(tag="dr")
    post_ok(post_scores, season, [ev.result("x", 500, reached_at="2026-11-15T10:00:00Z"),
                                  ev.result("y", 500, reached_at="2026-11-15T10:00:01Z")])
    publish(season)
    r, keys, live = redis_get(), keys_of(season), current_manifest(season)
    assert live.ties is not None
    # y's reached_at moved ahead of x's behind the materializer's back, in index and lookup.
    bucket = live.layout.bucket_of(500)
    high = live.layout.range_of(bucket)[1]
    r.zadd(keys.bucket(live.copy, live.layout.layout_id, bucket, groups=live.groups),
           {"y": live.ties.key(500, 0, high)})
    r.hset(keys.lookup_of(live.copy, "y", live.lookup_shards, groups=live.groups), "y", "500:0")
    report = version_check(r=r, keys=keys, full=True, sample=10)
    assert {f.check for f in report.failures()} == {"bucket_checksums"}
    report = version_reconcile(r=r, keys=keys, season_id=season.pk, version=live.version, sample=10)
    # The manifest's checksums still match the ledger; the index no longer matches them.
    assert {f.check for f in report.failures()} == {"bucket_checksums", "ledger_sampled_ranks"}


def expected_board(season: Season) -> Standings:
    rows = ledger_rows_list(season=season, queryset=PlayerScore.objects.filter(season=season).values_list(
        "player_id", "score", "reached_at"))
    return Standings({p: s for p, s, _ in rows}, {p: at for p, _, at in rows})
