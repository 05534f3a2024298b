"""A season's mode (docs/rules.md, Board kinds): `create_season --mode best|latest`, fixed
at creation and audited; in a `latest` season a newer result sets the score even when
lower, through the write API, the epochs and every read, and the FINAL."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.management import CommandError

from audit.models import AuditEntry
from leaderboard.core.lifecycle import SeasonState
from leaderboard.models import PlayerScore
from seasons.models import Season
from seasons.services import SeasonError, season_create, season_transition
from tests.support import TEST_ACTOR, Events, assert_board_equals, create_season_command, db_standings, post_ok, publish
from tests.support.publication import fast_get, reader_of

pytest_plugins = ["tests.support.staff_fixtures"]

NOW = datetime.now(UTC)




@pytest.mark.django_db
def test_create_season_takes_a_mode_prints_and_audits_it() -> None:
    out = create_season_command("newest", "--mode", "latest")
    assert out.splitlines()[-1] == "regions: none; tie-break: shared; mode: latest; scores: 0..1000000, desc"
    assert Season.objects.get(slug="newest").mode == "latest"
    entry = AuditEntry.objects.get(action="season.created", season_slug="newest")
    assert entry.after is not None and entry.after["mode"] == "latest"
    create_season_command("plain")
    assert Season.objects.get(slug="plain").mode == "best"


@pytest.mark.django_db
def test_an_unknown_mode_is_refused_with_the_modes_there_are() -> None:
    with pytest.raises(CommandError, match="invalid choice: 'max'"):
        create_season_command("summed", "--mode", "max")
    with pytest.raises(SeasonError, match="mode must be one of best, latest, sum, got 'median'"):
        season_create(slug="median", name="x", starts_at=NOW, cutoff=NOW + timedelta(days=1), actor=TEST_ACTOR,
                      mode="median")
    assert not Season.objects.filter(slug__in=["summed", "median"]).exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_a_latest_season_ranks_by_the_newest_result_in_every_read(
        season_factory: Callable[..., Season], post_scores: Any) -> None:
    season = season_factory(slug="latest", mode="latest")
    ev = Events(tag="latest")
    post_ok(post_scores, season, [ev.result(p, s) for p, s in (("ann", 500), ("bob", 400), ("cy", 300))])
    publish(season)
    assert fast_get("/v1/seasons/latest/players/ann/rank").json()["rank"] == 1
    # Ann's newest match went badly: her score is that result's, below both others.
    (lowered,) = post_ok(post_scores, season, [ev.result("ann", 100)])
    assert (lowered["status"], lowered["score"]) == ("applied", 100)
    # An older result (a lower score_version) is stale, whatever its score.
    (stale,) = post_ok(post_scores, season, [{**ev.result("ann", 900), "score_version": 1}])
    assert (stale["status"], stale["score"]) == ("stale", 100)
    publish(season)
    answer = fast_get("/v1/seasons/latest/players/ann/rank").json()
    assert (answer["rank"], answer["score"]) == (3, 100)
    top = fast_get("/v1/seasons/latest/leaderboard/top").json()
    assert [(e["player_id"], e["score"]) for e in top["entries"]] == [("bob", 400), ("cy", 300), ("ann", 100)]
    assert dict(PlayerScore.objects.filter(season=season).values_list("player_id", "score")) == {
        "ann": 100, "bob": 400, "cy": 300}
    assert_board_equals(reader_of(season), db_standings(season))


@pytest.mark.django_db
def test_the_same_results_rank_differently_in_a_best_and_a_latest_season(
        season_factory: Callable[..., Season], post_scores: Any) -> None:
    scores: dict[str, dict[str, int]] = {}
    for mode in ("best", "latest"):
        season = season_factory(slug=f"twin-{mode}", mode=mode)
        ev = Events(tag=f"twin-{mode}")
        post_ok(post_scores, season, [ev.result("dee", 700), ev.result("dee", 250), ev.result("eve", 500)])
        scores[mode] = dict(PlayerScore.objects.filter(season=season).values_list("player_id", "score"))
    assert scores == {"best": {"dee": 700, "eve": 500}, "latest": {"dee": 250, "eve": 500}}


@pytest.mark.django_db
def test_the_staff_season_page_says_how_scores_are_set(season_factory: Callable[..., Season],
                                                       client_as: Callable[..., Any]) -> None:
    season_factory(slug="page-latest", mode="latest")
    season_factory(slug="page-best")
    viewer = client_as("viewer")
    latest = viewer.get("/staff/seasons/page-latest/").content.decode()
    assert 'id="season-mode">the newest settled value (latest)<' in latest
    assert 'id="season-mode">the best settled score (best)<' in viewer.get("/staff/seasons/page-best/").content.decode()


@pytest.mark.django_db
def test_an_approver_changes_the_mode_while_scheduled_and_it_is_fixed_once_open(
        season_factory: Callable[..., Season], client_as: Callable[..., Any]) -> None:
    scheduled = season_factory(slug="soon", starts_at=NOW + timedelta(days=1), cutoff=NOW + timedelta(days=30))
    assert 'id="mode-form"' not in client_as("reviewer").get("/staff/seasons/soon/").content.decode()
    approver = client_as("approver")
    assert 'id="mode-form"' in approver.get("/staff/seasons/soon/").content.decode()
    response = approver.post("/staff/seasons/soon/mode", {"mode": "latest", "order": "desc", "max_score": 1_000_000,
                                                          "reason": "a ladder"})
    assert response.status_code == 302 and response["Location"] == "/staff/seasons/soon/"
    assert Season.objects.get(pk=scheduled.pk).mode == "latest"
    entry = AuditEntry.objects.get(action="season.mode.changed", season_slug="soon")
    assert (entry.before, entry.after, entry.reason) == ({"mode": "best"}, {"mode": "latest"}, "a ladder")
    assert (entry.actor_type, entry.actor_label) == ("user", approver.user.username)
    assert not AuditEntry.objects.filter(action="season.max_score.changed").exists()
    # The range: the layout follows it, audited by the range alone.
    approver.post("/staff/seasons/soon/mode", {"mode": "latest", "order": "asc", "max_score": 5_000,
                                               "reason": "levels"})
    changed = Season.objects.get(pk=scheduled.pk)
    assert (changed.max_score, changed.bucket_layout.size, changed.bucket_layout.range_of(0)) == (5_000, 101, (0, 49))
    entry = AuditEntry.objects.get(action="season.max_score.changed", season_slug="soon")
    assert (entry.before, entry.after) == ({"max_score": 1_000_000}, {"max_score": 5_000})
    entry = AuditEntry.objects.get(action="season.order.changed", season_slug="soon")
    assert (entry.before, entry.after) == ({"order": "desc"}, {"order": "asc"})
    page = approver.get("/staff/seasons/soon/").content.decode()
    assert 'id="season-range">0..5000<' in page and 'id="season-order">lower first (asc)<' in page
    # A mode the form does not offer, or a range above 2^40, changes nothing.
    approver.post("/staff/seasons/soon/mode", {"mode": "median", "order": "asc", "max_score": 10})
    approver.post("/staff/seasons/soon/mode", {"mode": "best", "order": "asc", "max_score": 2**40 + 1})
    assert (Season.objects.get(pk=scheduled.pk).mode, Season.objects.get(pk=scheduled.pk).max_score) == (
        "latest", 5_000)
    season_transition(season=scheduled, target=SeasonState.OPEN, actor=TEST_ACTOR)
    refused = approver.post("/staff/seasons/soon/mode", {"mode": "best", "order": "asc", "max_score": 5_000},
                            follow=True).content.decode()
    assert "the mode is fixed once the season opens; it is OPEN" in refused
    refused = approver.post("/staff/seasons/soon/mode", {"mode": "latest", "order": "asc", "max_score": 9},
                            follow=True).content.decode()
    assert "the score range is fixed once the season opens; it is OPEN" in refused
    assert Season.objects.get(pk=scheduled.pk).mode == "latest"
    assert AuditEntry.objects.filter(action="season.mode.changed").count() == 1
    assert 'id="mode-form"' not in refused
