"""Names and countries (docs/api.md, Names and countries): written by the profile service
with profiles:apply, checked field by field, stored in NFC; shown on every read, the
friends board and the FINAL standings as they are now (not versioned with the board); a
reviewer's reset sticks; Redis losing them refills them from the database. Real
PostgreSQL and Redis."""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from audit.models import AuditEntry
from leaderboard.api_clients import api_client_create
from leaderboard.core.profiles import ProfileWrite, display_name_normal
from leaderboard.models import FriendList, PlayerProfile, PlayerProfileChange
from leaderboard.profiles import names_recover, player_profiles_apply
from leaderboard.redis_client import redis_get
from leaderboard.views.names import names_key
from seasons.models import Season
from tests.support import TEST_ACTOR, Events, apply_events, fast_get, publish
from tests.support.lifecycle import finalize, in_season, staff

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]
pytest_plugins = ["tests.support.staff_fixtures"]

URL = "/internal/v1/players/profiles:apply"


@pytest.fixture
def profiles(db: Any) -> Callable[..., Any]:
    _, token = api_client_create(name="profile-service", scopes=["profiles:write"], actor=TEST_ACTOR)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")

    def send(*items: dict[str, Any]) -> Any:
        return client.post(URL, {"profiles": list(items)}, format="json")

    return send


def named(player_id: str, version: int, **fields: Any) -> dict[str, Any]:
    return {"player_id": player_id, "region": None, "profile_version": version, **fields}


def read(path: str) -> Any:
    response = fast_get(path)
    assert response.status_code == 200, (path, response.content)
    return response.json()


def names_in(entries: list[dict[str, Any]]) -> dict[str, tuple[str | None, str | None]]:
    return {e["player_id"]: (e["display_name"], e["country"]) for e in entries}


# --- the write -------------------------------------------------------------------------------


def test_names_are_stored_in_nfc_and_each_bad_field_is_a_400_naming_it_with_nothing_written(
        profiles: Callable[..., Any]) -> None:
    bad = profiles(named("a", 1, display_name=" lead", country="us"),
                   named("b", 1, display_name="x" * 33),
                   named("c", 1, display_name="tab\there"),
                   named("d", 1, display_name="smile \U0001F600"),
                   named("e", 1, display_name="", country="XX"),
                   named("f", 1, display_name=7),
                   named("g", 1, display_name="ok", country="ZZ"))
    assert bad.status_code == 400
    assert sorted(bad.json()["fields"]) == [
        "profiles[0].country", "profiles[0].display_name", "profiles[1].display_name", "profiles[2].display_name",
        "profiles[3].display_name", "profiles[4].country", "profiles[4].display_name", "profiles[5].display_name",
        "profiles[6].country"]
    assert not PlayerProfile.objects.exists() and not PlayerProfileChange.objects.exists()

    # "e" + combining acute is one character after NFC; 32 of them fit.
    decomposed = "Ame\u0301lie_" + "e\u0301" * 25
    assert len(decomposed) == 58 and len(unicodedata.normalize("NFC", decomposed)) == 32
    ok = profiles(named("a", 1, display_name=decomposed, country="FR"), named("b", 1, display_name="Łukasz-3.x"),
                  named("c", 1, display_name="東京 ゲーマー"), named("d", 1, display_name="नमस्ते"))
    assert ok.status_code == 200, ok.content
    results = ok.json()["results"]
    assert results[0] == {"player_id": "a", "status": "applied", "region": None, "profile_version": 1,
                          "display_name": unicodedata.normalize("NFC", decomposed), "country": "FR"}
    assert PlayerProfile.objects.get(player_id="a").display_name == unicodedata.normalize("NFC", decomposed)
    assert [r["display_name"] for r in results[1:]] == ["Łukasz-3.x", "東京 ゲーマー", "नमस्ते"]


def test_the_name_rule_in_the_core() -> None:
    assert display_name_normal("a")[0] == "a"
    assert display_name_normal("a" * 32)[0] == "a" * 32
    for bad in ("", " a", "a ", "a\u0000", "a\u200b", "<b>", "a/b", "\u0301a", "a" * 33):
        assert display_name_normal(bad)[0] is None, repr(bad)


def test_names_follow_profile_versions_left_out_fields_stay_and_null_clears(profiles: Callable[..., Any]) -> None:
    assert profiles(named("p", 5, display_name="Zed", country="DE")).json()["results"][0]["status"] == "applied"
    # Older: stale, nothing changes.
    stale = profiles(named("p", 4, display_name="Old", country="FR")).json()["results"][0]
    assert (stale["status"], stale["display_name"], stale["country"]) == ("stale", "Zed", "DE")
    # Newer, leaving both out: the region is the item's, the name and country stay.
    kept = profiles(named("p", 6)).json()["results"][0]
    assert (kept["status"], kept["display_name"], kept["country"]) == ("unchanged", "Zed", "DE")
    # Newer, with the name only: renamed, the country stays.
    renamed = profiles(named("p", 7, display_name="Zed II")).json()["results"][0]
    assert (renamed["status"], renamed["display_name"], renamed["country"]) == ("applied", "Zed II", "DE")
    cleared = profiles(named("p", 8, display_name=None, country=None)).json()["results"][0]
    assert (cleared["status"], cleared["display_name"], cleared["country"]) == ("applied", None, None)
    assert list(PlayerProfileChange.objects.filter(player_id="p").order_by("id").values_list(
        "profile_version", "display_name", "country")) == [
        (5, "Zed", "DE"), (6, "Zed", "DE"), (7, "Zed II", "DE"), (8, None, None)]
    assert redis_get().hget(names_key("lb"), "p") is None


# --- on every read ---------------------------------------------------------------------------


@pytest.fixture
def board(season_factory: Callable[..., Season]) -> Season:
    cutoff = datetime.now(UTC) - timedelta(minutes=5)  # CLOSING: a FINAL can be approved
    season = season_factory(slug="nm", regions=["eu", "na"], starts_at=cutoff - timedelta(days=10), cutoff=cutoff)
    player_profiles_apply(profiles=[
        ProfileWrite(player_id="ana", region="eu", profile_version=1, carries=frozenset({"display_name", "country"}),
                     display_name="Ana", country="ES"),
        ProfileWrite(player_id="bo", region="na", profile_version=1, carries=frozenset({"display_name"}),
                     display_name="Bo"),
        ProfileWrite(player_id="cy", region="eu", profile_version=1),
    ], client=None)
    events = Events("nm", in_season(season))
    apply_events(season, [events.result(p, s) for p, s in {"ana": 300, "bo": 200, "cy": 100}.items()])
    assert publish(season) == 1
    return season


EXPECTED = {"ana": ("Ana", "ES"), "bo": ("Bo", None), "cy": (None, None)}


def test_every_read_carries_the_current_name_and_country(board: Season) -> None:
    base = "/v1/seasons/nm"
    assert names_in(read(f"{base}/leaderboard/top")["entries"]) == EXPECTED
    assert names_in(read(f"{base}/leaderboard?from_position=2&limit=2")["entries"]) == {
        p: EXPECTED[p] for p in ("bo", "cy")}
    rank = read(f"{base}/players/ana/rank")
    assert (rank["display_name"], rank["country"]) == ("Ana", "ES")
    around = read(f"{base}/players/bo/neighbors?radius=1")
    assert names_in(around["entries"]) == EXPECTED and around["player"]["display_name"] == "Bo"
    assert names_in(read(f"{base}/regions/eu/leaderboard/top")["entries"]) == {
        p: EXPECTED[p] for p in ("ana", "cy")}
    assert read(f"{base}/regions/eu/players/cy/rank")["display_name"] is None
    FriendList.objects.create(player_id="cy", friends=["ana", "bo"], graph_version=1, updated_at=datetime.now(UTC))
    assert names_in(read(f"{base}/players/cy/friends")["entries"]) == EXPECTED

    # A new name shows on the next read, in the same version: names are not versioned.
    player_profiles_apply(profiles=[ProfileWrite(player_id="cy", region="eu", profile_version=2,
                                                 carries=frozenset({"display_name", "country"}),
                                                 display_name="Cy", country="PT")], client=None)
    top = read(f"{base}/leaderboard/top")
    assert top["leaderboard_version"] == 1 and names_in(top["entries"])["cy"] == ("Cy", "PT")
    assert read(f"{base}/players/cy/rank")["country"] == "PT"
    assert names_in(read(f"{base}/regions/eu/leaderboard/top")["entries"])["cy"] == ("Cy", "PT")


def test_the_final_standings_carry_the_names_as_they_are_now(board: Season) -> None:
    finalize(board, proposer=staff("carol"), approver=staff("dave"))
    standings = APIClient().get("/v1/seasons/nm/final/standings").json()
    assert names_in(standings["entries"]) == EXPECTED
    assert APIClient().get("/v1/seasons/nm/final/players/ana").json()["display_name"] == "Ana"


def test_names_lost_by_redis_are_refilled_from_the_database(board: Season) -> None:
    assert names_recover() == 3  # a Redis no refill has marked yet
    assert names_recover() is None  # the hash holds its mark: nothing to do
    redis_get().delete(names_key("lb"))
    assert names_in(read("/v1/seasons/nm/leaderboard/top")["entries"]) == {p: (None, None) for p in EXPECTED}
    assert names_recover() == 3
    assert names_in(read("/v1/seasons/nm/leaderboard/top")["entries"]) == EXPECTED
    assert names_recover() is None


# --- a reviewer's reset ----------------------------------------------------------------------


def test_a_reviewers_reset_is_audited_and_sticks(board: Season, profiles: Callable[..., Any],
                                                 client_as: Callable[..., Client]) -> None:
    page = "/staff/seasons/nm/players/ana/"
    reset = "/staff/seasons/nm/players/ana/name-reset/"
    viewer, reviewer = client_as("viewer"), client_as("reviewer")
    assert b"Reset the name" not in viewer.get(page).content
    assert viewer.post(reset, {"reason": "slur"}).status_code == 403
    assert b"Reset the name" in reviewer.get(page).content
    # A reason is required: nothing is reset without one.
    reviewer.post(reset, {"reason": ""})
    assert PlayerProfile.objects.get(player_id="ana").display_name == "Ana"
    response = reviewer.post(reset, {"reason": "impersonates a moderator"}, follow=True)
    assert b"was reset" in response.content
    profile = PlayerProfile.objects.get(player_id="ana")
    assert (profile.display_name, profile.name_blocked, profile.country) == (None, "Ana", "ES")
    entry = AuditEntry.objects.get(action="player.name.reset")
    assert (entry.target_id, entry.reason, entry.before, entry.after) == (
        "ana", "impersonates a moderator", {"display_name": "Ana"}, {"display_name": None})
    assert read("/v1/seasons/nm/players/ana/rank")["display_name"] is None
    assert names_in(read("/v1/seasons/nm/leaderboard/top")["entries"])["ana"] == (None, "ES")

    # The profile service sending the reset name again (in any case) brings no name back...
    again = profiles(named("ana", 2, display_name="ANA", country="ES")).json()["results"][0]
    assert (again["display_name"], again["country"]) == (None, "ES")
    assert read("/v1/seasons/nm/players/ana/rank")["display_name"] is None
    # ...and a new name is the player's.
    renamed = profiles(named("ana", 3, display_name="Ana Maria")).json()["results"][0]
    assert renamed["display_name"] == "Ana Maria"
    assert read("/v1/seasons/nm/players/ana/rank")["display_name"] == "Ana Maria"
