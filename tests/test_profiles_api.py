"""POST /internal/v1/players/profiles:apply (docs/api.md, Player profiles and friends): the
profile service writes players' regions, versioned like score events, with a history of
every accepted write; concurrent writers of one player keep versions moving forward."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.test import override_settings
from rest_framework.test import APIClient

from leaderboard.api_clients import KNOWN_SCOPES, api_client_create
from leaderboard.core.profiles import ProfileWrite
from leaderboard.models import ApiClient, PlayerProfile, PlayerProfileChange
from leaderboard.profiles import player_profiles_apply
from tests.support import TEST_ACTOR

URL = "/internal/v1/players/profiles:apply"
Post = Callable[[Any], Any]

# An outcome of a profile without a name or country.
NO_NAME = {"display_name": None, "country": None}


@pytest.fixture
def profile_service(db: Any) -> tuple[ApiClient, APIClient]:
    row, token = api_client_create(name="profile-service", scopes=["profiles:write"], actor=TEST_ACTOR)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return row, client


@pytest.fixture
def post(profile_service: tuple[ApiClient, APIClient]) -> Post:
    def send(body: Any) -> Any:
        return profile_service[1].post(URL, body, format="json")

    return send


def item(player_id: str, region: str | None, version: int) -> dict[str, Any]:
    return {"player_id": player_id, "region": region, "profile_version": version}


def apply_ok(post: Post, *items: dict[str, Any]) -> list[dict[str, Any]]:
    response = post({"profiles": list(items)})
    assert response.status_code == 200, response.content
    results: list[dict[str, Any]] = response.json()["results"]
    return results


def stored(player_id: str) -> tuple[str, int]:
    row = PlayerProfile.objects.get(player_id=player_id)
    return row.region, row.profile_version


def history(player_id: str) -> list[tuple[str, str, int]]:
    return list(PlayerProfileChange.objects.filter(player_id=player_id).order_by("id").values_list(
        "old_region", "region", "profile_version"))


def nothing_written() -> bool:
    return not PlayerProfile.objects.exists() and not PlayerProfileChange.objects.exists()


# --- scope --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_scope_is_known_and_the_command_hands_out_tokens_with_it() -> None:
    assert "profiles:write" in KNOWN_SCOPES
    out = StringIO()
    call_command("create_api_client", "profiles", "--scope", "profiles:write", stdout=out)
    assert "created with scopes profiles:write" in out.getvalue()


# --- outcomes -----------------------------------------------------------------------------


def test_a_first_profile_with_a_region_is_applied_stored_and_recorded(
    post: Post, profile_service: tuple[ApiClient, APIClient]
) -> None:
    response = post({"profiles": [item("alice", "eu", 3)]})
    assert response.status_code == 200
    assert response.json() == {"results": [{"player_id": "alice", "status": "applied", "region": "eu",
                                            "profile_version": 3, **NO_NAME}]}
    assert stored("alice") == ("eu", 3)
    change = PlayerProfileChange.objects.get(player_id="alice")
    assert (change.old_region, change.region, change.profile_version, change.client_id) == (
        "", "eu", 3, profile_service[0].pk)


def test_a_first_profile_without_a_region_is_unchanged_but_recorded(post: Post) -> None:
    assert apply_ok(post, item("bob", None, 1)) == [
        {"player_id": "bob", "status": "unchanged", "region": None, "profile_version": 1, **NO_NAME}]
    assert stored("bob") == ("", 1)
    assert history("bob") == [("", "", 1)]


def test_newer_versions_apply_or_leave_unchanged_and_older_ones_are_stale(post: Post) -> None:
    apply_ok(post, item("p", "eu", 5))
    assert apply_ok(post, item("p", "eu", 6)) == [
        {"player_id": "p", "status": "unchanged", "region": "eu", "profile_version": 6, **NO_NAME}]
    assert apply_ok(post, item("p", "na", 6), item("p", "na", 2)) == [
        {"player_id": "p", "status": "stale", "region": "eu", "profile_version": 6, **NO_NAME},
        {"player_id": "p", "status": "stale", "region": "eu", "profile_version": 6, **NO_NAME},
    ]
    assert apply_ok(post, item("p", "na", 9)) == [
        {"player_id": "p", "status": "applied", "region": "na", "profile_version": 9, **NO_NAME}]
    assert apply_ok(post, item("p", None, 10)) == [
        {"player_id": "p", "status": "applied", "region": None, "profile_version": 10, **NO_NAME}]
    assert stored("p") == ("", 10)
    assert history("p") == [("", "eu", 5), ("eu", "eu", 6), ("eu", "na", 9), ("na", "", 10)]


def test_items_of_one_batch_take_effect_in_order(post: Post) -> None:
    results = apply_ok(post, item("a", "eu", 1), item("b", "na", 1), item("a", "apac", 2), item("a", "na", 2),
                       item("a", "apac", 3))
    assert [(r["player_id"], r["status"], r["region"], r["profile_version"]) for r in results] == [
        ("a", "applied", "eu", 1), ("b", "applied", "na", 1), ("a", "applied", "apac", 2),
        ("a", "stale", "apac", 2), ("a", "unchanged", "apac", 3),
    ]
    assert stored("a") == ("apac", 3) and stored("b") == ("na", 1)
    assert history("a") == [("", "eu", 1), ("eu", "apac", 2), ("apac", "apac", 3)]


def test_a_batch_of_1000_profiles_is_applied_in_one_request(post: Post) -> None:
    results = apply_ok(post, *[item(f"p{i}", "eu" if i % 2 else None, 1) for i in range(1000)])
    assert [r["status"] for r in results[:2]] == ["unchanged", "applied"] and len(results) == 1000
    assert PlayerProfile.objects.count() == 1000 and PlayerProfileChange.objects.count() == 1000


# --- malformed requests: 400, nothing written ---------------------------------------------


def test_one_invalid_item_fails_the_whole_batch(post: Post) -> None:
    response = post({"profiles": [item("a", "eu", 1), item("b", "Europe", 1), item("c bad", "eu", 0)]})
    assert response.status_code == 400
    body = response.json()
    assert (body["error"], body["detail"]) == ("validation_error", "the request is invalid; nothing was written")
    assert body["fields"] == {
        "profiles[1].region": ["must be 1..16 characters from [a-z0-9-], or null"],
        "profiles[2].player_id": ["must be 1..64 characters from [A-Za-z0-9_.:-]"],
        "profiles[2].profile_version": ["out of range: must be in 1..9223372036854775807 (the largest 64-bit integer)"],
    }
    assert nothing_written()


@pytest.mark.parametrize("body", [{}, {"profiles": []}, [item("a", "eu", 1)], item("a", "eu", 1),
                                  {"profiles": [{"player_id": "a", "profile_version": 1}]}])
def test_a_bad_body_shape_is_400(post: Post, body: Any) -> None:
    response = post(body)
    assert response.status_code == 400 and response.json()["error"] == "validation_error"
    assert nothing_written()


@pytest.mark.parametrize("raw", [b"{", b"not json", b'{"profiles": [NaN]}'])
def test_malformed_json_is_400(profile_service: tuple[ApiClient, APIClient], raw: bytes) -> None:
    response = profile_service[1].post(URL, data=raw, content_type="application/json")
    assert response.status_code == 400 and response.json()["error"] == "malformed_json"
    assert nothing_written()


def test_a_batch_over_1000_profiles_is_413(post: Post) -> None:
    response = post({"profiles": [item(f"p{i}", "eu", 1) for i in range(1001)]})
    assert response.status_code == 413
    assert response.json() == {"error": "payload_too_large", "detail": "a batch holds at most 1000 profiles, got 1001"}
    assert nothing_written()


def test_a_body_over_the_size_limit_is_413(profile_service: tuple[ApiClient, APIClient]) -> None:
    body = json.dumps({"profiles": [item(f"p{i}", "eu", 1) for i in range(30)]}).encode()
    assert len(body) > 1024
    with override_settings(SCORES_MAX_BODY_BYTES=1024):
        response = profile_service[1].post(URL, data=body, content_type="application/json")
    assert response.status_code == 413 and response.json()["error"] == "payload_too_large"
    assert nothing_written()


def test_a_body_that_is_not_json_is_415(profile_service: tuple[ApiClient, APIClient]) -> None:
    response = profile_service[1].post(URL, data="player_id=a&region=eu",
                                       content_type="application/x-www-form-urlencoded")
    assert response.status_code == 415 and response.json()["error"] == "unsupported_media_type"
    assert nothing_written()


# --- authentication and scope ---------------------------------------------------------------


@pytest.mark.django_db
def test_no_token_is_401() -> None:
    response = APIClient().post(URL, {"profiles": [item("a", "eu", 1)]}, format="json")
    assert response.status_code == 401 and response.json()["error"] == "unauthenticated"
    assert nothing_written()


def test_a_score_writer_token_is_403(api: APIClient) -> None:
    response = api.post(URL, {"profiles": [item("a", "eu", 1)]}, format="json")
    assert response.status_code == 403
    assert response.json() == {"error": "forbidden", "detail": "this token lacks the 'profiles:write' scope"}
    assert nothing_written()


def test_get_is_405(profile_service: tuple[ApiClient, APIClient]) -> None:
    response = profile_service[1].get(URL)
    assert response.status_code == 405 and response.json()["error"] == "method_not_allowed"


# --- concurrent writers of one player (PostgreSQL) -------------------------------------------


def _in_thread(fn: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        try:
            return fn()
        finally:
            connection.close()

    return run


def _hold_open(writes: list[ProfileWrite], applied: threading.Event, release: threading.Event) -> None:
    with transaction.atomic():
        player_profiles_apply(profiles=writes, client=None)
        applied.set()
        assert release.wait(10)


def _race(held: ProfileWrite, later: ProfileWrite) -> list[Any]:
    """`held` applied in a transaction kept open while `later` is sent; returns `later`'s outcomes
    once both committed, after checking that `later` waited for `held`."""
    applied, release = threading.Event(), threading.Event()
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(_in_thread(lambda: _hold_open([held], applied, release)))
        assert applied.wait(10)
        second = pool.submit(_in_thread(lambda: player_profiles_apply(profiles=[later], client=None)))
        time.sleep(0.3)
        waited = not second.done()
        release.set()
        first.result(timeout=10)
        outcomes: list[Any] = second.result(timeout=10)
    assert waited, "the second writer did not wait for the first one's transaction"
    return outcomes


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_lower_version_arriving_while_a_higher_one_commits_is_stale() -> None:
    outcomes = _race(ProfileWrite("p", "eu", 2), ProfileWrite("p", "na", 1))
    assert [(o.status, o.region, o.profile_version) for o in outcomes] == [("stale", "eu", 2)]
    assert stored("p") == ("eu", 2)
    assert history("p") == [("", "eu", 2)]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_higher_version_waits_for_the_lower_one_and_history_has_both_in_version_order() -> None:
    outcomes = _race(ProfileWrite("p", "eu", 1), ProfileWrite("p", "na", 2))
    assert [(o.status, o.region, o.profile_version) for o in outcomes] == [("applied", "na", 2)]
    assert stored("p") == ("na", 2)
    assert history("p") == [("", "eu", 1), ("eu", "na", 2)]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_many_concurrent_batches_keep_the_highest_version_and_an_ordered_history() -> None:
    """Writers sending overlapping players in different orders: no deadlock, every player
    ends at its highest version, and each history is strictly increasing in version."""
    players, writers, versions = ["a", "b", "c", "d"], 4, 15
    rng = random.Random(14)
    plans = []
    for w in range(writers):
        batches = []
        for v in range(1, versions + 1):
            chosen = rng.sample(players, k=3)
            batches.append([ProfileWrite(p, rng.choice(["eu", "na", None]), v * writers + w) for p in chosen])
        rng.shuffle(batches)
        plans.append(batches)

    def write_all(batches: list[list[ProfileWrite]]) -> None:
        try:
            for batch in batches:
                player_profiles_apply(profiles=batch, client=None)
        finally:
            connection.close()

    with ThreadPoolExecutor(writers) as pool:
        for future in [pool.submit(write_all, batches) for batches in plans]:
            future.result(timeout=60)
    sent = [w for batches in plans for batch in batches for w in batch]
    for player in players:
        top = max((w for w in sent if w.player_id == player), key=lambda w: w.profile_version)
        assert stored(player) == (top.region or "", top.profile_version)
        recorded = history(player)
        assert [v for _, _, v in recorded] == sorted({v for _, _, v in recorded})
        assert recorded[-1][2] == top.profile_version
        # Each change starts from the region the previous one left.
        assert all(prev[1] == cur[0] for prev, cur in zip(recorded, recorded[1:], strict=False))
