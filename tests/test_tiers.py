"""Percentile and tiers (docs/rules.md, Percentile and tiers): `create_season --tiers` parsed
and refused with a reason; every entry and the rank answer name the tier of the rank, the
rank answer its percentile, tied players sharing both; the FINAL standings hold the tier
of the FINAL version, covered by the content hash. Real PostgreSQL and Redis."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from hypothesis import given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from leaderboard.core.ranking import Standings
from leaderboard.core.tiers import Tier, TiersError, percentile, tiers_parse
from seasons.models import FinalStanding, Season
from tests.support import Events, apply_events, fast_get, publish
from tests.support.lifecycle import finalize, in_season, staff

TIERS = "Champion:top2,Diamond:10%,Gold:50%,Bronze"


# --- the core --------------------------------------------------------------------------------


def test_tiers_parse_and_say_what_is_wrong() -> None:
    parsed = tiers_parse("Champion:top100, Diamond:1%,Gold:10%,Silver:50%,Bronze")
    assert parsed is not None and parsed.text() == "Champion:top100,Diamond:1%,Gold:10%,Silver:50%,Bronze"
    assert parsed.tiers[1] == Tier(name="Diamond", share=Fraction(1))
    assert tiers_parse("") is None and tiers_parse("  ") is None
    assert tiers_parse("Elite:0.5%,Rest").tiers[0].share == Fraction(1, 2)  # type: ignore[union-attr]
    for text, says in [
        ("Gold:10%,Diamond:1%,Rest", "must be above the tier before it (10%)"),
        ("A:top100,B:top50,Rest", "must be above the tier before it (top100)"),
        ("A:top10,Rest,B:top100", "comes after the unbounded tier 'Rest'"),
        ("A:top10,B:20%", "the last tier ('B') must be unbounded"),
        ("A:top0,Rest", "must be topN"),
        ("A:101%,Rest", "above 0% and at most 100%"),
        ("A:0%,Rest", "above 0% and at most 100%"),
        ("A:ten,Rest", "must be topN"),
        ("A:top1,a:top2,Rest", "named twice"),
        (":top1,Rest", "name ''"),
        ("A:top1,,Rest", "name ''"),
    ]:
        with pytest.raises(TiersError) as refused:
            tiers_parse(text)
        assert says in str(refused.value), (text, str(refused.value))


@settings(max_examples=300, deadline=None)
@given(scores=st.lists(st.integers(0, 6), min_size=1, max_size=60),
       top=st.integers(1, 5), share=st.sampled_from(["1", "12.5", "33.3", "50", "100"]))
def test_tied_players_share_a_tier_and_a_percentile_as_the_rules_define_them(
        scores: list[int], top: int, share: str) -> None:
    tiers = tiers_parse(f"T:top{top},S:{share}%,Rest")
    assert tiers is not None
    board = Standings({f"p{i:03}": s for i, s in enumerate(scores)})
    total = len(scores)
    entries = board.top(total)
    for entry in entries:
        tied = sum(1 for s in scores if s == entry.score)
        worse = sum(1 for s in scores if s < entry.score)
        assert percentile(rank=entry.rank, tied=tied, total=total) == int(Fraction(worse * 100, total) * 100) / 100
        expected = ("T" if entry.rank <= top else
                    "S" if Fraction(entry.rank * 100, total) <= Fraction(share) else "Rest")
        assert tiers.of(rank=entry.rank, total=total) == expected
    by_rank: dict[int, set[str]] = {}
    for entry in entries:
        by_rank.setdefault(entry.rank, set()).add(tiers.of(rank=entry.rank, total=total))
    assert all(len(names) == 1 for names in by_rank.values())


def test_percentile_edges() -> None:
    assert percentile(rank=1, tied=1, total=1) == 0.0  # alone: nobody below
    assert percentile(rank=1, tied=1, total=3) == 66.66  # rounded down, never up
    assert percentile(rank=1, tied=3, total=3) == 0.0
    assert percentile(rank=3, tied=1, total=3) == 0.0
    assert percentile(rank=1, tied=1, total=10_000) == 99.99


# --- create_season -------------------------------------------------------------------------


@pytest.mark.django_db
def test_create_season_takes_tiers_and_refuses_malformed_ones_with_the_reason() -> None:
    out = StringIO()
    call_command("create_season", "tiered", "--name", "T", "--starts-at", "2026-01-01T00:00:00Z",
                 "--cutoff", "2026-02-01T00:00:00Z", "--tiers", "Champion:top100,Diamond:1%,Bronze", stdout=out)
    assert "tiers: Champion:top100,Diamond:1%,Bronze" in out.getvalue()
    assert Season.objects.get(slug="tiered").tiers_parsed == tiers_parse("Champion:top100,Diamond:1%,Bronze")
    with pytest.raises(CommandError, match="only the last tier is unbounded"):
        call_command("create_season", "bad", "--name", "T", "--starts-at", "2026-01-01T00:00:00Z",
                     "--cutoff", "2026-02-01T00:00:00Z", "--tiers", "Bronze,Champion:top100")
    assert not Season.objects.filter(slug="bad").exists()


# --- reads and the FINAL -------------------------------------------------------------------

# Ten players: ranks 1, 1, 3, 4, 4, 4, 7, 8, 9, 9.
SCORES = {"a": 90, "b": 90, "c": 80, "d": 70, "e": 70, "f": 70, "g": 60, "h": 50, "i": 40, "j": 40}
# top2: ranks 1..2; 10%: rank <= 1; 50%: rank <= 5; then Bronze.
TIER_OF_RANK = {1: "Champion", 3: "Gold", 4: "Gold", 7: "Bronze", 8: "Bronze", 9: "Bronze"}


@pytest.fixture
def tiered(season_factory: Callable[..., Season]) -> Season:
    cutoff = datetime.now(UTC) - timedelta(minutes=5)
    season = season_factory(slug="tiers", tiers=TIERS, starts_at=cutoff - timedelta(days=10), cutoff=cutoff)
    events = Events("tiers", in_season(season))
    apply_events(season, [events.result(p, s) for p, s in SCORES.items()])
    assert publish(season) == 1
    return season


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_every_entry_names_its_tier_and_the_rank_answer_its_percentile(tiered: Season) -> None:
    standings = Standings(SCORES)
    top = fast_get("/v1/seasons/tiers/leaderboard/top").json()["entries"]
    assert [(e["player_id"], e["tier"]) for e in top] == [
        (e.player_id, TIER_OF_RANK[e.rank]) for e in standings.top(10)]
    window = fast_get("/v1/seasons/tiers/leaderboard?from_position=4&limit=3").json()["entries"]
    assert {e["tier"] for e in window} == {"Gold"}  # d, e, f: tied at rank 4
    around = fast_get("/v1/seasons/tiers/players/h/neighbors?radius=1").json()
    assert around["player"]["tier"] == "Bronze" and [e["tier"] for e in around["entries"]] == ["Bronze"] * 3
    for entry in standings.top(10):
        rank = fast_get(f"/v1/seasons/tiers/players/{entry.player_id}/rank").json()
        worse = sum(1 for s in SCORES.values() if s < entry.score)
        assert (rank["rank"], rank["tier"], rank["percentile"]) == (entry.rank, TIER_OF_RANK[entry.rank],
                                                                     worse * 10.0), entry
    # A, b (tied first) share 80.0; d, e, f share 40.0.
    assert {fast_get(f"/v1/seasons/tiers/players/{p}/rank").json()["percentile"] for p in "def"} == {40.0}


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_the_final_holds_the_tiers_of_its_version_in_its_hash(tiered: Season) -> None:
    finalize(tiered, proposer=staff("carol"), approver=staff("dave"))
    tiered.refresh_from_db()
    rows = list(FinalStanding.objects.filter(season=tiered).order_by("position").values_list(
        "position", "rank", "player_id", "score", "tier"))
    assert [(p, t) for _, r, p, _, t in rows] == [(p, TIER_OF_RANK[r]) for _, r, p, _, _ in rows]
    lines = "".join(f"{pos}\t{rank}\t{player}\t{score}\t{tier}\n" for pos, rank, player, score, tier in rows)
    final = APIClient().get("/v1/seasons/tiers/final").json()
    assert final["content_hash"] == hashlib.sha256(lines.encode()).hexdigest()
    assert final["hash_algorithm"] == (
        "sha256 over 'position\\trank\\tplayer_id\\tscore\\ttier\\n' lines in position order")
    standings = APIClient().get("/v1/seasons/tiers/final/standings").json()["entries"]
    assert [e["tier"] for e in standings] == [t for *_, t in rows]

