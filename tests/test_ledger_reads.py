"""Reads of a ledger whose partitions live in several databases (leaderboard/ledger_reads.py):
the reconciliation, a recovery, the staff player page, and the invariant checker's full
scan in bounded memory.

Run as they are, every partition lives in "default". With
LEDGER_PARTITION_URLS="4-7=postgresql://.../<db>" the seasons below (8 partitions) keep
partitions 4-7 in that database, and the players these tests look at live there: the
same tests then prove each reader asks the right database.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, cast

import pytest
from django.db import connections

from leaderboard.core.partitions import partition_of
from leaderboard.ledger_databases import DEFAULT_ALIAS, ledger_alias_of_player, ledger_aliases
from leaderboard.ledger_reads import ledger_rows_count, ledger_rows_merged
from leaderboard.models import PlayerScore, RebuildJob, ScoreEvent, ScoreEventConflict
from leaderboard.recovery.rebuild import rebuild_run, season_epoch_advance
from leaderboard.recovery.reconcile import reconciliation_run, version_reconcile
from leaderboard.redis_client import redis_get
from leaderboard.views import invariants
from seasons.models import Season
from tests.support import (
    Events,
    assert_matches_ledger,
    current_manifest,
    db_scores,
    keys_of,
    post_ok,
    publish,
)

pytest_plugins = ["tests.support.staff_fixtures"]
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]

Post = Callable[..., Any]
PARTITIONS = 8
SPLIT = bool(os.environ.get("LEDGER_PARTITION_URLS"))


def far(n: int, prefix: str = "far") -> list[str]:
    """`n` player ids of partitions 4-7 of an 8-partition season (the second database's
    when LEDGER_PARTITION_URLS places them there)."""
    found: list[str] = []
    i = 0
    while len(found) < n:
        player_id = f"{prefix}{i:04d}"
        if partition_of(player_id, PARTITIONS) >= 4:
            found.append(player_id)
        i += 1
    return found


def seeded(season_factory: Callable[..., Season], post_scores: Post, slug: str, players: int = 40
           ) -> tuple[Season, Events]:
    """An 8-partition season with players in every partition, published."""
    season = season_factory(slug=slug, partitions=PARTITIONS)
    events = Events(tag=slug)
    post_ok(post_scores, season, [events.result(f"p{i:03d}", (i * 37) % 1000) for i in range(players)])
    post_ok(post_scores, season, [events.result(p, 500 + i) for i, p in enumerate(far(5))])
    publish(season)
    return season, events


def where(season: Season, player_id: str) -> str:
    alias = ledger_alias_of_player(season=season, player_id=player_id)
    assert (alias != DEFAULT_ALIAS) == SPLIT, (alias, SPLIT)
    return alias


def test_a_split_season_has_its_far_players_in_the_second_database(season_factory: Callable[..., Season],
                                                                     post_scores: Post) -> None:
    season, _ = seeded(season_factory, post_scores, "lr-where")
    aliases = ledger_aliases(season=season)
    assert len(aliases) == (2 if SPLIT else 1)
    for player_id in far(5):
        alias = where(season, player_id)
        assert PlayerScore.objects.using(alias).filter(season_id=season.pk, player_id=player_id).exists()
        if SPLIT:
            assert not PlayerScore.objects.filter(season_id=season.pk, player_id=player_id).exists()
    # The fan-out helpers see every row: 40 + 5 players, each database's own.
    assert ledger_rows_count(season=season, queryset=PlayerScore.objects.filter(season_id=season.pk)) == 45
    top = ledger_rows_merged(season=season, queryset=PlayerScore.objects.filter(season_id=season.pk)
                             .order_by("-score", "player_id").values_list("player_id", "score"),
                             key=lambda row: (-row[1], row[0]), limit=5)
    assert top == sorted(db_scores(season).items(), key=lambda row: (-row[1], row[0]))[:5]


def test_the_reconciliation_finds_a_wrong_score_of_a_player_in_the_second_database(
    season_factory: Callable[..., Season], post_scores: Post
) -> None:
    season, _ = seeded(season_factory, post_scores, "lr-wrong")
    manifest = current_manifest(season)
    clean = version_reconcile(r=redis_get(), keys=keys_of(season), season_id=season.pk, version=manifest.version)
    assert clean.ok, clean.failures()

    victim = far(5)[2]
    alias = where(season, victim)
    # A score row changed behind the change stream's back, in the player's own database.
    with connections[alias].cursor() as cursor:
        cursor.execute("UPDATE leaderboard_playerscore SET score = score + 1 WHERE season_id = %s AND player_id = %s",
                       [season.pk, victim])
    report = version_reconcile(r=redis_get(), keys=keys_of(season), season_id=season.pk, version=manifest.version)
    failed = {f.check for f in report.failures()}
    assert "ledger_bucket_checksums" in failed, report.failures()
    # The copy itself is consistent: only the comparisons with the ledger fail.
    assert not failed & {"bucket_counts", "players_once", "bucket_checksums", "lookup_equals_index"}
    # The continuous check samples every player of this small board and names the one.
    run = reconciliation_run(season=season, full=False, sample=1000)
    assert not run.ok
    detail = {f["check"]: f["detail"] for f in run.findings}
    assert f"{victim}: version" in detail["ledger_scores"], detail


def test_a_recovery_of_a_split_season_publishes_every_databases_players(
    season_factory: Callable[..., Season], post_scores: Post
) -> None:
    season, events = seeded(season_factory, post_scores, "lr-recover")
    redis_get().flushdb()
    assert season_epoch_advance(season=season).status == "lost"
    job = rebuild_run(job_id=RebuildJob.objects.get(season=season, kind="recovery").pk)
    assert job.status == "published", (job.error, job.report)
    assert job.total == job.done == 45
    assert assert_matches_ledger(season)
    # After it, a write to a far player is published like any other.
    victim = far(5)[0]
    post_ok(post_scores, season, [events.result(victim, 999)])
    publish(season)
    assert db_scores(season)[victim] == 999
    assert assert_matches_ledger(season)


def test_the_staff_player_page_of_a_player_in_the_second_database(
    season_factory: Callable[..., Season], post_scores: Post, client_as: Any
) -> None:
    season, events = seeded(season_factory, post_scores, "lr-page")
    player_id = far(5)[1]
    alias = where(season, player_id)
    first = events.sent[[e["player_id"] for e in events.sent].index(player_id)]
    # The same event id again with another score: a conflict, recorded and listed.
    assert post_ok(post_scores, season, [{**first, "best_score": 7}])[0]["status"] == "conflict"
    assert ledger_rows_count(season=season, queryset=ScoreEventConflict.objects.filter(season_id=season.pk)) == 1
    assert ScoreEvent.objects.using(alias).filter(season_id=season.pk, player_id=player_id).count() == 1

    page = client_as("viewer").get(f"/staff/seasons/{season.slug}/players/{player_id}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert f"<code>{first['event_id']}</code>" in html
    assert f"{first['best_score']:,}" in html  # the current score, from the player's database
    assert "Conflicting deliveries (1)" in html
    assert "match-service" in html  # the API client, read from "default"


def test_the_full_invariant_check_finds_duplicates_and_wrong_lookups_a_chunk_at_a_time(
    season_factory: Callable[..., Season], post_scores: Post, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Members are checked SCAN_CHUNK at a time against the lookup: a player added to a
    second bucket, and a lookup entry changed, are still found with chunks of 3."""
    monkeypatch.setattr(invariants, "SCAN_CHUNK", 3)
    season, _ = seeded(season_factory, post_scores, "lr-chunks")
    r = redis_get()
    keys = keys_of(season)
    manifest = current_manifest(season)
    assert invariants.version_check(r=r, keys=keys, full=True).ok
    layout = manifest.layout
    held = next(b for b in range(layout.size) if manifest.counts[b])
    member = cast(bytes, r.zrange(keys.bucket(manifest.copy, layout.layout_id, held, groups=manifest.groups), 0, 0)[0])
    # The same player in another bucket too (within that bucket's range, so only the
    # duplicate tells): players_once and the lookup comparison fail.
    other = layout.size - 1 if held != layout.size - 1 else 0
    low, _ = layout.range_of(other)
    r.zadd(keys.bucket(manifest.copy, layout.layout_id, other, groups=manifest.groups), {member: -low})
    report = invariants.version_check(r=r, keys=keys, full=True)
    failed = {f.check for f in report.failures()}
    assert {"players_once", "lookup_equals_index", "bucket_counts"} <= failed, report.failures()
    detail = {f.check: f.detail for f in report.findings}
    assert member.decode() in detail["players_once"]


def test_a_pending_score_of_a_player_in_the_second_database_is_read_there(
    season_factory: Callable[..., Season], post_scores: Post
) -> None:
    from rest_framework.test import APIClient

    season, events = seeded(season_factory, post_scores, "lr-pending")
    player_id = far(5)[3]
    where(season, player_id)
    post_ok(post_scores, season, [events.result(player_id, 990)])  # committed, not yet published
    body = APIClient().get(f"/v1/seasons/{season.slug}/players/{player_id}/rank", {"include_pending": "true"}).json()
    assert body["pending"]["score"] == 990, body
    assert body["pending"]["pending_version"] == current_manifest(season).version + 1
