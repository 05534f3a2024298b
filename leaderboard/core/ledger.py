"""The ledger rules (docs/rules.md, Writes: per-event outcomes) as a pure function over one batch.

The database layer fetches what the batch needs (earlier events with the same ids, the
current score of each player involved), `batch_plan` decides every outcome in order, and
the database layer writes the plan in one statement. Keeping the decision here makes it
exact, testable against a brute-force model, and independent of the SQL dialect.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from leaderboard.core.events import KIND_CORRECTION, MAX_SCORE, ScoreEvent

APPLIED = "applied"
UNCHANGED = "unchanged"
STALE = "stale"
REJECTED = "rejected"
# Recorded but not applied: it waits for staff approval (a correction after the seal).
HELD = "held"
DUPLICATE = "duplicate"
CONFLICT = "conflict"
RECORDED_STATUSES = (APPLIED, UNCHANGED, STALE, REJECTED, HELD)
# The admission reason under which an event is held instead of refused: a correction
# that arrives once ingest is sealed never changes the board by itself; staff review it
# (who, when, evidence) and approve it through the two-person revocation flow.
HELD_AFTER_SEAL = "correction_after_seal"
# The reason a result is held when it would raise a player's score above a staff
# revocation the match service has not acknowledged: its absolute best may still count
# the revoked match. The match service acknowledges with a correction (any newer version).
HELD_REVOKED = "score_revoked"
ALL_STATUSES = RECORDED_STATUSES + (DUPLICATE, CONFLICT)
# A sum season's refusals (docs/rules.md, Board kinds): a correction naming no earlier
# result of its player, and an event whose sum would leave 0..max-score.
UNKNOWN_EVENT = "unknown_event"
OUT_OF_RANGE = "out_of_range"


@dataclass(frozen=True, slots=True)
class PlayerState:
    score: int
    score_version: int
    # When the player reached `score` (ms precision): moved by a result that raises the
    # score and by a correction, never by an equal score later. None: a row from before
    # reached_at was recorded. Left out of ==: a state is equal by score and version,
    # and whoever orders by reached_at compares it explicitly.
    reached_at: datetime | None = field(default=None, compare=False)
    # A staff revocation that lowered the score to this value (or a staff correction made
    # while one stood), not yet acknowledged by a correction from the match service:
    # until then, a result that would raise the score above it is held (HELD_REVOKED).
    # None: no revocation stands. Left out of == like reached_at.
    revoked_to: int | None = field(default=None, compare=False)
    # Hidden by staff (docs/rules.md, Hidden players): decides nothing here; the write
    # marks the player's changes hidden, so no board shows them. Left out of ==.
    hidden: bool = field(default=False, compare=False)


@dataclass(frozen=True, slots=True)
class RecordedEvent:
    """What the ledger remembers of an event id: enough to answer a retry exactly."""

    payload_hash: str
    status: str
    reason: str
    player_id: str
    score: int | None
    score_version: int | None
    pending_version: int | None


@dataclass(frozen=True, slots=True)
class Outcome:
    event_id: str
    status: str
    player_id: str
    score: int | None
    score_version: int | None
    pending_version: int | None
    reason: str = ""
    first_status: str | None = None

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"event_id": self.event_id, "status": self.status}
        if self.reason:
            out["reason"] = self.reason
        if self.first_status is not None:
            out["first_status"] = self.first_status
        out["player_id"] = self.player_id
        out["score"] = self.score
        out["score_version"] = self.score_version
        out["pending_version"] = self.pending_version
        return out


@dataclass(frozen=True, slots=True)
class LedgerRow:
    event: ScoreEvent
    payload_hash: str
    status: str
    reason: str
    score: int | None
    score_version: int | None
    pending_version: int | None


@dataclass(frozen=True, slots=True)
class Change:
    """ScoreChanged (docs/rules.md, The change stream); season and commit time are added when written."""

    player_id: str
    old_score: int | None
    new_score: int
    score_version: int
    event_id: str
    # Left out of == like PlayerState.reached_at.
    reached_at: datetime | None = field(default=None, compare=False)
    old_reached_at: datetime | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Counted:
    """A sum season's result as its player's score counts it now: its player, its points
    (as sent, or as its newest applied correction amended them) and that correction's
    score_version (0: never corrected)."""

    player_id: str
    points: int
    version: int


@dataclass(slots=True)
class BatchPlan:
    outcomes: list[Outcome] = field(default_factory=list)
    ledger_rows: list[LedgerRow] = field(default_factory=list)
    # The final state of each player whose version moved, one entry per player.
    player_states: dict[str, PlayerState] = field(default_factory=dict)
    changes: list[Change] = field(default_factory=list)
    conflicts: list[tuple[ScoreEvent, str]] = field(default_factory=list)


def batch_plan(
    *,
    events: list[ScoreEvent],
    recorded: Mapping[str, RecordedEvent],
    current: Mapping[str, PlayerState],
    rejection: Callable[[ScoreEvent], str | None],
    pending_version: int,
    digests: Sequence[str] | None = None,
    reached_orders: bool = False,
    staff: bool = False,
    latest: bool = False,
    summed: bool = False,
    counted: Mapping[str, Counted] | None = None,
    max_score: int | None = None,
    ascending: bool = False,
) -> BatchPlan:
    """Decide every event of a batch in order.

    `ascending`: the season's order is asc, a lower score is better (race times). Every
    "higher" below then reads "better": a `best` result keeps the lower of the two, a
    revocation is a correction to a worse (higher) score, and a result better than a
    standing revocation is held.

    `summed`: the season's mode is `sum`. A result adds its points to the player's score;
    a correction replaces the points of the result it `corrects` (found in `counted`, or
    earlier in the batch; else rejected `unknown_event`) when its score_version is newer
    than that result's last amendment (else `stale`); a staff correction names no result
    and sets the score. A score outside 0..`max_score` is rejected `out_of_range` and
    changes nothing. The player's score_version counts the events that were applied to
    them, so the change stream's versions still grow. No revocation hold: a sum's results
    are increments, which never carry a revoked match.

    `latest`: the season's mode is `latest` (core.season_options): a result with a newer
    score_version sets the score to its best_score even when lower, as a correction does
    (without a correction's revocation bookkeeping); an equal one keeps when the score
    was reached.

    `reached_orders`: the season orders ties by reached_at (first_reached), so a
    correction that moves only reached_at changes the board too.

    `staff`: the batch's corrections are staff's (the two-person revocation flow). One
    that lowers a score, or is applied while an earlier one stands, leaves the player's
    `revoked_to` at its score; a correction from the match service clears it (it has
    taken the revocation into its own best). Meanwhile a result that would raise the
    score above `revoked_to` is held for staff (HELD_REVOKED) and changes nothing.

    `recorded` holds earlier ledger rows for the batch's event ids, `current` the current
    state of the batch's players; neither is mutated. `digests`, when given, are the
    events' payload hashes, in order: the service computes them before it takes the
    partitions' locks, since hashing is a third of this function's time.
    """
    if digests is None:
        digests = [event.payload_hash() for event in events]
    elif len(digests) != len(events):
        raise ValueError("batch_plan needs one digest per event")
    plan = BatchPlan()
    seen: dict[str, RecordedEvent] = dict(recorded)
    state: dict[str, PlayerState] = dict(current)
    sums: dict[str, Counted] = dict(counted or {})
    better = int.__lt__ if ascending else int.__gt__

    for event, digest in zip(events, digests, strict=True):
        prior = seen.get(event.event_id)
        if prior is not None:
            if prior.payload_hash == digest:
                plan.outcomes.append(
                    Outcome(
                        event_id=event.event_id,
                        status=DUPLICATE,
                        first_status=prior.status,
                        reason=prior.reason,
                        player_id=prior.player_id,
                        score=prior.score,
                        score_version=prior.score_version,
                        pending_version=prior.pending_version,
                    )
                )
            else:
                plan.conflicts.append((event, digest))
                plan.outcomes.append(
                    Outcome(
                        event_id=event.event_id,
                        status=CONFLICT,
                        reason="event_id_reused_with_different_payload",
                        player_id=event.player_id,
                        score=None,
                        score_version=None,
                        pending_version=None,
                    )
                )
            continue

        before = state.get(event.player_id)
        if summed:
            _sum_decide(plan, event, digest, before, sums, seen, state, rejection=rejection,
                        pending_version=pending_version, max_score=max_score)
            continue
        status, reason, pending = _decide(event, before, rejection, pending_version)
        if (status == APPLIED and event.kind != KIND_CORRECTION and before is not None
                and before.revoked_to is not None and better(event.best_score, before.revoked_to)):
            status, reason, pending = HELD, HELD_REVOKED, None
        after = before
        if status in (APPLIED, UNCHANGED):
            new_reached: datetime | None = event.reached
            new_score = event.best_score
            revoked_to = before.revoked_to if before is not None else None
            if event.kind != KIND_CORRECTION and before is not None and (
                    before.score == event.best_score or (better(before.score, event.best_score) and not latest)):
                # An equal result keeps the score and when it was reached; so does a
                # lower one but in a `latest` season.
                new_score, new_reached = before.score, before.reached_at
            elif event.kind == KIND_CORRECTION and not staff:
                revoked_to = None
            elif event.kind == KIND_CORRECTION and (
                    revoked_to is not None or (before is not None and better(before.score, new_score))):
                revoked_to = new_score
            after = PlayerState(score=new_score, score_version=event.score_version, reached_at=new_reached,
                                revoked_to=revoked_to)
            state[event.player_id] = after
            plan.player_states[event.player_id] = after
            if (before is None or before.score != new_score
                    or (reached_orders and before.reached_at != new_reached)):
                plan.changes.append(
                    Change(
                        player_id=event.player_id,
                        old_score=before.score if before is not None else None,
                        new_score=new_score,
                        score_version=event.score_version,
                        event_id=event.event_id,
                        reached_at=new_reached,
                        old_reached_at=before.reached_at if before is not None else None,
                    )
                )
            else:
                pending = None
                if status == APPLIED and event.kind != KIND_CORRECTION:
                    status = UNCHANGED

        _record(plan, seen, event, digest, status, reason, after, pending)
    return plan


def _record(plan: BatchPlan, seen: dict[str, RecordedEvent], event: ScoreEvent, digest: str, status: str,
            reason: str, after: PlayerState | None, pending: int | None) -> None:
    """The event's ledger row, its outcome, and what a later event of the batch with the
    same id sees of it."""
    row = LedgerRow(
        event=event,
        payload_hash=digest,
        status=status,
        reason=reason,
        score=after.score if after is not None else None,
        score_version=after.score_version if after is not None else None,
        pending_version=pending,
    )
    plan.ledger_rows.append(row)
    seen[event.event_id] = RecordedEvent(
        payload_hash=digest,
        status=status,
        reason=reason,
        player_id=event.player_id,
        score=row.score,
        score_version=row.score_version,
        pending_version=pending,
    )
    plan.outcomes.append(
        Outcome(
            event_id=event.event_id,
            status=status,
            reason=reason,
            player_id=event.player_id,
            score=row.score,
            score_version=row.score_version,
            pending_version=pending,
        )
    )


def _sum_decide(plan: BatchPlan, event: ScoreEvent, digest: str, before: PlayerState | None,
                sums: dict[str, Counted], seen: dict[str, RecordedEvent], state: dict[str, PlayerState], *,
                rejection: Callable[[ScoreEvent], str | None], pending_version: int, max_score: int | None,
                ) -> None:
    """One event of a sum season (batch_plan's `summed`), recorded into the plan."""
    score = before.score if before is not None else 0
    version = before.score_version if before is not None else 0
    why = rejection(event)
    status, reason = APPLIED, ""
    target: Counted | None = None
    if why == HELD_AFTER_SEAL:
        status, reason = HELD, why
    elif why is not None:
        status, reason = REJECTED, why
    elif event.kind != KIND_CORRECTION:
        new_score = score + (event.points or 0)
    elif event.corrects is None:
        # A staff correction (the revocation flow): the score staff set, like any mode's.
        new_score = event.best_score
        if event.score_version <= version:
            status, reason = STALE, "score_version_not_newer"
    else:
        target = sums.get(event.corrects)
        if target is None or target.player_id != event.player_id:
            status, reason = REJECTED, UNKNOWN_EVENT
        elif event.score_version <= target.version:
            status, reason = STALE, "score_version_not_newer"
        else:
            new_score = score - target.points + (event.points or 0)
    if status == APPLIED and not 0 <= new_score <= (max_score if max_score is not None else MAX_SCORE):
        status, reason = REJECTED, OUT_OF_RANGE
    if status != APPLIED:
        _record(plan, seen, event, digest, status, reason, before, None)
        return
    if event.kind != KIND_CORRECTION:
        sums[event.event_id] = Counted(player_id=event.player_id, points=event.points or 0, version=0)
    elif target is not None:
        sums[event.corrects or ""] = Counted(player_id=event.player_id, points=event.points or 0,
                                             version=event.score_version)
    # A sum is reached when it last moved: an amendment that leaves it as it was keeps
    # the player's place among equal sums.
    moved = before is None or new_score != before.score
    reached = event.reached if moved or before is None else before.reached_at
    after = PlayerState(score=new_score, score_version=version + 1, reached_at=reached)
    state[event.player_id] = after
    plan.player_states[event.player_id] = after
    pending: int | None = pending_version
    if moved:
        plan.changes.append(Change(
            player_id=event.player_id, old_score=before.score if before is not None else None,
            new_score=new_score, score_version=after.score_version, event_id=event.event_id,
            reached_at=reached, old_reached_at=before.reached_at if before is not None else None))
    else:
        pending = None
        if event.kind != KIND_CORRECTION:
            status = UNCHANGED
    _record(plan, seen, event, digest, status, reason, after, pending)


def _decide(
    event: ScoreEvent,
    before: PlayerState | None,
    rejection: Callable[[ScoreEvent], str | None],
    pending_version: int,
) -> tuple[str, str, int | None]:
    why = rejection(event)
    if why == HELD_AFTER_SEAL:
        return HELD, why, None
    if why is not None:
        return REJECTED, why, None
    if before is not None and event.score_version <= before.score_version:
        return STALE, "score_version_not_newer", None
    return APPLIED, "", pending_version
