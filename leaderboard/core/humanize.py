"""Instants and spans as people read them: "2027-01-02 17:47 UTC (in 29 days)".

One way for every message a person reads (the staff console, refusals of the lifecycle,
the demo's banner); machines get RFC 3339 from the API.
"""

from __future__ import annotations

from datetime import UTC, datetime

_UNITS = ((86_400, "day"), (3600, "hour"), (60, "minute"), (1, "second"))


def span_text(seconds: float) -> str:
    """4 -> "4 seconds", 150 -> "2 minutes", 7200 -> "2 hours", 2_592_000 -> "30 days":
    the largest unit that fits, rounded down (a countdown never promises too much)."""
    seconds = abs(seconds)
    for size, name in _UNITS:
        if seconds >= size:
            count = int(seconds // size)
            return f"{count} {name}{'' if count == 1 else 's'}"
    return "less than a second"


def instant_text(at: datetime, *, now: datetime | None = None, seconds: bool = False) -> str:
    """The instant in UTC to the minute (or second), and how far it is from `now`:
    "2026-12-03 19:30 UTC (in 4 minutes)", "... (2 hours ago)"."""
    now = now or datetime.now(UTC)
    text = at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M") + " UTC"
    delta = (at - now).total_seconds()
    if abs(delta) < 1:
        return f"{text} (now)"
    return f"{text} (in {span_text(delta)})" if delta > 0 else f"{text} ({span_text(delta)} ago)"
