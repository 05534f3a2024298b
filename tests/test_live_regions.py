"""Regional live boards (docs/api.md, Live board websocket): the socket and the page with
`?region=` follow that region's board, through the real ASGI application and epochs
publishing real versions. Every message is checked against RankReader(region=...) at the
message's own version, and against the ledger's players of the region; a region move
between versions moves the followed player between regional boards; unknown and
malformed regions are refused; the global board of the same season is as it always was."""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.test import Client

from leaderboard.core.live import (
    CLOSE_BAD_REQUEST,
    RADIUS_DEFAULT,
    Refusal,
    Subscription,
    board_fields,
    region_refusal,
    subscription_parse,
    top_apply,
)
from leaderboard.core.ranking import Standings
from leaderboard.live import hub as live
from leaderboard.live.players import players_read
from leaderboard.models import PlayerScore
from leaderboard.redis_client import redis_get
from leaderboard.views.selectors import leaderboard_reader
from seasons.models import Season
from tests.support import (
    NARROW,
    Events,
    Profiles,
    apply_events,
    browser,
    current_manifest,
    keys_of,
    ledger_rows,
    publish,
)
from tests.support.reference import answer_entry
from tests.test_live_consumer import connect, receive, run
from tests.test_live_page import browse, text, wait_version

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]

REGIONS = ["na", "eu"]
apublish = sync_to_async(publish)


@pytest.fixture
def profiles() -> Profiles:
    return Profiles()


@pytest.fixture
def regional(season_factory: Callable[..., Season], profiles: Profiles) -> Season:
    """30 players in na, eu and none (every third), with ties; version 1 published."""
    season = season_factory(slug="lr", regions=REGIONS, layout=NARROW)
    rnd = random.Random(11)
    players = [f"p{i:02d}" for i in range(30)]
    profiles.set(**{p: [*REGIONS, None][i % 3] for i, p in enumerate(players)})
    apply_events(season, [Events("lr").result(p, rnd.choice([100, 250, 250, 400, 700, 700, 950])) for p in players])
    assert publish(season) == 1
    return season


def home_of(season: Season) -> dict[str, str]:
    """player -> region in the ledger ("" for none)."""
    return dict(ledger_rows(PlayerScore, season, "player_id", "region"))


def ledger_board(season: Season, region: str) -> Standings:
    return Standings({p: s for p, s, g in ledger_rows(PlayerScore, season, "player_id", "score", "region")
                      if g == region})


def reader_top(slug: str, region: str | None, version: int) -> list[dict[str, Any]]:
    _, top = leaderboard_reader(season_slug=slug, region=region).top(100, version=version)
    return [answer_entry(e) for e in top]  # as the live board shows it: nobody here has a name


def reader_place(slug: str, region: str | None, player_id: str, radius: int,
                 version: int) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The player's entry and neighbours on the board as the read API has them in `version`."""
    _, me, window = leaderboard_reader(season_slug=slug, region=region).neighbors(player_id, radius, version=version)
    return (None if me is None else answer_entry(me)), ([answer_entry(e) for e in window] if me is not None else [])


def assert_player_on_board(message: dict[str, Any], slug: str, region: str | None, player_id: str,
                           radius: int) -> None:
    entry, around = reader_place(slug, region, player_id, radius, message["leaderboard_version"])
    player = message["player"]
    assert (player["player_id"], player["ranked"], player["entry"]) == (player_id, entry is not None, entry), message
    assert player["neighbors"] == around


areader_top = sync_to_async(reader_top)
aassert_player_on_board = sync_to_async(assert_player_on_board)


def test_a_regional_socket_follows_the_regional_top_and_the_players_regional_place(regional: Season) -> None:
    slug = regional.slug
    homes = home_of(regional)
    eu = ledger_board(regional, "eu")
    eu_player = eu.top(100)[-1].player_id  # last on eu's board: somewhere to climb
    na_player = next(p for p, g in sorted(homes.items()) if g == "na")
    assert reader_top(slug, "eu", 1) == [answer_entry(e) for e in eu.top(100)]  # the reference is the ledger's
    assert reader_top(slug, "eu", 1) != reader_top(slug, None, 1)

    async def body() -> None:
        watcher = await connect(slug, "region=eu")
        follower = await connect(slug, f"region=eu&player_id={eu_player}&radius=2")
        stranger = await connect(slug, f"region=eu&player_id={na_player}&radius=2")
        everyone = await connect(slug)

        snap = await receive(watcher)
        assert (snap["type"], snap["region"], snap["leaderboard_version"]) == ("snapshot", "eu", 1)
        assert snap["total_players"] == len(eu) < 30
        assert snap["top"] == await areader_top(slug, "eu", 1)
        mine = await receive(follower)
        assert mine["region"] == "eu" and mine["top"] == snap["top"]
        await aassert_player_on_board(mine, slug, "eu", eu_player, 2)
        snap_entry = mine["player"]["entry"]
        assert snap_entry is not None
        other = await receive(stranger)
        # On another region's board: not ranked on this one, as without a score.
        assert other["player"] == {"player_id": na_player, "ranked": False, "entry": None, "radius": 2,
                                   "neighbors": [], "percentile": None, "rank_24h_ago": None}
        whole = await receive(everyone)
        assert "region" not in whole and whole["total_players"] == 30
        assert whole["top"] == await areader_top(slug, None, 1)

        # eu_player takes first place everywhere; an na player moves inside na only.
        await sync_to_async(apply_events)(regional, [Events("lr2").result(eu_player, 5000),
                                                     Events("lr3").result(na_player, 4000)])
        assert await apublish(regional) == 2
        pushed = await receive(watcher)
        assert (pushed["type"], pushed["region"], pushed["leaderboard_version"], pushed["previous_version"]) == (
            "version", "eu", 2, 1)
        assert pushed["top_diff"]["base_version"] == 1
        assert top_apply(snap["top"], pushed["top_diff"]) == await areader_top(slug, "eu", 2)
        assert pushed["top_diff"]["set"][0]["player_id"] == eu_player
        mine = await receive(follower)
        assert mine["region"] == "eu" and mine["leaderboard_version"] == 2
        await aassert_player_on_board(mine, slug, "eu", eu_player, 2)
        before = snap_entry
        assert mine["player"]["entry"]["rank"] == 1 < before["rank"]
        # Events against what this socket showed, on this board (a board of ~10: always in its top 100).
        assert mine["player"]["events"] == [{"type": "score_changed", "from": before["score"], "to": 5000},
                                            {"type": "rank_changed", "from": before["rank"], "to": 1}]
        other = await receive(stranger)
        assert other["leaderboard_version"] == 2 and not other["player"]["ranked"]
        assert other["player"]["events"] == []
        whole = await receive(everyone)
        assert "region" not in whole and whole["leaderboard_version"] == 2
        assert top_apply((await areader_top(slug, None, 1)), whole["top_diff"]) == await areader_top(slug, None, 2)

        # One hub per board in this process: the global one keyed as before, eu's apart,
        # each reading its own players in one batch.
        hubs = live.registry().hubs
        assert set(hubs) == {slug, live.hub_key(slug, "eu")}
        regional_hub = hubs[live.hub_key(slug, "eu")]
        assert regional_hub.region == "eu" and hubs[slug].region is None
        assert regional_hub.wanted() == {eu_player: 2, na_player: 2}
        assert (regional_hub.stats.rounds, regional_hub.stats.players_read) == (1, 2)
        assert regional_hub.stats.round_trips <= 4
        assert (hubs[slug].stats.rounds, hubs[slug].stats.players_read) == (1, 0)
        for comm in (watcher, follower, stranger, everyone):
            assert await comm.receive_nothing(timeout=0.2)
            await comm.disconnect()
        assert not live.registry().hubs

    run(body)


def test_a_region_move_between_versions_moves_the_player_between_regional_boards(
        regional: Season, profiles: Profiles) -> None:
    slug = regional.slug
    mover = next(p for p, g in sorted(home_of(regional).items()) if g == "na")

    async def body() -> None:
        on_na = await connect(slug, f"region=na&player_id={mover}&radius=1")
        on_eu = await connect(slug, f"region=eu&player_id={mover}&radius=1")
        na_before = await receive(on_na)
        eu_before = await receive(on_eu)
        assert na_before["player"]["ranked"] and not eu_before["player"]["ranked"]
        await aassert_player_on_board(na_before, slug, "na", mover, 1)

        await sync_to_async(profiles.set)(**{mover: "eu"})
        assert await apublish(regional) == 2
        assert (await sync_to_async(home_of)(regional))[mover] == "eu"
        na_after = await receive(on_na)
        eu_after = await receive(on_eu)
        for message, region in ((na_after, "na"), (eu_after, "eu")):
            assert (message["region"], message["leaderboard_version"]) == (region, 2)
            await aassert_player_on_board(message, slug, region, mover, 1)
        assert not na_after["player"]["ranked"] and eu_after["player"]["ranked"]
        assert [e["type"] for e in na_after["player"]["events"]][-1] == "unranked"
        assert eu_after["player"]["events"][0] == {"type": "ranked", **{k: eu_after["player"]["entry"][k]
                                                                        for k in ("rank", "position", "score")}}
        # The regional boards' totals moved with the player; the scores did not change.
        assert (na_after["total_players"], eu_after["total_players"]) == (
            na_before["total_players"] - 1, eu_before["total_players"] + 1)
        assert eu_after["player"]["entry"]["score"] == na_before["player"]["entry"]["score"]
        for comm in (on_na, on_eu):
            await comm.disconnect()

    run(body)


def test_the_batched_reads_of_a_regional_board_match_the_regional_reader(regional: Season) -> None:
    manifest = current_manifest(regional)
    homes = home_of(regional)
    for region in REGIONS:
        board = manifest.board_of(region)
        assert board is not None and board.board == region
        wanted = {p: i % 4 for i, p in enumerate(sorted(homes))} | {"absent": 2}
        reads, trips = players_read(redis_get(), keys_of(regional), board, wanted)
        assert trips <= 4
        ranked = 0
        for player_id, radius in wanted.items():
            entry, around = reader_place(regional.slug, region, player_id, radius, manifest.version)
            read = reads[player_id]
            assert (None if read.entry is None else answer_entry(read.entry)) == entry, (region, player_id)
            if read.entry is not None:
                ranked += 1
                assert homes[player_id] == region
                assert [answer_entry(e) for e in read.window if abs(e.position - read.entry.position) <= radius] == \
                    around, (region, player_id)
        assert ranked == len(ledger_board(regional, region)) > 0


@pytest.mark.parametrize(("query", "code", "error", "detail"), [
    ("region=mars", 4404, "unknown_region", "its regions are na, eu"),
    ("region=EU", 4400, "bad_region", "region must be"),
    ("region=eu&region=na", 4400, "bad_region", "more than once"),
    ("player_id=p00&region=" + "x" * 17, 4400, "bad_region", "region must be"),
])
def test_a_region_the_season_does_not_have_or_a_malformed_one_is_refused(
        regional: Season, query: str, code: int, error: str, detail: str) -> None:
    async def body() -> None:
        comm = await connect(regional.slug, query)
        message = await receive(comm)
        assert (message["type"], message["error"]) == ("error", error) and detail in message["detail"]
        close = await comm.receive_output(timeout=10)
        assert (close["type"], close["code"]) == ("websocket.close", code)
        await comm.disconnect()
        assert not live.registry().hubs

    run(body)


def test_a_season_without_regions_has_no_regional_board_and_an_empty_region_is_the_global_one(
        season: Season) -> None:
    apply_events(season, [Events("plain").result("solo", 10)])
    publish(season)

    async def body() -> None:
        comm = await connect(season.slug, "region=na")
        message = await receive(comm)
        assert message["error"] == "unknown_region" and "no regions" in message["detail"]
        assert (await comm.receive_output(timeout=10))["code"] == 4404
        await comm.disconnect()
        whole = await connect(season.slug, "region=&player_id=solo")
        snap = await receive(whole)
        assert snap["type"] == "snapshot" and "region" not in snap and snap["player"]["ranked"]
        await whole.disconnect()

    run(body)


def test_unavailable_names_the_region_until_the_first_version(
        season_factory: Callable[..., Season], profiles: Profiles) -> None:
    season = season_factory(slug="lr0", regions=REGIONS)
    profiles.set(a="eu", b="na")
    apply_events(season, [Events("lr0").result("a", 10), Events("lr0").result("b", 20)])

    async def body() -> None:
        comm = await connect(season.slug, "region=eu&player_id=b")
        first = await receive(comm)
        assert (first["type"], first["region"]) == ("unavailable", "eu")
        assert await apublish(season) == 1
        pushed = await receive(comm)
        assert (pushed["type"], pushed["region"], pushed["total_players"]) == ("version", "eu", 1)
        assert [e["player_id"] for e in pushed["top"]] == ["a"] and not pushed["player"]["ranked"]
        await comm.disconnect()

    run(body)


# --- the pure part -----------------------------------------------------------------------


def test_the_subscription_names_its_region() -> None:
    assert subscription_parse(b"region=eu-west&player_id=p") == Subscription(player_id="p", radius=RADIUS_DEFAULT,
                                                                            region="eu-west")
    assert subscription_parse(b"region=") == Subscription(player_id=None, radius=RADIUS_DEFAULT, region=None)
    for query in (b"region=Eu", b"region=e%20u", b"region=a&region=a", b"region=" + b"a" * 17):
        refusal = subscription_parse(query)
        assert isinstance(refusal, Refusal) and (refusal.code, refusal.error) == (CLOSE_BAD_REQUEST, "bad_region")
    assert region_refusal(None, []) is None and region_refusal("eu", ["na", "eu"]) is None
    unknown = region_refusal("sa", ["na", "eu"])
    assert unknown is not None and (unknown.code, unknown.error) == (4404, "unknown_region")
    assert board_fields("") == {} and board_fields("eu") == {"region": "eu"}


# --- the page --------------------------------------------------------------------------------


def test_the_page_follows_a_region_and_links_every_board(client: Client, regional: Season) -> None:
    html = client.get(f"/seasons/{regional.slug}/live?region=eu").content.decode()
    assert 'data-region="eu"' in html and f'data-socket-path="/ws/v1/seasons/{regional.slug}/live"' in html
    assert re.search(r'id="lb-board">region eu<', html)
    links = re.findall(r'<a href="([^"]*)"( aria-current="page")? data-board="([^"]*)">([^<]*)</a>', html)
    assert [(href, bool(current), board, text) for href, current, board, text in links] == [
        ("?", False, "", "Global"), ("?region=na", False, "na", "na"), ("?region=eu", True, "eu", "eu")]

    html = client.get(f"/seasons/{regional.slug}/live").content.decode()
    assert 'data-region=""' in html and re.search(r'id="lb-board">global<', html)
    assert re.search(r'<a href="\?" aria-current="page" data-board="">Global</a>', html)
    assert client.get(f"/seasons/{regional.slug}/live?region=").status_code == 200


def test_the_page_without_regions_has_no_switcher(client: Client, season: Season) -> None:
    html = client.get(f"/seasons/{season.slug}/live").content.decode()
    assert 'id="lb-boards"' not in html and re.search(r'id="lb-board">global<', html)


@pytest.mark.parametrize(("slug", "region", "status", "why"), [
    ("reg", "mars", 404, "The season has no region &#x27;mars&#x27;: its regions are na, eu."),
    ("reg", "Not%20One", 400, "“Not One” is not a region name: "),
    ("plain", "eu", 404, "The season has no region &#x27;eu&#x27;: it has no regions."),
])
def test_the_page_says_when_a_region_is_unknown_or_malformed(client: Client, regional: Season, season: Season,
                                                             slug: str, region: str, status: int, why: str) -> None:
    """A person asked for the board: the page itself says why there is none, with links to
    the boards there are, and connects to nothing (the API's codes as its status)."""
    season = regional if slug == "reg" else season
    response = client.get(f"/seasons/{season.slug}/live?region={region}")
    assert response.status_code == status and response["Content-Type"].startswith("text/html")
    html = response.content.decode()
    assert 'id="lb-board-error"' in html and why in html and 'data-board-error="true"' in html
    assert 'href="?">Watch the season\'s global board</a>' in html
    assert ('href="?region=eu">region eu</a>' in html) == bool(season.regions)
    assert 'id="lb-top"' not in html and 'id="lb-status"' not in html


@pytest.fixture
def asgi_server(transactional_db: Any) -> Iterator[str]:
    with browser.asgi_server() as base:
        yield base


@pytest.mark.browser
@pytest.mark.slow
def test_the_regional_page_in_a_browser(regional: Season, asgi_server: str) -> None:
    homes = home_of(regional)
    eu = ledger_board(regional, "eu")
    last = eu.top(100)[-1]
    climber = last.player_id
    na_player = next(p for p, g in sorted(homes.items()) if g == "na")

    async def scenario(page: Any) -> None:
        await page.goto(f"{asgi_server}/seasons/{regional.slug}/live?region=eu&player_id={na_player}")
        await wait_version(page, 1)
        assert await page.locator("#lb-top tbody tr").count() == len(eu)
        assert await text(page, "#lb-total") == str(len(eu))
        assert await text(page, "#lb-top tbody tr:first-child td:nth-child(3)") == eu.top(1)[0].player_id
        await page.wait_for_function("document.getElementById('me-summary')?.textContent.includes('region eu')")
        assert "is not on the board of region eu in version 1" in await text(page, "#me-summary")
        # The switcher's links keep the followed player; after "find me" the new one.
        assert await page.get_attribute('#lb-boards a[data-board="na"]', "href") == f"?region=na&player_id={na_player}"
        await page.fill("#findme-input", climber)
        await page.click("#findme-form button[type=submit]")
        await page.wait_for_function(f"document.getElementById('me-summary')?.dataset.rank === '{last.rank}'")
        assert await page.get_attribute('#lb-boards a[data-board=""]', "href") == f"?player_id={climber}"

        await sync_to_async(apply_events)(regional, [Events("lr4").result(climber, 9000)])
        assert await apublish(regional) == 2
        await wait_version(page, 2)
        assert await text(page, "#lb-top tbody tr:first-child td:nth-child(3)") == climber
        await page.wait_for_function("document.getElementById('me-summary')?.dataset.rank === '1'")

        await page.click('#lb-boards a[data-board=""]')
        await wait_version(page, 2)
        assert await text(page, "#lb-board") == "global" and await text(page, "#lb-total") == "30"
        assert await page.get_attribute("#me-summary", "data-rank") == "1"

    assert browse(asgi_server, scenario) == []
