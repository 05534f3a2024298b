"""The public live page /seasons/{season_id}/live (docs/api.md, Live board websocket): the Django view, and a
headless Chromium (Debian's /usr/bin/chromium driven by Playwright) watching the page of
a real ASGI server (uvicorn, in a subprocess on the test database) change in place when
versions are published."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.test import Client

from leaderboard.core.profiles import ProfileWrite
from leaderboard.profiles import player_profiles_apply
from seasons.models import Season
from tests.support import Events, apply_events, browser, current_manifest, db_standings, post_ok, publish

pytestmark = [pytest.mark.django_db(transaction=True)]

ROOT = browser.ROOT
CHROMIUM = browser.CHROMIUM
CHROMIUM_ARGS = browser.CHROMIUM_ARGS
Post = Callable[..., Any]


# --- the view --------------------------------------------------------------------------------


def test_the_page_is_a_shell_the_socket_fills(client: Client, season: Season) -> None:
    response = client.get(f"/seasons/{season.slug}/live")
    assert response.status_code == 200
    html = response.content.decode()
    assert f'data-socket-path="/ws/v1/seasons/{season.slug}/live"' in html
    assert '<script src="/static/live/live.js" defer></script>' in html
    assert 'href="/static/live/live.css"' in html
    assert re.search(r'id="lb-final"[^>]*\bhidden\b', html), "the FINAL banner shows only for a FINAL season"
    assert "cdn" not in html.lower() and "https://" not in html
    assert client.head(f"/seasons/{season.slug}/live").status_code == 200
    assert client.post(f"/seasons/{season.slug}/live").status_code == 405


def test_an_unknown_season_is_404(client: Client) -> None:
    assert client.get("/seasons/nope/live").status_code == 404


def test_a_final_season_says_so_before_the_socket_answers(client: Client, season: Season) -> None:
    Season.objects.filter(pk=season.pk).update(state="FINAL", final_version=7)
    html = client.get(f"/seasons/{season.slug}/live").content.decode()
    assert 'data-state="FINAL"' in html and 'data-final-version="7"' in html
    assert not re.search(r'id="lb-final"[^>]*\bhidden\b', html)
    assert "This season is FINAL." in html


def test_the_static_files_exist_and_use_no_network_but_the_socket() -> None:
    js = (ROOT / "static/live/live.js").read_text()
    css = (ROOT / "static/live/live.css").read_text()
    for text in (js, css):
        assert "http://" not in text and "https://" not in text and "@import" not in text
    assert "new WebSocket(" in js and "fetch(" not in js and "XMLHttpRequest" not in js


def test_the_asgi_application_serves_the_static_files_and_nothing_else() -> None:
    from asgiref.testing import ApplicationCommunicator

    from config.asgi import application

    async def get(path: str) -> dict[str, Any]:
        # Channels' HttpCommunicator insists on a "body" in every chunk; a streamed file's
        # last chunk may have none (it is optional in ASGI).
        comm = ApplicationCommunicator(application, {
            "type": "http", "http_version": "1.1", "method": "GET", "path": path, "raw_path": path.encode(),
            "query_string": b"", "headers": [(b"host", b"testserver")],
        })
        await comm.send_input({"type": "http.request", "body": b""})
        start = await comm.receive_output(timeout=10)
        body = b""
        while True:
            chunk = await comm.receive_output(timeout=10)
            body += chunk.get("body", b"")
            if not chunk.get("more_body"):
                break
        return {"status": start["status"], "body": body}

    async def body() -> None:
        js = await get("/static/live/live.js")
        assert js["status"] == 200 and b"new WebSocket(" in js["body"]
        assert (await get("/static/live/live.css"))["status"] == 200
        assert (await get("/static/live/missing.js"))["status"] == 404
        # A path out of the static directories is refused, not served and not a 500.
        assert (await get("/static/../config/settings.py"))["status"] == 400

    async_to_sync(body)()


# --- a real browser --------------------------------------------------------------------------


@pytest.fixture
def asgi_server(transactional_db: Any) -> Iterator[str]:
    with browser.asgi_server() as base:
        yield base


def browse(base: str, scenario: Callable[[Any], Any]) -> list[str]:
    """Run `scenario(page)` in headless Chromium; returns the page's JavaScript errors."""
    from playwright.async_api import async_playwright

    errors: list[str] = []

    async def body() -> None:
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = await browser.new_page()
                page.set_default_timeout(15_000)
                page.on("pageerror", lambda error: errors.append(str(error)))
                await scenario(page)
            finally:
                await browser.close()

    async_to_sync(body)()
    return errors


async def text(page: Any, selector: str) -> str:
    value: str = await page.locator(selector).inner_text()
    return value.strip()


async def wait_version(page: Any, version: int) -> None:
    await page.wait_for_function(f"document.getElementById('lb-version')?.textContent === '{version}'")


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.usefixtures("rank_views")
def test_the_page_shows_names_flags_tiers_and_the_followed_players_percentile(
        season_factory: Callable[..., Season], asgi_server: str) -> None:
    season = season_factory(slug="named", tiers="Champion:top1,Gold:25%,Rest")
    named = {"p00": ("Ana Lima", "BR"), "p01": ("Łukasz", "PL"), "p02": ("東京", "JP")}
    player_profiles_apply(profiles=[
        ProfileWrite(player_id=p, region=None, profile_version=1, carries=frozenset({"display_name", "country"}),
                     display_name=name, country=country) for p, (name, country) in named.items()], client=None)
    apply_events(season, [Events("named").result(f"p{i:02d}", 1000 - 10 * i) for i in range(20)])
    assert publish(season) == 1

    async def scenario(page: Any) -> None:
        await page.set_viewport_size({"width": 1280, "height": 900})
        await page.goto(f"{asgi_server}/seasons/named/live")
        await wait_version(page, 1)
        first = "#lb-top tbody tr:first-child"
        assert await text(page, f"{first} td.player .name") == "Ana Lima"
        assert await text(page, f"{first} td.player .id") == "p00"
        assert await page.get_attribute(f"{first} td.player .flag", "title") == "BR"
        assert await text(page, f"{first} .flag") == "\U0001F1E7\U0001F1F7"
        # Without a name the cell is the id alone.
        assert await text(page, "#lb-top tbody tr:nth-child(4) td:nth-child(3)") == "p03"
        # Top 1: Champion; ranks 2..5 of 20: Gold (25%); then Rest.
        assert [await text(page, f"#lb-top tbody tr:nth-child({n}) td.tier") for n in (1, 2, 5, 6)] == [
            "Champion", "Gold", "Gold", "Rest"]
        await page.fill("#findme-input", "p01")
        await page.click("#findme-form button[type=submit]")
        await page.wait_for_function("document.getElementById('me-summary')?.dataset.rank === '2'")
        # 18 of 20 players below rank 2.
        assert await text(page, "#me-summary") == (
            "Łukasz (p01): rank 2 · position 2 of 20 · score 990 · ahead of 90.00% of players · Gold")
        await browser.shot(page, "live-names-tiers")

    errors = browse(asgi_server, scenario)
    assert errors == []


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.usefixtures("rank_views")
def test_the_page_changes_in_place_when_a_version_is_published(season: Season, post_scores: Post,
                                                               asgi_server: str) -> None:
    ev = Events()
    post_ok(post_scores, season, [ev.result(f"p{i:03d}", 1000 + 10 * i) for i in range(120)])
    assert publish(season) == 1
    v1 = db_standings(season)
    apost = sync_to_async(post_ok)
    apublish = sync_to_async(publish)

    async def scenario(page: Any) -> None:
        await page.goto(f"{asgi_server}/seasons/{season.slug}/live")
        await wait_version(page, 1)
        assert await page.locator("#lb-top tbody tr").count() == 100
        assert await text(page, "#lb-top tbody tr:first-child td:nth-child(3)") == "p119"
        assert await text(page, "#lb-total") == "120"
        assert await text(page, "#lb-status") == "Live"
        manifest = await sync_to_async(current_manifest)(season)
        assert await page.get_attribute("#lb-asof", "datetime") == manifest.as_of
        assert await page.is_hidden("#lb-final") and await page.is_hidden("#lb-unavailable")

        # Find me: rank and neighbours of p050.
        await page.fill("#findme-input", "p050")
        await page.click("#findme-form button[type=submit]")
        await page.wait_for_function("document.getElementById('me-summary')?.dataset.rank === '70'")
        me = v1.entry("p050")
        assert me is not None and me.rank == 70
        assert await page.locator("#me-neighbors tbody tr").count() == 11
        assert await text(page, "#me-neighbors tr.me td:nth-child(3)") == "p050"
        assert "player_id=p050" in page.url

        # Rows are updated in place: remember the first row's node.
        await page.evaluate("window.firstRow = document.querySelector('#lb-top tbody tr')")

        # Version 2: a newcomer leads and p050 climbs to second.
        await apost(post_scores, season, [ev.result("zed", 99_000), ev.result("p050", 50_000)])
        assert await apublish(season) == 2
        await wait_version(page, 2)
        assert await text(page, "#lb-top tbody tr:first-child td:nth-child(3)") == "zed"
        assert await text(page, "#lb-top tbody tr:nth-child(2) td:nth-child(3)") == "p050"
        assert await page.evaluate("window.firstRow === document.querySelector('#lb-top tbody tr')")
        assert await page.locator("#lb-top tbody tr.changed").count() >= 2
        assert await text(page, "#lb-total") == "121"
        await page.wait_for_function("document.getElementById('me-summary')?.dataset.rank === '2'")
        events = await text(page, "#me-events")
        assert "v2: up from rank 70 to 2" in events and "entered the top 100" not in events
        manifest = await sync_to_async(current_manifest)(season)
        assert await page.get_attribute("#lb-asof", "datetime") == manifest.as_of

        # Version 3 is published after the season went FINAL: the page says so.
        await apost(post_scores, season, [ev.result("p000", 1001)])
        await sync_to_async(Season.objects.filter(pk=season.pk).update)(state="FINAL", final_version=3)
        assert await apublish(season) == 3
        await wait_version(page, 3)
        assert await page.is_visible("#lb-final")
        assert await text(page, "#lb-final-version") == "3"
        assert await text(page, "#lb-status") == "Final"

    errors = browse(asgi_server, scenario)
    assert errors == []


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.usefixtures("rank_views")
def test_the_page_shows_an_unavailable_board_then_the_first_version(season: Season, post_scores: Post,
                                                                      asgi_server: str) -> None:
    ev = Events()
    post_ok(post_scores, season, [ev.result("solo", 42)])

    async def scenario(page: Any) -> None:
        await page.goto(f"{asgi_server}/seasons/{season.slug}/live?player_id=solo")
        await page.wait_for_selector("#lb-unavailable", state="visible")
        assert await page.is_hidden("#board")
        assert await text(page, "#lb-version") == "–"
        assert await page.get_attribute("#live", "data-status") == "unavailable"
        assert await sync_to_async(publish)(season) == 1
        await wait_version(page, 1)
        assert await page.is_hidden("#lb-unavailable") and await page.is_visible("#board")
        assert await text(page, "#lb-top tbody tr:first-child td:nth-child(3)") == "solo"
        await page.wait_for_function("document.getElementById('me-summary')?.dataset.rank === '1'")

    errors = browse(asgi_server, scenario)
    assert errors == []


@pytest.fixture
def asgi_server_rejoining(transactional_db: Any) -> Iterator[str]:
    # A flushed Redis takes the channel layer's groups with it: the server re-joins quickly.
    with browser.asgi_server(LIVE_GROUP_REFRESH_SECONDS="1") as base:
        yield base


@pytest.mark.browser
@pytest.mark.slow
def test_during_a_recovery_the_page_shows_its_progress_then_the_recovered_board(
        season: Season, post_scores: Post, rank_views: Any, asgi_server_rejoining: str) -> None:
    from leaderboard.models import RebuildJob
    from leaderboard.recovery.rebuild import rebuild_run
    from leaderboard.views import rankview
    from tests.support import epoch

    ev = Events()
    post_ok(post_scores, season, [ev.result("solo", 42), ev.result("duo", 41)])
    assert publish(season) == 1

    def views_lost_and_recovery_started() -> RebuildJob:
        rank_views.flushdb()
        rankview.manifest_cache_clear()
        assert epoch(season).status == "lost"
        job = RebuildJob.objects.get(season=season, kind="recovery")
        # As the recovery's worker records it, a quarter of the way through its copy.
        RebuildJob.objects.filter(pk=job.pk).update(status="building", done=300, total=800, eta_seconds=75.0)
        return job

    def recovery_run(job: RebuildJob) -> int:
        RebuildJob.objects.filter(pk=job.pk).update(status="queued")  # hand it to a worker
        done = rebuild_run(job_id=job.pk)
        assert done.status == "published" and done.published_version is not None, done.error
        return done.published_version

    async def scenario(page: Any) -> None:
        await page.goto(f"{asgi_server_rejoining}/seasons/{season.slug}/live?player_id=solo")
        await wait_version(page, 1)
        job = await sync_to_async(views_lost_and_recovery_started)()
        # No version comes while the views are lost: the page learns it from the server.
        await page.wait_for_selector("#lb-recovery", state="visible")
        assert await page.is_visible("#lb-unavailable") and await page.is_hidden("#board")
        assert await text(page, "#lb-version") == "–"
        assert await page.get_attribute("#live", "data-status") == "unavailable"
        assert await text(page, "#lb-recovery-text") == "300 of 800 players copied (37.5%) · about 1 min left"
        assert await page.eval_on_selector("#lb-recovery-bar", "bar => bar.value") == 37.5
        assert "rebuilding, 37.5%" in await text(page, "#lb-status")
        version = await sync_to_async(recovery_run)(job)
        await wait_version(page, version)
        assert await page.is_hidden("#lb-unavailable") and await page.is_visible("#board")
        assert await text(page, "#lb-top tbody tr:first-child td:nth-child(3)") == "solo"

    errors = browse(asgi_server_rejoining, scenario)
    assert errors == []


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.usefixtures("rank_views")
def test_a_newcomer_reads_the_page_on_a_phone_and_looks_for_a_stranger(season: Season, post_scores: Post,
                                                                     asgi_server: str) -> None:
    """390 px wide, as a phone: nothing wider than the screen; the input's example is an id
    of this board; a legend says what highlighted rows mean; an id with no entry gets a
    sentence, not empty table headers; an unknown region is the page's own message."""
    ev = Events()
    post_ok(post_scores, season, [ev.result(f"p{i:06d}", 1000 + 10 * i) for i in range(120)])
    assert publish(season) == 1
    standings = db_standings(season)

    async def scenario(page: Any) -> None:
        await page.set_viewport_size({"width": 390, "height": 844})
        await page.goto(f"{asgi_server}/seasons/{season.slug}/live")
        await wait_version(page, 1)
        assert await page.evaluate("document.documentElement.scrollWidth") <= 390
        forty_second = standings.window(from_position=42, limit=1)[0].player_id
        assert await page.get_attribute("#findme-input", "placeholder") == f"e.g. {forty_second}"
        assert "the player you follow" in await text(page, "#lb-legend")
        await page.fill("#findme-input", "nobody-here")
        await page.click("#findme-form button[type=submit]")
        await page.wait_for_function("document.getElementById('me-summary')?.textContent.includes('nobody-here')")
        assert await text(page, "#me-summary") == "nobody-here is not on the board in version 1."
        assert await page.is_hidden("#me-neighbors") and await page.is_hidden("#me-history")
        await page.fill("#findme-input", "p000050")
        await page.click("#findme-form button[type=submit]")
        await page.wait_for_function("document.getElementById('me-summary')?.dataset.rank === '70'")
        assert await page.is_visible("#me-neighbors") and await page.is_hidden("#me-history")
        assert await page.evaluate("document.documentElement.scrollWidth") <= 390
        await browser.shot(page, "live-390px")

        response = await page.goto(f"{asgi_server}/seasons/{season.slug}/live?region=eu")
        assert response.status == 404
        assert "has no region 'eu': it has no regions" in await text(page, "#lb-board-error")
        await page.wait_for_timeout(300)
        assert await page.evaluate("performance.getEntriesByType('resource').every(r => !r.name.startsWith('ws'))")

    errors = browse(asgi_server, scenario)
    assert errors == []


def test_find_me_shows_the_rank_a_day_ago_as_an_arrow_and_the_difference(
        season_factory: Callable[..., Season], asgi_server: str) -> None:
    from datetime import UTC, datetime, timedelta

    from leaderboard.core.history import hour_floor
    from leaderboard.history.services import movement_snapshot_name, season_snapshot_take
    from leaderboard.models import Manifest

    season = season_factory(slug="moving")
    events = Events("moving")
    apply_events(season, [events.result(f"p{i:02d}", 1000 - 10 * i) for i in range(10)])
    assert publish(season) == 1
    # A day later p06 climbed to 2nd, pushing p01..p05 down one; p00 stayed 1st.
    apply_events(season, [events.result("p06", 995)])
    assert publish(season) == 2
    latest = hour_floor(datetime.now(UTC))
    Manifest.objects.filter(season=season, version=1).update(published_at=latest - timedelta(hours=30))
    for hour in (latest - timedelta(hours=24), latest):
        season_snapshot_take(season=season, taken_for=hour)
    assert movement_snapshot_name(season=season) is not None

    async def follow(page: Any, player: str, rank: str) -> str:
        await page.fill("#findme-input", player)
        await page.click("#findme-form button[type=submit]")
        await page.wait_for_function(f"document.getElementById('me-summary')?.dataset.rank === '{rank}'")
        await page.wait_for_selector("#me-movement:not([hidden])")
        return await text(page, "#me-movement")

    async def scenario(page: Any) -> None:
        await page.set_viewport_size({"width": 1280, "height": 900})
        await page.goto(f"{asgi_server}/seasons/moving/live")
        await wait_version(page, 2)
        assert await follow(page, "p06", "2") == "▲ up 5 since yesterday (rank 7)"
        assert await page.get_attribute("#me-movement", "data-moved") == "up"
        await browser.shot(page, "live-movement")
        assert await follow(page, "p03", "5") == "▼ down 1 since yesterday (rank 4)"
        assert await follow(page, "p00", "1") == "= same rank as yesterday"

    errors = browse(asgi_server, scenario)
    assert errors == []
