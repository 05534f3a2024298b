"""manage.py create_season and create_api_client."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from audit.models import AuditEntry
from leaderboard.models import ApiClient, ScoreEvent
from seasons.models import Season
from tests.support import ledger_rows
from tests.test_season_regions import placement_lines

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def create_season(slug: str, starts_at: str, cutoff: str, *extra: str) -> str:
    return run("create_season", slug, "--name", "Winter 2026", "--starts-at", starts_at, "--cutoff", cutoff, *extra)


def iso(moment: datetime) -> str:
    return moment.isoformat()


NOW = datetime.now(UTC)


# --- create_season -----------------------------------------------------------------------


def test_create_season_writes_the_season_and_an_audit_row() -> None:
    out = create_season("winter-2026", "2026-11-01T00:00:00Z", iso(NOW + timedelta(days=30)))
    season = Season.objects.get(slug="winter-2026")
    assert out.splitlines() == [f"season winter-2026 created, state OPEN, {season.partitions} ledger partitions",
                                *placement_lines(season)]
    assert season.partitions == settings.SEASON_PARTITIONS
    assert season.name == "Winter 2026"
    assert season.starts_at == datetime(2026, 11, 1, tzinfo=UTC)
    assert season.state == "OPEN"
    assert season.published_version == 0
    entry = AuditEntry.objects.get(action="season.created")
    assert (entry.actor_type, entry.actor_label, entry.target_type, entry.target_id, entry.season_slug) == (
        "system", "manage.py create_season", "season", "winter-2026", "winter-2026",
    )
    assert entry.after is not None
    assert (entry.after["name"], entry.after["state"], entry.after["starts_at"]) == (
        "Winter 2026", "OPEN", "2026-11-01T00:00:00+00:00",
    )


@pytest.mark.parametrize(
    ("start_offset", "cutoff_offset", "state"),
    [(timedelta(days=1), timedelta(days=10), "SCHEDULED"), (-timedelta(days=10), -timedelta(days=1), "CLOSING")],
)
def test_create_season_initial_state_follows_the_clock(
    start_offset: timedelta, cutoff_offset: timedelta, state: str
) -> None:
    out = create_season("s", iso(NOW + start_offset), iso(NOW + cutoff_offset))
    season = Season.objects.get(slug="s")
    assert out.splitlines() == [f"season s created, state {state}, {settings.SEASON_PARTITIONS} ledger partitions",
                                *placement_lines(season)]
    assert season.state == state


def test_create_season_accepts_offsets() -> None:
    create_season("tz", "2026-11-01T02:00:00+02:00", iso(NOW + timedelta(days=3)))
    assert Season.objects.get(slug="tz").starts_at == datetime(2026, 11, 1, tzinfo=UTC)


def test_create_season_with_a_single_bucket() -> None:
    create_season("one", "2026-11-01T00:00:00Z", iso(NOW + timedelta(days=3)), "--single-bucket")
    assert Season.objects.get(slug="one").layout["lower_bounds"] == [0]


def test_create_season_duplicate_slug_is_an_error() -> None:
    create_season("dup", "2026-11-01T00:00:00Z", iso(NOW + timedelta(days=3)))
    with pytest.raises(CommandError, match="a season 'dup' already exists"):
        create_season("dup", "2026-11-02T00:00:00Z", iso(NOW + timedelta(days=4)))
    assert Season.objects.filter(slug="dup").count() == 1
    assert AuditEntry.objects.filter(action="season.created").count() == 1


@pytest.mark.parametrize(
    ("starts_at", "cutoff"),
    [
        ("2026-11-01", "2026-12-01T00:00:00Z"),
        ("2026-11-01T00:00:00", "2026-12-01T00:00:00Z"),
        ("2026-11-01T00:00:00Z", "next tuesday"),
        ("2026-13-01T00:00:00Z", "2026-12-01T00:00:00Z"),
    ],
)
def test_create_season_bad_dates_are_an_error(starts_at: str, cutoff: str) -> None:
    with pytest.raises(CommandError, match="RFC 3339"):
        create_season("bad", starts_at, cutoff)
    assert Season.objects.count() == 0
    assert AuditEntry.objects.count() == 0


@pytest.mark.parametrize("cutoff", ["2026-10-31T23:59:59Z", "2026-11-01T00:00:00Z"])
def test_create_season_cutoff_not_after_start_is_an_error(cutoff: str) -> None:
    with pytest.raises(CommandError, match="the cutoff must be after the start"):
        create_season("early", "2026-11-01T00:00:00Z", cutoff)
    assert Season.objects.count() == 0


@pytest.mark.parametrize("slug", ["Upper", "has space", "x" * 65, "ünï"])
def test_create_season_bad_slug_is_an_error(slug: str) -> None:
    with pytest.raises(CommandError, match="SLUG must be"):
        create_season(slug, "2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z")
    assert Season.objects.count() == 0


# --- create_api_client -------------------------------------------------------------------


def test_create_api_client_prints_the_token_last_and_stores_only_its_hash() -> None:
    out = run("create_api_client", "match-service", "--scope", "scores:write")
    lines = out.strip().splitlines()
    assert lines[0] == "api client match-service created with scopes scores:write"
    token = lines[-1]
    assert token.startswith("lbk_")
    assert len(token) >= 40
    client = ApiClient.objects.get(name="match-service")
    assert client.token_hash == hashlib.sha256(token.encode()).hexdigest()
    assert client.token_prefix == token[:12]
    assert client.scopes == ["scores:write"]
    assert client.active is True
    stored = [str(v) for v in ApiClient.objects.values_list().get()]
    assert all(token not in value for value in stored)

    entry = AuditEntry.objects.get(action="api_client.created")
    assert (entry.actor_type, entry.actor_label, entry.target_type, entry.target_id) == (
        "system", "manage.py create_api_client", "api_client", str(client.pk),
    )
    assert entry.after == {"name": "match-service", "scopes": ["scores:write"], "token_prefix": token[:12]}
    assert token not in str(entry.after)


def test_created_token_authenticates_a_write(event_factory: Any) -> None:
    create_season("live", "2026-11-01T00:00:00Z", iso(NOW + timedelta(days=3)))
    token = run("create_api_client", "svc", "--scope", "scores:write").strip().splitlines()[-1]
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    response = api.post("/internal/v1/seasons/live/scores:apply", event_factory(), format="json")
    assert response.status_code == 200
    assert response.json()["results"][0]["status"] == "applied"
    (event,) = ledger_rows(ScoreEvent, Season.objects.get(slug="live"))
    assert event.client_id == ApiClient.objects.get(name="svc").pk


def test_two_clients_get_different_tokens() -> None:
    first = run("create_api_client", "a", "--scope", "scores:write").strip().splitlines()[-1]
    second = run("create_api_client", "b", "--scope", "scores:write").strip().splitlines()[-1]
    assert first != second


def test_create_api_client_unknown_scope_is_an_error() -> None:
    with pytest.raises(CommandError, match=r"unknown scope\(s\): scores:admin"):
        run("create_api_client", "svc", "--scope", "scores:admin")
    assert ApiClient.objects.count() == 0
    assert AuditEntry.objects.count() == 0


def test_create_api_client_duplicate_name_is_an_error() -> None:
    run("create_api_client", "svc", "--scope", "scores:write")
    with pytest.raises(CommandError, match="an API client named 'svc' already exists"):
        run("create_api_client", "svc", "--scope", "scores:write")
    assert ApiClient.objects.count() == 1


def test_create_api_client_requires_a_scope() -> None:
    with pytest.raises(CommandError):
        run("create_api_client", "svc")
    assert ApiClient.objects.count() == 0


# --- deactivate_api_client ---------------------------------------------------------------


def test_a_deactivated_client_token_no_longer_authenticates_and_the_change_is_audited(
    event_factory: Any,
) -> None:
    token = run("create_api_client", "old-svc", "--scope", "scores:write").strip().splitlines()[-1]
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    create_season("rot", "2026-11-01T00:00:00Z", iso(NOW + timedelta(days=3)))
    url = "/internal/v1/seasons/rot/scores:apply"
    assert api.post(url, event_factory(), format="json").status_code == 200
    assert run("deactivate_api_client", "old-svc", "--reason", "rotated").strip() == "api client old-svc deactivated"
    assert api.post(url, event_factory(), format="json").status_code == 401
    entry = AuditEntry.objects.get(action="api_client.deactivated")
    assert (entry.actor_label, entry.reason, entry.after) == (
        "manage.py deactivate_api_client", "rotated", {"name": "old-svc", "active": False})
    with pytest.raises(CommandError, match="already deactivated"):
        run("deactivate_api_client", "old-svc")
    with pytest.raises(CommandError, match="no API client named 'nobody'"):
        run("deactivate_api_client", "nobody")
