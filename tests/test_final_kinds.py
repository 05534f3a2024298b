"""A FINAL of each board kind (docs/rules.md, How a result sets the score) recomputed from
the ledger alone: every ledger row replayed in the order it was recorded through the
reference model of the season's mode, order and range, the standings ranked by hand, and
their hash written out independently, against the FINAL the service approved."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from leaderboard.core.buckets import BucketLayout
from leaderboard.models import Manifest, ScoreEvent
from seasons.models import Season
from tests.support import Events, canonical_sha256, closing_season, final_rows, finalize, in_season, post_ok, publish
from tests.support.reference import ReferenceLedger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]

# (mode, order, max_score)
KINDS = [("best", "desc", 1_000_000), ("latest", "desc", 1_000_000), ("sum", "desc", 1_000_000),
         ("best", "asc", 1_000_000), ("latest", "asc", 1_000_000), ("sum", "asc", 5_000), ("best", "desc", 2**40)]


def standings(scores: dict[str, int], *, ascending: bool) -> list[tuple[int, int, str, int]]:
    sign = 1 if ascending else -1
    ordered = sorted(scores.items(), key=lambda item: (sign * item[1], item[0].encode()))
    return [(position, 1 + sum(1 for s in scores.values() if sign * s < sign * score), player, score)
            for position, (player, score) in enumerate(ordered, start=1)]


@pytest.mark.parametrize(("mode", "order", "max_score"), KINDS)
def test_a_final_of_each_kind_is_recomputed_from_the_ledger_alone(
        season_factory: Callable[..., Season], post_scores: Callable[..., Any], mode: str, order: str,
        max_score: int) -> None:
    season = closing_season(season_factory, f"fk-{mode}-{order}-{max_score}")
    Season.objects.filter(pk=season.pk).update(mode=mode, order=order,
                                               layout=BucketLayout.uniform(max_score=max_score).as_dict())
    season.refresh_from_db()
    rng = random.Random(f"{mode}{order}{max_score}")
    ev = Events(f"fk{mode}{order}", in_season(season))
    players = [f"p{i:02d}" for i in range(30)]
    for round_ in range(4):
        if mode == "sum":
            # Points that keep most sums in range; some leave it (rejected) at the narrow one.
            events = [{"event_id": f"r{round_}-{p}", "match_id": f"m{round_}", "player_id": p,
                       "points": rng.randint(-300, 1_500), "completed_at": ev.completed_at} for p in players]
        else:
            # Few distinct values, so ties happen; the range's top too.
            events = [ev.result(p, rng.choice([0, 7, max_score // 3, max_score // 3 + 1, max_score]))
                      for p in players]
        post_ok(post_scores, season, events)
        if mode == "sum" and round_ == 3:
            post_ok(post_scores, season, [
                {"event_id": f"c-{p}", "match_id": "m0", "player_id": p, "kind": "correction", "reason": "recount",
                 "corrects": f"r0-{p}", "points": 10, "score_version": 1, "completed_at": ev.completed_at}
                for p in players[:10]])
    publish(season)
    assert finalize(season).state == "FINAL"

    replay = ReferenceLedger(rejection=lambda e: None, latest=mode == "latest", summed=mode == "sum",
                             ascending=order == "asc", max_score=max_score)
    for row in ScoreEvent.objects.filter(season=season).order_by("id").values(
            "event_id", "match_id", "player_id", "best_score", "score_version", "completed_at", "kind",
            "reason", "points", "corrects"):
        replay.apply({k: v for k, v in row.items() if v is not None}, published_version=0)
    expected = standings({p: s for p, (s, _) in replay.players.items()}, ascending=order == "asc")
    assert final_rows(season) == expected
    assert Manifest.objects.get(season=season, is_final=True).content_hash == canonical_sha256(expected)
