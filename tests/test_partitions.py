"""Partitioned ingest (docs/architecture.md, Partitions): per-partition write locks and
commit numbers, vector watermarks, the cross-partition event-id race, repartitioning an
open season, and a partitioned season's FINAL against the same events unpartitioned."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.db import connection, connections, transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leaderboard.core.events import events_parse
from leaderboard.core.partitions import TXID_PARTITION_SHIFT, Watermark, partition_of, txid_partition
from leaderboard.ingest import ledger_store
from leaderboard.ingest.selectors import score_change_heads_after
from leaderboard.ingest.services import ApplyResult, score_events_apply
from leaderboard.ledger_databases import season_ledger_is_split
from leaderboard.models import ScoreChange, ScoreEventConflict, StreamHead
from seasons.models import Season
from seasons.services import SeasonError, season_repartition
from tests.conftest import SEASON_CUTOFF, SEASON_START
from tests.support import (
    TEST_ACTOR,
    Events,
    apply_events,
    assert_matches_ledger,
    closing_season,
    db_scores,
    final_rows,
    finalize,
    ledger_rows,
    materialize,
)
from tests.support.reference import Script, as_json, event_scripts, reference_run, season_rejection

pytestmark = [pytest.mark.postgres]


def players_in(partitions: int, partition: int, count: int, prefix: str = "p") -> list[str]:
    """`count` player ids that fall in `partition` of a layout of `partitions`."""
    found: list[str] = []
    i = 0
    while len(found) < count:
        player = f"{prefix}{i}"
        if partition_of(player, partitions) == partition:
            found.append(player)
        i += 1
    return found


def connections_close() -> None:
    """A thread's connections back (to the pool): every database's, the ledger databases' too."""
    for conn in connections.all(initialized_only=True):
        conn.close()


def apply(season: Season, events: list[dict[str, Any]]) -> ApplyResult:
    return score_events_apply(season=season, events=events_parse({"events": events}), client=None)


def statuses_of(result: ApplyResult) -> list[str]:
    return [o.status for o in result.outcomes]


class HeldBatch:
    """A batch applied in a thread inside a transaction kept open until `release()`."""

    def __init__(self, season: Season, events: list[dict[str, Any]], *, commit: bool = True):
        self.applied = threading.Event()
        self._release = threading.Event()
        self.result: ApplyResult | None = None
        self.error: BaseException | None = None
        self._commit = commit
        self._thread = threading.Thread(target=self._run, args=(season, events), daemon=True)
        self._thread.start()
        assert self.applied.wait(10), "the held batch never applied"

    def _run(self, season: Season, events: list[dict[str, Any]]) -> None:
        try:
            with transaction.atomic():
                self.result = apply(season, events)
                self.applied.set()
                self._release.wait(20)
                if not self._commit:
                    transaction.set_rollback(True)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            self.error = exc
            self.applied.set()
        finally:
            connections_close()

    def release(self) -> None:
        self._release.set()
        self._thread.join(20)
        if self.error is not None:
            raise self.error


@pytest.fixture
def one_database(request: pytest.FixtureRequest) -> None:
    """The test's seasons keep every partition in "default", whatever LEDGER_PARTITION_URLS
    says: the test holds a batch's transaction open from outside (HeldBatch, or several
    batches in one), which a write of a season with partitions in another database refuses
    (LedgerWriteNested). tests/test_ledger_databases.py has their split counterparts."""
    request.getfixturevalue("settings").LEDGER_PARTITION_ALIASES = {}


def in_thread(fn: Callable[[], Any]) -> Any:
    def run() -> Any:
        try:
            return fn()
        finally:
            connections_close()

    return ThreadPoolExecutor(1).submit(run)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("one_database")
def test_writers_on_disjoint_partitions_hold_their_locks_at_the_same_time(
        season_factory: Callable[..., Season]) -> None:
    season = season_factory(slug="disjoint", partitions=8)
    (a,), (b,) = players_in(8, 1, 1, "a"), players_in(8, 6, 1, "b")
    (c,) = players_in(8, 1, 1, "c")  # a's partition
    ev = Events("dj")
    held = HeldBatch(season, [ev.result(a, 10)])
    try:
        # b's partition is free: its batch commits while a's transaction still holds partition 1.
        other = in_thread(lambda: apply(season, [ev.result(b, 20)]))
        assert statuses_of(other.result(timeout=10)) == ["applied"]
        # Both locks were held at once: a's is still granted now, b's was granted meanwhile.
        # c shares a's partition: its batch waits for a's commit.
        same = in_thread(lambda: apply(season, [ev.result(c, 30)]))
        time.sleep(0.5)
        assert not same.done(), "a batch on a held partition did not wait for its lock"
    finally:
        held.release()
    assert statuses_of(same.result(timeout=10)) == ["applied"]
    assert db_scores(season) == {a: 10, b: 20, c: 30}
    changes = ledger_rows(ScoreChange, season, "player_id", "txid")
    assert {p: txid_partition(t) for p, t in changes} == {a: 1, b: 6, c: 1}
    assert dict(ledger_rows(StreamHead, season, "partition", "head")) == {
        1: 1 << TXID_PARTITION_SHIFT | 2, 6: 6 << TXID_PARTITION_SHIFT | 1}


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("one_database")
@pytest.mark.parametrize("first_commits", [True, False])
def test_the_same_new_event_id_on_two_partitions_at_once_is_a_conflict_not_an_error(
        season_factory: Callable[..., Season], first_commits: bool) -> None:
    """The unique index holds the second insert until the first transaction ends; the
    second batch then runs again as a whole and sees the first one's row (conflict), or
    (the first rolled back) applies."""
    season = season_factory(slug="race", partitions=8)
    (a,), (b,) = players_in(8, 2, 1, "a"), players_in(8, 5, 1, "b")
    event_a = {"event_id": "shared", "match_id": "m", "player_id": a, "best_score": 5, "score_version": 1,
               "completed_at": "2026-11-15T12:00:00Z"}
    event_b = {**event_a, "player_id": b, "best_score": 7}
    extra = {**event_b, "event_id": "own", "score_version": 2, "best_score": 9}
    held = HeldBatch(season, [event_a], commit=first_commits)
    second = in_thread(lambda: apply(season, [event_b, extra]))
    time.sleep(0.5)
    assert not second.done(), "the second insert did not wait for the first transaction"
    held.release()
    result = second.result(timeout=10)
    if first_commits:
        assert statuses_of(result) == ["conflict", "applied"]
        assert db_scores(season) == {a: 5, b: 9}
        assert ledger_rows(ScoreEventConflict, season, "event_id") == ["shared"]
    else:
        assert statuses_of(result) == ["applied", "applied"]
        assert db_scores(season) == {b: 9}
    # Each change exactly once: nothing of the second batch's failed attempt was kept.
    assert len(ledger_rows(ScoreChange, season, "id")) == 2
    assert [e for e, p in ledger_rows(ScoreChange, season, "event_id", "player_id") if p == b] == (
        ["own"] if first_commits else ["shared", "own"])


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("one_database")
def test_two_shared_new_event_ids_in_opposite_orders_deadlock_into_conflicts_not_an_error(
        season_factory: Callable[..., Season]) -> None:
    """Batch A (partition 2) inserts x, then y; batch B (partition 5) inserts y, then x in
    between: each waits for the other's insert. PostgreSQL aborts B (the only session
    whose deadlock check runs within the test); B runs again after A commits and sees
    both of A's events. A holds its transaction open across two batches, which no
    production writer does: were A the one aborted, only its second batch would roll
    back and it would wait for B again."""
    season = season_factory(slug="opposite", partitions=8)
    (a,), (b,) = players_in(8, 2, 1, "a"), players_in(8, 5, 1, "b")
    base = {"match_id": "m", "completed_at": "2026-11-15T12:00:00Z"}
    x_a = {**base, "event_id": "x", "player_id": a, "best_score": 5, "score_version": 1}
    y_a = {**x_a, "event_id": "y", "best_score": 6, "score_version": 2}
    y_b = {**base, "event_id": "y", "player_id": b, "best_score": 7, "score_version": 1}
    x_b = {**y_b, "event_id": "x", "best_score": 8, "score_version": 2}
    first_done, go = threading.Event(), threading.Event()

    def run_a() -> None:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET deadlock_timeout = '60s'")
            apply(season, [x_a])
            first_done.set()
            assert go.wait(10)
            apply(season, [y_a])

    a_run = in_thread(run_a)
    assert first_done.wait(10)
    def run_b() -> ApplyResult:
        with connection.cursor() as cursor:
            # Long enough for A's second insert to close the cycle before B checks.
            cursor.execute("SET deadlock_timeout = '3s'")
        return apply(season, [y_b, x_b])

    b_run = in_thread(run_b)
    time.sleep(0.5)  # B has inserted y and waits for A's x
    go.set()
    a_run.result(timeout=20)
    assert statuses_of(b_run.result(timeout=20)) == ["conflict", "conflict"]
    assert db_scores(season) == {a: 6}
    assert sorted(ledger_rows(ScoreEventConflict, season, "event_id")) == ["x", "y"]


def advisory_locks_held() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()")
        return int(cursor.fetchone()[0])


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("one_database")
def test_a_season_wide_write_takes_one_lock_waits_for_batches_and_holds_off_later_ones(
        season_factory: Callable[..., Season]) -> None:
    """Two lock levels: a season-wide write (lifecycle, repartition, region moves) takes
    the season's lock exclusively, one lock whatever the partition count (PostgreSQL's lock
    table is shared by every session); batches hold it shared beside their partitions'."""
    season = season_factory(slug="levels", partitions=64)
    with transaction.atomic():
        ledger_store.season_write_lock(season_id=season.pk)
        assert advisory_locks_held() == 1
    (a,), (b,) = players_in(64, 1, 1, "a"), players_in(64, 9, 1, "b")
    ev = Events("lv")
    held = HeldBatch(season, [ev.result(a, 10)])
    season_wide_done = threading.Event()

    def season_wide() -> None:
        with transaction.atomic():
            ledger_store.season_write_lock(season_id=season.pk)
            season_wide_done.set()
            time.sleep(0.5)  # a batch on another partition waits meanwhile

    try:
        waiting = in_thread(season_wide)
        time.sleep(0.5)
        assert not season_wide_done.is_set(), "a season-wide write did not wait for a batch in flight"
    finally:
        held.release()
    assert season_wide_done.wait(10)
    later = in_thread(lambda: apply(season, [ev.result(b, 20)]))
    time.sleep(0.2)
    assert not later.done(), "a batch did not wait for a season-wide write"
    waiting.result(timeout=10)
    assert statuses_of(later.result(timeout=10)) == ["applied"]


@pytest.mark.django_db(transaction=True)
def test_a_batch_spanning_partitions_commits_as_a_whole_with_a_number_per_partition(
        season_factory: Callable[..., Season]) -> None:
    season = season_factory(slug="span", partitions=4)
    players = [p for part in range(4) for p in players_in(4, part, 2, f"s{part}-")]
    ev = Events("sp")
    result = apply(season, [ev.result(p, 10 + i) for i, p in enumerate(players)])
    assert statuses_of(result) == ["applied"] * 8
    rows = ledger_rows(ScoreChange, season, "player_id", "txid")
    for player, txid in rows:
        assert txid == partition_of(player, 4) << TXID_PARTITION_SHIFT | 1
    # A failing batch leaves nothing in any partition (one transaction).
    bad = [ev.result(players[0], 99), {**ev.result(players[5], 98), "score_version": -1}]
    with pytest.raises(Exception):  # noqa: B017,PT011 - rejected at parse time: nothing reaches the ledger
        apply(season, bad)
    assert len(ledger_rows(ScoreChange, season, "id")) == 8


@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_on_partitions_never_lose_or_repeat_a_change(
        season_factory: Callable[..., Season]) -> None:
    """Writers through the real write path on 4 partitions (and batches spanning them),
    read by a consumer walking the vector watermark while they run: every committed change
    exactly once, each player's changes in their order."""
    season = season_factory(slug="stream", partitions=4)
    writers, per_writer = 4, 20

    def write(w: int) -> None:
        try:
            ev = Events(f"w{w}")
            for i in range(per_writer):
                # Each writer owns its players; a batch touches up to three partitions.
                apply(season, [ev.result(f"w{w}-p{(i + k) % 7}", 10 * i + k) for k in range(3)])
        finally:
            connections_close()

    seen: list[tuple[int, int, str, int]] = []
    cursor = Watermark()

    def poll() -> None:
        nonlocal cursor
        while page := score_change_heads_after(season_id=season.pk, cursor=cursor, limit=7):
            seen.extend((row[0], row[1], row[2], row[4]) for row in page)
            cursor = cursor.advanced(page)

    with ThreadPoolExecutor(writers) as pool:
        futures = [pool.submit(write, w) for w in range(writers)]
        while not all(f.done() for f in futures):
            poll()
        for f in futures:
            f.result()
    poll()
    expected = ledger_rows(ScoreChange, season, "id")
    assert sorted(i for _, i, _, _ in seen) == sorted(expected)
    assert len(seen) == len(set(seen)) == writers * per_writer * 3
    versions: dict[str, int] = {}
    for _, _, player, version in seen:
        assert version > versions.get(player, 0), f"{player}'s changes out of order"
        versions[player] = version


# --- the reference model over the write API with concurrent writers, partitioned ---------


@pytest.mark.django_db(transaction=True)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=event_scripts(starts_at=SEASON_START, cutoff=SEASON_CUTOFF, max_events=30), writers=st.integers(2, 3))
def test_concurrent_writers_on_a_partitioned_season_match_the_reference_model(
        season_factory: Callable[..., Season], script: Any, writers: int) -> None:
    """The script's batches split by player between concurrent writers (each player's
    events stay in order with one writer, as from a real match service, and the writers'
    players fall in different partitions): every outcome and the final scores are the
    sequential reference model's. An event id reused across players races across
    partitions: its players are left out of the comparison (which delivery came first is
    the race's), but it is recorded once, every other delivery a conflict or a duplicate."""
    season = season_factory(slug=f"ref-{time.monotonic_ns()}", partitions=8)
    # With LEDGER_PARTITION_URLS naming some of the 8 (.ci/run), the same model over a season
    # split over databases: event-id claims, a transaction per database.
    assert season_ledger_is_split(season=season) == bool(
        set(django_settings.LEDGER_PARTITION_ALIASES) & set(range(8)))
    events = script.events
    owners: dict[str, set[str]] = {}
    for e in events:
        owners.setdefault(e["event_id"], set()).add(e["player_id"])
    raced = {event_id for event_id, players in owners.items() if len(players) > 1}
    # Which delivery of a raced event id comes first decides its players' later outcomes.
    racers = {p for event_id in raced for p in owners[event_id]}
    by_writer: list[list[dict[str, Any]]] = [[] for _ in range(writers)]
    for e in events:
        by_writer[partition_of(e["player_id"], 8) % writers].append(e)

    def write(mine: list[dict[str, Any]]) -> list[dict[str, Any]]:
        try:
            outcomes: list[dict[str, Any]] = []
            for start in range(0, len(mine), 4):
                batch = mine[start:start + 4]
                result = score_events_apply(season=season, events=events_parse({"events": [as_json(e) for e in batch]}),
                                            client=None)
                outcomes.extend(o.as_dict() for o in result.outcomes)
            return outcomes
        finally:
            connections_close()

    with ThreadPoolExecutor(writers) as pool:
        results = list(pool.map(write, by_writer))
    # The reference model, one writer's events at a time: players of different writers
    # never share state, and every event id of one player belongs to one writer.
    model_events = [e for mine in by_writer for e in mine if e["player_id"] not in racers]
    model, expected = reference_run(Script(batches=[model_events], published=[0]), season_rejection(
        starts_at=SEASON_START, cutoff=SEASON_CUTOFF))
    got = [o for mine, outs in zip(by_writer, results, strict=True) for e, o in zip(mine, outs, strict=True)
           if e["player_id"] not in racers]
    assert got == expected
    for event_id in raced:
        statuses = [o["status"] for mine, outs in zip(by_writer, results, strict=True)
                    for e, o in zip(mine, outs, strict=True) if e["event_id"] == event_id]
        assert sum(s not in ("duplicate", "conflict") for s in statuses) == 1, (event_id, statuses)
    assert {p: s for p, s in db_scores(season).items() if p not in racers} == {
        p: score for p, (score, _) in model.players.items()}


# --- repartitioning an open season -------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_repartitioning_an_open_season_under_write_load_loses_and_doubles_nothing(
        season_factory: Callable[..., Season]) -> None:
    season = season_factory(slug="repart", partitions=1)
    ev = Events("rp")
    apply_events(season, [ev.result(f"p{i}", 100 + i) for i in range(30)])
    materialize(season)
    stop = threading.Event()

    def write(w: int) -> int:
        n = 0
        try:
            while not stop.is_set() and n < 60:
                wev = Events(f"rw{w}-{n}")
                apply(season, [wev.result(f"p{(w * 7 + n + k) % 30}", 1000 + n * 10 + k) for k in range(3)])
                n += 1
        finally:
            connections_close()
        return n

    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(write, w) for w in range(2)]
        time.sleep(0.3)
        call_command("season_repartition", "repart", "4", reason="test")
        materialize(season)  # an epoch reading both layouts while writers go on
        time.sleep(0.3)
        stop.set()
        assert all(f.result() > 0 for f in futures)
    season.refresh_from_db()
    assert (season.partition_base, season.partitions) == (1, 4)
    parts = {txid_partition(t) for t in ledger_rows(ScoreChange, season, "txid")}
    assert 0 in parts and parts - {0}, parts  # changes before and after the repartition
    # Each change read exactly once from the start, and the published board is the ledger's.
    read: list[int] = []
    cursor = Watermark()
    while page := score_change_heads_after(season_id=season.pk, cursor=cursor, limit=25):
        read.extend(row[1] for row in page)
        cursor = cursor.advanced(page)
    assert sorted(read) == sorted(ledger_rows(ScoreChange, season, "id"))
    assert len(read) == len(set(read))
    materialize(season)
    assert_matches_ledger(season)
    with pytest.raises(SeasonError):
        season_repartition(season=season, partitions=4, actor=TEST_ACTOR)


# --- FINAL: partitioned and unpartitioned seasons agree byte for byte --------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_a_partitioned_seasons_final_is_byte_identical_to_the_unpartitioned_one(
        season_factory: Callable[..., Season]) -> None:
    seasons = [closing_season(season_factory, "plain"), closing_season(season_factory, "parted")]
    Season.objects.filter(slug="plain").update(partitions=1)
    Season.objects.filter(slug="parted").update(partitions=8)
    for season in seasons:
        season.refresh_from_db()
    ev = Events("fin", completed_at=(seasons[0].cutoff - timedelta(hours=1)).isoformat().replace("+00:00", "Z"))
    events = [ev.result(f"p{i % 40}", (i * 7919) % 500) for i in range(120)]
    events += [ev.correction(f"p{i}", 3) for i in range(0, 40, 9)]
    for season in seasons:
        for start in range(0, len(events), 25):
            apply_events(season, events[start:start + 25])
    finals = []
    for season in seasons:
        done = finalize(season)
        assert done.state == "FINAL"
        finals.append((final_rows(done), done.manifests.get(version=done.final_version or 0).content_hash))
    assert finals[0] == finals[1]
    assert len(finals[0][0]) == 40
