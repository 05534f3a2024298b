"""Score events as the trusted match service sends them (docs/api.md, Writes), and their validation.

Hand-written rather than a DRF serializer: a batch of 1,000 events is validated on every
write and a serializer costs ~40x more per event. Errors are keyed by JSON path
(`events[3].best_score`) so the caller can fix exactly what is wrong.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeGuard

from leaderboard.core.buckets import MAX_SCORE, MAX_SCORE_LIMIT, MIN_SCORE
from leaderboard.core.errors import DomainError
from leaderboard.core.season_options import MODE_BEST, MODE_SUM
from leaderboard.core.tiebreak import truncate_ms

MAX_BATCH = 1000
MAX_ID_LENGTH = 64
MAX_REASON_LENGTH = 500
# The largest integer a PostgreSQL bigint (and orjson) holds: the bound of every version.
BIGINT_MAX = 2**63 - 1
MAX_SCORE_VERSION = BIGINT_MAX

KIND_RESULT = "result"
KIND_CORRECTION = "correction"
KINDS = (KIND_RESULT, KIND_CORRECTION)

# The public id rule: player ids and season ids (a season slug is a subset of it). An id
# outside it names nothing: reads answer 404, writes 400, and it never reaches a query
# (PostgreSQL text refuses NUL) or a Redis key.
ID_RE = re.compile(r"[A-Za-z0-9_.:\-]{1,64}")
ID_RULE = "1..64 characters from [A-Za-z0-9_.:-]"
# Unicode's control characters (category Cc): C0, DEL and C1 (U+0080..U+009F, e.g. NEL).
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# RFC 3339 date-time with a mandatory offset ("Z" or +hh:mm); fromisoformat alone would
# also take naive times and week dates.
_RFC3339_RE = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})"
)

# The instants a date-time may name: anything else is a typo or a probe, refused as invalid.
EARLIEST_INSTANT = datetime(1970, 1, 1, tzinfo=UTC)
LATEST_INSTANT = datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)

# The bound of a sum event's points either way: no sum can move by more and stay in range.
MAX_POINTS = MAX_SCORE_LIMIT

REQUIRED_FIELDS = ("event_id", "match_id", "player_id", "best_score", "score_version", "completed_at")
OPTIONAL_FIELDS = ("kind", "reason", "reached_at")
ALLOWED_FIELDS = frozenset(REQUIRED_FIELDS + OPTIONAL_FIELDS)
# A sum season's events (docs/rules.md, Board kinds): points instead of best_score; a
# correction names the result it amends (corrects) and versions its amendments.
SUM_REQUIRED_FIELDS = ("event_id", "match_id", "player_id", "points", "completed_at")
SUM_ALLOWED_FIELDS = frozenset(SUM_REQUIRED_FIELDS + OPTIONAL_FIELDS + ("score_version", "corrects"))


@dataclass(frozen=True, slots=True)
class ScoreEvent:
    event_id: str
    match_id: str
    player_id: str
    best_score: int
    score_version: int
    completed_at: datetime
    kind: str = KIND_RESULT
    reason: str = ""
    # When the player reached best_score, to the millisecond (truncated); None: not sent,
    # which means completed_at (docs/rules.md, Ties decided by who got there first).
    reached_at: datetime | None = None
    # A sum season's event: the points it adds (a result) or the amended points of the
    # result named by `corrects` (a correction); best_score is then 0 and unused. A staff
    # correction in a sum season names no result: it sets the score to best_score.
    points: int | None = None
    corrects: str | None = None

    @property
    def reached(self) -> datetime:
        """The effective reached_at: as sent, else completed_at, both to the millisecond."""
        return self.reached_at if self.reached_at is not None else truncate_ms(self.completed_at)

    def payload_hash(self) -> str:
        """SHA-256 of the canonical payload: what decides duplicate vs conflict.

        completed_at is normalised to UTC, so the same instant written with another
        offset is the same payload. reached_at counts only when it differs from its
        default: an event without it keeps the hash it always had, and a retry that
        spells the default out (or differs below the millisecond) is a duplicate.
        """
        fields = [
            self.event_id,
            self.match_id,
            self.player_id,
            str(self.best_score),
            str(self.score_version),
            self.completed_at.astimezone(UTC).isoformat(timespec="microseconds"),
            self.kind,
            self.reason,
        ]
        if self.reached_at is not None and self.reached_at != truncate_ms(self.completed_at):
            fields.append(self.reached_at.astimezone(UTC).isoformat(timespec="milliseconds"))
        # Named, so no sum event hashes like a best one, and a best event keeps its hash.
        if self.points is not None:
            fields.append(f"points={self.points}")
        if self.corrects is not None:
            fields.append(f"corrects={self.corrects}")
        return hashlib.sha256("\x1f".join(fields).encode()).hexdigest()


class EventValidationError(DomainError):
    code = "validation_error"

    def __init__(self, errors: dict[str, list[str]]):
        super().__init__("invalid score events", extra={"fields": errors})
        self.errors = errors


class BatchTooLarge(DomainError):
    code = "payload_too_large"
    status = 413

    def __init__(self, size: int):
        super().__init__(f"a batch holds at most {MAX_BATCH} events, got {size}")
        self.size = size


def _is_int(value: Any) -> TypeGuard[int]:
    # bool is an int subclass in Python; JSON true must not pass as score 1.
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(value: Any, *, low: int, high: int) -> str | None:
    """None for an integer in low..high, else what is wrong with it. A number out of the
    range is told so with the range, not called "not an integer": orjson reads a JSON
    integer beyond 64 bits (2**70) as a float, and it is still an integer to the sender."""
    if _is_int(value):
        if low <= value <= high:
            return None
    elif not (isinstance(value, float) and (value.is_integer() or math.isinf(value)) and not low <= value <= high):
        return f"must be an integer in {low}..{high}"
    bound = " (the largest 64-bit integer)" if high == BIGINT_MAX else ""
    return f"out of range: must be in {low}..{high}{bound}"


def _check_text_id(value: Any) -> str | None:
    if not isinstance(value, str):
        return "must be a string"
    if not 1 <= len(value) <= MAX_ID_LENGTH:
        return f"must be 1..{MAX_ID_LENGTH} characters"
    if _CONTROL_RE.search(value):
        return "must not contain control characters"
    return None


def id_is_valid(value: Any) -> bool:
    return isinstance(value, str) and ID_RE.fullmatch(value) is not None


def check_player_id(value: Any) -> str | None:
    if not isinstance(value, str):
        return "must be a string"
    if not ID_RE.fullmatch(value):
        return f"must be {ID_RULE}"
    return None


def parse_rfc3339(value: Any) -> datetime | None:
    if not isinstance(value, str) or not _RFC3339_RE.fullmatch(value):
        return None
    text = value.replace("z", "Z").replace("t", "T")
    # Python < 3.11 parity and >6 fractional digits: trim to microseconds.
    match = re.search(r"\.(\d+)", text)
    if match and len(match.group(1)) > 6:
        text = text[: match.start(1) + 6] + text[match.end(1) :]
    try:
        parsed = datetime.fromisoformat(text.replace(" ", "T"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return None
    # Year 1 at +01:00 or 9999-12-31 at -01:00 is no instant Python can hold in UTC: the
    # payload hash would fail (OverflowError) long after validation.
    try:
        instant = parsed.astimezone(UTC)
    except OverflowError:
        return None
    return parsed if EARLIEST_INSTANT <= instant <= LATEST_INSTANT else None


_INSTANT_RULE = ("must be an RFC 3339 date-time with an offset between 1970-01-01T00:00:00Z and "
                 "9999-12-31T23:59:59Z, e.g. 2026-01-31T18:00:00Z")


def _parse_one(raw: Any, path: str, errors: dict[str, list[str]], *, mode: str, max_score: int,
               ) -> ScoreEvent | None:
    if not isinstance(raw, dict):
        errors[path or "body"] = ["must be a JSON object"]
        return None
    prefix = f"{path}." if path else ""
    start = len(errors)
    summed = mode == MODE_SUM

    def fail(field: str, message: str) -> None:
        errors.setdefault(prefix + field, []).append(message)

    for field in raw.keys() - (SUM_ALLOWED_FIELDS if summed else ALLOWED_FIELDS):
        if field == "best_score":
            fail(field, "unknown field: a sum season's events carry points, not best_score")
        elif field in ("points", "corrects"):
            fail(str(field), f"unknown field: only a sum season's events carry it (this season's mode is {mode})")
        else:
            fail(str(field), "unknown field")
    for field in SUM_REQUIRED_FIELDS if summed else REQUIRED_FIELDS:
        if field not in raw:
            fail(field, "this field is required")

    for field in ("event_id", "match_id"):
        if field in raw and (problem := _check_text_id(raw[field])):
            fail(field, problem)
    if "player_id" in raw and (problem := check_player_id(raw["player_id"])):
        fail("player_id", problem)

    score = raw.get("best_score", 0)
    if "best_score" in raw and not summed and (problem := check_int(score, low=MIN_SCORE, high=max_score)):
        fail("best_score", problem)
    points = raw.get("points")
    if "points" in raw and summed and (problem := check_int(points, low=-MAX_POINTS, high=MAX_POINTS)):
        fail("points", problem)
    # A sum result carries no version (its points add up whatever the order): 0 when not sent.
    version = raw.get("score_version", 0)
    if "score_version" in raw and (problem := check_int(version, low=1, high=MAX_SCORE_VERSION)):
        fail("score_version", problem)
    corrects = raw.get("corrects")
    if "corrects" in raw and summed and (problem := _check_text_id(corrects)):
        fail("corrects", problem)

    completed_at = None
    if "completed_at" in raw:
        completed_at = parse_rfc3339(raw["completed_at"])
        if completed_at is None:
            fail("completed_at", _INSTANT_RULE)
    reached_at = None
    if raw.get("reached_at") is not None:
        reached_at = parse_rfc3339(raw["reached_at"])
        if reached_at is None:
            fail("reached_at", _INSTANT_RULE)
        else:
            reached_at = truncate_ms(reached_at)

    kind = raw.get("kind", KIND_RESULT)
    if kind not in KINDS:
        fail("kind", "must be 'result' or 'correction'")
    reason = raw.get("reason", "")
    if reason is None:
        reason = ""
    if not isinstance(reason, str):
        fail("reason", "must be a string")
    elif len(reason) > MAX_REASON_LENGTH:
        fail("reason", f"must be at most {MAX_REASON_LENGTH} characters")
    elif "\x00" in reason:
        # PostgreSQL text cannot hold NUL: without this the write fails with a 500.
        fail("reason", "must not contain NUL characters")
    elif kind == KIND_CORRECTION and not reason.strip():
        fail("reason", "is required for a correction")
    if summed and kind == KIND_CORRECTION:
        for field in ("corrects", "score_version"):
            if field not in raw:
                fail(field, "is required for a correction in a sum season")
    elif summed and "corrects" in raw:
        fail("corrects", "only a correction names the result it corrects")

    if len(errors) != start or completed_at is None:
        return None
    return ScoreEvent(
        event_id=raw["event_id"],
        match_id=raw["match_id"],
        player_id=raw["player_id"],
        best_score=score,  # type: ignore[arg-type]
        score_version=version,  # type: ignore[arg-type]
        completed_at=completed_at,
        kind=kind,
        reason=reason,
        reached_at=reached_at,
        points=points if summed else None,
        corrects=corrects if summed else None,
    )


def events_parse(body: Any, *, mode: str = MODE_BEST, max_score: int = MAX_SCORE) -> list[ScoreEvent]:
    """Validate a request body: one event object, or {"events": [...]} with 1..1,000 events,
    for a season of this mode and score range (a sum season's events carry points).

    All or nothing: any invalid event makes the whole batch invalid, so nothing is written.
    """
    errors: dict[str, list[str]] = {}
    if isinstance(body, dict) and "events" in body:
        extra = body.keys() - {"events"}
        if extra:
            for field in sorted(map(str, extra)):
                errors[field] = ["unknown field (a batch body holds only 'events')"]
        raw_events = body["events"]
        if not isinstance(raw_events, list):
            errors["events"] = ["must be a list of event objects"]
            raise EventValidationError(errors)
        if not raw_events:
            errors["events"] = ["must hold at least one event"]
            raise EventValidationError(errors)
        if len(raw_events) > MAX_BATCH:
            raise BatchTooLarge(len(raw_events))
        events = [_parse_one(raw, f"events[{i}]", errors, mode=mode, max_score=max_score)
                  for i, raw in enumerate(raw_events)]
    else:
        events = [_parse_one(body, "", errors, mode=mode, max_score=max_score)]
    if errors:
        raise EventValidationError(errors)
    return [event for event in events if event is not None]
