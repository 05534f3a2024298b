"""A season's regions and tie-break (docs/rules.md, Regional and friends boards): set by
manage.py create_season, changed only while the season is SCHEDULED (season_regions_set, the
staff console's season page), audited."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.core.management import CommandError

from audit.models import AuditEntry
from leaderboard.core.lifecycle import SeasonState
from leaderboard.ledger_databases import ledger_aliases
from seasons.models import Season
from seasons.services import SeasonError, season_create, season_regions_set, season_transition
from tests.support import TEST_ACTOR, create_season_command

pytestmark = pytest.mark.django_db
pytest_plugins = ["tests.support.staff_fixtures"]

NOW = datetime.now(UTC)
SeasonFactory = Callable[..., Season]




@pytest.fixture
def scheduled(season_factory: SeasonFactory) -> Season:
    return season_factory(slug="later", starts_at=NOW + timedelta(days=1), cutoff=NOW + timedelta(days=30),
                          regions=["na", "eu"])


def reload(season: Season) -> Season:
    return Season.objects.get(pk=season.pk)


# --- manage.py create_season -------------------------------------------------------------------


def placement_lines(season: Season) -> list[str]:
    """The line naming the databases of a season's partitions, printed when some are not in
    "default" (LEDGER_PARTITION_URLS)."""
    if not season.ledger_databases:
        return []
    return ["ledger databases: " + "; ".join(f"{alias} partitions {', '.join(map(str, parts))}"
                                             for alias, parts in ledger_aliases(season=season).items())]


def test_create_season_takes_regions_and_a_tie_break_and_audits_them() -> None:
    out = create_season_command("reg", "--regions", "na, eu,apac", "--tie-break", "first_reached")
    season = Season.objects.get(slug="reg")
    assert out.splitlines() == [f"season reg created, state SCHEDULED, {settings.SEASON_PARTITIONS} ledger partitions",
                                *placement_lines(season),
                                "regions: na, eu, apac; tie-break: first_reached; mode: best; scores: 0..1000000, desc"]
    assert (season.regions, season.tie_break) == (["na", "eu", "apac"], "first_reached")
    entry = AuditEntry.objects.get(action="season.created", season_slug="reg")
    assert entry.after is not None
    assert (entry.after["regions"], entry.after["tie_break"]) == (["na", "eu", "apac"], "first_reached")


def test_create_season_without_options_has_no_regions_and_shared_ties() -> None:
    out = create_season_command("plain")
    season = Season.objects.get(slug="plain")
    assert out.splitlines() == [
        f"season plain created, state SCHEDULED, {settings.SEASON_PARTITIONS} ledger partitions",
        *placement_lines(season)]
    assert (season.regions, season.tie_break) == ([], "shared")


@pytest.mark.parametrize(
    ("regions", "message"),
    [
        ("na,EU", "region 'EU' must be 1..16 characters from \\[a-z0-9-\\]"),
        ("na,eu,na", "region 'na' is listed twice"),
        (",".join(f"r{i}" for i in range(17)), "a season has at most 16 regions, got 17"),
        ("north_america", "region 'north_america' must be"),
    ],
)
def test_create_season_refuses_bad_regions_and_creates_nothing(regions: str, message: str) -> None:
    with pytest.raises(CommandError, match=message):
        create_season_command("bad", "--regions", regions)
    assert not Season.objects.filter(slug="bad").exists()
    assert not AuditEntry.objects.filter(action="season.created").exists()


def test_create_season_refuses_an_unknown_tie_break() -> None:
    with pytest.raises(CommandError, match="invalid choice: 'coin_flip'"):
        create_season_command("bad", "--tie-break", "coin_flip")
    assert not Season.objects.filter(slug="bad").exists()


def test_season_create_refuses_an_unknown_tie_break() -> None:
    with pytest.raises(SeasonError, match="tie_break must be one of shared, first_reached"):
        season_create(slug="x", name="x", starts_at=NOW, cutoff=NOW + timedelta(days=1), actor=TEST_ACTOR,
                      tie_break="coin_flip")
    assert not Season.objects.exists()


# --- season_regions_set ------------------------------------------------------------------------


def test_a_scheduled_seasons_regions_change_with_an_audit_row(scheduled: Season) -> None:
    season_regions_set(season=scheduled, regions=["na", "eu", "apac"], actor=TEST_ACTOR, reason="launch in APAC")
    assert reload(scheduled).regions == ["na", "eu", "apac"]
    entry = AuditEntry.objects.get(action="season.regions.changed")
    assert (entry.target_type, entry.target_id, entry.season_slug, entry.reason) == (
        "season", "later", "later", "launch in APAC")
    assert (entry.before, entry.after) == ({"regions": ["na", "eu"]}, {"regions": ["na", "eu", "apac"]})

    season_regions_set(season=scheduled, regions=[], actor=TEST_ACTOR)
    assert reload(scheduled).regions == []
    assert AuditEntry.objects.filter(action="season.regions.changed").count() == 2


def test_setting_the_same_regions_writes_no_audit_row(scheduled: Season) -> None:
    season_regions_set(season=scheduled, regions=["na", "eu"], actor=TEST_ACTOR)
    assert not AuditEntry.objects.filter(action="season.regions.changed").exists()


def test_regions_are_fixed_once_the_season_opens(scheduled: Season) -> None:
    season_transition(season=scheduled, target=SeasonState.OPEN, actor=TEST_ACTOR, reason="early")
    opened = AuditEntry.objects.get(action="season.opened")
    assert opened.after is not None and opened.after["regions"] == ["na", "eu"]
    with pytest.raises(SeasonError, match="regions are fixed once the season opens; it is OPEN"):
        season_regions_set(season=scheduled, regions=["na"], actor=TEST_ACTOR)
    assert reload(scheduled).regions == ["na", "eu"]
    assert not AuditEntry.objects.filter(action="season.regions.changed").exists()


def test_invalid_regions_are_refused(scheduled: Season) -> None:
    with pytest.raises(SeasonError, match="listed twice"):
        season_regions_set(season=scheduled, regions=["eu", "eu"], actor=TEST_ACTOR)
    assert reload(scheduled).regions == ["na", "eu"]


# --- the staff console ---------------------------------------------------------------------------


def page(client: Any, season: Season) -> str:
    response = client.get(f"/staff/seasons/{season.slug}/")
    assert response.status_code == 200
    text: str = response.content.decode()
    return text


def test_the_season_page_shows_regions_and_tie_break(season_factory: SeasonFactory, client_as: Any) -> None:
    season = season_factory(slug="shown", regions=["na", "eu"], tie_break="first_reached")
    text = page(client_as("viewer"), season)
    assert '<span id="season-regions"><code>na</code>, <code>eu</code></span>' in text
    assert "first to reach the score ranks ahead" in text
    plain = season_factory(slug="plain")
    text = page(client_as("viewer"), plain)
    assert '<span id="season-regions">none</span>' in text and "shared (equal scores share a rank)" in text


def test_only_an_approver_sees_the_regions_form_and_only_while_scheduled(
    scheduled: Season, season_factory: SeasonFactory, client_as: Any
) -> None:
    assert 'id="regions-form"' not in page(client_as("reviewer"), scheduled)
    approver = client_as("approver")
    assert 'id="regions-form"' in page(approver, scheduled)
    assert 'value="na, eu"' in page(approver, scheduled)
    opened = season_factory(slug="open-now", starts_at=NOW - timedelta(days=1), cutoff=NOW + timedelta(days=3))
    assert 'id="regions-form"' not in page(approver, opened)


def test_an_approver_sets_regions_with_a_plain_form_post(scheduled: Season, client_as: Any) -> None:
    approver = client_as("approver")
    response = approver.post(f"/staff/seasons/{scheduled.slug}/regions",
                             {"regions": "na, eu , latam", "reason": "new market"})
    assert response.status_code == 302 and response["Location"] == f"/staff/seasons/{scheduled.slug}/"
    assert reload(scheduled).regions == ["na", "eu", "latam"]
    entry = AuditEntry.objects.get(action="season.regions.changed")
    assert (entry.actor_type, entry.actor_label, entry.reason) == ("user", approver.user.username, "new market")
    assert "Regions: na, eu, latam" in page(approver, scheduled)


def test_a_refused_regions_change_is_a_message_and_changes_nothing(scheduled: Season, client_as: Any) -> None:
    approver = client_as("approver")
    response = approver.post(f"/staff/seasons/{scheduled.slug}/regions", {"regions": "na, Europe"}, follow=True)
    assert response.status_code == 200
    assert "region &#x27;Europe&#x27; must be 1..16 characters from [a-z0-9-]" in response.content.decode()
    season_transition(season=scheduled, target=SeasonState.OPEN, actor=TEST_ACTOR)
    response = approver.post(f"/staff/seasons/{scheduled.slug}/regions", {"regions": "na"}, follow=True)
    assert "regions are fixed once the season opens; it is OPEN" in response.content.decode()
    assert reload(scheduled).regions == ["na", "eu"]


def test_a_reviewer_cannot_set_regions(scheduled: Season, client_as: Any) -> None:
    response = client_as("reviewer").post(f"/staff/seasons/{scheduled.slug}/regions", {"regions": "na"})
    assert response.status_code == 403
    assert reload(scheduled).regions == ["na", "eu"]
