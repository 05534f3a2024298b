"""POST /internal/v1/seasons/{season_id}/disputes: a support tool files disputes with its own
scope (disputes:write), idempotently per ticket, audited as the API client."""

from __future__ import annotations

from collections.abc import Callable
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from audit.models import AuditEntry
from leaderboard.api_clients import KNOWN_SCOPES, api_client_create
from seasons.models import Dispute, Season
from tests.support import TEST_ACTOR

pytestmark = pytest.mark.django_db


@pytest.fixture
def support() -> APIClient:
    client_row, token = api_client_create(name="support-tool", scopes=["disputes:write"], actor=TEST_ACTOR)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    client.row = client_row  # type: ignore[attr-defined]
    return client


def url(season: str) -> str:
    return f"/internal/v1/seasons/{season}/disputes"


def test_the_scope_is_known_and_the_command_hands_out_tokens_with_it() -> None:
    assert "disputes:write" in KNOWN_SCOPES
    out = StringIO()
    call_command("create_api_client", "helpdesk", "--scope", "disputes:write", stdout=out)
    assert "created with scopes disputes:write" in out.getvalue()


def test_a_support_tool_files_a_dispute_once_per_ticket(support: APIClient, season: Season) -> None:
    body = {"player_id": "p-17", "summary": "score missing after match m-9", "details": "ticket text",
            "claimed_score": 48_200, "match_id": "m-9", "external_ref": "ZD-1001"}
    response = support.post(url(season.slug), body, format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["status"] == "open" and data["player_id"] == "p-17" and data["season_id"] == season.slug
    dispute = Dispute.objects.get(pk=data["dispute_id"])
    assert (dispute.source, dispute.filed_by_label, dispute.claimed_score, dispute.external_ref) == (
        "api", "support-tool", 48_200, "ZD-1001")
    entry = AuditEntry.objects.get(action="dispute.filed")
    assert (entry.actor_type, entry.actor_label, entry.target_id) == ("api_client", "support-tool", str(dispute.pk))

    again = support.post(url(season.slug), body, format="json")
    assert again.status_code == 200 and again.json()["dispute_id"] == dispute.pk
    assert Dispute.objects.count() == 1 and AuditEntry.objects.filter(action="dispute.filed").count() == 1

    minimal = support.post(url(season.slug), {"player_id": "p-18", "summary": "wrong rank"}, format="json")
    assert minimal.status_code == 201 and minimal.json()["claimed_score"] is None


@pytest.mark.parametrize(("body", "field"), [
    ({"summary": "x"}, "player_id"),
    ({"player_id": "bad id", "summary": "x"}, "player_id"),
    ({"player_id": "p"}, "summary"),
    ({"player_id": "p", "summary": "x", "claimed_score": 1_000_001}, "claimed_score"),
    ({"player_id": "p", "summary": "x", "claimed_score": True}, "claimed_score"),
    ({"player_id": "p", "summary": "x" * 201}, "summary"),
    ({"player_id": "p", "summary": "x", "details": 5}, "details"),
    ({"player_id": "p", "summary": "x", "status": "resolved"}, "status"),
])
def test_a_malformed_dispute_is_a_400_naming_the_field(support: APIClient, season: Season, body: dict[str, Any],
                                                      field: str) -> None:
    response = support.post(url(season.slug), body, format="json")
    assert response.status_code == 400
    assert response.json()["error"] == "validation_error" and field in response.json()["fields"]
    assert not Dispute.objects.exists()


def test_auth_scope_and_season_errors(support: APIClient, season: Season, api: APIClient) -> None:
    body = {"player_id": "p", "summary": "x"}
    assert APIClient().post(url(season.slug), body, format="json").status_code == 401
    bad = APIClient()
    bad.credentials(HTTP_AUTHORIZATION="Bearer lbk_nope")
    assert bad.post(url(season.slug), body, format="json").status_code == 401
    forbidden = api.post(url(season.slug), body, format="json")  # the match service's token: scores:write only
    assert forbidden.status_code == 403 and forbidden.json()["error"] == "forbidden"
    missing = support.post(url("no-such-season"), body, format="json")
    assert missing.status_code == 404 and missing.json()["error"] == "season_not_found"
    assert support.post(url(season.slug), b"{not json", content_type="application/json").status_code == 400
    assert support.get(url(season.slug)).status_code == 405
    assert not Dispute.objects.exists()


def test_the_disputes_token_cannot_write_scores(support: APIClient, season: Season,
                                                event_factory: Callable[..., dict[str, Any]]) -> None:
    response = support.post(f"/internal/v1/seasons/{season.slug}/scores:apply", event_factory(), format="json")
    assert response.status_code == 403
