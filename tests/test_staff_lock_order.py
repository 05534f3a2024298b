"""The staff services take their row locks in one order (seasons/staff/): the
revocation, then its dispute, then its late result, then the season's write lock, and the
audit chain's head last. Two actions on one dispute then queue behind each other instead
of deadlocking. Real PostgreSQL, real threads, no seam replaced."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, connections, transaction

from seasons.models import Dispute, DisputeNote, ScoreRevocation, Season
from seasons.staff.disputes.services import _dispute_locked, dispute_file, dispute_note_add
from seasons.staff.revocations.services import (
    score_revocation_approve,
    score_revocation_propose,
    score_revocation_reject,
)
from tests.support import Events, post_ok
from tests.support.staff_console import actor_of

pytest_plugins = ["tests.support.staff_fixtures"]
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]
Post = Callable[..., Any]


def _lock_waiters() -> int:
    """Backends of this database waiting for a row lock right now."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND wait_event_type = 'Lock'")
        return int(cursor.fetchone()[0])


def _note_while_decision_runs(dispute: Dispute, decide: Callable[[], Any], author: Any) -> dict[str, Any]:
    """A note on the dispute whose transaction has taken the dispute's lock (its first step)
    when a decision on the dispute's revocation starts; the note goes on (its audit row)
    once the decision is blocked on a lock. Returns what each side raised or returned."""
    outcome: dict[str, Any] = {}
    note_locked, decision_started = threading.Event(), threading.Event()

    def decision() -> None:
        note_locked.wait(10)
        decision_started.set()
        try:
            outcome["decision"] = decide()
        except Exception as exc:  # noqa: BLE001 - the finding
            outcome["decision"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=decision, name="decision")
    thread.start()
    try:
        with transaction.atomic():
            _dispute_locked(dispute)
            note_locked.set()
            decision_started.wait(10)
            deadline = time.monotonic() + 10
            while _lock_waiters() == 0:
                assert time.monotonic() < deadline, "the decision never waited for a lock"
                time.sleep(0.02)
            outcome["note"] = dispute_note_add(dispute=dispute, text="evidence attached", actor=actor_of(author))
    except Exception as exc:  # noqa: BLE001
        outcome["note"] = exc
    finally:
        thread.join(30)
    return outcome


@pytest.fixture
def disputed(season_factory: Callable[..., Season], post_scores: Post,
             make_staff: Callable[..., Any]) -> tuple[Dispute, ScoreRevocation, dict[str, Any]]:
    season = season_factory(slug="locks")
    events = Events("locks", "2026-11-15T12:00:00Z")
    post_ok(post_scores, season, [events.result("alice", 900)])
    people = {"reviewer": make_staff("reviewer"), "approver": make_staff("approver")}
    dispute, _ = dispute_file(season=season, player_id="alice", summary="cheated", actor=actor_of(people["reviewer"]))
    revocation = score_revocation_propose(season=season, player_id="alice", new_score=100, reason="cheating proven",
                                          actor=actor_of(people["reviewer"]), dispute=dispute)
    return dispute, revocation, people


def test_an_approval_and_a_note_on_the_same_dispute_queue_instead_of_deadlocking(
    disputed: tuple[Dispute, ScoreRevocation, dict[str, Any]],
) -> None:
    dispute, revocation, people = disputed
    outcome = _note_while_decision_runs(
        dispute, lambda: score_revocation_approve(revocation=revocation, actor=actor_of(people["approver"])),
        people["reviewer"])
    assert isinstance(outcome["note"], DisputeNote), outcome
    assert not isinstance(outcome["decision"], Exception), outcome
    assert outcome["decision"].applied
    dispute.refresh_from_db()
    assert dispute.status == Dispute.Status.RESOLVED


def test_a_rejection_and_a_note_on_the_same_dispute_queue_instead_of_deadlocking(
    disputed: tuple[Dispute, ScoreRevocation, dict[str, Any]],
) -> None:
    dispute, revocation, people = disputed
    outcome = _note_while_decision_runs(
        dispute, lambda: score_revocation_reject(revocation=revocation, actor=actor_of(people["approver"]),
                                                 reason="not proven"),
        people["reviewer"])
    assert isinstance(outcome["note"], DisputeNote), outcome
    assert not isinstance(outcome["decision"], Exception), outcome
    dispute.refresh_from_db()
    assert dispute.status == Dispute.Status.OPEN
