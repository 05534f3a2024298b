"""Recurring seasons (docs/rules.md, Recurring seasons): the windows of a schedule, a series
created by `manage.py create_series`, its windows opened, sealed and finalized by the clock
(a clock moved by the test: `series_tick(now=...)`, `seasons_lifecycle_tick(now=...)`),
never twice and never skipped, results filed in the window that holds them, and the
series read."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from hypothesis import given
from hypothesis import strategies as st
from rest_framework.test import APIClient

from audit.models import AuditEntry
from leaderboard.core.events import events_parse
from leaderboard.core.series import EVERIES, window_bounds, window_of, windows_due
from leaderboard.models import ScoreEvent
from leaderboard.redis_client import redis_get
from leaderboard.views.season_index import season_keys
from seasons.models import FinalCandidate, Season, Series
from seasons.series.services import series_create, series_events_apply, series_tick
from seasons.services import seasons_lifecycle_tick
from tests.support import TEST_ACTOR, Events, publish
from tests.support.publication import current_manifest

pytest_plugins = ["tests.support.staff_fixtures"]



def _now() -> datetime:
    """The real time now: windows are created in the state their dates call for by it (the
    clock a test moves only drives the ticks), so each test takes it when it starts."""
    return datetime.now(UTC).replace(microsecond=0)


# --- the schedule (pure) ----------------------------------------------------------------------


def test_windows_of_a_day_a_week_and_a_calendar_month() -> None:
    anchor = datetime(2027, 1, 31, 18, 0, tzinfo=UTC)
    assert window_bounds(every="1d", anchor=anchor, n=3) == (anchor + timedelta(days=2), anchor + timedelta(days=3))
    assert window_bounds(every="7d", anchor=anchor, n=2) == (anchor + timedelta(days=7), anchor + timedelta(days=14))
    # A month anchored on the 31st: the day clamped to the month's last.
    assert [window_bounds(every="1mo", anchor=anchor, n=n)[0].date().isoformat() for n in (1, 2, 3, 4)] == [
        "2027-01-31", "2027-02-28", "2027-03-31", "2027-04-30"]
    assert window_of(every="1mo", anchor=anchor, instant=datetime(2027, 2, 28, 17, 59, tzinfo=UTC)) == 1
    assert window_of(every="1mo", anchor=anchor, instant=datetime(2027, 2, 28, 18, 0, tzinfo=UTC)) == 2
    assert window_of(every="1d", anchor=anchor, instant=anchor - timedelta(seconds=1)) is None
    assert list(windows_due(every="1d", anchor=anchor, now=anchor - timedelta(days=1))) == [1]
    assert list(windows_due(every="1d", anchor=anchor, now=anchor + timedelta(days=2, hours=1))) == [1, 2, 3, 4]


@given(every=st.sampled_from(EVERIES), n=st.integers(1, 400),
       anchor=st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)))
def test_every_instant_belongs_to_exactly_the_window_that_spans_it(every: str, n: int, anchor: datetime) -> None:
    starts_at, cutoff = window_bounds(every=every, anchor=anchor, n=n)
    assert starts_at < cutoff
    assert window_of(every=every, anchor=anchor, instant=starts_at) == n
    assert window_of(every=every, anchor=anchor, instant=cutoff - timedelta(microseconds=1)) == n
    assert window_of(every=every, anchor=anchor, instant=cutoff) == n + 1


# --- creating a series --------------------------------------------------------------------------


def _create(series_id: str, *extra: str) -> str:
    out = StringIO()
    call_command("create_series", series_id, "--name", "Daily challenge", *extra, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_create_series_opens_every_window_since_its_anchor_late_and_the_next_ahead() -> None:
    anchor = _now() - timedelta(days=2, hours=12)
    out = _create("daily", "--every", "1d", "--anchor", anchor.isoformat(), "--approval", "auto", "--grace", "5m",
                  "--mode", "latest", "--tiers", "Top:top10,Rest")
    assert out.splitlines() == [
        f"series daily created: every 1d from {anchor.isoformat()}, approval auto",
        "window daily-1: CLOSING", "window daily-2: CLOSING", "window daily-3: OPEN", "window daily-4: SCHEDULED"]
    series = Series.objects.get(slug="daily")
    seasons = list(Season.objects.filter(series=series).order_by("series_window"))
    assert [(s.slug, s.starts_at, s.cutoff, s.mode, s.seal_after_seconds, s.tiers) for s in seasons] == [
        (f"daily-{n}", anchor + timedelta(days=n - 1), anchor + timedelta(days=n), "latest", 300, "Top:top10,Rest")
        for n in (1, 2, 3, 4)]
    created = AuditEntry.objects.get(action="series.created", target_id="daily")
    assert created.after is not None and (created.after["every"], created.after["approval"]) == ("1d", "auto")
    windows = AuditEntry.objects.filter(action="season.created", season_slug__startswith="daily-")
    assert sorted(e.after["series_window"] for e in windows if e.after) == [1, 2, 3, 4]


@pytest.mark.django_db
@pytest.mark.parametrize(("args", "message"), [
    (("--every", "2d"), "invalid choice: '2d'"),
    (("--every", "1d", "--grace", "ten"), "--grace takes a whole number with s, m, h or d"),
    (("--every", "1d", "--anchor", "tomorrow"), "--anchor must be an RFC 3339 date-time with an offset"),
    (("--every", "1d", "--tiers", "Gold:10%,Diamond:1%,Rest"), "must be above the tier before it"),
])
def test_create_series_refuses_bad_options_with_the_reason(args: tuple[str, ...], message: str) -> None:
    anchor = ("--anchor", _now().isoformat()) if "--anchor" not in args else ()
    with pytest.raises(CommandError, match=message):
        _create("bad", *args, *anchor)
    assert not Series.objects.exists() and not Season.objects.exists()


@pytest.mark.django_db
def test_a_series_id_too_long_for_its_windows_ids_is_refused() -> None:
    with pytest.raises(CommandError, match="a series id is lowercase letters, digits and single dashes"):
        _create("x" * 49, "--every", "1d", "--anchor", _now().isoformat())


# --- the clock ----------------------------------------------------------------------------------


def _tick(now: datetime, times: int = 1) -> list[str]:
    done: list[str] = []
    for _ in range(times):
        done += series_tick(now=now) + seasons_lifecycle_tick(now=now)
    return done


def _states(series: Series) -> dict[str, str]:
    return dict(Season.objects.filter(series=series).order_by("series_window").values_list("slug", "state"))


@pytest.fixture
def daily(db: Any) -> Series:
    """A daily series with automatic approval whose first window starts a minute from now."""
    return series_create(slug="day", name="Daily", every="1d", anchor=_now() + timedelta(minutes=1),
                         grace_seconds=60, approval="auto", actor=TEST_ACTOR)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_a_window_opens_takes_results_closes_and_is_finalized_by_the_clock_alone(
        daily: Series, api: Any) -> None:
    anchor = daily.anchor
    assert _states(daily) == {"day-1": "SCHEDULED"}
    assert _tick(anchor + timedelta(seconds=1)) == ["day: opened day-2", "day-1: OPEN"]
    # Results filed by completed_at: two in window 1, one in window 2.
    ev = Events(tag="series", completed_at=(anchor + timedelta(minutes=5)).isoformat())
    body = {"events": [ev.result("ann", 300), ev.result("bob", 200),
                       {**ev.result("cy", 900), "completed_at": (anchor + timedelta(days=1, hours=1)).isoformat()}]}
    response = api.post("/internal/v1/series/day/scores:apply", body, format="json")
    assert response.status_code == 200, response.content
    answer = response.json()
    assert [(r["season_id"], r["player_id"], r["status"]) for r in answer["results"]] == [
        ("day-1", "ann", "applied"), ("day-1", "bob", "applied"), ("day-2", "cy", "rejected")]
    assert answer["results"][2]["reason"] == "season_not_open"  # window 2 is still SCHEDULED
    assert answer["leaderboard_versions"] == {"day-1": 0, "day-2": 0}
    day1 = Season.objects.get(slug="day-1")
    publish(day1)
    # The cutoff passes: window 1 closes, window 2 opens, window 3 is created ahead.
    assert sorted(_tick(anchor + timedelta(days=1, seconds=1))) == [
        "day-1: CLOSING", "day-2: OPEN", "day: opened day-3"]
    # The grace passes: sealed (version 1 covers everything before the seal); the
    # candidate is built, reconciled and approved by the system.
    assert _tick(anchor + timedelta(days=1, seconds=62)) == ["day-1: sealed"]
    done = _tick(anchor + timedelta(days=1, seconds=63))
    assert done[-1] == f"day-1: FINAL v{Season.objects.get(pk=day1.pk).final_version} (auto)", done
    day1.refresh_from_db()
    assert day1.state == "FINAL"
    approved = AuditEntry.objects.get(action="season.final.approved", season_slug="day-1")
    assert (approved.actor_type, approved.actor_label) == ("system", "system")
    final = api.get("/v1/seasons/day-1/final/standings").json()
    assert [(e["player_id"], e["rank"]) for e in final["entries"]] == [("ann", 1), ("bob", 2)]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_auto_approval_is_refused_when_the_reconciliation_fails(daily: Series, api: Any) -> None:
    anchor = daily.anchor
    _tick(anchor + timedelta(seconds=1))
    ev = Events(tag="series-bad", completed_at=(anchor + timedelta(minutes=5)).isoformat())
    assert api.post("/internal/v1/series/day/scores:apply", {"events": [ev.result("ann", 300)]},
                    format="json").status_code == 200
    day1 = Season.objects.get(slug="day-1")
    publish(day1)
    _tick(anchor + timedelta(days=1, seconds=1))
    _tick(anchor + timedelta(days=1, seconds=62))
    manifest = current_manifest(day1)
    stray = season_keys(day1).bucket(manifest.copy, manifest.layout.layout_id, manifest.layout.bucket_of(50_000),
                                     groups=manifest.groups)
    assert redis_get().zadd(stray, {"ghost": -50_000}) == 1
    done = _tick(anchor + timedelta(days=1, seconds=63), times=2)
    assert any("failed its reconciliation; waiting for staff" in line for line in done), done
    day1.refresh_from_db()
    assert day1.state == "FINALIZING"
    (candidate,) = FinalCandidate.objects.filter(season=day1)
    assert (candidate.status, candidate.reconciliation_ok) == (FinalCandidate.Status.BUILT, False)
    assert not AuditEntry.objects.filter(action="season.final.approved", season_slug="day-1").exists()


@pytest.mark.django_db(transaction=True)
def test_a_clock_stopped_for_days_opens_every_missed_window_in_order_and_closes_them_late(daily: Series) -> None:
    anchor = daily.anchor
    _tick(anchor + timedelta(seconds=1))
    # Beat and the workers were down for three and a half days.
    later = anchor + timedelta(days=3, hours=12)
    assert series_tick(now=later) == ["day: opened day-3", "day: opened day-4", "day: opened day-5"]
    assert series_tick(now=later) == []  # a restarted beat ticking again: nothing twice
    _tick(later, times=4)
    assert _states(daily) == {"day-1": "FINALIZING", "day-2": "FINALIZING", "day-3": "FINALIZING", "day-4": "OPEN",
                              "day-5": "SCHEDULED"}
    assert list(Season.objects.filter(series=daily).values_list("series_window", flat=True).order_by(
        "series_window")) == [1, 2, 3, 4, 5]


@pytest.mark.django_db(transaction=True)
def test_two_clocks_at_once_open_each_window_once(daily: Series) -> None:
    later = daily.anchor + timedelta(days=4, hours=1)
    barrier = threading.Barrier(2)
    opened: list[list[str]] = []

    def clock() -> None:
        barrier.wait()
        try:
            opened.append(series_tick(now=later))
        finally:
            connection.close()

    threads = [threading.Thread(target=clock) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(line for lines in opened for line in lines) == [f"day: opened day-{n}" for n in (2, 3, 4, 5, 6)]
    assert Season.objects.filter(series=daily).count() == 6


# --- the series read and write -----------------------------------------------------------------


@pytest.mark.django_db
def test_the_series_read_lists_windows_newest_first_in_pages() -> None:
    anchor = _now() - timedelta(days=4, hours=1)
    series_create(slug="pages", name="Pages", every="1d", anchor=anchor, actor=TEST_ACTOR)
    client = APIClient()
    first = client.get("/v1/series/pages?limit=2").json()
    assert (first["series_id"], first["every"], first["approval"], first["mode"]) == ("pages", "1d", "two-person",
                                                                                      "best")
    assert first["current"]["season_id"] == "pages-5"
    assert [w["season_id"] for w in first["seasons"]] == ["pages-6", "pages-5"]
    assert [w["state"] for w in first["seasons"]] == ["SCHEDULED", "OPEN"]
    second = client.get(f"/v1/series/pages?limit=2&before={first['next_before']}").json()
    assert [w["season_id"] for w in second["seasons"]] == ["pages-4", "pages-3"]
    last = client.get(f"/v1/series/pages?limit=5&before={second['next_before']}").json()
    assert [w["season_id"] for w in last["seasons"]] == ["pages-2", "pages-1"] and last["next_before"] is None
    assert client.get("/v1/series/nope").status_code == 404
    for before in ("elsewhere-1", "pages-1\x00"):
        bad = client.get("/v1/series/pages", {"before": before})
        assert bad.status_code == 400 and "before" in bad.json()["fields"], before
    assert client.get("/v1/series/pages?limit=0").status_code == 400


@pytest.mark.django_db
def test_an_event_no_window_holds_refuses_the_batch_and_writes_nothing(api: Any) -> None:
    anchor = _now() + timedelta(hours=1)
    series_create(slug="soon", name="Soon", every="1d", anchor=anchor, actor=TEST_ACTOR)
    ev = Events(tag="early", completed_at=(anchor + timedelta(minutes=1)).isoformat())
    early = {**ev.result("ann", 5), "completed_at": (anchor - timedelta(minutes=1)).isoformat()}
    response = api.post("/internal/v1/series/soon/scores:apply", {"events": [ev.result("bob", 5), early]},
                        format="json")
    assert response.status_code == 400
    assert list(response.json()["fields"]) == ["events[1].completed_at"]
    assert not ScoreEvent.objects.filter(season__series__slug="soon").exists()
    assert api.post("/internal/v1/series/none/scores:apply", {"events": [ev.result("bob", 5)]},
                    format="json").status_code == 404


# --- the staff console -------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_series_pages_show_the_windows_their_states_and_the_next_opening(client_as: Callable[..., Any]) -> None:
    anchor = _now() - timedelta(days=1, hours=1)
    series_create(slug="console", name="Console daily", every="1d", anchor=anchor, approval="auto", actor=TEST_ACTOR)
    viewer = client_as("viewer")
    listing = viewer.get("/staff/series/").content.decode()
    assert '<a href="/staff/series/console/">console</a>' in listing
    page = viewer.get("/staff/series/console/").content.decode()
    assert "automatic when the reconciliation passes" in page
    assert '<span id="series-current"><a href="/staff/seasons/console-2/">console-2</a> (OPEN)</span>' in page
    assert page.index('href="/staff/seasons/console-3/"') < page.index('href="/staff/seasons/console-1/"')
    assert ">SCHEDULED<" in page and ">CLOSING<" in page
    assert 'id="series-next">none scheduled' not in page
    season_page = viewer.get("/staff/seasons/console-1/").content.decode()
    assert '<a href="/staff/series/console/" id="season-series">console</a>' in season_page
    assert viewer.get("/staff/series/nothing/").status_code == 404


@pytest.mark.django_db
def test_a_write_for_a_window_the_clock_has_not_opened_yet_opens_it(writer: Any) -> None:
    anchor = _now() - timedelta(hours=1)
    series = series_create(slug="behind", name="Behind", every="1d", anchor=anchor, actor=TEST_ACTOR)
    assert _states(series) == {"behind-1": "OPEN", "behind-2": "SCHEDULED"}
    # Beat has not ticked for two days; a result of the third window arrives.
    later = anchor + timedelta(days=2, minutes=1)
    event = events_parse({"events": [Events(tag="behind", completed_at=(later - timedelta(seconds=30)).isoformat())
                                     .result("ann", 10)]})
    result = series_events_apply(series=series, events=event, client=writer[0], now=later)
    assert [slug for slug, _ in result.outcomes] == ["behind-3"]
    assert list(_states(series)) == ["behind-1", "behind-2", "behind-3", "behind-4"]
