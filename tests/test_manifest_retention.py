"""How long a version stays readable: the current version's manifest never expires, however
quiet the season (no match overnight, a FINAL waiting for its approver); a superseded one
expires after MANIFEST_TTL; the FINAL version keeps its manifest when a correction replaces
it; the per-process manifest cache evicts the least recently used entry when full."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from leaderboard.core.buckets import BucketLayout
from leaderboard.core.manifest import Manifest
from leaderboard.core.partitions import Watermark
from leaderboard.models import RebuildJob
from leaderboard.redis_client import redis_get
from leaderboard.views import rankview
from seasons.models import Season
from seasons.staff.revocations.services import score_revocation_approve, score_revocation_propose
from tests.support import (
    Events,
    closing_season,
    epoch,
    finalize,
    in_season,
    keys_of,
    materialize,
    post_ok,
    publish,
    staff,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]

Post = Callable[..., Any]


def top(season: Season, version: int | None = None) -> Any:
    query = f"?version={version}" if version else ""
    return APIClient().get(f"/v1/seasons/{season.slug}/leaderboard/top{query}")


def test_the_current_manifest_has_no_expiry_and_the_one_it_replaced_has(season: Season, post_scores: Post) -> None:
    r = redis_get()
    keys = keys_of(season)
    ev = Events(tag="ttl")
    post_ok(post_scores, season, [ev.result("a", 10)])
    first = publish(season)
    assert r.ttl(keys.manifest(first)) == -1  # -1: the key exists and has no expiry
    post_ok(post_scores, season, [ev.result("b", 20)])
    second = publish(season)
    assert r.ttl(keys.manifest(second)) == -1
    assert 0 < r.ttl(keys.manifest(first)) <= rankview.MANIFEST_TTL


def test_a_quiet_season_stays_readable_past_the_manifest_ttl_without_a_recovery(
    season: Season, post_scores: Post, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rankview.fence, "MANIFEST_TTL", 1)
    monkeypatch.setattr(rankview.manifests, "MANIFEST_TTL", 1)
    ev = Events(tag="quiet")
    post_ok(post_scores, season, [ev.result("a", 10), ev.result("b", 20)])
    publish(season)
    post_ok(post_scores, season, [ev.result("c", 30)])
    current = publish(season)

    time.sleep(1.5)  # an hour of silence, with a one-second TTL
    rankview.manifest_cache_clear()  # a process that has not read the version yet
    response = top(season)
    assert response.status_code == 200, response.content
    assert (response.json()["leaderboard_version"], response.json()["total_players"]) == (current, 3)
    assert epoch(season).status == "idle"
    assert not RebuildJob.objects.filter(season=season).exists()
    # Only the superseded version is gone: a reader pinned to it repositions.
    pinned = top(season, current - 1)
    assert (pinned.status_code, pinned.json()["error"], pinned.json()["current_version"]) == (
        410, "version_expired", current)


def test_the_final_version_keeps_its_manifest_after_a_correction_replaces_it(
    season_factory: Callable[..., Season], post_scores: Post
) -> None:
    r = redis_get()
    season = closing_season(season_factory, "final-kept")
    events = Events("fk", in_season(season))
    post_ok(post_scores, season, [events.result("champ", 900), events.result("second", 800)])
    finalize(season)
    season.refresh_from_db()
    final_version = season.final_version
    assert final_version is not None
    keys = keys_of(season)
    assert r.ttl(keys.manifest(final_version)) == -1

    # A revoked champion: the two-person correction flow, the one way a FINAL season changes.
    revocation = score_revocation_propose(season=season, player_id="champ", new_score=1, reason="revoked",
                                          actor=staff())
    assert score_revocation_approve(revocation=revocation, actor=staff()).applied
    corrected = materialize(season)
    assert corrected.version == final_version + 1
    assert r.ttl(keys.manifest(corrected.version)) == -1
    assert r.ttl(keys.manifest(final_version)) == -1
    pinned = top(season, final_version)
    assert pinned.status_code == 200, pinned.content
    assert pinned.json()["entries"][0]["player_id"] == "champ"


def test_the_manifest_cache_evicts_the_least_recently_used_entry_when_full(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rankview.manifests, "_MANIFEST_CACHE_MAX", 3)
    r = redis_get()
    keys = rankview.Keys("lbtest-cache", "lru")
    layout = BucketLayout(layout_id=1, lower_bounds=(0,))

    def stored(version: int) -> None:
        manifest = Manifest(season="lru", version=version, as_of="2026-11-15T12:00:00.000+00:00",
                            watermark=Watermark(), copy="0", gen=1, layout=layout, counts=[0], checksums=[0])
        r.set(keys.manifest(version), manifest.to_json())

    for version in (1, 2, 3, 4):
        stored(version)
    for version in (1, 2, 3, 1, 4):  # 1 read again: 2 is now the least recently used
        assert rankview.manifest_get(r, keys, version) is not None
    r.delete(*(keys.manifest(v) for v in (1, 2, 3, 4)))
    # Only the cache can answer now.
    assert [rankview.manifest_get(r, keys, v) is not None for v in (1, 2, 3, 4)] == [True, False, True, True]
