"""Regional FINAL standings (docs/api.md, FINAL standings; docs/rules.md, Regional and friends
boards): each FINAL row of a season with regions holds the player's region and their
position and rank among that region's players, ordered and ranked like the global ones;
the content hash covers them there; `final/standings?region=` pages a region's standings
and `final/players/{id}` names the player's regional place."""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import IntegrityError, transaction
from rest_framework.test import APIClient

from leaderboard.core.final_hash import FinalLineFormat
from leaderboard.core.profiles import ProfileWrite
from leaderboard.core.ranking import Standings
from leaderboard.models import Manifest as ManifestRow
from leaderboard.profiles import player_profiles_apply
from seasons.models import FinalStanding, Season
from seasons.services import final_standings_hash, season_seal_ingest
from tests.support import (
    DEFAULT_KIND,
    TEST_ACTOR,
    Events,
    Post,
    canonical_sha256,
    final_rows,
    finalize,
    in_season,
    iso,
    post_ok,
)

# The staff fixtures (client_as), for the console's player page.
pytest_plugins = ["tests.support.staff_fixtures"]

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]

SeasonFactory = Callable[..., Season]
# (position, rank, player_id, score, region, regional_position, regional_rank)
Row = tuple[int, int, str, int, str, int | None, int | None]

REGIONS = ["na", "eu", "apac"]
# Ties inside and across regions; "B2" sorts before "a1" by bytes. h8 has no profile, i9's
# region is not one of the season's, j0's profile names none: all three have no region.
SCORES = {"a1": 500, "B2": 500, "c3": 400, "d4": 400, "e5": 300, "f6": 500, "g7": 200,
          "h8": 500, "i9": 450, "j0": 400}
PROFILES: dict[str, str | None] = {"a1": "na", "B2": "na", "c3": "na", "d4": "na", "e5": "na", "f6": "eu",
                                   "g7": "eu", "i9": "oce", "j0": None}
EXPECTED: list[Row] = [
    (1, 1, "B2", 500, "na", 1, 1), (2, 1, "a1", 500, "na", 2, 1), (3, 1, "f6", 500, "eu", 1, 1),
    (4, 1, "h8", 500, "", None, None), (5, 5, "i9", 450, "", None, None), (6, 6, "c3", 400, "na", 3, 3),
    (7, 6, "d4", 400, "na", 4, 3), (8, 6, "j0", 400, "", None, None), (9, 9, "e5", 300, "na", 5, 5),
    (10, 10, "g7", 200, "eu", 2, 2),
]


def get(path: str) -> Any:
    return APIClient().get(path)


def profiles_apply(regions: Mapping[str, str | None], *, version: int = 1) -> None:
    player_profiles_apply(profiles=[ProfileWrite(player_id=p, region=r, profile_version=version)
                                    for p, r in regions.items()], client=None)


def ended_season(season_factory: SeasonFactory, slug: str, *, regions: Sequence[str] = REGIONS,
                 tie_break: str = "shared") -> Season:
    """A season whose cutoff has passed (CLOSING), created with its regions."""
    cutoff = datetime.now(UTC) - timedelta(minutes=5)
    return season_factory(slug=slug, starts_at=cutoff - timedelta(days=10), cutoff=cutoff, regions=list(regions),
                          tie_break=tie_break)


def scores_post(post_scores: Post, season: Season, scores: Mapping[str, int]) -> None:
    events = Events(season.slug, in_season(season))
    post_ok(post_scores, season, [events.result(p, s) for p, s in scores.items()])


def final_of(season: Season) -> Season:
    finalize(season)
    season.refresh_from_db()
    return season


def regional_rows(season: Season) -> list[Row]:
    return list(FinalStanding.objects.filter(season=season).order_by("position").values_list(
        "position", "rank", "player_id", "score", "region", "regional_position", "regional_rank"))


def documented_sha256(rows: Sequence[Row], reached: Mapping[str, str] | None = None) -> str:
    """The documented hash of a season with regions, written out independently of the service:
    `position\trank\tplayer_id\tscore[\treached_at]\tregion\tregional_position\tregional_rank\n`,
    empty fields for a player with no region."""
    def text(value: int | None) -> str:
        return "" if value is None else str(value)

    lines = []
    for position, rank, player, score, region, regional_position, regional_rank in rows:
        reached_field = f"\t{reached[player]}" if reached is not None else ""
        lines.append(f"{position}\t{rank}\t{player}\t{score}{reached_field}\t{region}\t{text(regional_position)}"
                     f"\t{text(regional_rank)}\n")
    return hashlib.sha256("".join(lines).encode()).hexdigest()


@pytest.fixture
def regional_final(season_factory: SeasonFactory, post_scores: Post) -> Season:
    season = ended_season(season_factory, "fin-reg")
    profiles_apply(PROFILES)
    scores_post(post_scores, season, SCORES)
    return final_of(season)


# --- the rows --------------------------------------------------------------------------------


def test_regional_places_share_ranks_like_the_global_ones_and_players_without_a_region_have_none(
    regional_final: Season,
) -> None:
    assert regional_rows(regional_final) == EXPECTED


def test_regional_places_match_the_reference_model_region_by_region(
    season_factory: SeasonFactory, post_scores: Post,
) -> None:
    rng = random.Random(7)
    # 300 players over 3 regions and none, 25 distinct scores: many ties in every region.
    scores = {f"{rng.choice('aAbB')}{i:03d}": 100 * rng.randrange(25) for i in range(300)}
    regions = {p: rng.choice([*REGIONS, None]) for p in scores}
    season = ended_season(season_factory, "fin-many")
    profiles_apply(regions)
    scores_post(post_scores, season, scores)
    rows = regional_rows(final_of(season))
    assert len(rows) == len(scores)
    for region in REGIONS:
        members = {p: s for p, s in scores.items() if regions[p] == region}
        want = [(e.position, e.rank, e.player_id) for e in Standings(members).window(from_position=1,
                                                                                    limit=len(members))]
        assert [(rp, rr, p) for _, _, p, _, r, rp, rr in rows if r == region] == want, region
    assert [(r, rp, rr) for _, _, p, _, r, rp, rr in rows if regions[p] is None] == [
        ("", None, None)] * sum(r is None for r in regions.values())


def test_first_reached_regional_places_order_and_rank_by_reached_at(
    season_factory: SeasonFactory, post_scores: Post,
) -> None:
    season = ended_season(season_factory, "fin-fr", regions=["na", "eu"], tie_break="first_reached")
    early, late = season.starts_at + timedelta(hours=1), season.starts_at + timedelta(hours=2, milliseconds=7)
    earliest = season.starts_at + timedelta(minutes=1)
    profiles_apply({"x": "na", "y": "na", "z": "na", "v": "eu"})
    events = Events("fr", in_season(season))
    post_ok(post_scores, season, [
        events.result("z", 100, reached_at=iso(late)), events.result("y", 100, reached_at=iso(late)),
        events.result("x", 100, reached_at=iso(early)), events.result("v", 100, reached_at=iso(late)),
        events.result("w", 100, reached_at=iso(earliest)),  # no region
    ])
    final_of(season)
    rows = regional_rows(season)
    assert rows == [(1, 1, "w", 100, "", None, None), (2, 2, "x", 100, "na", 1, 1), (3, 3, "v", 100, "eu", 1, 1),
                    (4, 3, "y", 100, "na", 2, 2), (5, 3, "z", 100, "na", 3, 2)]
    reached = {"w": earliest, "x": early, "y": late, "z": late, "v": late}
    texts = {p: at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"
             for p, at in reached.items()}
    assert final_standings_hash(season_id=season.pk) == (documented_sha256(rows, texts), 5)
    body = get("/v1/seasons/fin-fr/final/standings?region=na").json()
    assert [(e["player_id"], e["reached_at"], e["regional_position"], e["regional_rank"], e["rank"])
            for e in body["entries"]] == [("x", texts["x"], 1, 1, 2), ("y", texts["y"], 2, 2, 3),
                                          ("z", texts["z"], 3, 2, 3)]


def test_the_database_refuses_a_regional_place_without_a_region_and_a_region_without_one(
    regional_final: Season,
) -> None:
    # Rows from before regional places existed (region "", no place) are what a season
    # without regions still writes: valid. The two half-rows are not.
    for region, place in (("", 1), ("na", None)):
        with pytest.raises(IntegrityError), transaction.atomic():
            FinalStanding.objects.create(season=regional_final, position=99, rank=99, player_id="odd", score=1,
                                         region=region, regional_position=place, regional_rank=place)


# --- the hash --------------------------------------------------------------------------------


def test_the_hash_covers_regions_as_documented_and_the_manifest_names_the_line(regional_final: Season) -> None:
    digest, total = final_standings_hash(season_id=regional_final.pk)
    assert (digest, total) == (documented_sha256(EXPECTED), len(EXPECTED))
    assert digest != canonical_sha256(final_rows(regional_final))  # not the four-field hash
    row = ManifestRow.objects.get(season=regional_final, is_final=True)
    assert (row.version, row.content_hash) == (regional_final.final_version, digest)
    body = get("/v1/seasons/fin-reg/final").json()
    assert body["content_hash"] == digest
    assert body["hash_algorithm"] == ("sha256 over 'position\\trank\\tplayer_id\\tscore\\tregion\\tregional_position"
                                      "\\tregional_rank\\n' lines in position order")
    # One line written out in full: a player with no region keeps every tab.
    assert documented_sha256([EXPECTED[3]]) == hashlib.sha256(b"4\t1\th8\t500\t\t\t\n").hexdigest()
    assert documented_sha256([EXPECTED[0]]) == hashlib.sha256(b"1\t1\tB2\t500\tna\t1\t1\n").hexdigest()


def test_each_kind_of_season_has_its_line() -> None:
    args: dict[str, Any] = {"position": 8, "rank": 6, "player_id": "p-18", "score": 48200,
                            "reached_at": "2026-12-01T18:04:05.123Z", "region": "", "regional_position": None,
                            "regional_rank": None}
    assert FinalLineFormat(first_reached=False, regional=False).line(**args) == "8\t6\tp-18\t48200\n"
    assert FinalLineFormat(first_reached=True, regional=False).line(**args) == (
        "8\t6\tp-18\t48200\t2026-12-01T18:04:05.123Z\n")
    assert FinalLineFormat(first_reached=False, regional=True).line(**args) == "8\t6\tp-18\t48200\t\t\t\n"
    assert FinalLineFormat(first_reached=True, regional=True).line(
        **{**args, "region": "eu", "regional_position": 4, "regional_rank": 3}) == (
        "8\t6\tp-18\t48200\t2026-12-01T18:04:05.123Z\teu\t4\t3\n")
    assert FinalLineFormat(first_reached=True, regional=True).describe() == (
        "sha256 over 'position\\trank\\tplayer_id\\tscore\\treached_at\\tregion\\tregional_position"
        "\\tregional_rank\\n' lines in position order")


def test_a_player_in_another_region_changes_the_hash_and_nothing_else_global(
    season_factory: SeasonFactory, post_scores: Post,
) -> None:
    first = ended_season(season_factory, "fin-a")
    second = ended_season(season_factory, "fin-b")
    profiles_apply(PROFILES)
    scores_post(post_scores, first, SCORES)
    season_seal_ingest(season=first, actor=TEST_ACTOR)
    profiles_apply({"e5": "eu"}, version=2)  # moves e5 in no sealed season
    scores_post(post_scores, second, SCORES)
    finalize(first, seal=False)
    final_of(second)
    assert final_rows(first) == final_rows(second)
    moved = dict((r[2], r[4:]) for r in regional_rows(second))
    assert (moved["e5"], moved["g7"]) == (("eu", 2, 2), ("eu", 3, 3))
    first_hash, second_hash = (final_standings_hash(season_id=s.pk)[0] for s in (first, second))
    assert first_hash == documented_sha256(EXPECTED)
    assert second_hash == documented_sha256(regional_rows(second)) != first_hash


def test_a_season_without_regions_hashes_and_answers_exactly_as_before(
    season_factory: SeasonFactory, post_scores: Post,
) -> None:
    season = ended_season(season_factory, "fin-plain", regions=[])
    profiles_apply(PROFILES)  # profiles name regions; the season has none
    scores_post(post_scores, season, SCORES)
    final_of(season)
    assert all((r, rp, rr) == ("", None, None) for *_, r, rp, rr in regional_rows(season))
    assert final_standings_hash(season_id=season.pk) == (canonical_sha256(final_rows(season)), len(SCORES))
    body = get("/v1/seasons/fin-plain/final").json()
    assert body["hash_algorithm"] == "sha256 over 'position\\trank\\tplayer_id\\tscore\\n' lines in position order"
    assert set(get("/v1/seasons/fin-plain/final/standings").json()["entries"][0]) == {
        "position", "rank", "player_id", "score", *UNHASHED}
    assert get("/v1/seasons/fin-plain/final/players/a1").json() == {
        "season_id": "fin-plain", "final_version": season.final_version, "kind": DEFAULT_KIND, "position": 2, "rank": 1,
        "player_id": "a1", "score": 500, "display_name": None, "country": None, "tier": None}
    # No region is known to a season without regions.
    response = get("/v1/seasons/fin-plain/final/standings?region=na")
    assert (response.status_code, response.json()["error"]) == (404, "unknown_region")
    assert "has no regions" in response.json()["detail"]


def test_a_final_approved_before_regional_places_keeps_its_rows_hash_and_answers(
    season_factory: SeasonFactory, post_scores: Post,
) -> None:
    # What the migration leaves of such a FINAL: rows with region "" and no regional place,
    # and a season with regions whose final_regional is false.
    season = ended_season(season_factory, "fin-old")
    profiles_apply(PROFILES)
    scores_post(post_scores, season, SCORES)
    final_of(season)
    old = Season.objects.create(slug="fin-old-final", name="old", starts_at=season.starts_at, cutoff=season.cutoff,
                                regions=REGIONS, state="FINAL", final_version=season.final_version)
    FinalStanding.objects.bulk_create(FinalStanding(season=old, position=p, rank=r, player_id=i, score=s)
                                      for p, r, i, s, *_ in EXPECTED)
    assert old.final_regional is False
    assert final_standings_hash(season_id=old.pk) == (canonical_sha256(row[:4] for row in EXPECTED), len(EXPECTED))
    assert set(get("/v1/seasons/fin-old-final/final/standings").json()["entries"][0]) == {
        "position", "rank", "player_id", "score", *UNHASHED}
    assert set(get("/v1/seasons/fin-old-final/final/players/d4").json()) == {
        "season_id", "final_version", "kind", "position", "rank", "player_id", "score", *UNHASHED}
    response = get("/v1/seasons/fin-old-final/final/standings?region=na")
    assert (response.status_code, response.json()["error"]) == (404, "unknown_region")


# Beside the hashed fields every entry carries the player's current name and country and
# its tier (null in a season without tiers; hashed in a season with them).
UNHASHED = ("display_name", "country", "tier")


# --- the API ---------------------------------------------------------------------------------


def entry_of(row: Row) -> dict[str, Any]:
    position, rank, player, score, region, regional_position, regional_rank = row
    return {"position": position, "rank": rank, "player_id": player, "score": score, "region": region or None,
            "regional_position": regional_position, "regional_rank": regional_rank, "display_name": None,
            "country": None, "tier": None}


def test_standings_of_a_region_page_by_regional_position_with_global_places(regional_final: Season) -> None:
    everything = get("/v1/seasons/fin-reg/final/standings?limit=1000").json()
    assert "region" not in everything
    assert everything["entries"] == [entry_of(r) for r in EXPECTED]
    for region in REGIONS:
        want = [entry_of(r) for r in EXPECTED if r[4] == region]
        whole = get(f"/v1/seasons/fin-reg/final/standings?region={region}&limit=1000").json()
        assert (whole["season_id"], whole["final_version"], whole["region"], whole["from_position"]) == (
            "fin-reg", regional_final.final_version, region, 1)
        assert whole["entries"] == want, region
        paged: list[dict[str, Any]] = []
        position = 1
        while True:
            page = get(f"/v1/seasons/fin-reg/final/standings?region={region}&from_position={position}&limit=2").json()
            assert (page["region"], page["from_position"]) == (region, position)
            if not page["entries"]:
                break
            assert page["entries"][0]["regional_position"] == position
            paged.extend(page["entries"])
            position += len(page["entries"])
        assert paged == want, region
    assert [e["player_id"] for e in get("/v1/seasons/fin-reg/final/standings?region=na&from_position=3&limit=2")
            .json()["entries"]] == ["c3", "d4"]
    # An empty value is the default: the whole standings.
    assert get("/v1/seasons/fin-reg/final/standings?region=&limit=1000").json() == everything


def test_an_unknown_region_is_404_unknown_region_and_a_malformed_one_400(regional_final: Season) -> None:
    for region in ("oce", "eu-west", "a" * 16):
        response = get(f"/v1/seasons/fin-reg/final/standings?region={region}")
        assert response.status_code == 404, region
        body = response.json()
        assert body["error"] == "unknown_region", region
        assert repr(region) in body["detail"] and "na, eu, apac" in body["detail"]
    for region in ("NA", "na_", "a" * 17, "n%20a", "%00", "caf%C3%A9"):
        response = get(f"/v1/seasons/fin-reg/final/standings?region={region}")
        assert response.status_code == 400, region
        body = response.json()
        assert (body["error"], list(body["fields"])) == ("validation_error", ["region"]), region
    # Not FINAL, or no such season, comes first.
    assert get("/v1/seasons/nope/final/standings?region=zz").json()["error"] == "season_not_found"


def test_a_player_in_the_final_names_their_region_and_regional_place(regional_final: Season) -> None:
    head = {"season_id": "fin-reg", "final_version": regional_final.final_version,
            "kind": {**DEFAULT_KIND, "tie_break": regional_final.tie_break}}
    assert get("/v1/seasons/fin-reg/final/players/d4").json() == {**head, **entry_of(EXPECTED[6])}
    assert get("/v1/seasons/fin-reg/final/players/d4").json()["regional_rank"] == 3
    assert get("/v1/seasons/fin-reg/final/players/i9").json() == {
        **head, "position": 5, "rank": 5, "player_id": "i9", "score": 450, "region": None,
        "regional_position": None, "regional_rank": None, "display_name": None, "country": None, "tier": None}


def test_the_staff_player_page_shows_the_regional_final_place(regional_final: Season, client_as: Any) -> None:
    viewer = client_as("viewer", "viewer")
    page = viewer.get("/staff/seasons/fin-reg/players/d4/").content.decode()
    assert re.search(r'id="player-final">6 <small>position 7, score 400 \(board version \d+\) · '
                     r'region <code>na</code>: rank 3, position 4</small>', page)
    plain = viewer.get("/staff/seasons/fin-reg/players/h8/").content.decode()
    assert re.search(r'id="player-final">1 <small>position 4, score 500 \(board version \d+\)</small>', plain)

