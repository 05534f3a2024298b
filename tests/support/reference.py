"""A brute-force reference model of the score ledger, written from docs/rules.md, Writes: per-event outcomes.

Deliberately naive: one event at a time, plain dicts, no hashing, no batching. The
property tests run the real code (the pure `batch_plan`, and `score_events_apply` on a
real database) in random batch splits and compare against this model event by event.

Where the contract is silent, the model pins the behaviour the service has chosen:
- admission (cutoff, season state) is decided before staleness: an event the season does
  not admit is `rejected`, whatever its version;
- `stale` carries reason "score_version_not_newer" and reports the player's current score;
- `pending_version` is the next leaderboard version when the score changed, else None
  (an `unchanged` result, and a correction to the same score, have nothing to publish);
- a staff correction (the revocation flow) that lowers a score, or is applied while one
  stands, stands until a correction from the match service: meanwhile a result that
  would raise the score above it is `held` ("score_revoked") and changes nothing.

Also the hypothesis strategy that produces the random event scripts both tests use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import strategies as st

from leaderboard.core.events import ScoreEvent
from leaderboard.core.ranking import Entry

CONFLICT_REASON = "event_id_reused_with_different_payload"
STALE_REASON = "score_version_not_newer"
REVOKED_REASON = "score_revoked"

Event = dict[str, Any]  # the contract's event fields; completed_at is an aware datetime


def effective_reached(event: Event) -> datetime:
    """reached_at as the ledger keeps it: as sent, else completed_at, to the millisecond."""
    reached = event.get("reached_at") or event["completed_at"]
    return reached.astimezone(UTC).replace(microsecond=reached.microsecond // 1000 * 1000)


def payload_key(event: Event) -> tuple[Any, ...]:
    """What "same payload" means: every field, completed_at compared as an instant, and
    reached_at only when it differs from its default (completed_at, to the millisecond)."""
    reached = effective_reached(event)
    default = effective_reached({"completed_at": event["completed_at"]})
    key: tuple[Any, ...] = (
        event["event_id"],
        event["match_id"],
        event["player_id"],
        event["best_score"],
        event["score_version"],
        event["completed_at"].astimezone(UTC),
        event.get("kind", "result"),
        event.get("reason") or "",
    )
    key = key if reached == default else (*key, reached)
    # A sum season's fields, named so they never collide with the ones above.
    if "points" in event:
        key = (*key, ("points", event["points"]))
    if event.get("corrects") is not None:
        key = (*key, ("corrects", event["corrects"]))
    return key


def outcome_dict(
    *,
    event_id: str,
    status: str,
    player_id: str,
    score: int | None,
    score_version: int | None,
    pending_version: int | None,
    reason: str = "",
    first_status: str | None = None,
) -> dict[str, Any]:
    """One entry of the response's "results" list (docs/api.md, Writes)."""
    out: dict[str, Any] = {"event_id": event_id, "status": status}
    if reason:
        out["reason"] = reason
    if first_status is not None:
        out["first_status"] = first_status
    out.update(
        player_id=player_id, score=score, score_version=score_version, pending_version=pending_version
    )
    return out


@dataclass
class ReferenceLedger:
    rejection: Callable[[Event], str | None]
    players: dict[str, tuple[int, int]] = field(default_factory=dict)  # player -> (score, version)
    # player -> when they reached their score: set by a higher result or a correction.
    reached: dict[str, datetime] = field(default_factory=dict)
    # A first_reached season: a correction moving only reached_at is a change too.
    reached_orders: bool = False
    ledger: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = field(default_factory=dict)
    # ScoreChanged: (player_id, old_score, new_score, score_version, event_id)
    changes: list[tuple[str, int | None, int, int, str]] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    # player -> the score a standing staff revocation set
    revoked: dict[str, int] = field(default_factory=dict)
    # A `latest` season: a newer result sets the score even when lower.
    latest: bool = False
    # A `sum` season: results add points, a correction replaces one result's points.
    summed: bool = False
    max_score: int = 1_000_000
    # An `asc` season: a lower score is better (race times).
    ascending: bool = False

    def better(self, a: int, b: int) -> bool:
        return a < b if self.ascending else a > b
    # A sum season's accepted results: event_id -> (player, points counted, amendment version)
    counted: dict[str, tuple[str, int, int]] = field(default_factory=dict)

    def apply(self, event: Event, *, published_version: int, staff: bool = False) -> dict[str, Any]:
        event_id = event["event_id"]
        player_id = event["player_id"]
        key = payload_key(event)

        if event_id in self.ledger:
            first_key, first = self.ledger[event_id]
            if first_key == key:
                return outcome_dict(
                    event_id=event_id,
                    status="duplicate",
                    first_status=first["status"],
                    reason=first.get("reason", ""),
                    player_id=first["player_id"],
                    score=first["score"],
                    score_version=first["score_version"],
                    pending_version=first["pending_version"],
                )
            self.conflicts.append(event_id)
            return outcome_dict(
                event_id=event_id, status="conflict", reason=CONFLICT_REASON, player_id=player_id,
                score=None, score_version=None, pending_version=None,
            )

        current = self.players.get(player_id)
        current_score = current[0] if current else None
        current_version = current[1] if current else None
        if self.summed:
            outcome = self._sum_apply(event, current, published_version)
            self.ledger[event_id] = (key, outcome)
            return outcome
        why = self.rejection(event)
        if why is not None:
            outcome = outcome_dict(
                event_id=event_id, status="rejected", reason=why, player_id=player_id,
                score=current_score, score_version=current_version, pending_version=None,
            )
        elif current is not None and event["score_version"] <= current[1]:
            outcome = outcome_dict(
                event_id=event_id, status="stale", reason=STALE_REASON, player_id=player_id,
                score=current_score, score_version=current_version, pending_version=None,
            )
        elif (event.get("kind", "result") == "result" and player_id in self.revoked
              and self.better(event["best_score"], self.revoked[player_id])):
            outcome = outcome_dict(
                event_id=event_id, status="held", reason=REVOKED_REASON, player_id=player_id,
                score=current_score, score_version=current_version, pending_version=None,
            )
        else:
            if event.get("kind", "result") == "correction":
                new_score = event["best_score"]
                status = "applied"
                if not staff:
                    self.revoked.pop(player_id, None)
                elif player_id in self.revoked or (current is not None and self.better(current[0], new_score)):
                    self.revoked[player_id] = new_score
            else:
                new_score = (event["best_score"] if current is None or self.latest
                             else (min if self.ascending else max)(current[0], event["best_score"]))
                status = "applied" if current is None or new_score != current[0] else "unchanged"
            reached = self.reached.get(player_id)
            if (event.get("kind", "result") == "correction" or current is None or self.better(new_score, current[0])
                    or (self.latest and new_score != current[0])):
                reached = effective_reached(event)
            changed = (current is None or new_score != current[0]
                       or (self.reached_orders and reached != self.reached.get(player_id)))
            self.players[player_id] = (new_score, event["score_version"])
            assert reached is not None
            self.reached[player_id] = reached
            if changed:
                self.changes.append(
                    (player_id, current_score, new_score, event["score_version"], event_id)
                )
            outcome = outcome_dict(
                event_id=event_id, status=status, player_id=player_id, score=new_score,
                score_version=event["score_version"],
                pending_version=published_version + 1 if changed else None,
            )
        self.ledger[event_id] = (key, outcome)
        return outcome

    def _sum_apply(self, event: Event, current: tuple[int, int] | None, published_version: int) -> dict[str, Any]:
        """docs/rules.md, Board kinds, `sum`, one event at a time."""
        event_id, player_id = event["event_id"], event["player_id"]
        score, version = current if current is not None else (0, 0)

        def refused(status: str, reason: str) -> dict[str, Any]:
            return outcome_dict(event_id=event_id, status=status, reason=reason, player_id=player_id,
                                score=current[0] if current else None, score_version=current[1] if current else None,
                                pending_version=None)

        why = self.rejection(event)
        if why is not None:
            return refused("rejected", why)
        correction = event.get("kind", "result") == "correction"
        if not correction:
            new_score = score + event["points"]
        elif event.get("corrects") is None:
            # staff's: sets the score
            if event["score_version"] <= version:
                return refused("stale", STALE_REASON)
            new_score = event["best_score"]
        else:
            target = self.counted.get(event["corrects"])
            if target is None or target[0] != player_id:
                return refused("rejected", "unknown_event")
            if event["score_version"] <= target[2]:
                return refused("stale", STALE_REASON)
            new_score = score - target[1] + event["points"]
        if not 0 <= new_score <= self.max_score:
            return refused("rejected", "out_of_range")
        if not correction:
            self.counted[event_id] = (player_id, event["points"], 0)
        elif event.get("corrects") is not None:
            self.counted[event["corrects"]] = (player_id, event["points"], event["score_version"])
        changed = current is None or new_score != score
        if changed:
            self.reached[player_id] = effective_reached(event)
            self.changes.append((player_id, current[0] if current else None, new_score, version + 1, event_id))
        self.players[player_id] = (new_score, version + 1)
        status = "unchanged" if not changed and not correction else "applied"
        return outcome_dict(event_id=event_id, status=status, player_id=player_id, score=new_score,
                            score_version=version + 1, pending_version=published_version + 1 if changed else None)


def season_rejection(*, starts_at: datetime, cutoff: datetime) -> Callable[[Event], str | None]:
    """The admission rule of an OPEN season (docs/rules.md, Writes and Season lifecycle)."""

    def rejection(event: Event) -> str | None:
        if event["completed_at"] > cutoff:
            return "after_cutoff"
        if event["completed_at"] < starts_at:
            return "before_season_start"
        return None

    return rejection


def as_score_event(event: Event) -> ScoreEvent:
    return ScoreEvent(
        event_id=event["event_id"],
        match_id=event["match_id"],
        player_id=event["player_id"],
        best_score=event["best_score"],
        score_version=event["score_version"],
        completed_at=event["completed_at"],
        kind=event.get("kind", "result"),
        reason=event.get("reason") or "",
        points=event.get("points"),
        corrects=event.get("corrects"),
    )


def as_json(event: Event) -> dict[str, Any]:
    """The event as the match service sends it over HTTP (completed_at in its own offset)."""
    out = dict(event)
    out["completed_at"] = event["completed_at"].isoformat()
    return out


# --- Random event scripts -------------------------------------------------------------

PLAYERS = ("p1", "p2", "p3", "p.4:x_Y-z")
OFFSETS = (UTC, timezone(timedelta(hours=2)), timezone(-timedelta(hours=5, minutes=30)))
# Symbolic times, made concrete against a season's start and cutoff.
TIME_SLOTS = ("in", "in", "in", "in_late", "at_cutoff", "after_cutoff", "before_start")


def slot_time(slot: str, *, starts_at: datetime, cutoff: datetime) -> datetime:
    return {
        "in": starts_at + timedelta(days=1),
        "in_late": starts_at + timedelta(days=2, seconds=7),
        "at_cutoff": cutoff,
        "after_cutoff": cutoff + timedelta(seconds=1),
        "before_start": starts_at - timedelta(microseconds=1),
    }[slot]


@dataclass
class Script:
    batches: list[list[Event]]
    # The season's published version while each batch is applied (non-decreasing).
    published: list[int]
    # Per batch: its corrections are staff's (the revocation flow); none when empty.
    staff: list[bool] = field(default_factory=list)

    def staff_of(self, batch: int) -> bool:
        return bool(self.staff) and self.staff[batch]

    @property
    def events(self) -> list[Event]:
        return [event for batch in self.batches for event in batch]


@st.composite
def event_scripts(draw: Any, *, starts_at: datetime, cutoff: datetime, max_events: int = 30,
                  with_staff: bool = False) -> Script:
    """Interleavings of results, corrections, exact duplicates, conflicting retries
    (same event_id, another payload), stale versions and rejected times, in random batches;
    `with_staff`: some batches are staff's (their corrections are revocations)."""
    count = draw(st.integers(min_value=1, max_value=max_events))
    events: list[Event] = []
    for i in range(count):
        action = draw(st.sampled_from(("new", "new", "new", "new", "duplicate", "conflict")))
        if action == "new" or not events:
            kind = draw(st.sampled_from(("result", "result", "result", "correction")))
            reason = draw(st.sampled_from(("revoked", "dispute #12"))) if kind == "correction" else ""
            event: Event = {
                "event_id": f"e{i}",
                "match_id": f"m{draw(st.integers(0, 3))}",
                "player_id": draw(st.sampled_from(PLAYERS)),
                # a narrow range so ties, max() and equal scores happen often
                "best_score": draw(st.one_of(st.integers(0, 12), st.sampled_from((0, 1_000_000)))),
                # With staff batches, versions mostly grow, so that results come after a
                # revocation often enough to meet it.
                "score_version": max(1, i + draw(st.integers(-3, 1))) if with_staff else draw(st.integers(1, 8)),
                "completed_at": slot_time(
                    draw(st.sampled_from(TIME_SLOTS)), starts_at=starts_at, cutoff=cutoff
                ).astimezone(draw(st.sampled_from(OFFSETS))),
                "kind": kind,
                "reason": reason,
            }
        elif action == "duplicate":
            # The exact same payload, possibly written in another offset (same instant).
            event = dict(draw(st.sampled_from(events)))
            event["completed_at"] = event["completed_at"].astimezone(draw(st.sampled_from(OFFSETS)))
        else:
            event = dict(draw(st.sampled_from(events)))
            change = draw(
                st.sampled_from(("best_score", "match_id", "player_id", "score_version", "kind", "time"))
            )
            if change == "best_score":
                event["best_score"] = (event["best_score"] + 1) % 13
            elif change == "match_id":
                event["match_id"] = event["match_id"] + "-retry"
            elif change == "player_id":
                others = [p for p in PLAYERS if p != event["player_id"]]
                event["player_id"] = draw(st.sampled_from(others))
            elif change == "score_version":
                event["score_version"] = event["score_version"] + 1
            elif change == "kind":
                if event["kind"] == "result":
                    event.update(kind="correction", reason="changed to a correction")
                else:
                    event.update(kind="result", reason="")
            else:
                event["completed_at"] = event["completed_at"] + timedelta(seconds=1)
        events.append(event)

    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, count - 1)), max_size=5))))
    bounds = [0, *[c for c in cuts if 0 < c < count], count]
    batches = [events[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    steps = draw(st.lists(st.integers(0, 2), min_size=len(batches), max_size=len(batches)))
    published, version = [], draw(st.integers(0, 5))
    for step in steps:
        version += step
        published.append(version)
    staff = draw(st.lists(st.sampled_from((False, False, False, True)), min_size=len(batches),
                          max_size=len(batches))) if with_staff else []
    return Script(batches=batches, published=published, staff=staff)


@st.composite
def sum_event_scripts(draw: Any, *, starts_at: datetime, cutoff: datetime, max_events: int = 30) -> Script:
    """A sum season's scripts: results with points (negative ones and ones that overflow
    the range too), corrections of earlier results in any order and version (of another
    player's, of unknown ids, of corrections), staff corrections that set a score, exact
    resends and conflicting ones, in random batches."""
    count = draw(st.integers(min_value=1, max_value=max_events))
    events: list[Event] = []
    for i in range(count):
        action = draw(st.sampled_from(("result", "result", "result", "correction", "correction", "set",
                                       "duplicate", "conflict")))
        time = slot_time(draw(st.sampled_from(TIME_SLOTS)), starts_at=starts_at, cutoff=cutoff)
        base: Event = {"event_id": f"e{i}", "match_id": f"m{draw(st.integers(0, 3))}",
                       "player_id": draw(st.sampled_from(PLAYERS)),
                       "completed_at": time.astimezone(draw(st.sampled_from(OFFSETS)))}
        points = draw(st.one_of(st.integers(-6, 12), st.sampled_from((999_990, -1_000_000))))
        if action in ("duplicate", "conflict") and events:
            event = dict(draw(st.sampled_from(events)))
            if action == "conflict":
                event["match_id"] = event["match_id"] + "-retry"
        elif action == "correction" and events:
            target = draw(st.sampled_from(events))
            # mostly the same player's result; sometimes another's, or an id never sent
            corrects = draw(st.sampled_from((target["event_id"],) * 4 + ("nobody",)))
            player = draw(st.sampled_from((target["player_id"],) * 4 + PLAYERS))
            event = {**base, "player_id": player, "kind": "correction", "reason": "recount", "points": points,
                     "corrects": corrects, "score_version": draw(st.integers(1, 4))}
        elif action == "set":
            event = {**base, "kind": "correction", "reason": "revoked", "best_score": draw(st.integers(0, 20)),
                     "points": 0, "score_version": draw(st.integers(1, 12))}
        else:
            event = {**base, "kind": "result", "reason": "", "points": points, "score_version": 0}
        event.setdefault("best_score", 0)
        event.setdefault("score_version", 0)
        events.append(event)
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, count - 1)), max_size=5))))
    bounds = [0, *[c for c in cuts if 0 < c < count], count]
    batches = [events[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    published = sorted(draw(st.lists(st.integers(0, 6), min_size=len(batches), max_size=len(batches))))
    return Script(batches=batches, published=published)


def reference_run(
    script: Script, rejection: Callable[[Event], str | None], *, latest: bool = False, summed: bool = False,
    ascending: bool = False, max_score: int = 1_000_000,
) -> tuple[ReferenceLedger, list[dict[str, Any]]]:
    """Apply a script to the reference model strictly one event at a time; `latest`,
    `summed`: in a season of that mode; `ascending`: of order asc; `max_score`: its range's top."""
    model = ReferenceLedger(rejection=rejection, latest=latest, summed=summed, ascending=ascending,
                            max_score=max_score)
    outcomes = [
        model.apply(event, published_version=published, staff=script.staff_of(i))
        for i, (batch, published) in enumerate(zip(script.batches, script.published, strict=True))
        for event in batch
    ]
    return model, outcomes


def answer_entry(entry: Entry | dict[str, Any], *, tier: str | None = None, display_name: str | None = None,
                 country: str | None = None) -> dict[str, Any]:
    """An entry as a read answer gives it: the model's entry with the player's name and
    country (null when unset) and the tier of its rank (null in a season without tiers)."""
    out = dict(entry.as_dict() if isinstance(entry, Entry) else entry)
    return {**out, "display_name": display_name, "country": country, "tier": tier}
