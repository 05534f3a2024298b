"""The season lifecycle services (seasons/services.py, docs/rules.md, Season lifecycle) on a real database:
transitions and their audit rows, admission of results in each state, the clock (beat
tick), the ingest seal with its watermark and late-results queue, and the race between
writers and the seal."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connections
from rest_framework.test import APIClient

from audit.models import AuditEntry
from audit.services import SYSTEM
from leaderboard.core.lifecycle import SeasonState
from leaderboard.core.partitions import Watermark
from leaderboard.ledger_reads import ledger_rows_list
from leaderboard.models import ApiClient, LateResult, PlayerScore, ScoreChange, ScoreEvent
from seasons.models import FinalCandidate, FinalStanding, Season
from seasons.services import (
    FinalNotReady,
    SeasonError,
    season_final_candidate_build,
    season_final_reject,
    season_seal_ingest,
    season_transition,
    seasons_lifecycle_tick,
)
from seasons.tasks import seasons_lifecycle
from tests.support import (
    TEST_ACTOR,
    Events,
    change_head,
    closing_season,
    db_scores,
    finalize,
    in_season,
    iso,
    ledger_rows,
    materialize,
    post_ok,
    staff,
    statuses,
)
from tests.support.staff_console import audit_actions

Post = Callable[..., Any]
SeasonFactory = Callable[..., Season]

NOW = datetime.now(UTC)


def reload(season: Season) -> Season:
    return Season.objects.get(pk=season.pk)


def open_season_past_cutoff(season_factory: SeasonFactory, slug: str, cutoff_ago: timedelta) -> Season:
    """An OPEN season whose cutoff the clock has since passed (as if time went by)."""
    season = season_factory(slug=slug, starts_at=NOW - timedelta(days=10), cutoff=NOW + timedelta(days=1))
    assert season.state == SeasonState.OPEN
    Season.objects.filter(pk=season.pk).update(cutoff=datetime.now(UTC) - cutoff_ago)
    return reload(season)


def scheduled_season(season_factory: SeasonFactory, slug: str) -> Season:
    season = season_factory(slug=slug, starts_at=NOW + timedelta(hours=1), cutoff=NOW + timedelta(days=10))
    assert season.state == SeasonState.SCHEDULED
    return season


# --- creation and manual transitions ----------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("start", "cutoff", "state"),
    [
        (timedelta(hours=1), timedelta(days=3), "SCHEDULED"),
        (-timedelta(days=1), timedelta(days=3), "OPEN"),
        (-timedelta(days=3), -timedelta(hours=1), "CLOSING"),
    ],
)
def test_a_season_is_created_in_the_state_the_clock_says_with_an_audit_row(
    season_factory: SeasonFactory, start: timedelta, cutoff: timedelta, state: str
) -> None:
    season = season_factory(slug="created", starts_at=NOW + start, cutoff=NOW + cutoff)
    assert reload(season).state == state
    entry = AuditEntry.objects.get(action="season.created", season_slug="created")
    assert entry.after is not None
    assert entry.after["state"] == state
    assert (entry.target_type, entry.target_id, entry.actor_label) == ("season", "created", TEST_ACTOR.label)


@pytest.mark.django_db
def test_opening_closing_and_sealing_each_write_an_audit_row_with_before_and_after(
    season_factory: SeasonFactory,
) -> None:
    season = scheduled_season(season_factory, "audited")
    opener, closer, sealer = staff("opener"), staff("closer"), staff("sealer")

    season = season_transition(season=season, target=SeasonState.OPEN, actor=opener, reason="early start")
    assert reload(season).state == SeasonState.OPEN
    Season.objects.filter(pk=season.pk).update(starts_at=NOW - timedelta(days=2),
                                               cutoff=datetime.now(UTC) - timedelta(seconds=1))
    season_transition(season=season, target=SeasonState.CLOSING, actor=closer, reason="cutoff reached")
    assert reload(season).state == SeasonState.CLOSING
    season_seal_ingest(season=season, actor=sealer, reason="all results in")
    sealed = reload(season)
    assert sealed.state == SeasonState.FINALIZING
    assert sealed.sealed_at is not None
    assert sealed.ingest_watermark == Watermark()  # nothing was ever written

    assert audit_actions(season) == ["season.created", "season.opened", "season.closing", "season.ingest.sealed"]
    rows = {e.action: e for e in AuditEntry.objects.filter(season_slug="audited")}
    snapshot: dict[str, object] = {"published_version": 0, "final_version": None, "ingest_watermark": None,
                                   "regions": [], "tie_break": "shared", "mode": "best", "order": "desc"}
    for action, actor, before, after, reason in [
        ("season.opened", opener, "SCHEDULED", "OPEN", "early start"),
        ("season.closing", closer, "OPEN", "CLOSING", "cutoff reached"),
        ("season.ingest.sealed", sealer, "CLOSING", "FINALIZING", "all results in"),
    ]:
        entry = rows[action]
        assert (entry.actor_type, entry.actor_id, entry.actor_label) == ("user", actor.id, actor.label)
        assert (entry.target_type, entry.target_id, entry.reason) == ("season", "audited", reason)
        assert entry.before == {**snapshot, "state": before}
        expected_after = {**snapshot, "state": after}
        if action == "season.ingest.sealed":
            expected_after["ingest_watermark"] = "0:0"
        assert entry.after == expected_after


@pytest.mark.django_db
def test_closing_before_the_cutoff_is_refused_and_changes_nothing(season_factory: SeasonFactory) -> None:
    season = season_factory(slug="early", starts_at=NOW - timedelta(days=1), cutoff=NOW + timedelta(days=1))
    with pytest.raises(SeasonError, match=r"the cutoff, .* UTC \(in .*\), has not passed yet"):
        season_transition(season=season, target=SeasonState.CLOSING, actor=staff())
    with pytest.raises(SeasonError, match=r"a OPEN season cannot become FINALIZING \(only CLOSING\)"):
        season_seal_ingest(season=season, actor=staff())
    assert reload(season).state == SeasonState.OPEN
    assert reload(season).sealed_at is None
    assert audit_actions(season) == ["season.created"]


@pytest.mark.django_db
def test_illegal_transitions_are_refused(season_factory: SeasonFactory) -> None:
    season = closing_season(season_factory, "illegal")
    with pytest.raises(SeasonError, match="a CLOSING season cannot become OPEN"):
        season_transition(season=season, target=SeasonState.OPEN, actor=SYSTEM)
    with pytest.raises(SeasonError, match="use the dedicated service to make a season FINALIZING"):
        season_transition(season=season, target=SeasonState.FINALIZING, actor=SYSTEM)
    with pytest.raises(SeasonError, match="use the dedicated service to make a season FINAL"):
        season_transition(season=season, target=SeasonState.FINAL, actor=SYSTEM)
    season_seal_ingest(season=season, actor=SYSTEM)
    with pytest.raises(SeasonError, match="a FINALIZING season cannot become FINALIZING"):
        season_seal_ingest(season=season, actor=SYSTEM)
    assert audit_actions(season) == ["season.created", "season.ingest.sealed"]


@pytest.mark.django_db
def test_a_transition_acts_on_the_current_row_not_a_stale_copy(season_factory: SeasonFactory) -> None:
    season = closing_season(season_factory, "stale-copy")
    stale = Season.objects.get(pk=season.pk)
    season_seal_ingest(season=season, actor=SYSTEM)
    # The stale object still says CLOSING; the service re-reads under the lock.
    assert stale.state == SeasonState.CLOSING
    with pytest.raises(SeasonError, match="a FINALIZING season cannot become FINALIZING"):
        season_seal_ingest(season=stale, actor=SYSTEM)


# --- admission of results, state by state ------------------------------------------------


@pytest.mark.django_db
def test_a_scheduled_season_rejects_results_until_it_is_opened(
    season_factory: SeasonFactory, post_scores: Post
) -> None:
    season = scheduled_season(season_factory, "sched")
    events = Events("sched", in_season(season, before_cutoff=timedelta(days=1)))
    first = events.result("alice", 500)
    assert statuses(post_ok(post_scores, season, [first])) == [("rejected", "season_not_open")]
    (row,) = ledger_rows_list(season=season, queryset=ScoreEvent.objects.filter(season=season,
                                                                                event_id=first["event_id"]))
    assert (row.status, row.status_reason) == ("rejected", "season_not_open")
    assert not ledger_rows(PlayerScore, season)
    assert not ledger_rows(LateResult, season)

    season_transition(season=season, target=SeasonState.OPEN, actor=staff())
    results = post_ok(post_scores, season, [events.result("alice", 500)])
    assert statuses(results) == [("applied", "")]
    assert db_scores(season) == {"alice": 500}
    # The rejected event is remembered as rejected: resending it is a duplicate, not a second chance.
    again = post_ok(post_scores, season, [first])[0]
    assert (again["status"], again["first_status"], again["reason"]) == ("duplicate", "rejected", "season_not_open")


@pytest.mark.django_db
def test_an_open_season_admits_results_inside_the_season_only(
    season_factory: SeasonFactory, post_scores: Post
) -> None:
    season = season_factory(slug="open", starts_at=NOW - timedelta(days=1), cutoff=NOW + timedelta(days=1))
    events = Events("open", iso(NOW))
    results = post_ok(post_scores, season, [
        events.result("alice", 100),
        events.result("bob", 100, completed_at=iso(season.cutoff + timedelta(seconds=1))),
        events.result("carol", 100, completed_at=iso(season.starts_at - timedelta(seconds=1))),
    ])
    assert statuses(results) == [("applied", ""), ("rejected", "after_cutoff"), ("rejected", "before_season_start")]
    assert db_scores(season) == {"alice": 100}


@pytest.mark.django_db
def test_a_closing_season_accepts_pre_cutoff_results_and_rejects_after_cutoff_ones(
    season_factory: SeasonFactory, post_scores: Post
) -> None:
    season = closing_season(season_factory, "closing")
    events = Events("closing", in_season(season))
    results = post_ok(post_scores, season, [
        events.result("alice", 300),
        events.result("bob", 200, completed_at=iso(season.cutoff)),  # exactly at the cutoff: in
        events.result("carol", 900, completed_at=iso(season.cutoff + timedelta(microseconds=1))),
        events.result("alice", 100),  # lower than her best: unchanged
        events.correction("bob", 150, reason="cheating in one match"),
    ])
    assert statuses(results) == [
        ("applied", ""), ("applied", ""), ("rejected", "after_cutoff"), ("unchanged", ""), ("applied", ""),
    ]
    assert db_scores(season) == {"alice": 300, "bob": 150}
    assert not ledger_rows(LateResult, season)


@pytest.mark.django_db
def test_after_the_seal_late_results_and_api_corrections_wait_in_the_queue_for_staff(
    season_factory: SeasonFactory, post_scores: Post, writer: tuple[ApiClient, str]
) -> None:
    season = closing_season(season_factory, "sealed")
    events = Events("sealed", in_season(season))
    post_ok(post_scores, season, [events.result("alice", 300), events.result("bob", 200)])
    watermark = change_head(season)
    season_seal_ingest(season=season, actor=SYSTEM)
    sealed = reload(season)
    assert sealed.ingest_watermark == watermark

    late = events.result("alice", 5000)
    new_player = events.result("dave", 700)
    after_cutoff = events.result("erin", 800, completed_at=iso(season.cutoff + timedelta(minutes=1)))
    before_start = events.result("frank", 800, completed_at=iso(season.starts_at - timedelta(minutes=1)))
    correction = events.correction("bob", 50, reason="revoked: exploit")
    results = post_ok(post_scores, season, [late, new_player, after_cutoff, before_start, correction])
    assert statuses(results) == [
        ("rejected", "late_after_seal"), ("rejected", "late_after_seal"), ("rejected", "after_cutoff"),
        ("rejected", "before_season_start"), ("held", "correction_after_seal"),
    ]
    assert [r["pending_version"] for r in results] == [None, None, None, None, None]
    # The held correction is recorded but changes nothing until staff approve it.
    assert db_scores(season) == {"alice": 300, "bob": 200}

    # Each queued row lives beside its ledger row, in its player's database: ids are per
    # database, so the queue is compared in the order the events were sent.
    sent = [e["event_id"] for e in events.sent]
    queued = sorted(ledger_rows(LateResult, season), key=lambda q: sent.index(q.ledger_event.event_id))
    assert [(q.ledger_event.event_id, q.player_id, q.best_score, q.reason, q.status) for q in queued] == [
        (late["event_id"], "alice", 5000, "late_after_seal", "pending"),
        (new_player["event_id"], "dave", 700, "late_after_seal", "pending"),
        (correction["event_id"], "bob", 50, "correction_after_seal", "pending"),
    ]
    assert queued[0].completed_at == season.cutoff - timedelta(hours=1)
    assert [(q.ledger_event.status, q.ledger_event.status_reason, q.ledger_event.client_id) for q in queued] == [
        ("rejected", "late_after_seal", writer[0].pk), ("rejected", "late_after_seal", writer[0].pk),
        ("held", "correction_after_seal", writer[0].pk),
    ]

    # A retry of a late result is a duplicate: it is not queued twice.
    again = post_ok(post_scores, season, [late])[0]
    assert (again["status"], again["first_status"], again["reason"]) == ("duplicate", "rejected", "late_after_seal")
    held_again = post_ok(post_scores, season, [correction])[0]
    assert (held_again["status"], held_again["first_status"]) == ("duplicate", "held")
    assert len(ledger_rows(LateResult, season)) == 3
    # Nothing after the seal moved the change stream, nor the seal itself.
    assert change_head(season) == watermark
    assert reload(season).ingest_watermark == watermark


@pytest.mark.django_db
def test_the_seal_records_the_newest_change_of_its_own_season_only(
    season_factory: SeasonFactory, post_scores: Post
) -> None:
    season = closing_season(season_factory, "mine")
    other = season_factory(slug="other", starts_at=NOW - timedelta(days=1), cutoff=NOW + timedelta(days=1))
    mine = Events("mine", in_season(season))
    theirs = Events("theirs", iso(NOW))
    post_ok(post_scores, season, [mine.result("a", 1), mine.result("b", 2)])
    head = change_head(season)
    # Newer, but another season's: the same players, so the same partitions and databases.
    post_ok(post_scores, other, [theirs.result("a", 9), theirs.result("b", 9)])
    sealed = season_seal_ingest(season=season, actor=SYSTEM)
    assert sealed.ingest_watermark == head
    # In each partition this season wrote, a newer change (a larger id in its database), but not this season's.
    newer = change_head(other)
    written = [p for p in range(head.partitions) if head.cursor(p) != Watermark().cursor(p)]
    assert written and all(head.cursor(p)[1] < newer.cursor(p)[1] for p in written)
    # The other season is untouched and still accepts results.
    assert reload(other).state == SeasonState.OPEN
    assert statuses(post_ok(post_scores, other, [theirs.result("y", 3)])) == [("applied", "")]


# --- the clock: seasons_lifecycle_tick ---------------------------------------------------


@pytest.mark.django_db
def test_the_tick_opens_a_season_at_its_start(season_factory: SeasonFactory) -> None:
    season = scheduled_season(season_factory, "tick-open")
    assert seasons_lifecycle_tick() == []
    assert reload(season).state == SeasonState.SCHEDULED
    # The start passes.
    Season.objects.filter(pk=season.pk).update(starts_at=datetime.now(UTC) - timedelta(seconds=1))
    assert seasons_lifecycle_tick() == ["tick-open: OPEN"]
    assert reload(season).state == SeasonState.OPEN
    entry = AuditEntry.objects.get(action="season.opened", season_slug="tick-open")
    assert (entry.actor_type, entry.actor_label) == ("system", "system")
    assert seasons_lifecycle_tick() == []


@pytest.mark.django_db
def test_the_tick_takes_its_time_from_the_caller(season_factory: SeasonFactory) -> None:
    season = scheduled_season(season_factory, "tick-now")
    assert seasons_lifecycle_tick(now=season.starts_at - timedelta(seconds=1)) == []
    assert seasons_lifecycle_tick(now=season.starts_at) == ["tick-now: OPEN"]


@pytest.mark.django_db
def test_the_tick_closes_a_season_at_its_cutoff(season_factory: SeasonFactory, settings: Any) -> None:
    settings.SEAL_AFTER_CUTOFF_SECONDS = 600.0
    open_now = season_factory(slug="still-open", starts_at=NOW - timedelta(days=1), cutoff=NOW + timedelta(days=1))
    season = open_season_past_cutoff(season_factory, "tick-close", cutoff_ago=timedelta(seconds=1))
    assert seasons_lifecycle_tick() == ["tick-close: CLOSING"]
    assert reload(season).state == SeasonState.CLOSING
    assert reload(open_now).state == SeasonState.OPEN
    assert audit_actions(season) == ["season.created", "season.closing"]
    # Not sealed yet: the seal comes SEAL_AFTER_CUTOFF_SECONDS after the cutoff.
    assert seasons_lifecycle_tick() == []


@pytest.mark.django_db
def test_the_tick_seals_ingest_the_configured_delay_after_the_cutoff(
    season_factory: SeasonFactory, post_scores: Post, settings: Any
) -> None:
    season = closing_season(season_factory, "tick-seal", cutoff_ago=timedelta(minutes=5))
    post_ok(post_scores, season, [Events("ts", in_season(season)).result("alice", 10)])
    settings.SEAL_AFTER_CUTOFF_SECONDS = 600.0  # ten minutes: not yet
    assert seasons_lifecycle_tick() == []
    assert reload(season).state == SeasonState.CLOSING
    settings.SEAL_AFTER_CUTOFF_SECONDS = 240.0  # four minutes: due
    done = seasons_lifecycle_tick()
    assert done[0] == "tick-seal: sealed"
    sealed = reload(season)
    assert sealed.state == SeasonState.FINALIZING
    assert sealed.ingest_watermark == change_head(season)
    entry = AuditEntry.objects.get(action="season.ingest.sealed", season_slug="tick-seal")
    assert (entry.actor_type, entry.reason) == ("system", "automatic seal after the cutoff")


@pytest.mark.django_db
def test_one_tick_moves_every_due_season_one_step(season_factory: SeasonFactory, settings: Any) -> None:
    settings.SEAL_AFTER_CUTOFF_SECONDS = 0.0
    a = scheduled_season(season_factory, "a-sched")
    Season.objects.filter(pk=a.pk).update(starts_at=datetime.now(UTC) - timedelta(seconds=1))
    b = open_season_past_cutoff(season_factory, "b-open", cutoff_ago=timedelta(seconds=1))
    c = closing_season(season_factory, "c-closing")
    done = sorted(seasons_lifecycle_tick())
    assert done[:3] == ["a-sched: OPEN", "b-open: CLOSING", "c-closing: sealed"]
    assert [reload(s).state for s in (a, b, c)] == ["OPEN", "CLOSING", "FINALIZING"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_the_tick_builds_a_final_candidate_once_a_version_covers_the_seal(
    season_factory: SeasonFactory, post_scores: Post, settings: Any
) -> None:
    settings.SEAL_AFTER_CUTOFF_SECONDS = 60.0
    season = closing_season(season_factory, "tick-final")
    events = Events("tf", in_season(season))
    post_ok(post_scores, season, [events.result(f"p{i}", 100 * i) for i in range(1, 6)])
    assert len(db_scores(season)) == 5
    assert seasons_lifecycle_tick() == ["tick-final: sealed"]
    # Nothing published yet: the tick reports it and builds nothing.
    assert seasons_lifecycle_tick() == ["tick-final: no published version yet"]
    assert not FinalCandidate.objects.exists()

    materialize(season)
    done = seasons_lifecycle_tick()
    candidate = FinalCandidate.objects.get(season=season)
    assert done == [f"tick-final: candidate v{candidate.version}"]
    assert (candidate.status, candidate.reconciliation_ok) == ("built", True)
    entry = AuditEntry.objects.get(action="season.final.candidate_built")
    assert (entry.actor_type, entry.target_id, entry.after) == (
        "system", str(candidate.pk), {"version": candidate.version, "reconciliation_ok": True, "failed_checks": []},
    )
    # A built candidate is waiting for staff: the next tick builds no other.
    assert seasons_lifecycle_tick() == []
    assert FinalCandidate.objects.count() == 1
    # Once staff reject it, the clock builds a fresh one.
    season_final_reject(candidate=candidate, actor=staff(), reason="want a second look")
    assert seasons_lifecycle_tick() == [f"tick-final: candidate v{candidate.version}"]
    assert list(FinalCandidate.objects.order_by("id").values_list("status", flat=True)) == ["rejected", "built"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_the_tick_leaves_final_seasons_alone_and_the_celery_task_runs_it(
    season_factory: SeasonFactory, post_scores: Post, settings: Any
) -> None:
    settings.SEAL_AFTER_CUTOFF_SECONDS = 0.0
    season = closing_season(season_factory, "done")
    post_ok(post_scores, season, [Events("done", in_season(season)).result("alice", 10)])
    finalize(season)
    before = AuditEntry.objects.count()
    assert seasons_lifecycle.apply().get() == []
    assert seasons_lifecycle_tick() == []
    assert AuditEntry.objects.count() == before
    assert reload(season).state == SeasonState.FINAL


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_a_candidate_cannot_be_built_outside_finalizing_or_without_a_version(
    season_factory: SeasonFactory, post_scores: Post
) -> None:
    season = closing_season(season_factory, "no-cand")
    with pytest.raises(SeasonError, match="a CLOSING season has no FINAL candidate to build"):
        season_final_candidate_build(season=season, actor=SYSTEM)
    post_ok(post_scores, season, [Events("nc", in_season(season)).result("alice", 10)])
    season_seal_ingest(season=season, actor=SYSTEM)
    with pytest.raises(FinalNotReady, match="no published version yet"):
        season_final_candidate_build(season=season, actor=SYSTEM)
    assert not FinalCandidate.objects.exists()


# --- the race: writers around the cutoff and the seal ------------------------------------

WRITERS = 4
PLAYERS_PER_WRITER = 4
ACCEPTED_BEFORE_SEAL = 3 * WRITERS  # batches accepted (all writers together) before the seal
LATE_PER_WRITER = 3  # batches each writer sends after seeing the seal


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rank_views")
def test_race_every_result_is_either_in_the_final_or_in_the_late_queue_exactly_once(
    season_factory: SeasonFactory, writer: tuple[ApiClient, str]
) -> None:
    """Writer threads post pre-cutoff results (and some after the cutoff) while another
    thread seals ingest. Each batch is one transaction against one state: all of it
    before the seal, or all of it after."""
    season = closing_season(season_factory, "race", cutoff_ago=timedelta(seconds=2))
    pre_cutoff = iso(season.cutoff - timedelta(milliseconds=1))
    post_cutoff = iso(season.cutoff + timedelta(milliseconds=1))
    token = writer[1]

    lock = threading.Lock()
    accepted_batches = [0]
    sealed = threading.Event()
    errors: list[BaseException] = []
    # Per writer, in order: (events, results) of each batch.
    logs: dict[int, list[tuple[list[dict[str, Any]], list[dict[str, Any]]]]] = {t: [] for t in range(WRITERS)}

    def write(t: int) -> None:
        try:
            client = APIClient()
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
            late_batches = 0
            for i in range(1, 400):
                events = [
                    {"event_id": f"w{t}-b{i}-p{k}", "match_id": f"w{t}-m{i}", "player_id": f"w{t}-p{k}",
                     # increasing per player, so a late result would always raise the score;
                     # the last player only ever sends low scores: unchanged after its first
                     "best_score": 1 if k == PLAYERS_PER_WRITER - 1 else 1000 * i + 10 * k + t,
                     "score_version": i, "completed_at": pre_cutoff}
                    for k in range(PLAYERS_PER_WRITER)
                ]
                if i % 3 == 0:
                    events.append({"event_id": f"w{t}-b{i}-x", "match_id": f"w{t}-m{i}", "player_id": f"w{t}-x",
                                   "best_score": 10**6, "score_version": i, "completed_at": post_cutoff})
                response = client.post(f"/internal/v1/seasons/{season.slug}/scores:apply", {"events": events},
                                        format="json")
                assert response.status_code == 200, response.content
                results = response.json()["results"]
                logs[t].append((events, results))
                if any(r.get("reason") == "late_after_seal" for r in results):
                    late_batches += 1
                    if late_batches >= LATE_PER_WRITER:
                        return
                else:
                    with lock:
                        accepted_batches[0] += 1
        except BaseException as exc:  # noqa: BLE001 (reported by the main thread)
            errors.append(exc)
        finally:
            connections.close_all()  # the thread's sessions of every ledger database too

    def seal() -> None:
        try:
            while True:
                with lock:
                    if accepted_batches[0] >= ACCEPTED_BEFORE_SEAL:
                        break
                if errors:
                    return
                threading.Event().wait(0.001)
            season_seal_ingest(season=season, actor=SYSTEM, reason="race")
            sealed.set()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=write, args=(t,)) for t in range(WRITERS)]
    threads.append(threading.Thread(target=seal))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
        assert not thread.is_alive(), "a thread hung"
    assert not errors, errors
    assert sealed.is_set()

    accepted: dict[str, dict[str, Any]] = {}  # event_id -> event, applied or unchanged
    late: dict[str, dict[str, Any]] = {}
    after_cutoff: set[str] = set()
    posted = 0
    for t, batches in logs.items():
        phases = []
        for events, results in batches:
            posted += len(events)
            assert [r["event_id"] for r in results] == [e["event_id"] for e in events]
            in_board = {r["status"] for r in results if r["status"] in ("applied", "unchanged")}
            was_late = any(r.get("reason") == "late_after_seal" for r in results)
            # One batch, one transaction, one state: never half before and half after the seal.
            assert not (in_board and was_late), results
            phases.append("late" if was_late else "before")
            for event, result in zip(events, results, strict=True):
                if event["completed_at"] == post_cutoff:
                    assert (result["status"], result["reason"]) == ("rejected", "after_cutoff")
                    after_cutoff.add(event["event_id"])
                elif was_late:
                    assert (result["status"], result["reason"]) == ("rejected", "late_after_seal")
                    late[event["event_id"]] = event
                else:
                    assert result["status"] in ("applied", "unchanged"), result
                    accepted[event["event_id"]] = event
        # The seal is one moment: once a writer saw it, it never sees an open ingest again.
        assert phases == sorted(phases), f"writer {t}: {phases}"
        assert phases.count("late") == LATE_PER_WRITER
    assert len(accepted) >= ACCEPTED_BEFORE_SEAL * PLAYERS_PER_WRITER
    assert len(accepted) + len(late) + len(after_cutoff) == posted

    # None lost, none twice: the ledger holds every posted event once, with the answer given.
    ledger = dict(ledger_rows(ScoreEvent, season, "event_id", "status_reason"))
    assert len(ledger) == posted
    assert {e for e, why in ledger.items() if why == "late_after_seal"} == set(late)
    assert {e for e, why in ledger.items() if why == "after_cutoff"} == after_cutoff
    queued = ledger_rows(LateResult, season, "ledger_event__event_id")
    assert sorted(queued) == sorted(late)  # every late result queued, once; nothing else
    assert set(ledger_rows(LateResult, season, "status")) <= {"pending"}

    # Every accepted change is at or below the watermark; nothing entered the board after it.
    season.refresh_from_db()
    watermark = season.ingest_watermark
    assert watermark is not None
    changes = ledger_rows(ScoreChange, season, "txid", "id", "event_id")
    above = [(txid, ident, event_id) for txid, ident, event_id in changes if not watermark.covers(txid, ident)]
    assert not above, f"accepted after the watermark {watermark}: {above[:5]}"
    assert Watermark().advanced(sorted((txid, ident) for txid, ident, _ in changes)) == watermark
    changed_events = [event_id for _, _, event_id in changes]
    assert len(changed_events) == len(set(changed_events))
    assert set(changed_events) <= set(accepted)
    applied_ids = set(ledger_rows_list(season=season, queryset=ScoreEvent.objects.filter(
        season=season, status="applied").values_list("event_id", flat=True)))
    assert set(changed_events) == applied_ids

    # The FINAL holds exactly what was accepted before the seal: each player's best accepted
    # score (late results were all higher, so any leak would show), and no late-only player.
    expected: dict[str, int] = {}
    for event in accepted.values():
        expected[event["player_id"]] = max(expected.get(event["player_id"], 0), event["best_score"])
    assert db_scores(season) == expected
    finalize(season, seal=False)
    final = dict(FinalStanding.objects.filter(season=season).values_list("player_id", "score"))
    assert final == expected
    assert not any(player.endswith("-x") for player in final)
    for event in late.values():
        assert final.get(event["player_id"], -1) < event["best_score"] or event["best_score"] == 1


@pytest.mark.django_db(transaction=True)
def test_race_closing_while_results_arrive_loses_nothing(
    season_factory: SeasonFactory, writer: tuple[ApiClient, str]
) -> None:
    """OPEN -> CLOSING while writers post: pre-cutoff results are accepted in both states,
    after-cutoff ones rejected in both; nothing is lost or queued."""
    season = open_season_past_cutoff(season_factory, "close-race", cutoff_ago=timedelta(seconds=1))
    pre_cutoff = iso(season.cutoff - timedelta(milliseconds=1))
    post_cutoff = iso(season.cutoff + timedelta(milliseconds=1))
    token = writer[1]
    started = threading.Barrier(3)
    errors: list[BaseException] = []
    answers: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def write(t: int) -> None:
        try:
            client = APIClient()
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
            started.wait(timeout=10)
            for i in range(1, 16):
                events = [{"event_id": f"c{t}-{i}-{k}", "match_id": f"c{t}-{i}", "player_id": f"c{t}-p{k}",
                           "best_score": 10 * i + k, "score_version": i,
                           "completed_at": post_cutoff if k == 2 else pre_cutoff} for k in range(3)]
                response = client.post(f"/internal/v1/seasons/{season.slug}/scores:apply", {"events": events},
                                       format="json")
                assert response.status_code == 200, response.content
                answers.extend(zip(events, response.json()["results"], strict=True))
        except BaseException as exc:  # noqa: BLE001 (reported by the main thread)
            errors.append(exc)
        finally:
            connections.close_all()

    def close() -> None:
        try:
            started.wait(timeout=10)
            threading.Event().wait(0.01)
            season_transition(season=season, target=SeasonState.CLOSING, actor=SYSTEM)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=write, args=(t,)) for t in range(2)] + [threading.Thread(target=close)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
        assert not thread.is_alive()
    assert not errors, errors
    assert reload(season).state == SeasonState.CLOSING
    assert len(answers) == 2 * 15 * 3
    for event, result in answers:
        if event["completed_at"] == post_cutoff:
            assert (result["status"], result["reason"]) == ("rejected", "after_cutoff")
        else:
            assert result["status"] == "applied", result
    assert len(ledger_rows(ScoreEvent, season)) == len(answers)
    assert db_scores(season) == {f"c{t}-p{k}": 150 + k for t in range(2) for k in range(2)}
    assert not ledger_rows(LateResult, season)
