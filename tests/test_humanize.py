"""Instants and spans as the console and the lifecycle's refusals write them for people."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from leaderboard.core.humanize import instant_text, span_text

CUTOFF = datetime(2026, 12, 1, tzinfo=UTC)


@pytest.mark.parametrize(("seconds", "text"), [(0.4, "less than a second"), (1, "1 second"), (59.9, "59 seconds"),
                                              (150, "2 minutes"), (3600, "1 hour"), (-7300, "2 hours"),
                                              (86_400 * 29.5, "29 days")])
def test_spans_read_as_people_say_them(seconds: float, text: str) -> None:
    assert span_text(seconds) == text


def test_an_instant_says_how_far_it_is() -> None:
    assert instant_text(CUTOFF, now=CUTOFF - timedelta(minutes=4, seconds=10)) == "2026-12-01 00:00 UTC (in 4 minutes)"
    assert instant_text(CUTOFF, now=CUTOFF + timedelta(hours=3)) == "2026-12-01 00:00 UTC (3 hours ago)"
    assert instant_text(CUTOFF, now=CUTOFF, seconds=True) == "2026-12-01 00:00:00 UTC (now)"
