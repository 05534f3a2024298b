"""The public reads of a region's board (docs/api.md, Regional boards): top, window, rank and
neighbours under /v1/seasons/{id}/regions/{region}/, through both front ends (the DRF views
and the fast read path, which must answer identically), against the ledger's standings of
that region's players; pinning, 410, 404 unknown_region / not_ranked, 400, 503; and the
player's region in the global rank answer."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

import orjson
import pytest
from rest_framework.test import APIClient

from leaderboard.core.ranking import Standings
from leaderboard.core.tiers import percentile
from leaderboard.models import PlayerScore
from leaderboard.recovery.rebuild import rebuild_run
from leaderboard.redis_client import redis_get
from leaderboard.views import rankview
from seasons.models import Season
from tests.support import (
    DEFAULT_KIND,
    NARROW,
    Events,
    Profiles,
    apply_events,
    current_manifest,
    epoch,
    fast_get,
    ledger_rows,
    publish,
    recovery_jobs,
)
from tests.support.publication import RoundTrips
from tests.support.reference import answer_entry

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]

REGIONS = ["na", "eu", "apac"]
READS = ("top", "window", "rank", "neighbors")


def url(slug: str, read: str, *, region: str | None = None, player: str = "p00", **params: Any) -> str:
    base = f"/v1/seasons/{slug}" + ("" if region is None else f"/regions/{region}")
    path = {"top": "/leaderboard/top", "window": "/leaderboard", "rank": f"/players/{player}/rank",
            "neighbors": f"/players/{player}/neighbors"}[read]
    return base + path + (f"?{urlencode(params)}" if params else "")


def both(target: str) -> tuple[int, dict[str, Any], dict[str, str]]:
    """The answer of the DRF view and of the fast read path, which must be the same; the
    fast path must serve the URL itself (fast_get fails a request it hands on)."""
    slow = APIClient().get(target)
    fast = fast_get(target)
    assert slow.status_code != 500, slow.content
    assert (fast.status_code, orjson.loads(fast.content)) == (slow.status_code, orjson.loads(slow.content)), target
    assert fast.headers.get("retry-after") == slow.headers.get("Retry-After"), target
    return slow.status_code, slow.json(), {k.lower(): v for k, v in slow.headers.items()}


def ok(target: str) -> dict[str, Any]:
    status, body, _ = both(target)
    assert status == 200, (target, body)
    return body


def error(target: str, status: int, code: str) -> dict[str, Any]:
    got, body, _ = both(target)
    assert (got, body["error"]) == (status, code), (target, body)
    return body


def ledger(season: Season) -> dict[str, tuple[int, str]]:
    """player -> (score, region in the season; "" for none) from the ledger."""
    return {p: (s, g) for p, s, g in ledger_rows(PlayerScore, season, "player_id", "score", "region")}


def regional_standings(season: Season, region: str) -> Standings:
    return Standings({p: s for p, (s, g) in ledger(season).items() if g == region})


def dicts(entries: list[Any]) -> list[dict[str, object]]:
    return [answer_entry(e) for e in entries]


@pytest.fixture
def profiles() -> Profiles:
    return Profiles()


@pytest.fixture
def regional(season_factory: Callable[..., Season], profiles: Profiles) -> Season:
    """36 players over three regions, none, and a region the season does not have (so none
    in it), with ties inside each region; version 1 published."""
    season = season_factory(slug="rr", regions=REGIONS, layout=NARROW)
    rnd = random.Random(7)
    players = [f"p{i:02d}" for i in range(36)]
    profiles.set(**{p: [*REGIONS, None, "mars"][i % 5] for i, p in enumerate(players)})
    events = Events("rr")
    apply_events(season, [events.result(p, rnd.choice([100, 250, 250, 400, 700, 700, 950])) for p in players])
    assert publish(season) == 1
    return season


def assert_regional_reads_match_ledger(season: Season, region: str, version: int) -> None:
    """Every read of the region's board in `version`, through both front ends, against the
    ledger's standings of the region's players."""
    expected = regional_standings(season, region)
    everything = expected.window(from_position=1, limit=len(expected) + 1)
    slug = season.slug
    envelope = {"leaderboard_version": version, "region": region, "total_players": len(expected),
                "kind": {**DEFAULT_KIND, "tie_break": season.tie_break}}

    top = ok(url(slug, "top", region=region))
    assert top == {**envelope, "as_of": top["as_of"], "entries": dicts(expected.top(100)), "next_cursor": None}
    assert ok(url(slug, "top", region=region, limit=2))["entries"] == dicts(expected.top(2))
    for first in range(1, len(expected) + 2):
        window = ok(url(slug, "window", region=region, from_position=first, limit=3))
        assert window == {**envelope, "as_of": top["as_of"], "from_position": first,
                          "entries": dicts(everything[first - 1 : first + 2]), "next_cursor": window["next_cursor"]}
        assert (window["next_cursor"] is None) == (first + 2 >= len(expected))
    for player_id, (_, home) in ledger(season).items():
        entry = expected.entry(player_id)
        if entry is None:  # no region, or another region's board: not ranked on this one
            body = error(url(slug, "rank", region=region, player=player_id), 404, "not_ranked")
            assert body["player_id"] == player_id and body["region"] == region
            assert body["leaderboard_version"] == version
            error(url(slug, "neighbors", region=region, player=player_id), 404, "not_ranked")
            continue
        assert home == region
        rank = ok(url(slug, "rank", region=region, player=player_id))
        tied = sum(1 for other in everything if other.score == entry.score)
        assert rank == {**envelope, "as_of": top["as_of"], "player_id": player_id, "score": entry.score,
                        "rank": entry.rank, "position": entry.position, "display_name": None, "country": None,
                        "tier": None, "percentile": percentile(rank=entry.rank, tied=tied, total=len(expected))}
        around = ok(url(slug, "neighbors", region=region, player=player_id, radius=2))
        assert around == {**envelope, "as_of": top["as_of"], "player": answer_entry(entry), "radius": 2,
                          "entries": dicts(expected.neighbors(player_id, 2))}


def test_every_read_of_each_region_answers_as_the_ledger_through_both_front_ends(regional: Season) -> None:
    counts = {region: len(regional_standings(regional, region)) for region in REGIONS}
    assert all(counts.values()) and sum(counts.values()) < len(ledger(regional))  # some players have no region
    for region in REGIONS:
        assert_regional_reads_match_ledger(regional, region, version=1)


def test_the_global_rank_names_the_players_region_in_the_version(
        regional: Season, season_factory: Callable[..., Season]) -> None:
    for player_id, (score, region) in ledger(regional).items():
        body = ok(url(regional.slug, "rank", player=player_id))
        assert (body["score"], body["region"]) == (score, region or None), player_id
        assert body["total_players"] == 36  # the global board holds every player
    plain = season_factory(slug="plain")
    Profiles().set(solo="na")
    apply_events(plain, [Events("plain").result("solo", 10)])
    publish(plain)
    assert ok(url("plain", "rank", player="solo"))["region"] is None  # a season without regions has none


@pytest.mark.usefixtures("without_catch_up")
def test_a_pinned_version_answers_as_it_did_until_it_expires(regional: Season, profiles: Profiles) -> None:
    slug = regional.slug
    mover = next(p for p, (_, g) in ledger(regional).items() if g == "na")
    targets = [url(slug, read, region=region, player=mover) for region in ("na", "eu") for read in READS]
    before = {target: ok(target) for target in targets if "/players/" not in target or "/na/" in target}

    profiles.set(**{mover: "eu"})  # the player moves to eu
    apply_events(regional, [Events("rr2").result(mover, 999)])
    assert publish(regional) == 2
    assert ok(url(slug, "rank", region="eu", player=mover))["rank"] == 1
    error(url(slug, "rank", region="na", player=mover), 404, "not_ranked")
    assert_regional_reads_match_ledger(regional, "eu", version=2)
    for target, body in before.items():  # version 1 is retained: pinned reads answer exactly as before
        assert ok(f"{target}{'&' if '?' in target else '?'}version=1") == body, target

    apply_events(regional, [Events("rr3").correction(mover, 50)])
    assert publish(regional) == 3
    # The copy that held version 1 was brought up to date: gone, but for the top, kept in its manifest.
    for read in ("window", "rank", "neighbors"):
        body = error(url(slug, read, region="na", player=mover, version=1), 410, "version_expired")
        assert body["current_version"] == 3
    assert ok(url(slug, "top", region="na", version=1)) == before[url(slug, "top", region="na")]
    for read in READS:  # a version not yet published
        assert error(url(slug, read, region="eu", player=mover, version=4), 410,
                     "version_expired")["current_version"] == 3


def test_a_region_the_season_does_not_have_is_404_unknown_region(
        regional: Season, season_factory: Callable[..., Season]) -> None:
    for read in READS:
        body = error(url(regional.slug, read, region="mars", player="p00"), 404, "unknown_region")
        assert "na, eu, apac" in body["detail"]
        # Pinned to a retained version, the version's regions decide alike.
        error(url(regional.slug, read, region="mars", player="p00", version=1), 404, "unknown_region")
    plain = season_factory(slug="plain")
    apply_events(plain, [Events("plain").result("solo", 10)])
    publish(plain)
    for read in READS:
        body = error(url("plain", read, region="na", player="solo"), 404, "unknown_region")
        assert "no regions" in body["detail"]


@pytest.mark.parametrize("region", ["NA", "n_a", "a" * 17, "caf%C3%A9", "n%20a"])
def test_a_malformed_region_is_400_naming_it(regional: Season, region: str) -> None:
    for read in READS:
        body = error(url(regional.slug, read, region=region, player="p00"), 400, "validation_error")
        assert list(body["fields"]) == ["region"]
    # Checked before the season: an unknown season with a malformed region is still a 400.
    error(url("nope", "top", region=region), 400, "validation_error")


def test_not_ranked_on_a_board_is_404_with_the_version(regional: Season) -> None:
    homes = ledger(regional)
    eu_player = next(p for p, (_, g) in homes.items() if g == "eu")
    nowhere = next(p for p, (_, g) in homes.items() if g == "")
    for player_id, region in ((eu_player, "na"), (nowhere, "eu"), ("nobody", "apac")):
        for read in ("rank", "neighbors"):
            body = error(url(regional.slug, read, region=region, player=player_id), 404, "not_ranked")
            assert body | {"as_of": None, "detail": None} == {
                "error": "not_ranked", "detail": None, "leaderboard_version": 1, "as_of": None,
                "kind": {**DEFAULT_KIND, "tie_break": regional.tie_break}, "region": region, "player_id": player_id}
    error(url(regional.slug, "rank", region="na", player="bad!id"), 404, "player_not_found")
    error(url("nope", "rank", region="na", player=eu_player), 404, "season_not_found")


def test_include_pending_on_a_regional_board_follows_the_ledgers_region(regional: Season,
                                                                         profiles: Profiles) -> None:
    slug = regional.slug
    mover = next(p for p, (_, g) in ledger(regional).items() if g == "na")
    profiles.set(**{mover: "eu"})
    apply_events(regional, [Events("rr2").result(mover, 990)])
    # Not yet published: the version still holds the player on na, the ledger on eu.
    on_na = ok(url(slug, "rank", region="na", player=mover, include_pending="true"))
    assert on_na["region"] == "na" and on_na["rank"] is not None and on_na["pending"] is None
    on_eu = ok(url(slug, "rank", region="eu", player=mover, include_pending="true"))
    assert (on_eu["region"], on_eu["score"], on_eu["rank"], on_eu["position"]) == ("eu", None, None, None)
    assert (on_eu["pending"]["score"], on_eu["pending"]["pending_version"]) == (990, 2)
    error(url(slug, "rank", region="apac", player=mover, include_pending="true"), 404, "not_ranked")
    publish(regional)
    on_eu = ok(url(slug, "rank", region="eu", player=mover, include_pending="true"))
    assert (on_eu["rank"], on_eu["pending"]) == (1, None)


def test_lost_views_answer_503_and_the_database_decides_the_404s(regional: Season) -> None:
    redis_get().flushdb()
    rankview.manifest_cache_clear()
    for read in READS:
        unpinned_and_pinned: list[dict[str, Any]] = [{}, {"version": 1}]
        for pinned in unpinned_and_pinned:
            status, body, headers = both(url(regional.slug, read, region="eu", **pinned))
            assert (status, body["error"]) == (503, "unavailable")
            assert body["retry_after"] >= 1 and headers["retry-after"] == str(body["retry_after"])
            assert "leaderboard_version" not in body
        error(url(regional.slug, read, region="mars"), 404, "unknown_region")
        error(url("nope", read, region="eu"), 404, "season_not_found")
        error(url(regional.slug, read, region="EU"), 400, "validation_error")
    # The epoch starts a recovery build; until it publishes, the reads stay 503.
    assert epoch(regional).status == "lost"
    error(url(regional.slug, "top", region="na"), 503, "unavailable")
    (job,) = recovery_jobs(regional)
    assert rebuild_run(job_id=job.pk).status == "published"
    for region in REGIONS:  # the recovered version holds every regional board
        assert_regional_reads_match_ledger(regional, region, version=2)
    error(url(regional.slug, "window", region="apac", version=1), 410, "version_expired")


def test_a_global_rank_read_of_a_season_without_regions_costs_what_it_did(
        season_factory: Callable[..., Season], regional: Season, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two round trips (one for a player read before with the same score), and no region
    shard named, on the fast path; a season with regions adds the region's HGET to the
    first round trip once the process has seen its regions."""
    plain = season_factory(slug="plain")
    apply_events(plain, [Events("plain").result(p, 10 * i) for i, p in enumerate(["a", "b", "c"])])
    publish(plain)
    fast_get(url("plain", "rank", player="a"))  # warm: the manifest is cached per process
    spied = RoundTrips(monkeypatch, plain)
    trips = spied.during(lambda: fast_get(url("plain", "rank", player="b")))
    assert len(trips) == 2, trips
    # Region shards are {season:copy:group}:rg:shard: none is named.
    assert not any(b"}:rg:" in trip for trip in trips), trips
    # One place script: the count ahead, the tied count (the percentile's) and the position.
    assert (trips[1].count(b"EVAL"), trips[1].count(b"ZCOUNT"), trips[1].count(b"ZRANK")) == (1, 2, 1)
    (again,) = spied.during(lambda: fast_get(url("plain", "rank", player="b")))
    assert b"}:rg:" not in again and again.count(b"ZCOUNT") == 2, again

    fast_get(url(regional.slug, "rank", player="p01"))
    spied = RoundTrips(monkeypatch, regional)
    trips = spied.during(lambda: fast_get(url(regional.slug, "rank", player="p00")))
    assert len(trips) == 2, trips
    assert f"{{rr:{current_manifest(regional).copy}:".encode() in trips[0] and b"}:rg:" in trips[0], trips
    (again,) = spied.during(lambda: fast_get(url(regional.slug, "rank", player="p00")))
    assert b"}:rg:" in again and again.count(b"ZCOUNT") == 2, again
