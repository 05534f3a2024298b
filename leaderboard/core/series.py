"""Recurring seasons (docs/rules.md, Recurring seasons): a series opens one season per
window of its schedule, window n spanning [start(n), start(n + 1)), start(1) the anchor.

Pure: no Django. Windows are counted from the anchor, never from the last one opened, so
a clock that skipped ticks (the service was down) finds every window it owes, in order.
"""

from __future__ import annotations

import calendar
import re
from datetime import datetime, timedelta

EVERY_DAY, EVERY_WEEK, EVERY_MONTH = "1d", "7d", "1mo"
EVERIES = (EVERY_DAY, EVERY_WEEK, EVERY_MONTH)
APPROVAL_TWO_PERSON, APPROVAL_AUTO = "two-person", "auto"
APPROVALS = (APPROVAL_TWO_PERSON, APPROVAL_AUTO)
# Window seasons are named f"{series_id}-{n}" and season ids are at most 64 characters.
MAX_SERIES_ID_LENGTH = 48
SERIES_ID_RE = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_DAYS = {EVERY_DAY: 1, EVERY_WEEK: 7}


class SeriesError(ValueError):
    pass


def series_id_problem(series_id: str) -> str | None:
    if len(series_id) > MAX_SERIES_ID_LENGTH or not SERIES_ID_RE.fullmatch(series_id):
        return (f"a series id is lowercase letters, digits and single dashes, at most "
                f"{MAX_SERIES_ID_LENGTH} characters, got {series_id!r}")
    return None


def every_problem(every: object) -> str | None:
    if every not in EVERIES:
        return f"every must be one of {', '.join(EVERIES)}, got {every!r}"
    return None


def approval_problem(approval: object) -> str | None:
    if approval not in APPROVALS:
        return f"approval must be one of {', '.join(APPROVALS)}, got {approval!r}"
    return None


def _add_months(moment: datetime, months: int) -> datetime:
    """The same day and time `months` later, the day clamped to the month's last (an anchor
    on the 31st opens on the 30th in April and the 28th or 29th in February)."""
    month0 = moment.month - 1 + months
    year, month = moment.year + month0 // 12, month0 % 12 + 1
    day = min(moment.day, calendar.monthrange(year, month)[1])
    return moment.replace(year=year, month=month, day=day)


def window_start(*, every: str, anchor: datetime, n: int) -> datetime:
    """When window n (1, 2, ...) starts."""
    if n < 1:
        raise SeriesError(f"windows are numbered from 1, got {n}")
    if every == EVERY_MONTH:
        return _add_months(anchor, n - 1)
    return anchor + timedelta(days=_DAYS[every] * (n - 1))


def window_bounds(*, every: str, anchor: datetime, n: int) -> tuple[datetime, datetime]:
    """(starts_at, cutoff) of window n: its cutoff is the next window's start."""
    return window_start(every=every, anchor=anchor, n=n), window_start(every=every, anchor=anchor, n=n + 1)


def window_of(*, every: str, anchor: datetime, instant: datetime) -> int | None:
    """The window whose span holds `instant` (its start included, its cutoff not), or None
    before the anchor."""
    if instant < anchor:
        return None
    if every == EVERY_MONTH:
        months = (instant.year - anchor.year) * 12 + instant.month - anchor.month
        n = months + 1
        # The day-of-month clamp can put the instant one window either side of the guess.
        while n > 1 and window_start(every=every, anchor=anchor, n=n) > instant:
            n -= 1
        while window_start(every=every, anchor=anchor, n=n + 1) <= instant:
            n += 1
        return n
    return int((instant - anchor) // timedelta(days=_DAYS[every])) + 1


def windows_due(*, every: str, anchor: datetime, now: datetime) -> range:
    """The windows a series must have by `now`: every one started so far and the next one
    (created SCHEDULED ahead of its start, so it opens on the tick at its start and events
    at the boundary have a season to go to)."""
    current = window_of(every=every, anchor=anchor, instant=now)
    return range(1, (current or 0) + 2)
