"""PUT /internal/v1/players/{player_id}/friends (docs/api.md, Player profiles and friends): the
social service replaces a player's friend list, only with a newer graph_version."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from rest_framework.test import APIClient

from leaderboard.api_clients import KNOWN_SCOPES, api_client_create
from leaderboard.core.profiles import StaleGraphVersion
from leaderboard.models import FriendList
from leaderboard.profiles import player_friends_put
from tests.support import TEST_ACTOR


def url(player_id: str) -> str:
    return f"/internal/v1/players/{player_id}/friends"


@pytest.fixture
def social(db: Any) -> APIClient:
    _, token = api_client_create(name="social-service", scopes=["social:write"], actor=TEST_ACTOR)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


Put = Callable[..., Any]


@pytest.fixture
def put(social: APIClient) -> Put:
    def send(player_id: str, body: Any) -> Any:
        return social.put(url(player_id), body, format="json")

    return send


def stored(player_id: str) -> tuple[list[str], int]:
    row = FriendList.objects.get(player_id=player_id)
    return row.friends, row.graph_version


@pytest.mark.django_db
def test_the_scope_is_known_and_the_command_hands_out_tokens_with_it() -> None:
    assert "social:write" in KNOWN_SCOPES
    out = StringIO()
    call_command("create_api_client", "social", "--scope", "social:write", stdout=out)
    assert "created with scopes social:write" in out.getvalue()


# --- versions -----------------------------------------------------------------------------


def test_a_friend_list_is_stored_in_order_and_answered_with_its_size(put: Put) -> None:
    response = put("alice", {"friends": ["carol", "bob", "dave"], "graph_version": 4})
    assert response.status_code == 200
    assert response.json() == {"player_id": "alice", "graph_version": 4, "friends": 3}
    assert stored("alice") == (["carol", "bob", "dave"], 4)


def test_a_newer_graph_version_replaces_the_whole_list(put: Put) -> None:
    put("alice", {"friends": ["bob", "carol"], "graph_version": 1})
    response = put("alice", {"friends": ["dave"], "graph_version": 2})
    assert response.status_code == 200 and response.json()["friends"] == 1
    assert stored("alice") == (["dave"], 2)
    assert put("alice", {"friends": [], "graph_version": 3}).json() == {"player_id": "alice", "graph_version": 3,
                                                                        "friends": 0}
    assert stored("alice") == ([], 3)


@pytest.mark.parametrize("version", [5, 4, 1])
def test_a_graph_version_not_newer_is_409_and_changes_nothing(put: Put, version: int) -> None:
    put("alice", {"friends": ["bob"], "graph_version": 5})
    response = put("alice", {"friends": ["carol"], "graph_version": version})
    assert response.status_code == 409
    assert response.json() == {
        "error": "stale_graph_version", "graph_version": 5,
        "detail": f"graph_version {version} is not newer than the stored 5; the friend list is unchanged",
    }
    assert stored("alice") == (["bob"], 5)


def test_1000_friends_are_accepted(put: Put) -> None:
    response = put("alice", {"friends": [f"f{i}" for i in range(1000)], "graph_version": 1})
    assert response.status_code == 200 and response.json()["friends"] == 1000


# --- bad requests: 400, nothing written -----------------------------------------------------


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ({"friends": ["bob", "alice"], "graph_version": 1},
         {"friends[1]": ["is the player itself: a player is not their own friend"]}),
        ({"friends": ["bob", "carol", "bob"], "graph_version": 1},
         {"friends[2]": ["repeats friends[0]: friends must be distinct"]}),
        ({"friends": [f"f{i}" for i in range(1001)], "graph_version": 1},
         {"friends": ["must hold at most 1000 ids, got 1001"]}),
        ({"friends": ["b o b"], "graph_version": 1}, {"friends[0]": ["must be 1..64 characters from [A-Za-z0-9_.:-]"]}),
        ({"friends": ["bob"], "graph_version": 0},
         {"graph_version": ["out of range: must be in 1..9223372036854775807 (the largest 64-bit integer)"]}),
        ({"friends": ["bob"]}, {"graph_version": ["this field is required"]}),
        (["bob"], {"body": ["must be a JSON object"]}),
    ],
)
def test_a_bad_friend_list_is_400_naming_the_field(put: Put, body: Any, fields: dict[str, list[str]]) -> None:
    response = put("alice", body)
    assert response.status_code == 400
    assert response.json() == {"error": "validation_error", "detail": "the request is invalid; nothing was written",
                               "fields": fields}
    assert not FriendList.objects.exists()


def test_a_player_id_outside_the_id_rule_is_400(put: Put) -> None:
    response = put("al ice", {"friends": [], "graph_version": 1})
    assert response.status_code == 400
    assert response.json()["fields"] == {"player_id": ["must be 1..64 characters from [A-Za-z0-9_.:-]"]}
    assert not FriendList.objects.exists()


def test_malformed_json_is_400_and_a_form_body_is_415(social: APIClient) -> None:
    bad = social.put(url("alice"), data=b"{", content_type="application/json")
    assert bad.status_code == 400 and bad.json()["error"] == "malformed_json"
    form = social.put(url("alice"), data="friends=bob", content_type="application/x-www-form-urlencoded")
    assert form.status_code == 415 and form.json()["error"] == "unsupported_media_type"
    assert not FriendList.objects.exists()


@pytest.mark.django_db
def test_no_token_is_401_and_another_scope_is_403(api: APIClient) -> None:
    body = {"friends": ["bob"], "graph_version": 1}
    assert APIClient().put(url("alice"), body, format="json").status_code == 401
    refused = api.put(url("alice"), body, format="json")
    assert refused.status_code == 403
    assert refused.json() == {"error": "forbidden", "detail": "this token lacks the 'social:write' scope"}
    assert not FriendList.objects.exists()


def test_post_is_405(social: APIClient) -> None:
    response = social.post(url("alice"), {"friends": [], "graph_version": 1}, format="json")
    assert response.status_code == 405 and response.json()["error"] == "method_not_allowed"


# --- concurrent writers (PostgreSQL) ----------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_lower_graph_version_arriving_while_a_higher_one_commits_is_409_and_the_higher_stays() -> None:
    applied, release = threading.Event(), threading.Event()

    def hold_v2() -> None:
        try:
            with transaction.atomic():
                player_friends_put(player_id="alice", friends=["bob", "carol"], graph_version=2)
                applied.set()
                assert release.wait(10)
        finally:
            connection.close()

    def put_v1() -> None:
        try:
            player_friends_put(player_id="alice", friends=["dave"], graph_version=1)
        finally:
            connection.close()

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(hold_v2)
        assert applied.wait(10)
        second = pool.submit(put_v1)
        time.sleep(0.3)
        waited = not second.done()
        release.set()
        first.result(timeout=10)
        with pytest.raises(StaleGraphVersion) as refused:
            second.result(timeout=10)
    assert waited, "the second writer did not wait for the first one's transaction"
    assert refused.value.extra == {"graph_version": 2}
    assert stored("alice") == (["bob", "carol"], 2)
