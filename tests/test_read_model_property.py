"""The reference-model test of the read side: random streams of results, corrections,
duplicates, stale events, ties and bucket moves go through the real write API and real
epochs on a real database and Redis; then every read of each published version (top,
rank, neighbours with radius 10, a window at every position) is compared with the
brute-force `Standings` (docs/rules.md, Ranking) of the current-scores table at that version."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from leaderboard.core.buckets import BucketLayout
from leaderboard.core.ranking import Standings
from leaderboard.redis_client import redis_get
from leaderboard.views import rankview
from leaderboard.views.invariants import version_check
from seasons.models import Season
from tests.support import (
    NARROW,
    Events,
    assert_board_equals,
    assert_idle_copy_caught_up,
    board_read,
    change_head,
    current_manifest,
    db_scores,
    epoch,
    keys_of,
    post_ok,
    reader_of,
    scores_at_watermark,
)
from tests.support.reference import answer_entry

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]

Post = Callable[..., Any]
SEASONS = itertools.count(1)

# name -> (layout, score strategy). Narrow buckets make moves between buckets frequent;
# the default layout gets scores around its bucket edges; "sparse" has many empty buckets.
LAYOUTS: dict[str, tuple[BucketLayout, st.SearchStrategy[int]]] = {
    "narrow": (NARROW, st.integers(0, 1000)),
    "default": (BucketLayout.uniform(), st.one_of(
        st.integers(0, 60_000), st.sampled_from([0, 9_999, 10_000, 19_999, 20_000, 999_999, 1_000_000]))),
    "single": (BucketLayout.single(), st.integers(0, 1000)),
    "sparse": (BucketLayout.uniform(width=1000), st.integers(0, 30_000)),
}
# Ids that differ by case and by punctuation: display order is by UTF-8 bytes.
TRICKY_IDS = ["a", "B", "Z", "_", "b", "A", "-", "a.b", "a:b", "a-b", "0", "9z", "Zz", "zZ"]


@dataclass
class Op:
    kind: str  # result | correction | duplicate | stale
    player: int
    score: int
    pick: int = 0  # which earlier event a duplicate resends


@dataclass
class Round:
    ops: list[Op]
    one_batch: bool
    epochs: int


@dataclass
class Scenario:
    layout: str
    players: int
    tie_above: int | None  # players above a 150-player tie, or no tie block
    catch_up: bool  # EPOCH_CATCH_UP: the older copy brought up to date right after each publication
    rounds: list[Round] = field(default_factory=list)


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    layout = draw(st.sampled_from(list(LAYOUTS)))
    scores = LAYOUTS[layout][1]
    players = draw(st.integers(1, 30))
    tie_above = draw(st.one_of(st.none(), st.integers(0, 99)))
    op = st.builds(
        Op,
        kind=st.sampled_from(["result", "result", "result", "correction", "duplicate", "stale"]),
        player=st.integers(0, players - 1),
        score=scores,
        pick=st.integers(0, 10_000),
    )
    n_rounds = draw(st.integers(1, 2 if tie_above is not None else 4))
    rounds = [
        Round(ops=draw(st.lists(op, min_size=0, max_size=25)), one_batch=draw(st.booleans()),
              epochs=draw(st.integers(0 if i < n_rounds - 1 else 1, 2)))
        for i in range(n_rounds)
    ]
    return Scenario(layout=layout, players=players, tie_above=tie_above, catch_up=draw(st.booleans()),
                    rounds=rounds)


def player_name(i: int) -> str:
    return TRICKY_IDS[i] if i < len(TRICKY_IDS) else f"p{i:03d}"


def initial_events(scenario: Scenario, ev: Events) -> list[dict[str, Any]]:
    """A tie of 150 equal scores straddling positions 100/101 (when drawn)."""
    if scenario.tie_above is None:
        return []
    layout = LAYOUTS[scenario.layout][0]
    tie = 500 if layout.size in (11, 1) else 20_000
    events = [ev.result(f"hi{i:02d}", tie + 1 + i) for i in range(scenario.tie_above)]
    events += [ev.result(f"tie{i:03d}", tie) for i in range(150)]
    return events


def round_events(rnd: Round, ev: Events) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for op in rnd.ops:
        player = player_name(op.player)
        if op.kind == "duplicate" and ev.sent:
            events.append(dict(ev.sent[op.pick % len(ev.sent)]))
        elif op.kind == "stale" and player in ev.versions:
            events.append(ev.stale(player, op.score))
        elif op.kind == "correction":
            events.append(ev.correction(player, op.score))
        else:
            events.append(ev.result(player, op.score))
    return events


def check_version(season: Season, client: APIClient, players: set[str]) -> tuple[int, list[Any]]:
    """Everything the version answers equals the reference built from the database."""
    manifest = current_manifest(season)
    head = change_head(season)
    assert head <= manifest.watermark, "the version misses committed changes"
    scores = db_scores(season)
    # The ledger's current scores are exactly what its change stream replays to.
    assert scores_at_watermark(season, manifest.watermark) == scores
    expected = Standings(scores)
    reader = reader_of(season)
    version = assert_board_equals(reader, expected, players=players, absent=["never-seen"], radius=10,
                                  window_limits=(1, 7))
    assert version == manifest.version
    # The same through HTTP, for the top and a few players.
    body = client.get(f"/v1/seasons/{season.slug}/leaderboard/top").json()
    assert body["leaderboard_version"] == version
    assert body["entries"] == [answer_entry(e) for e in expected.top(100)]
    for player_id in sorted(scores)[:3]:
        body = client.get(f"/v1/seasons/{season.slug}/players/{player_id}/neighbors", {"radius": 10}).json()
        assert body["entries"] == [answer_entry(e) for e in expected.neighbors(player_id, 10)]
        assert body["player"] == answer_entry(expected.entry(player_id))  # type: ignore[arg-type]
    report = version_check(r=redis_get(), keys=keys_of(season), full=True, sample=50, seed=version)
    assert report.ok, report.failures()
    return version, board_read(reader, version)[1]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(scenario=scenarios())
def test_published_versions_match_the_reference_model(
    scenario: Scenario, season_factory: Callable[..., Season], post_scores: Post
) -> None:
    with override_settings(EPOCH_CATCH_UP=scenario.catch_up):
        published_versions_check(scenario, season_factory, post_scores)


def published_versions_check(scenario: Scenario, season_factory: Callable[..., Season], post_scores: Post) -> None:
    rankview.manifest_cache_clear()
    season = season_factory(slug=f"prop-{next(SEASONS)}", layout=LAYOUTS[scenario.layout][0])
    client = APIClient()
    ev = Events(tag=season.slug)
    first = initial_events(scenario, ev)
    if first:
        post_ok(post_scores, season, first)
    seen: set[str] = {e["player_id"] for e in first}
    history: list[tuple[int, list[Any]]] = []  # (version, its whole board) as published
    for rnd in scenario.rounds:
        events = round_events(rnd, ev)
        seen |= {e["player_id"] for e in events}
        if events and rnd.one_batch:
            post_ok(post_scores, season, events)
        else:
            for event in events:
                post_ok(post_scores, season, [event])
        if not rnd.epochs:
            continue
        results = [epoch(season) for _ in range(rnd.epochs)]
        assert results[0].status in ("published", "idle")
        assert all(r.status == "idle" for r in results[1:]), results
        if results[0].status == "idle":
            # Nothing changed since the last version: same board.
            assert history and board_read(reader_of(season))[1] == history[-1][1]
            continue
        history.append(check_version(season, client, seen))
        if scenario.catch_up and len(history) >= 2:
            # The older copy was brought up to this version: it holds what the current
            # one holds, and the version it served is gone.
            assert_idle_copy_caught_up(season)
            with pytest.raises(rankview.VersionExpired):
                reader_of(season).window(1, 10, history[-2][0])
        elif len(history) >= 2:
            # The previous version is still retained and answers exactly as when it was current.
            previous, board = history[-2]
            assert board_read(reader_of(season), previous) == (previous, board)
        if len(history) >= 3:
            with pytest.raises(rankview.VersionExpired):
                reader_of(season).window(1, 10, history[-3][0])
