"""Ledger partitions in PostgreSQL databases of their own (docs/architecture.md, Ledger
databases): the setting, where a season's partitions live, the write path of a season
split over two databases (event-id claims, per-database atomicity, the season's session
lock), and its change stream.

The database tests need a second database: run them with, for example,
LEDGER_PARTITION_URLS="4-7=postgresql://postgres@127.0.0.1:5432/<db>_ledger_b" (pytest-django
creates its test database; .ci/run does this). Without it they are skipped; the setting's
own tests always run."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import DatabaseError, OperationalError, connection, connections, transaction

from audit.models import AuditEntry
from config.ledger_urls import ledger_databases_parse
from leaderboard.core.partitions import Watermark, partition_of, txid_partition
from leaderboard.ingest import ledger_store
from leaderboard.ingest.selectors import (
    score_changes_after,
    stream_committed_watermark,
    stream_last_watermark,
)
from leaderboard.ledger_databases import (
    DEFAULT_ALIAS,
    LedgerDatabaseMissing,
    LedgerWriteNested,
    ledger_alias,
    ledger_alias_of_player,
    ledger_aliases,
    ledger_databases_check,
    ledger_placement_cache_clear,
    ledger_placement_for,
    season_ledger_is_split,
)
from leaderboard.models import (
    LateResult,
    LedgerEventClaim,
    PlayerScore,
    ScoreChange,
    ScoreEvent,
    ScoreEventConflict,
    StreamHead,
)
from seasons.models import Season
from seasons.services import SeasonError, season_repartition, season_seal_ingest
from tests.support import (
    TEST_ACTOR,
    Events,
    Profiles,
    audit_action_failing,
    board_read,
    db_scores,
    in_season,
    ledger_rows,
    materialize,
    post_ok,
    reader_of,
)
from tests.test_partitions import apply, statuses_of
from tests.test_partitions import players_in as partitioned_players

PG = {"ENGINE": "django.db.backends.postgresql", "NAME": "lb", "CONN_MAX_AGE": 0, "OPTIONS": {"pool": {"x": 1}}}
URL_B = "postgresql://postgres@127.0.0.1:5432/lb_ledger_b"


# --- the setting -------------------------------------------------------------------------


def test_unset_adds_no_database_and_places_nothing() -> None:
    assert ledger_databases_parse("", default=PG, max_partitions=64) == ({}, {})
    assert ledger_databases_parse("  ", default={"ENGINE": "django.db.backends.sqlite3"}, max_partitions=64) == (
        {}, {})


def test_ranges_and_single_partitions_map_to_one_alias_per_database() -> None:
    databases, placement = ledger_databases_parse(
        f"4-5={URL_B}, 7={URL_B} 6=postgresql://h2/lb_ledger_c", default=PG, max_partitions=64)
    assert placement == {4: "ledger_lb_ledger_b", 5: "ledger_lb_ledger_b", 7: "ledger_lb_ledger_b",
                         6: "ledger_lb_ledger_c"}
    b = databases["ledger_lb_ledger_b"]
    assert (b["NAME"], b["ENGINE"], b["CONN_MAX_AGE"], b["OPTIONS"]) == (
        "lb_ledger_b", PG["ENGINE"], 0, {"pool": {"x": 1}})
    assert databases["ledger_lb_ledger_c"]["HOST"] == "h2"


@pytest.mark.parametrize(("text", "default", "says"), [
    (f"4-7={URL_B}", {"ENGINE": "django.db.backends.sqlite3", "NAME": "x"}, "PostgreSQL as the default"),
    (f"4-7={URL_B} 6-8={URL_B}", PG, "named twice"),
    (f"60-64={URL_B}", PG, "within 0..63"),
    (f"5-4={URL_B}", PG, "not a range"),
    ("4=sqlite:///x.db", PG, "not a PostgreSQL URL"),
    (f"4={URL_B} 5=postgresql://other-host/lb_ledger_b", PG, "two URLs name a database 'lb_ledger_b'"),
    ("4=postgresql://h/lb", {**PG, "HOST": "h"}, "the default database itself"),
    (f"4:{URL_B}", PG, "is not P=URL"),
])
def test_a_bad_setting_stops_the_settings_with_a_clear_message(text: str, default: dict[str, Any],
                                                               says: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=says):
        ledger_databases_parse(text, default=default, max_partitions=64)


def test_a_ledger_database_named_like_default_on_another_server_is_accepted() -> None:
    databases, _ = ledger_databases_parse("4-7=postgresql://other-host/lb", default={**PG, "HOST": "h"},
                                          max_partitions=64)
    assert databases["ledger_lb"]["HOST"] == "other-host"


def test_a_new_season_is_placed_by_the_setting_and_all_default_is_the_empty_list(settings: Any) -> None:
    settings.LEDGER_PARTITION_ALIASES = {}
    assert ledger_placement_for(partitions=8) == []
    settings.LEDGER_PARTITION_ALIASES = {2: "ledger_x", 3: "ledger_x"}
    assert ledger_placement_for(partitions=4) == ["default", "default", "ledger_x", "ledger_x"]
    assert ledger_placement_for(partitions=2) == []


@pytest.mark.django_db
def test_without_the_setting_a_season_records_no_placement_and_writes_no_claims(
        season_factory: Callable[..., Season], settings: Any) -> None:
    settings.LEDGER_PARTITION_ALIASES = {}
    season = season_factory(slug="plain", partitions=8)
    assert season.ledger_databases == []
    assert ledger_aliases(season=season) == {DEFAULT_ALIAS: list(range(8))}
    assert not season_ledger_is_split(season=season)
    ev = Events("plain")
    apply(season, [ev.result(f"p{i}", 10 + i) for i in range(20)])
    assert LedgerEventClaim.objects.count() == 0
    assert ScoreEvent.objects.filter(season=season).count() == 20


# --- a season over two databases -----------------------------------------------------------

needs_ledger_b = pytest.mark.skipif(
    not settings.LEDGER_PARTITION_ALIASES,
    reason="needs a second ledger database: LEDGER_PARTITION_URLS=\"4-7=postgresql://.../<db>_ledger_b\"")


def ledger_b() -> str:
    return sorted(set(settings.LEDGER_PARTITION_ALIASES.values()))[0]


def split_partitions() -> tuple[int, int]:
    """A partition of an 8-partition season in "default", and one in the ledger database."""
    placed = settings.LEDGER_PARTITION_ALIASES
    return min(p for p in range(8) if p not in placed), min(p for p in range(8) if p in placed)


def players_in(partition: int, count: int, prefix: str) -> list[str]:
    return partitioned_players(8, partition, count, prefix)


def rows_per_database(model: type[Any], season: Season) -> dict[str, int]:
    return {alias: model.objects.using(alias).filter(season_id=season.pk).count()
            for alias in (DEFAULT_ALIAS, ledger_b())}


@pytest.fixture
def split_season(season_factory: Callable[..., Season]) -> Iterator[Season]:
    ledger_placement_cache_clear()
    yield season_factory(slug=f"split-{time.monotonic_ns()}", partitions=8)
    ledger_placement_cache_clear()


@needs_ledger_b
@pytest.mark.django_db(databases="__all__")
def test_a_season_records_where_its_partitions_live_and_keeps_it(split_season: Season, settings: Any) -> None:
    b = ledger_b()
    expected = [settings.LEDGER_PARTITION_ALIASES.get(p, DEFAULT_ALIAS) for p in range(8)]
    assert split_season.ledger_databases == expected
    assert season_ledger_is_split(season=split_season)
    assert ledger_aliases(season=split_season) == {
        DEFAULT_ALIAS: [p for p in range(8) if expected[p] == DEFAULT_ALIAS],
        b: [p for p in range(8) if expected[p] == b]}
    home, away = split_partitions()
    assert ledger_alias(season=split_season, partition=away) == b
    assert ledger_alias_of_player(season=split_season, player_id=players_in(home, 1, "x")[0]) == DEFAULT_ALIAS
    # A later setting changes new seasons only.
    settings.LEDGER_PARTITION_ALIASES = {}
    split_season.refresh_from_db()
    assert split_season.ledger_databases == expected
    with pytest.raises(SeasonError, match="split over ledger databases cannot be repartitioned"):
        season_repartition(season=split_season, partitions=4, actor=TEST_ACTOR)


@needs_ledger_b
@pytest.mark.django_db(databases="__all__")
def test_a_season_in_one_ledger_database_repartitions_there(season_factory: Callable[..., Season]) -> None:
    season = season_factory(slug="all-b", partitions=2)
    Season.objects.filter(pk=season.pk).update(ledger_databases=[ledger_b()] * 2)
    season.refresh_from_db()
    ledger_placement_cache_clear()
    season = season_repartition(season=season, partitions=3, actor=TEST_ACTOR)
    assert season.ledger_databases == [ledger_b()] * 5
    ev = Events("allb")
    assert statuses_of(apply(season, [ev.result(f"q{i}", i + 1) for i in range(12)])) == ["applied"] * 12
    assert rows_per_database(ScoreEvent, season) == {DEFAULT_ALIAS: 0, ledger_b(): 12}
    assert LedgerEventClaim.objects.filter(season=season).count() == 0
    assert len(score_changes_after(season_id=season.pk, cursor=Watermark())) == 12


@needs_ledger_b
@pytest.mark.django_db(databases="__all__")
def test_a_season_naming_an_unconfigured_database_answers_503_and_fails_the_check(
        season_factory: Callable[..., Season], post_scores: Callable[..., Any]) -> None:
    season = season_factory(slug="lost", partitions=2)
    Season.objects.filter(pk=season.pk).update(ledger_databases=["default", "ledger_gone"])
    ledger_placement_cache_clear()
    response = post_scores("lost", {"events": [Events("lost").result(f"g{i}", 5) for i in range(6)]})
    assert response.status_code == 503, response.content
    assert response.json()["error"] == "ledger_database_missing"
    assert response.json()["database"] == "ledger_gone"
    assert response["Retry-After"]
    errors = ledger_databases_check(databases=[DEFAULT_ALIAS])
    assert [e.id for e in errors] == ["leaderboard.E001"]
    assert "ledger_gone" in errors[0].msg
    with pytest.raises(LedgerDatabaseMissing):
        stream_committed_watermark(season_id=season.pk)
    ledger_placement_cache_clear()


@needs_ledger_b
@pytest.mark.django_db(databases="__all__")
def test_events_land_in_their_partitions_database_and_a_spanning_batch_applies_whole(
        split_season: Season, post_scores: Callable[..., Any]) -> None:
    home, away = split_partitions()
    here, there = players_in(home, 3, "h"), players_in(away, 3, "t")
    ev = Events("span")
    batch = [ev.result(p, 100 + i) for i, p in enumerate([*here, *there])]
    results = post_ok(post_scores, split_season, batch)
    assert [r["status"] for r in results] == ["applied"] * 6
    assert [r["event_id"] for r in results] == [e["event_id"] for e in batch]
    for model in (ScoreEvent, PlayerScore, ScoreChange):
        assert rows_per_database(model, split_season) == {DEFAULT_ALIAS: 3, ledger_b(): 3}, model
    assert set(PlayerScore.objects.using(ledger_b()).values_list("player_id", flat=True)) == set(there)
    assert {txid_partition(t) for t in ScoreChange.objects.using(ledger_b()).values_list("txid", flat=True)} == {away}
    assert set(StreamHead.objects.using(ledger_b()).filter(season_id=split_season.pk).values_list(
        "partition", flat=True)) == {away}
    claims = dict(LedgerEventClaim.objects.filter(season=split_season).values_list("event_id", "partition"))
    assert claims == {e["event_id"]: partition_of(e["player_id"], 8) for e in batch}
    assert LedgerEventClaim.objects.using(ledger_b()).count() == 0
    assert db_scores(split_season) == {p: 100 + i for i, p in enumerate([*here, *there])}
    # The whole batch again: every event a duplicate of its first outcome, nothing written twice.
    again = post_ok(post_scores, split_season, batch)
    assert [(r["status"], r["first_status"]) for r in again] == [("duplicate", "applied")] * 6
    assert rows_per_database(ScoreEvent, split_season) == {DEFAULT_ALIAS: 3, ledger_b(): 3}


@needs_ledger_b
@pytest.mark.django_db(databases="__all__")
def test_an_event_id_reused_for_a_player_in_the_other_database_is_a_conflict(split_season: Season) -> None:
    home, away = split_partitions()
    (here,), (there,) = players_in(home, 1, "h"), players_in(away, 1, "t")
    ev = Events("reuse")
    first = ev.result(here, 50)
    assert statuses_of(apply(split_season, [first])) == ["applied"]
    reused = {**ev.result(there, 60), "event_id": first["event_id"]}
    same_batch = {**ev.result(there, 70), "event_id": "fresh-1"}
    twice = {**ev.result(here, 80), "event_id": "fresh-1"}
    result = apply(split_season, [reused, same_batch, twice])
    assert statuses_of(result) == ["conflict", "applied", "conflict"]
    assert ScoreEvent.objects.using(ledger_b()).filter(event_id=first["event_id"]).count() == 0
    assert ScoreEventConflict.objects.using(DEFAULT_ALIAS).filter(event_id=first["event_id"]).count() == 1
    assert ScoreEventConflict.objects.using(ledger_b()).filter(event_id="fresh-1").count() == 1
    assert db_scores(split_season) == {here: 50, there: 70}


@needs_ledger_b
@pytest.mark.django_db(transaction=True, databases="__all__")
def test_a_part_failing_after_the_claims_answers_503_and_the_resend_is_exactly_once(
        split_season: Season, post_scores: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    home, away = split_partitions()
    here, there = players_in(home, 2, "h"), players_in(away, 2, "t")
    ev = Events("crash")
    batch = [ev.result(p, 10 * (i + 1)) for i, p in enumerate([here[0], there[0], here[1], there[1]])]
    write = ledger_store.batch_plan_write

    def b_down(**kwargs: Any) -> None:
        if kwargs["using"] == ledger_b():
            raise OperationalError("the ledger database went away")
        write(**kwargs)

    monkeypatch.setattr(ledger_store, "batch_plan_write", b_down)
    response = post_scores(split_season.slug, {"events": batch})
    assert response.status_code == 503, response.content
    assert response["Retry-After"]
    # The claims were committed first, then default's part; the other database's failed.
    assert LedgerEventClaim.objects.filter(season=split_season).count() == 4
    assert rows_per_database(ScoreEvent, split_season) == {DEFAULT_ALIAS: 2, ledger_b(): 0}
    monkeypatch.setattr(ledger_store, "batch_plan_write", write)
    results = post_ok(post_scores, split_season, batch)
    assert [(r["status"], r.get("first_status")) for r in results] == [
        ("duplicate", "applied"), ("applied", None), ("duplicate", "applied"), ("applied", None)]
    assert rows_per_database(ScoreEvent, split_season) == {DEFAULT_ALIAS: 2, ledger_b(): 2}
    assert rows_per_database(ScoreChange, split_season) == {DEFAULT_ALIAS: 2, ledger_b(): 2}
    assert db_scores(split_season) == {here[0]: 10, there[0]: 20, here[1]: 30, there[1]: 40}
    # The season's session lock was released after the failure: a season-wide write runs now.
    with transaction.atomic():
        ledger_store.season_write_lock(season_id=split_season.pk)


def held_in(alias: str, monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Batches writing their part in `alias` from a thread marked `held` stop inside it
    (partition locks taken, nothing committed) until released: (reached, release)."""
    reached, release = threading.Event(), threading.Event()
    write = ledger_store.batch_plan_write

    def paused(**kwargs: Any) -> None:
        if kwargs["using"] == alias and getattr(threading.current_thread(), "held", False):
            reached.set()
            assert release.wait(20)
        write(**kwargs)

    monkeypatch.setattr(ledger_store, "batch_plan_write", paused)
    return reached, release


def in_thread(fn: Callable[[], Any], *, held: bool = False) -> Any:
    def run() -> Any:
        threading.current_thread().held = held  # type: ignore[attr-defined]
        try:
            return fn()
        finally:
            threading.current_thread().held = False  # type: ignore[attr-defined]
            for alias in connections:
                connections[alias].close()

    return ThreadPoolExecutor(1).submit(run)


@needs_ledger_b
@pytest.mark.django_db(transaction=True, databases="__all__")
def test_a_season_wide_write_cannot_run_between_the_parts_commits(
        split_season: Season, monkeypatch: pytest.MonkeyPatch) -> None:
    home, away = split_partitions()
    (here,), (there,) = players_in(home, 1, "h"), players_in(away, 1, "t")
    ev = Events("seal")
    reached, release = held_in(ledger_b(), monkeypatch)
    batch = in_thread(lambda: apply(split_season, [ev.result(here, 1), ev.result(there, 2)]), held=True)
    assert reached.wait(10)
    # Default's part is committed, the other database's is not: the window a seal must not enter.
    assert ScoreEvent.objects.filter(season=split_season).count() == 1

    def seal_lock() -> float:
        with transaction.atomic():
            ledger_store.season_write_lock(season_id=split_season.pk)
            return time.monotonic()

    seal = in_thread(seal_lock)
    time.sleep(0.5)
    assert not seal.done(), "a season-wide write ran between a split batch's commits"
    released_at = time.monotonic()
    release.set()
    assert statuses_of(batch.result(timeout=20)) == ["applied", "applied"]
    assert seal.result(timeout=20) >= released_at
    assert rows_per_database(ScoreEvent, split_season) == {DEFAULT_ALIAS: 1, ledger_b(): 1}


@needs_ledger_b
@pytest.mark.django_db(transaction=True, databases="__all__")
def test_writers_on_disjoint_databases_hold_their_locks_at_the_same_time(
        split_season: Season, monkeypatch: pytest.MonkeyPatch) -> None:
    home, away = split_partitions()
    (here,), (there,) = players_in(home, 1, "h"), players_in(away, 1, "t")
    (same,) = players_in(home, 1, "s")
    ev = Events("disjoint")
    reached, release = held_in(DEFAULT_ALIAS, monkeypatch)
    held = in_thread(lambda: apply(split_season, [ev.result(here, 1)]), held=True)
    try:
        assert reached.wait(10)
        # The other database's partition is free: that batch commits while default's is held.
        other = in_thread(lambda: apply(split_season, [ev.result(there, 2)]))
        assert statuses_of(other.result(timeout=10)) == ["applied"]
        waiting = in_thread(lambda: apply(split_season, [ev.result(same, 3)]))
        time.sleep(0.5)
        assert not waiting.done(), "a batch on a held partition did not wait for its lock"
    finally:
        release.set()
    assert statuses_of(held.result(timeout=20)) == ["applied"]
    assert statuses_of(waiting.result(timeout=20)) == ["applied"]
    assert db_scores(split_season) == {here: 1, there: 2, same: 3}


@needs_ledger_b
@pytest.mark.django_db(transaction=True, databases="__all__")
def test_the_same_new_event_id_from_two_writers_in_two_databases_is_recorded_once(
        split_season: Season) -> None:
    home, away = split_partitions()
    ev = Events("race")
    for round_ in range(6):
        (here,), (there,) = players_in(home, 1, f"h{round_}-"), players_in(away, 1, f"t{round_}-")
        event_id = f"race-{round_}"
        start = threading.Barrier(2)

        def write(player: str, score: int, event_id: str = event_id, start: threading.Barrier = start) -> str:
            start.wait(5)
            return statuses_of(apply(split_season, [{**ev.result(player, score), "event_id": event_id}]))[0]

        a = in_thread(lambda here=here: write(here, 1))  # type: ignore[misc]
        b = in_thread(lambda there=there: write(there, 2))  # type: ignore[misc]
        outcomes = sorted([a.result(timeout=20), b.result(timeout=20)])
        assert outcomes == ["applied", "conflict"], outcomes
        recorded = sum(ScoreEvent.objects.using(alias).filter(event_id=event_id).count()
                       for alias in (DEFAULT_ALIAS, ledger_b()))
        assert recorded == 1


@needs_ledger_b
@pytest.mark.django_db(databases="__all__")
def test_profile_regions_reach_players_in_both_databases(season_factory: Callable[..., Season]) -> None:
    """A new player takes the profile's region (profiles live in "default", the player's
    score in its partition's database); a region change moves each player in their own
    database, with a change-stream row there."""
    season = season_factory(slug="regions-split", partitions=8, regions=["eu", "na"])
    home, away = split_partitions()
    (here,), (there,) = players_in(home, 1, "rh"), players_in(away, 1, "rt")
    profiles = Profiles()
    profiles.set(**{here: "eu", there: "na"})
    ev = Events("regions")
    assert statuses_of(apply(season, [ev.result(here, 10), ev.result(there, 20)])) == ["applied", "applied"]
    regions = dict(ledger_rows(PlayerScore, season, "player_id", "region"))
    assert regions == {here: "eu", there: "na"}
    profiles.set(**{here: "na", there: "eu"})
    assert PlayerScore.objects.using(ledger_b()).get(season_id=season.pk, player_id=there).region == "eu"
    assert PlayerScore.objects.get(season_id=season.pk, player_id=here).region == "na"
    moves = {alias: list(ScoreChange.objects.using(alias).filter(
        season_id=season.pk, event_id__startswith="region:").values_list("player_id", "old_region", "region"))
        for alias in (DEFAULT_ALIAS, ledger_b())}
    assert moves == {DEFAULT_ALIAS: [(here, "eu", "na")], ledger_b(): [(there, "na", "eu")]}


@needs_ledger_b
@pytest.mark.django_db(databases="__all__")
def test_late_results_and_held_corrections_queue_beside_their_ledger_rows(
        season_factory: Callable[..., Season]) -> None:
    """After the seal, a late result and a held correction are recorded in their
    partition's database with their late-result rows (one FK, same database); the seal's
    audit row stays in "default"."""
    cutoff = datetime.now(UTC) - timedelta(minutes=5)
    season = season_factory(slug=f"late-{time.monotonic_ns()}", starts_at=cutoff - timedelta(days=10), cutoff=cutoff,
                            partitions=8)
    assert season.state == "CLOSING" and season_ledger_is_split(season=season)
    ledger_placement_cache_clear()
    home, away = split_partitions()
    (here,), (there,) = players_in(home, 1, "lh"), players_in(away, 1, "lt")
    ev = Events("late", completed_at=in_season(season))
    assert statuses_of(apply(season, [ev.result(here, 10), ev.result(there, 20)])) == ["applied", "applied"]
    season = season_seal_ingest(season=season, actor=TEST_ACTOR)
    late = apply(season, [ev.result(there, 30), ev.correction(here, 5)])
    assert [(o.status, o.reason) for o in late.outcomes] == [
        ("rejected", "late_after_seal"), ("held", "correction_after_seal")]
    queued = {alias: list(LateResult.objects.using(alias).filter(season_id=season.pk).values_list(
        "player_id", "ledger_event__event_id")) for alias in (DEFAULT_ALIAS, ledger_b())}
    assert queued == {DEFAULT_ALIAS: [(here, ev.sent[-1]["event_id"])], ledger_b(): [(there, ev.sent[-2]["event_id"])]}
    assert db_scores(season) == {here: 10, there: 20}
    assert AuditEntry.objects.filter(season_slug=season.slug, action__contains="seal").exists()


# --- the change stream and an epoch over both databases ------------------------------------


@needs_ledger_b
@pytest.mark.django_db(transaction=True, databases="__all__")
@pytest.mark.usefixtures("rank_views")
def test_the_stream_reads_each_partition_from_its_database_and_an_epoch_publishes_both(
        split_season: Season) -> None:
    ev = Events("stream")
    players = [f"s{i}" for i in range(40)]
    apply(split_season, [ev.result(p, 1000 + i) for i, p in enumerate(players)])
    per_db = rows_per_database(ScoreChange, split_season)
    assert per_db[DEFAULT_ALIAS] > 0 and per_db[ledger_b()] > 0 and sum(per_db.values()) == 40
    changes = score_changes_after(season_id=split_season.pk, cursor=Watermark())
    assert sorted(c.player_id for c in changes) == sorted(players)
    # Each partition's changes in its own order, partitions ascending.
    parts = [txid_partition(c.cursor.txid) for c in changes]
    assert parts == sorted(parts)
    committed, last = stream_committed_watermark(season_id=split_season.pk), stream_last_watermark(
        season_id=split_season.pk)
    assert last <= committed
    assert {p for p in range(8) if last.cursor(p)[1] > 0} == {txid_partition(c.cursor.txid) for c in changes}
    # A page that stops inside one database and goes on in the next.
    page = score_changes_after(season_id=split_season.pk, cursor=Watermark(), limit=25)
    rest = score_changes_after(season_id=split_season.pk, cursor=Watermark().advanced(
        [(c.cursor.txid, c.cursor.id) for c in page]))
    assert [c.player_id for c in [*page, *rest]] == [c.player_id for c in changes]
    materialize(split_season)
    _, board = board_read(reader_of(split_season))
    assert {e.player_id: e.score for e in board} == {p: 1000 + i for i, p in enumerate(players)}


@needs_ledger_b
@pytest.mark.django_db(databases="__all__")
def test_the_ledger_database_runs_the_same_migrations(capsys: pytest.CaptureFixture[str]) -> None:
    """The partition database has every ledger table, and `migrate --database` finds
    nothing left to do."""
    with connections[ledger_b()].cursor() as cursor:
        tables = connections[ledger_b()].introspection.table_names(cursor)
    assert {"leaderboard_scoreevent", "leaderboard_playerscore", "leaderboard_scorechange",
            "leaderboard_streamhead", "leaderboard_lateresult", "leaderboard_scoreeventconflict"} <= set(tables)
    call_command("migrate", database=ledger_b(), verbosity=1, interactive=False)
    assert "No migrations to apply" in capsys.readouterr().out


@pytest.mark.django_db(transaction=True)
def test_a_session_lock_whose_release_fails_goes_with_its_session_not_into_the_pool() -> None:
    """An unlock that fails on a live session (here: its transaction aborted) ends that
    session, and the season's lock with it: a pooled connection handed back to the pool
    would keep the lock, and every seal of the season would wait for it. The error the
    caller met is the one raised, and the next query gets a working connection."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's session locks")
    import psycopg

    season_id = 987654
    with pytest.raises(DatabaseError, match="division by zero"):  # noqa: SIM117 - the order matters
        with transaction.atomic():
            with ledger_store.season_lock_shared_hold(season_id=season_id), connection.cursor() as cursor:
                cursor.execute("SELECT 1/0")
    s = connection.settings_dict
    with psycopg.connect(dbname=s["NAME"], user=s["USER"], host=s["HOST"], port=s["PORT"] or 5432,
                         autocommit=True) as other:
        held = other.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s "
                             "AND objid = %s", [ledger_store._SEASON_LOCK, season_id]).fetchone()
        assert held == (0,)
    with transaction.atomic():
        ledger_store.season_write_lock(season_id=season_id)


# --- writes that must not nest, and what a resend repairs -----------------------------------


@needs_ledger_b
@pytest.mark.django_db(transaction=True, databases="__all__")
def test_a_split_seasons_write_inside_a_transaction_is_refused_before_anything_is_written(
        split_season: Season) -> None:
    """Its other database would commit at once while the outer transaction could still roll
    back the claims: the event would be recorded without its claim."""
    _, away = split_partitions()
    (there,) = players_in(away, 1, "t")
    event = Events("nest").result(there, 50)
    with pytest.raises(LedgerWriteNested), transaction.atomic():
        apply(split_season, [event])
    with pytest.raises(LedgerWriteNested), transaction.atomic(using=ledger_b()):
        apply(split_season, [event])
    assert rows_per_database(ScoreEvent, split_season) == {DEFAULT_ALIAS: 0, ledger_b(): 0}
    assert not LedgerEventClaim.objects.filter(season=split_season).exists()
    assert statuses_of(apply(split_season, [event])) == ["applied"]


@needs_ledger_b
@pytest.mark.django_db(transaction=True, databases="__all__")
def test_a_revocation_approval_interrupted_after_the_ledger_write_completes_when_approved_again(
        split_season: Season) -> None:
    """The ledger write commits in the other database on its own: the approval records its
    attempt first and its outcome after. Interrupted in between, the revocation stays
    proposed with the attempt pending (nothing may rebase or reject it); approved again,
    the same event is `duplicate` of an applied one and the approval completes, audited."""
    from seasons.models import ScoreRevocation
    from seasons.staff import common
    from seasons.staff.revocations import services as revocations
    from tests.support.lifecycle import staff

    _, away = split_partitions()
    (there,) = players_in(away, 1, "t")
    assert statuses_of(apply(split_season, [Events("rv").result(there, 100)])) == ["applied"]
    revocation = revocations.score_revocation_propose(season=split_season, player_id=there, new_score=7,
                                                      reason="cheat", actor=staff())
    approver = staff()
    with audit_action_failing("revocation.approved"), pytest.raises(OperationalError):
        revocations.score_revocation_approve(revocation=revocation, actor=approver)
    revocation.refresh_from_db()
    assert (revocation.status, revocation.attempts, revocation.last_outcome) == ("proposed", 1, "pending")
    assert db_scores(split_season)[there] == 7
    for refused in (lambda: revocations.score_revocation_reject(revocation=revocation, actor=approver,
                                                                reason="no"),
                    lambda: revocations.score_revocation_rebase(revocation=revocation, actor=approver)):
        with pytest.raises(common.StaffError, match="interrupted"):
            refused()
    result = revocations.score_revocation_approve(revocation=revocation, actor=approver)
    assert (result.status, result.revocation.status) == ("applied", "applied"), result.detail
    assert result.revocation.event_id == f"staff-revocation-{revocation.pk}-1"
    assert AuditEntry.objects.filter(action="revocation.approved", target_id=str(revocation.pk)).count() == 1
    assert ScoreEvent.objects.using(ledger_b()).filter(season_id=split_season.pk,
                                                       match_id=f"staff-revocation-{revocation.pk}").count() == 1
    assert db_scores(split_season)[there] == 7
    assert ScoreRevocation.objects.get(pk=revocation.pk).last_outcome == "applied"


def staff_apply(season: Season, event: dict[str, Any], actor: Any) -> Any:
    """A correction staff approved, applied as the revocation flow applies it."""
    from leaderboard.core.events import events_parse
    from leaderboard.ingest.services import score_events_apply

    return score_events_apply(season=season, events=events_parse({"events": [event]}), client=None, actor=actor)


def final_season_split(season_factory: Callable[..., Season], slug: str) -> tuple[Season, Events, str]:
    """A FINAL season with a player in each database; returns the one in the other database."""
    from tests.support.lifecycle import finalize

    cutoff = datetime.now(UTC) - timedelta(minutes=5)
    season = season_factory(slug=f"{slug}-{time.monotonic_ns()}", starts_at=cutoff - timedelta(days=10),
                            cutoff=cutoff, partitions=8)
    ledger_placement_cache_clear()
    home, away = split_partitions()
    (here,), (there,) = players_in(home, 1, "fh"), players_in(away, 1, "ft")
    ev = Events(slug, completed_at=in_season(season))
    assert statuses_of(apply(season, [ev.result(here, 10), ev.result(there, 20)])) == ["applied", "applied"]
    season = finalize(season)
    assert season.state == "FINAL"
    return season, ev, there


def default_commits_after(then: Callable[[], None]) -> Callable[..., contextlib.AbstractContextManager[None]]:
    """services.ledger_atomic, with `then` run between the other database's commit and "default"'s."""
    from leaderboard.ledger_databases import ledger_atomic

    @contextlib.contextmanager
    def atomic(*, aliases: Any, statement_timeout: float | None = None) -> Iterator[None]:
        with ledger_atomic(aliases=[a for a in aliases if a == DEFAULT_ALIAS], statement_timeout=statement_timeout):
            with ledger_atomic(aliases=[a for a in aliases if a != DEFAULT_ALIAS],
                               statement_timeout=statement_timeout):
                yield
            then()
    return atomic


@needs_ledger_b
@pytest.mark.django_db(transaction=True, databases="__all__")
@pytest.mark.usefixtures("rank_views")
def test_a_final_correction_lost_with_defaults_commit_is_listed_when_the_correction_is_resent(
        season_factory: Callable[..., Season], monkeypatch: pytest.MonkeyPatch) -> None:
    """A staff correction to a FINAL season, for a player in the other database: that
    database commits first, "default" (the FinalCorrection and its audit row) after. When
    "default"'s commit fails, the resend finds the event applied (`duplicate`) and writes
    what was lost, once."""
    from leaderboard.ingest import services
    from leaderboard.ledger_databases import ledger_atomic
    from seasons.models import FinalCorrection
    from tests.support.lifecycle import staff

    season, ev, there = final_season_split(season_factory, "fc")

    def default_commit_fails() -> None:
        raise OperationalError("server closed the connection unexpectedly")  # as at default's COMMIT

    correction = ev.correction(there, 5)
    approver = staff()
    monkeypatch.setattr(services, "ledger_atomic", default_commits_after(default_commit_fails))
    with pytest.raises(OperationalError):
        staff_apply(season, correction, approver)
    monkeypatch.setattr(services, "ledger_atomic", ledger_atomic)
    assert db_scores(season)[there] == 5
    assert not FinalCorrection.objects.filter(season=season).exists()
    for _ in range(2):
        [outcome] = staff_apply(season, correction, approver).outcomes
        assert (outcome.status, outcome.first_status) == ("duplicate", "applied")
    assert list(FinalCorrection.objects.filter(season=season).values_list(
        "player_id", "score_before", "score_after", "event_id")) == [(there, 20, 5, correction["event_id"])]
    assert AuditEntry.objects.filter(season_slug=season.slug, action="season.final.correction").count() == 1


@needs_ledger_b
@pytest.mark.django_db(transaction=True, databases="__all__")
def test_a_profile_write_failing_after_the_other_databases_moves_is_repaired_by_its_resend(
        season_factory: Callable[..., Season], monkeypatch: pytest.MonkeyPatch) -> None:
    """The players in the other database move in a transaction there, committed before the
    profile's in "default": when the profile's then fails they stay moved with the old
    profile; the same write sent again is applied and moves nobody twice."""
    from leaderboard import profiles as profile_services
    from leaderboard.core.profiles import ProfileWrite

    season = season_factory(slug=f"regions-fail-{time.monotonic_ns()}", partitions=8, regions=["eu", "na"])
    ledger_placement_cache_clear()
    home, away = split_partitions()
    (here,), (there,) = players_in(home, 1, "fh"), players_in(away, 1, "ft")
    Profiles().set(**{here: "eu", there: "eu"})
    assert statuses_of(apply(season, [Events("rf").result(here, 10), Events("rf2").result(there, 20)])) == [
        "applied", "applied"]
    writes = [ProfileWrite(player_id=p, region="na", profile_version=2) for p in (here, there)]
    follow = profile_services._seasons_follow

    def then_default_fails(**kwargs: Any) -> None:
        follow(**kwargs)
        raise OperationalError("server closed the connection unexpectedly")  # as at default's COMMIT

    monkeypatch.setattr(profile_services, "_seasons_follow", then_default_fails)
    with pytest.raises(OperationalError):
        profile_services.player_profiles_apply(profiles=writes, client=None)
    monkeypatch.setattr(profile_services, "_seasons_follow", follow)
    assert dict(ledger_rows(PlayerScore, season, "player_id", "region")) == {here: "eu", there: "na"}

    def moves() -> list[tuple[str, str, str]]:
        return sorted(row for alias in (DEFAULT_ALIAS, ledger_b()) for row in ScoreChange.objects.using(alias).filter(
            season_id=season.pk, event_id__startswith="region:").values_list("player_id", "old_region", "region"))

    assert moves() == [(there, "eu", "na")]
    outcomes = profile_services.player_profiles_apply(profiles=writes, client=None)
    assert [o.status for o in outcomes] == ["applied", "applied"]
    assert dict(ledger_rows(PlayerScore, season, "player_id", "region")) == {here: "na", there: "na"}
    assert moves() == sorted([(here, "eu", "na"), (there, "eu", "na")])


@needs_ledger_b
@pytest.mark.django_db(transaction=True, databases="__all__")
@pytest.mark.usefixtures("rank_views")
def test_a_staff_correction_sent_twice_at_once_is_listed_once(season_factory: Callable[..., Season],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The second sending sees the event recorded in the partition's database before the
    first one's FinalCorrection commits in "default"; it must wait for it, not list it again."""
    from leaderboard.ingest import services
    from seasons.models import FinalCorrection
    from tests.support.lifecycle import staff

    season, ev, there = final_season_split(season_factory, "fcr")
    partition_committed = threading.Event()

    def slow_default_commit() -> None:
        if threading.current_thread().name == "first":
            partition_committed.set()
            time.sleep(2.0)  # "default" commits a little later (load, network)

    monkeypatch.setattr(services, "ledger_atomic", default_commits_after(slow_default_commit))
    correction = ev.correction(there, 5)

    def first_sending() -> None:
        try:
            staff_apply(season, correction, staff())
        finally:
            for c in connections.all():
                c.close()

    first = threading.Thread(target=first_sending, name="first")
    first.start()
    assert partition_committed.wait(20)
    staff_apply(season, correction, staff())
    first.join()
    assert db_scores(season)[there] == 5
    assert FinalCorrection.objects.filter(season=season).count() == 1
    assert AuditEntry.objects.filter(season_slug=season.slug, action="season.final.correction").count() == 1
