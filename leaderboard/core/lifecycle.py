"""Season states (CONTRACT.md 5) and which results a season admits."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum


class SeasonState(StrEnum):
    SCHEDULED = "SCHEDULED"
    OPEN = "OPEN"
    CLOSING = "CLOSING"
    FINALIZING = "FINALIZING"
    FINAL = "FINAL"


ACCEPTING_STATES = frozenset({SeasonState.OPEN, SeasonState.CLOSING})

REJECT_AFTER_CUTOFF = "after_cutoff"
REJECT_BEFORE_START = "before_season_start"
REJECT_NOT_OPEN = "season_not_open"
REJECT_NOT_ACCEPTING = "season_not_accepting_results"


def initial_state(*, starts_at: datetime, cutoff: datetime, now: datetime) -> SeasonState:
    if now < starts_at:
        return SeasonState.SCHEDULED
    if now < cutoff:
        return SeasonState.OPEN
    return SeasonState.CLOSING


def admission_rejection(
    *, state: str, starts_at: datetime, cutoff: datetime, completed_at: datetime
) -> str | None:
    """Why a season refuses a result, or None when it admits it.

    Decided on the trusted completed_at, never on arrival time: a result that ended
    before the cutoff and arrives late is still eligible while ingest is open.
    """
    if state == SeasonState.SCHEDULED:
        return REJECT_NOT_OPEN
    if state not in ACCEPTING_STATES:
        return REJECT_NOT_ACCEPTING
    if completed_at > cutoff:
        return REJECT_AFTER_CUTOFF
    if completed_at < starts_at:
        return REJECT_BEFORE_START
    return None
