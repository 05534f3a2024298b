"""A `sum` season (docs/rules.md, Board kinds): results carry points, a player's score is
the sum of their accepted results' points, a correction amends one result's points by
version, and a FINAL is recomputable from the ledger rows alone."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from rest_framework.test import APIClient

from leaderboard.core.ranking import Standings
from leaderboard.ingest.services import score_events_apply
from leaderboard.models import ApiClient, Manifest, PlayerScore, ScoreChange, ScoreEvent
from seasons.models import Season
from seasons.services import season_seal_ingest
from tests.conftest import SEASON_CUTOFF, SEASON_START
from tests.support import (
    TEST_ACTOR,
    assert_board_equals,
    canonical_sha256,
    closing_season,
    db_standings,
    final_rows,
    finalize,
    held_correction_approve,
    in_season,
    post_ok,
    publish,
    statuses,
)
from tests.support.publication import fast_get, reader_of
from tests.support.reference import (
    ReferenceLedger,
    Script,
    as_score_event,
    reference_run,
    season_rejection,
    sum_event_scripts,
)

Post = Callable[..., Any]
_ids = itertools.count(1)


class Points:
    """A sum season's events: results with points, corrections of one result by version."""

    def __init__(self, tag: str, completed_at: str = "2026-11-15T12:00:00Z") -> None:
        self.tag, self.completed_at = tag, completed_at

    def result(self, player_id: str, points: int, **extra: Any) -> dict[str, Any]:
        n = next(_ids)
        return {"event_id": f"{self.tag}-{n}", "match_id": f"{self.tag}-m{n}", "player_id": player_id,
                "points": points, "completed_at": self.completed_at, **extra}

    def correction(self, result: dict[str, Any], points: int, version: int, **extra: Any) -> dict[str, Any]:
        n = next(_ids)
        return {"event_id": f"{self.tag}-c{n}", "match_id": result["match_id"], "player_id": result["player_id"],
                "kind": "correction", "reason": "recount", "corrects": result["event_id"], "points": points,
                "score_version": version, "completed_at": self.completed_at, **extra}


def scores(season: Season) -> dict[str, int]:
    return dict(PlayerScore.objects.filter(season=season).values_list("player_id", "score"))


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_a_sum_season_adds_points_and_amends_them_by_correction_over_http(
        season_factory: Callable[..., Season], post_scores: Post) -> None:
    season = season_factory(slug="xp", mode="sum")
    ev = Points("xp")
    ann1, ann2, bob1 = ev.result("ann", 30), ev.result("ann", 25), ev.result("bob", 50)
    results = post_ok(post_scores, season, [ann1, ann2, bob1, ev.result("cy", 0)])
    assert [(r["status"], r["score"], r["score_version"]) for r in results] == [
        ("applied", 30, 1), ("applied", 55, 2), ("applied", 50, 1), ("applied", 0, 1)]
    publish(season)
    assert fast_get("/v1/seasons/xp/players/ann/rank").json()["rank"] == 1

    # Version 2 of a correction arrives before version 1: the older one is stale.
    v2, v1 = ev.correction(ann1, 5, 2), ev.correction(ann1, 100, 1)
    out = post_ok(post_scores, season, [v2, v1])
    assert [(r["status"], r.get("reason", ""), r["score"]) for r in out] == [
        ("applied", "", 30), ("stale", "score_version_not_newer", 30)]
    # Resent: the same answers, nothing changes.
    again = post_ok(post_scores, season, [v2, v1])
    assert [(r["status"], r["first_status"], r["score"]) for r in again] == [
        ("duplicate", "applied", 30), ("duplicate", "stale", 30)]
    # A correction of an id never sent, or of another player's result, names no result.
    unknown = post_ok(post_scores, season, [
        ev.correction({**ann1, "event_id": "never-sent"}, 1, 1), {**ev.correction(bob1, 1, 1), "player_id": "ann"}])
    assert statuses(unknown) == [("rejected", "unknown_event")] * 2
    # A sum that would leave 0..max-score changes nothing.
    below = post_ok(post_scores, season, [ev.result("ann", -31), ev.correction(bob1, -1, 1)])
    assert statuses(below) == [("rejected", "out_of_range")] * 2
    assert [r["score"] for r in below] == [30, 50]
    above = post_ok(post_scores, season, [ev.result("bob", 999_951)])
    assert statuses(above) == [("rejected", "out_of_range")]
    # A conflicting resend (same id, other points) is a conflict.
    (conflict,) = post_ok(post_scores, season, [{**ann2, "points": 26}])
    assert conflict["status"] == "conflict"
    # Zero points: recorded, unchanged.
    (zero,) = post_ok(post_scores, season, [ev.result("cy", 0)])
    assert (zero["status"], zero["score"], zero["pending_version"]) == ("unchanged", 0, None)

    assert scores(season) == {"ann": 30, "bob": 50, "cy": 0}
    publish(season)
    top = fast_get("/v1/seasons/xp/leaderboard/top").json()
    assert [(e["player_id"], e["score"]) for e in top["entries"]] == [("bob", 50), ("ann", 30), ("cy", 0)]
    assert_board_equals(reader_of(season), db_standings(season))


@pytest.mark.django_db
def test_each_mode_refuses_the_other_modes_fields_with_a_reason(
        season_factory: Callable[..., Season], post_scores: Post) -> None:
    season_factory(slug="summed", mode="sum")
    season_factory(slug="bested")
    ev = Points("fields")
    response = post_scores("summed", {"events": [{**ev.result("ann", 5), "best_score": 5}]})
    assert response.status_code == 400
    assert response.json()["fields"] == {
        "events[0].best_score": ["unknown field: a sum season's events carry points, not best_score"]}
    response = post_scores("summed", {"events": [{k: v for k, v in ev.correction(ev.result("a", 1), 1, 1).items()
                                                  if k not in ("corrects", "score_version")}]})
    assert response.status_code == 400
    assert response.json()["fields"] == {
        "events[0].corrects": ["is required for a correction in a sum season"],
        "events[0].score_version": ["is required for a correction in a sum season"]}
    response = post_scores("summed", {"events": [{**ev.result("ann", 5), "corrects": "x"}]})
    assert response.json()["fields"] == {"events[0].corrects": ["only a correction names the result it corrects"]}
    response = post_scores("summed", {"events": [ev.result("ann", 2**41)]})
    assert response.json()["fields"]["events[0].points"] == [
        "out of range: must be in -1099511627776..1099511627776"]
    response = post_scores("bested", {"events": [{**ev.result("ann", 5), "best_score": 5, "score_version": 1}]})
    assert response.status_code == 400
    assert response.json()["fields"] == {
        "events[0].points": ["unknown field: only a sum season's events carry it (this season's mode is best)"]}
    assert not ScoreEvent.objects.exists()


_slugs = itertools.count(1)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(script=sum_event_scripts(starts_at=SEASON_START, cutoff=SEASON_CUTOFF, max_events=30))
@pytest.mark.django_db
def test_score_events_apply_in_a_sum_season_matches_the_reference_model(
        season_factory: Callable[..., Season], writer: tuple[ApiClient, str], script: Script) -> None:
    season = season_factory(slug=f"sum-prop-{next(_slugs)}", mode="sum")
    model, expected = reference_run(script, season_rejection(starts_at=season.starts_at, cutoff=season.cutoff),
                                    summed=True)
    outcomes: list[dict[str, Any]] = []
    for batch, published in zip(script.batches, script.published, strict=True):
        Season.objects.filter(pk=season.pk).update(published_version=published)
        result = score_events_apply(season=season, events=[as_score_event(e) for e in batch], client=writer[0])
        outcomes.extend(o.as_dict() for o in result.outcomes)
    assert outcomes == expected
    assert {p: (s, v) for p, s, v in PlayerScore.objects.filter(season=season).values_list(
        "player_id", "score", "score_version")} == model.players
    assert [tuple(row) for row in ScoreChange.objects.filter(season=season).order_by("id").values_list(
        "player_id", "old_score", "new_score", "score_version", "event_id")] == model.changes
    # The ledger keeps each event's points and the result it corrects.
    kept = dict(ScoreEvent.objects.filter(season=season).values_list("event_id", "points"))
    assert kept == {event_id: key[-1][1] if key[-1][0] == "points" else key[-2][1]
                    for event_id, (key, _) in model.ledger.items()}


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_a_sum_seasons_final_is_recomputed_from_the_ledger_rows_alone(
        season_factory: Callable[..., Season], post_scores: Post) -> None:
    season = closing_season(season_factory, "sum-final")
    Season.objects.filter(pk=season.pk).update(mode="sum")
    season.refresh_from_db()
    ev = Points("sf", completed_at=in_season(season))
    firsts = [ev.result(f"p{i:02d}", 10 * (i % 7)) for i in range(40)]
    post_ok(post_scores, season, firsts)
    post_ok(post_scores, season, [ev.result(f"p{i:02d}", i % 5 - 1) for i in range(40)])
    # Amendments in any order; some stale, one of an unknown id.
    post_ok(post_scores, season, [ev.correction(firsts[3], 70, 2), ev.correction(firsts[3], 1, 1),
                                  ev.correction(firsts[8], 0, 1), ev.correction({**firsts[9], "event_id": "zz"}, 5, 1)])
    post_ok(post_scores, season, [ev.correction(firsts[8], 33, 3)])
    # After the seal, the match service's amendment is held; staff apply it as the sum it comes to.
    season_seal_ingest(season=season, actor=TEST_ACTOR)
    (held,) = post_ok(post_scores, season, [ev.correction(firsts[6], 0, 1)])
    assert (held["status"], held["reason"], held["score"]) == ("held", "correction_after_seal", 60)
    assert held_correction_approve(season, held["event_id"]).status == "applied"
    # The approved amendment counts as that result's: a newer one amends from it.
    (again,) = post_ok(post_scores, season, [ev.correction(firsts[6], 7, 1)])
    assert (again["status"], again["reason"]) == ("held", "correction_after_seal")
    assert held_correction_approve(season, again["event_id"]).status == "stale"
    (newer,) = post_ok(post_scores, season, [ev.correction(firsts[6], 7, 2)])
    assert held_correction_approve(season, newer["event_id"]).status == "applied"
    final = finalize(season, seal=False)
    assert final.state == "FINAL"

    # Replay every ledger row in the order it was recorded through the rules, with
    # nothing else: the FINAL's scores, ranks and hash come out. A held row changed
    # nothing; the staff event that applied it follows it.
    replay = ReferenceLedger(rejection=lambda e: "held" if e["status"] == "held" else None, summed=True)
    for row in ScoreEvent.objects.filter(season=season).order_by("id").values(
            "event_id", "match_id", "player_id", "best_score", "score_version", "completed_at", "kind",
            "reason", "points", "corrects", "status"):
        replay.apply({k: v for k, v in row.items() if v is not None}, published_version=0)
    ranked = Standings({p: s for p, (s, _) in replay.players.items()})
    expected = [(e.position, e.rank, e.player_id, e.score) for e in ranked.window(from_position=1, limit=len(ranked))]
    assert final_rows(season) == expected
    assert (scores(season)["p03"], scores(season)["p08"], scores(season)["p06"]) == (70 + 2, 33 + 2, 7)
    final_manifest = Manifest.objects.get(season=season, is_final=True)
    assert final_manifest.content_hash == canonical_sha256(expected)
    assert APIClient().get("/v1/seasons/sum-final/final/players/p03").json()["score"] == 72
