"""The FINAL read API for the rewards service (docs/api.md, FINAL standings):
GET /v1/seasons/{id}/final, /final/standings, /final/players/{player_id}, /final/corrections."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from rest_framework.test import APIClient

from audit.services import SYSTEM
from leaderboard.core.ranking import Standings
from leaderboard.models import Manifest as ManifestRow
from seasons.models import FinalCandidate, Season
from seasons.services import season_final_propose, season_seal_ingest
from tests.support import (
    DEFAULT_KIND,
    Events,
    closing_season,
    db_scores,
    final_rows,
    finalize,
    held_correction_approve,
    in_season,
    materialize,
    post_ok,
    seal_and_build,
    staff,
)
from tests.support.reference import answer_entry

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]

Post = Callable[..., Any]
SeasonFactory = Callable[..., Season]

PLAYERS = 150
# 150 players, scores with ties (every score is shared by three players).
SCORES = {f"p{i:03d}": 1000 * (i // 3) for i in range(PLAYERS)}
ENDPOINTS = ("final", "final/standings", "final/players/p001", "final/corrections")


def get(path: str, **extra: Any) -> Any:
    return APIClient().get(path, **extra)


@pytest.fixture
def final_season(season_factory: SeasonFactory, post_scores: Post) -> Season:
    season = closing_season(season_factory, "fin")
    events = Events("fin", in_season(season))
    post_ok(post_scores, season, [events.result(p, s) for p, s in SCORES.items()])
    finalize(season, proposer=staff("carol"), approver=staff("dave"))
    season.refresh_from_db()
    return season


def expected_entries() -> list[dict[str, Any]]:
    standings = Standings(SCORES)
    return [answer_entry(e) for e in standings.window(from_position=1, limit=PLAYERS)]


# --- /final -------------------------------------------------------------------------------


def test_final_describes_the_approved_version_and_its_hash(final_season: Season) -> None:
    response = get("/v1/seasons/fin/final")
    assert response.status_code == 200
    body = response.json()
    assert final_season.final_version is not None
    row = ManifestRow.objects.get(season=final_season, version=final_season.final_version)
    assert set(body) == {"season_id", "state", "final_version", "kind", "finalized_at", "content_hash",
                         "hash_algorithm", "total_players", "proposed_by", "approved_by", "manifest"}
    assert body["kind"] == DEFAULT_KIND
    assert (body["season_id"], body["state"], body["final_version"], body["total_players"]) == (
        "fin", "FINAL", final_season.final_version, PLAYERS)
    # Opaque staff ids, never the staff members' user names.
    candidate = FinalCandidate.objects.get(season=final_season, status="approved")
    assert (body["proposed_by"], body["approved_by"]) == (f"staff-{candidate.proposed_by}",
                                                          f"staff-{candidate.decided_by}")
    assert "carol" not in response.content.decode() and "dave" not in response.content.decode()
    assert body["content_hash"] == row.content_hash
    assert len(body["content_hash"]) == 64
    assert body["hash_algorithm"].startswith("sha256")
    assert final_season.finalized_at is not None
    assert datetime.fromisoformat(body["finalized_at"].replace("Z", "+00:00")) == final_season.finalized_at
    manifest = body["manifest"]
    assert set(manifest) == {"version", "as_of", "watermark", "layout", "buckets"}
    assert manifest["version"] == final_season.final_version
    assert manifest["watermark"] == row.watermark.as_json()
    assert manifest["layout"] == final_season.layout
    assert len(manifest["buckets"]) == 101
    assert sum(b["count"] for b in manifest["buckets"]) == PLAYERS
    assert manifest["buckets"][0] == {"bucket": 0, "low": 0, "high": 9999, "count": 30,
                                      "checksum": manifest["buckets"][0]["checksum"]}


# --- /final/standings -------------------------------------------------------------------


def test_standings_default_to_the_first_hundred_in_display_order(final_season: Season) -> None:
    body = get("/v1/seasons/fin/final/standings").json()
    assert (body["season_id"], body["final_version"], body["from_position"]) == (
        "fin", final_season.final_version, 1)
    assert body["entries"] == expected_entries()[:100]
    assert body["entries"][:4] == [
        answer_entry({"position": 1, "rank": 1, "player_id": "p147", "score": 49000}),
        answer_entry({"position": 2, "rank": 1, "player_id": "p148", "score": 49000}),
        answer_entry({"position": 3, "rank": 1, "player_id": "p149", "score": 49000}),
        answer_entry({"position": 4, "rank": 4, "player_id": "p144", "score": 48000}),
    ]


def test_standings_page_through_the_whole_final(final_season: Season) -> None:
    everything = get("/v1/seasons/fin/final/standings?limit=1000").json()["entries"]
    assert everything == expected_entries()
    assert [(e["position"], e["rank"], e["player_id"], e["score"]) for e in everything] == final_rows(final_season)
    paged: list[dict[str, Any]] = []
    position = 1
    while True:
        page = get(f"/v1/seasons/fin/final/standings?from_position={position}&limit=7").json()
        assert page["from_position"] == position
        if not page["entries"]:
            break
        assert page["entries"][0]["position"] == position
        paged.extend(page["entries"])
        position += len(page["entries"])
    assert paged == everything


WINDOWS = [  # (from_position, limit) -> positions answered
    ((1, 1), [1]), ((148, 10), [148, 149, 150]), ((150, 1000), [150]), ((151, 5), []), ((10**9, 1), []),
    ((60, 3), [60, 61, 62]), ((2**63 - 1, 1), []),
]
BAD_PAGING = [  # query -> the parameter the 400 names
    ("limit=1001", "limit"), ("limit=0", "limit"), ("limit=-1", "limit"), ("limit=ten", "limit"),
    ("from_position=0", "from_position"), ("from_position=-3", "from_position"), ("from_position=1.5", "from_position"),
    # beyond 64 bits: neither the database nor the JSON renderer could carry it (was a 500)
    ("from_position=9223372036854775808", "from_position"), ("from_position=" + "9" * 30, "from_position"),
]


def test_standings_windows_start_anywhere_and_bad_paging_is_a_400_naming_the_parameter(
    final_season: Season,
) -> None:
    # One FINAL for all the cases: building one per case would dominate the runtime.
    everything = expected_entries()
    for (first, limit), positions in WINDOWS:
        response = get(f"/v1/seasons/fin/final/standings?from_position={first}&limit={limit}")
        assert response.status_code == 200, (first, limit, response.content)
        body = response.json()
        assert body["from_position"] == first
        assert [e["position"] for e in body["entries"]] == positions, (first, limit)
        assert body["entries"] == [everything[p - 1] for p in positions], (first, limit)
    assert len(get("/v1/seasons/fin/final/standings?limit=1000").json()["entries"]) == PLAYERS
    for query, field in BAD_PAGING:
        response = get(f"/v1/seasons/fin/final/standings?{query}")
        assert response.status_code == 400, (query, response.content)
        body = response.json()
        assert body["error"] == "validation_error", query
        assert list(body["fields"]) == [field], query


# --- /final/players/{player_id} ---------------------------------------------------------


def test_a_player_in_the_final(final_season: Season) -> None:
    body = get("/v1/seasons/fin/final/players/p145").json()
    assert body == {"season_id": "fin", "final_version": final_season.final_version, "kind": DEFAULT_KIND,
                    "position": 5, "rank": 4, "player_id": "p145", "score": 48000, "display_name": None,
                    "country": None, "tier": None}
    for entry in expected_entries()[::17]:
        got = get(f"/v1/seasons/fin/final/players/{entry['player_id']}").json()
        assert {k: got[k] for k in entry} == entry


def test_a_player_not_in_the_final_is_404_not_in_final(final_season: Season) -> None:
    response = get("/v1/seasons/fin/final/players/nobody")
    assert response.status_code == 404
    assert response.json()["error"] == "not_in_final"
    # Player ids are exact, byte for byte.
    assert get("/v1/seasons/fin/final/players/P001").json()["error"] == "not_in_final"


def test_a_player_id_outside_the_id_rule_is_404_and_a_64_character_one_is_valid(final_season: Season) -> None:
    for player_id in ("a" * 65, "bad%20id", "caf%C3%A9", "semi;colon", "%00"):
        response = get(f"/v1/seasons/fin/final/players/{player_id}")
        assert response.status_code == 404, player_id
        assert response.json()["error"] == "player_not_found"
    response = get(f"/v1/seasons/fin/final/players/{'a' * 64}")
    assert (response.status_code, response.json()["error"]) == (404, "not_in_final")


# --- /final/corrections ------------------------------------------------------------------


def test_corrections_are_empty_until_a_correction_after_final(final_season: Season, post_scores: Post) -> None:
    assert get("/v1/seasons/fin/final/corrections").json() == {
        "season_id": "fin", "final_version": final_season.final_version, "corrections": []}
    events = Events("fix", in_season(final_season))
    fixes = [events.correction("p149", 5, reason="revoked"),
             events.correction("p000", 60_000, reason="dispute won"),
             events.correction("p999", 7, reason="match was never counted")]
    post_ok(post_scores, final_season, fixes)
    # Held for staff: nothing is listed until a correction is approved.
    assert get("/v1/seasons/fin/final/corrections").json()["corrections"] == []
    approver = staff("fix-approver")
    for fix, public in zip(fixes, ["cheating", "", "scoring error"], strict=True):
        assert held_correction_approve(final_season, fix["event_id"], public_reason=public, approver=approver).applied
    corrections = get("/v1/seasons/fin/final/corrections").json()["corrections"]
    assert final_season.final_version is not None
    who = f"staff-{approver.id}"
    assert [(c["player_id"], c["before"], c["after"], c["version"], c["who"], c["why"]) for c in corrections] == [
        ("p149", 49000, 5, final_season.final_version + 1, who, "cheating"),
        ("p000", 0, 60_000, final_season.final_version + 1, who, "score corrected after staff review"),
        ("p999", None, 7, final_season.final_version + 1, who, "scoring error"),
    ]
    assert get("/v1/seasons/fin/final/players/p999").json()["error"] == "not_in_final"
    assert all(set(c) == {"player_id", "before", "after", "event_id", "version", "who", "why", "at"}
               for c in corrections)
    # The standings are the FINAL ones still.
    assert get("/v1/seasons/fin/final/players/p149").json()["score"] == 49000


# --- not FINAL, unknown season, no auth ----------------------------------------------------


def test_every_final_endpoint_is_404_not_final_before_final(season_factory: SeasonFactory, post_scores: Post) -> None:
    season = closing_season(season_factory, "pending")
    post_ok(post_scores, season, [Events("pe", in_season(season)).result("p001", 10)])
    scheduled = season_factory(slug="later", starts_at=datetime.now(UTC) + timedelta(days=1),
                               cutoff=datetime.now(UTC) + timedelta(days=9))
    assert scheduled.state == "SCHEDULED"

    def assert_not_final(slug: str, state: str) -> None:
        for endpoint in ENDPOINTS:
            response = get(f"/v1/seasons/{slug}/{endpoint}")
            assert response.status_code == 404, (slug, endpoint)
            assert response.json()["error"] == "not_final", (slug, endpoint)
            assert state in response.json()["detail"]

    assert_not_final("pending", "CLOSING")
    assert_not_final("later", "SCHEDULED")
    # Sealed, candidate proposed: still not FINAL.
    candidate = seal_and_build(season)
    season_final_propose(candidate=candidate, actor=staff())
    assert_not_final("pending", "FINALIZING")


def test_every_final_endpoint_is_404_for_an_unknown_season(db: Any) -> None:
    for endpoint in ENDPOINTS:
        response = get(f"/v1/seasons/no-such-season/{endpoint}")
        assert response.status_code == 404, endpoint
        assert response.json()["error"] == "season_not_found", endpoint


def test_final_endpoints_are_read_only_and_need_no_credentials(final_season: Season) -> None:
    for endpoint in ENDPOINTS:
        assert get(f"/v1/seasons/fin/{endpoint}", HTTP_AUTHORIZATION="Bearer not-a-token").status_code == 200
        response = APIClient().post(f"/v1/seasons/fin/{endpoint}", {}, format="json")
        assert response.status_code == 405, endpoint
        assert response.json()["error"] == "method_not_allowed"


def test_the_final_of_one_season_is_not_another_seasons(final_season: Season, season_factory: SeasonFactory,
                                                        post_scores: Post) -> None:
    other = closing_season(season_factory, "other")
    post_ok(post_scores, other, [Events("ot", in_season(other)).result("p001", 999_999)])
    season_seal_ingest(season=other, actor=SYSTEM)
    materialize(other)
    finalize(other, seal=False)
    assert get("/v1/seasons/other/final/players/p001").json()["score"] == 999_999
    assert get("/v1/seasons/fin/final/players/p001").json()["score"] == 0
    assert get("/v1/seasons/other/final/players/p002").json()["error"] == "not_in_final"
    assert db_scores(other) == {"p001": 999_999}
