"""Lookup shards sized by the players a copy holds: a power of two >= max(minimum,
players / 48), chosen when the copy is built from the scores and recorded in its meta and
manifests, so each shard stays a compact hash (listpack; ziplist before Redis 7). The
minimum (VIEW_LOOKUP_SHARDS_MIN, 128) is lowered to 16 here so that small seasons outgrow
it. Reads stay exact when a copy is built again with another count (a reader that learned
the old one pays one more round trip), and a season that outgrows its shards through
epochs gets a background rebuild that sizes them again."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from audit.models import AuditEntry
from leaderboard.core.manifest import lookup_shards_for, lookup_shards_outgrown
from leaderboard.core.ranking import Standings
from leaderboard.models import RebuildJob
from leaderboard.recovery.rebuild import rebuild_run
from leaderboard.redis_client import redis_get
from leaderboard.tasks import rebuild_run_task
from leaderboard.views import rankview
from leaderboard.views.epoch import SHARDS_OUTGROWN_REASON
from seasons.models import Season
from tests.support import Events, Profiles, apply_events, db_scores, db_standings, full_check, players
from tests.support.publication import RoundTrips, current_manifest, keys_of, publish

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rank_views")]


@pytest.fixture(autouse=True)
def small_minimum(settings: Any) -> None:
    settings.VIEW_LOOKUP_SHARDS_MIN = 16


def compact_encoding() -> str:
    """What Redis calls a small hash's compact encoding: listpack from 7.0, ziplist before."""
    major = int(str(redis_get().info("server")["redis_version"]).split(".")[0])
    return "listpack" if major >= 7 else "ziplist"

REGIONS = ["eu", "na"]


@pytest.fixture
def queued(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rebuild jobs handed to Celery (the broker is the network edge): run by the test."""
    jobs: list[int] = []
    monkeypatch.setattr(rebuild_run_task, "delay", lambda job_id: jobs.append(job_id))
    return jobs


def test_shard_counts() -> None:
    assert [lookup_shards_for(players=n) for n in (0, 768, 769, 1500, 1_000_000, 10_000_000)] == [
        16, 16, 32, 32, 32_768, 262_144]
    assert [lookup_shards_for(players=n, minimum=128) for n in (0, 5000, 6144, 6145, 1_000_000)] == [
        128, 128, 128, 256, 32_768]
    assert lookup_shards_for(players=0, minimum=100) == 128  # a power of two
    assert not lookup_shards_outgrown(players=16 * 96, shards=16)
    assert lookup_shards_outgrown(players=16 * 96 + 1, shards=16)


def scored(season: Season, ids: list[str], tag: str, *, seed: int, floor: int = 0) -> None:
    """Results for `ids` in [floor, floor + 1000): above `floor`, a player's earlier scores
    (a result only ever raises a score)."""
    rng = random.Random(seed)
    events = Events(tag)
    # Few distinct scores: ties everywhere.
    apply_events(season, [events.result(p, floor + rng.randrange(0, 1000, 10)) for p in ids])


def shard_encodings(keys: rankview.Keys, copy: str, shards: int, *, regions: bool = False) -> tuple[set[str], int]:
    """The OBJECT ENCODING of each shard of a copy's index (a missing one counts as
    "missing"), and the fields they hold (one a player, whatever the sides see of them)."""
    r = redis_get()
    key = keys.region if regions else keys.lookup
    meta = rankview.copy_meta_load(r, keys, copy)
    assert meta is not None
    names = [key(meta.index, shard, groups=meta.groups) for shard in range(shards)]
    encodings = {(r.object("encoding", name) or b"missing").decode() for name in names}  # type: ignore[union-attr]
    return encodings, sum(int(r.hlen(name)) for name in names)  # type: ignore[arg-type]


def assert_reads_exact(season: Season, reader: rankview.RankReader, expected: Standings, ids: list[str]) -> None:
    for player_id in ids:
        view = reader.rank(player_id)
        assert view.entry == expected.entry(player_id), player_id
        _, me, around = reader.neighbors(player_id, 3)
        assert me == expected.entry(player_id)
        assert around == expected.neighbors(player_id, 3), player_id
    friends = reader.players(ids)
    assert friends.scores == {p: expected.entry(p).score for p in ids}  # type: ignore[union-attr]
    assert friends.ranks == {p: expected.entry(p).rank for p in ids}  # type: ignore[union-attr]


def test_a_copy_of_n_players_has_about_n_over_48_compact_shards(season_factory: Callable[..., Season]) -> None:
    season = season_factory(slug="shards-sized", regions=REGIONS)
    ids = list(players("p", 1500))
    Profiles().set(**{p: REGIONS[i % 3] if i % 3 < 2 else None for i, p in enumerate(ids)})
    scored(season, ids, "a", seed=1)
    publish(season)  # copy 0, built from the scores: one index, copy 1 its other side
    scored(season, ids[:10], "b", seed=2, floor=1000)
    publish(season)  # copy 1, brought up to date in the same index
    manifest = current_manifest(season)
    assert manifest.lookup_shards == 32 == lookup_shards_for(players=1500)
    keys = keys_of(season)
    regional = sum(1 for i in range(1500) if i % 3 < 2)
    for copy in rankview.copies_get(redis_get(), keys):
        meta = rankview.copy_meta_load(redis_get(), keys, copy)
        assert meta is not None and (meta.lookup_shards, meta.index) == (32, manifest.index)
        # ~47 players a shard: every shard exists and is a listpack, far below 128.
        assert shard_encodings(keys, copy, 32) == ({compact_encoding()}, 1500)
        assert shard_encodings(keys, copy, 32, regions=True) == ({compact_encoding()}, regional)
        assert not redis_get().exists(keys.lookup(meta.index, 32, groups=meta.groups),
                                        keys.lookup(meta.index, 16 + 32, groups=meta.groups))
    expected = db_standings(season)
    reader = rankview.RankReader(redis_get(), keys, deadline=3600)
    assert_reads_exact(season, reader, expected, ids[::37])
    eu = rankview.RankReader(redis_get(), keys, deadline=3600, region="eu")
    scores = db_scores(season)
    eu_expected = Standings({p: scores[p] for p in ids[::3]})
    for player_id in ids[:60]:  # eu's, and the others', not ranked on eu's board
        assert eu.rank(player_id).entry == eu_expected.entry(player_id), player_id
    full_check(season)


def test_reads_stay_exact_while_the_shard_count_changes_and_an_outgrown_copy_is_rebuilt(
        season_factory: Callable[..., Season], queued: list[int], monkeypatch: pytest.MonkeyPatch,
        settings: Any) -> None:
    # Round trips counted here are a first read's: no player's place is known beforehand.
    settings.READ_PLACE_HINTS = 0
    season = season_factory(slug="shards-grow", regions=REGIONS)
    r = redis_get()
    keys = keys_of(season)
    first = list(players("a", 10))
    Profiles().set(**{p: "eu" for p in first})
    scored(season, first, "a", seed=3)
    publish(season)
    scored(season, first[:2], "b", seed=4, floor=1000)
    publish(season)
    before = current_manifest(season)
    assert before.lookup_shards == 16
    reader = rankview.RankReader(r, keys, deadline=3600)
    trips = RoundTrips(monkeypatch, season)
    assert_reads_exact(season, reader, db_standings(season), first)

    # 1,600 players now, more than 16 shards x 96, brought in by epochs: the next one brings
    # the other copy (the other side of the same index, built for 10 players) up to date.
    # It publishes, and starts a background rebuild (one: the epochs after it find it in flight).
    grown = list(players("g", 1590))
    scored(season, grown, "c", seed=5)
    idle = next(c for c in rankview.copies_get(r, keys) if c != before.copy)
    publish(season)
    outgrown = current_manifest(season)
    assert (outgrown.copy, outgrown.index, outgrown.lookup_shards, outgrown.total) == (idle, before.index, 16, 1600)
    (job,) = RebuildJob.objects.filter(season=season)
    assert (job.kind, job.status, queued) == (RebuildJob.Kind.REBUILD, RebuildJob.Status.QUEUED, [job.pk])
    assert job.reason.startswith(SHARDS_OUTGROWN_REASON) and "1,600 players in 16 lookup shards" in job.reason
    audit = AuditEntry.objects.filter(action="views.rebuild.requested", target_id=str(job.pk))
    assert list(audit.values_list("actor_type", "reason")) == [("system", job.reason)]
    everyone = first + grown
    # The reader learned both copies' 16 (their index's) on its first read.
    assert len(trips.during(lambda: reader.rank("g00007"))) == 2
    assert_reads_exact(season, reader, db_standings(season), everyone[::53])
    for floor, tag in enumerate(("e", "f"), start=1):
        scored(season, grown[5:8], tag, seed=7, floor=1000 * floor)
        publish(season)
    assert RebuildJob.objects.filter(season=season).count() == 1
    assert_reads_exact(season, reader, db_standings(season), everyone[::97])

    # A failed one is not started again at once (each is a full build)...
    RebuildJob.objects.filter(pk=job.pk).update(status=RebuildJob.Status.FAILED, finished_at=timezone.now())
    for floor, tag in enumerate(("g", "h"), start=1):
        scored(season, grown[8:10], tag, seed=8, floor=1000 * floor)
        publish(season)
    assert RebuildJob.objects.filter(season=season).count() == 1
    # ...but some minutes later it is.
    RebuildJob.objects.filter(pk=job.pk).update(finished_at=timezone.now() - timedelta(minutes=11))
    for floor, tag in enumerate(("i", "j"), start=1):
        scored(season, grown[10:12], tag, seed=9, floor=1000 * floor)
        publish(season)
    again = RebuildJob.objects.filter(season=season).exclude(pk=job.pk).get()
    assert queued == [job.pk, again.pk]

    # Meanwhile the copy the next epoch targets is found broken: that epoch builds a new
    # index from the scores beside the serving one, sized for 1,600 players (64 shards),
    # publishes its first copy under a new name and drops the copies it replaced.
    serving = current_manifest(season)
    idle = next(c for c in rankview.copies_get(r, keys) if c != serving.copy)
    r.hset(keys.copy_meta(idle), "state", rankview.STATE_BROKEN)
    scored(season, grown[12:14], "k", seed=10, floor=3000)
    publish(season)
    rebuilt = current_manifest(season)
    assert rebuilt.copy.startswith("e") and rebuilt.copy not in (idle, serving.copy)
    assert (rebuilt.index, rebuilt.side, rebuilt.lookup_shards, rebuilt.total) == (rebuilt.copy, 0, 64, 1600)
    assert rankview.copies_get(r, keys) == [rebuilt.copy, f"{rebuilt.copy}b"]
    assert rankview.copy_meta_load(r, keys, idle) is None and rankview.copy_meta_load(r, keys, serving.copy) is None
    assert not r.exists(*(keys.lookup(serving.index, k, groups=serving.groups) for k in range(16)))
    assert RebuildJob.objects.filter(season=season).count() == 2  # 64 shards hold 1,600 players: nothing outgrown
    expected = db_standings(season)
    # The reader never read this copy: one more round trip, once, and the right answer.
    read = trips.during(lambda: reader.rank("g00007"))
    assert len(read) == 3, read
    assert reader.rank("g00007").entry == expected.entry("g00007")
    assert len(trips.during(lambda: reader.rank("g00011"))) == 2
    assert_reads_exact(season, reader, expected, everyone[::53])

    # The rebuild builds both copies with 64 shards, compares them with the live version
    # and publishes: the reads stay exact through it, each in at most one extra round trip.
    assert rebuild_run(job_id=again.pk).status == RebuildJob.Status.PUBLISHED
    published = current_manifest(season)
    assert (published.copy, published.lookup_shards) == (f"r{again.pk}", 64)
    second = rankview.copy_meta_load(r, keys, f"r{again.pk}b")
    assert second is not None and second.lookup_shards == 64
    expected = db_standings(season)
    assert len(trips.during(lambda: reader.rank("a00003"))) <= 3
    assert len(trips.during(lambda: reader.rank("a00003"))) == 2
    assert_reads_exact(season, reader, expected, everyone[::41])
    scored(season, grown[12:20], "l", seed=11, floor=4000)
    publish(season)  # the second new copy, under its new name
    assert current_manifest(season).copy == f"r{again.pk}b"
    assert len(trips.during(lambda: reader.rank("a00003"))) <= 3
    assert_reads_exact(season, reader, db_standings(season), everyone[::41])
    assert RebuildJob.objects.filter(season=season).count() == 2
    full_check(season)


def test_a_new_season_built_with_few_players_holds_thousands_before_its_shards_are_outgrown(
        season_factory: Callable[..., Season], queued: list[int], settings: Any) -> None:
    """The default minimum: a season's first build, with a handful of players (a demo's
    first second), is sized for the thousands that follow, and asks for no rebuild."""
    settings.VIEW_LOOKUP_SHARDS_MIN = 128
    season = season_factory(slug="shards-new")
    scored(season, list(players("a", 10)), "a", seed=1)
    publish(season)
    assert current_manifest(season).lookup_shards == 128
    scored(season, list(players("b", 5000)), "b", seed=2)
    publish(season)
    grown = current_manifest(season)
    assert (grown.lookup_shards, grown.total) == (128, 5010)
    assert not RebuildJob.objects.filter(season=season).exists() and queued == []
    assert shard_encodings(keys_of(season), grown.copy, 128) == ({compact_encoding()}, 5010)
