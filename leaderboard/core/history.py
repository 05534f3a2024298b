"""Hourly snapshots and a player's history (docs/rules.md, Movement and history).

At every full hour (UTC) a season's snapshot records the version current at that instant
and that version's score histogram: how many players held each value on the board. It
never records a player: a player's value in a snapshot is their score in the ledger as of
the version's watermark (their last applied event published at or before that version),
and their rank there is 1 + the players the histogram holds above that value. So a
snapshot's size follows the board's distinct values, not its players.

A histogram is stored in chunks of consecutive values, ascending, each with the count of
players above its highest value: a rank reads one chunk (the one whose lowest value is the
greatest at or below the player's), never the whole histogram.

Values are what the board ranks, higher first: the score, or max_score - score on an asc
board (core.season_options.BoardKind.flipped).
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

HISTORY_DAYS_DEFAULT = 30
HISTORY_DAYS_MAX = 366
# Values per chunk: a rank reads one chunk, 2 x 8 bytes a value; a chunk of 1 KB stays in
# its row (PostgreSQL moves values over 2 KB out of line, and a history reads 30 of them).
CHUNK_VALUES = 64
# The snapshot rank_24h_ago reads: this long before the latest one.
MOVEMENT_HOURS = 24
# Snapshots other than midnight's are kept this long (rank_24h_ago reads the snapshot a
# day before the latest; the history reads midnights only).
HOURLY_KEPT = timedelta(hours=MOVEMENT_HOURS + 24)


def hour_floor(instant: datetime) -> datetime:
    """The full hour (UTC) at or before `instant`."""
    return instant.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def midnights(*, today: date, days: int) -> list[datetime]:
    """00:00 UTC of each of the `days` days ending with `today`, oldest first."""
    return [datetime.combine(today - timedelta(days=back), time(0), tzinfo=UTC) for back in range(days - 1, -1, -1)]


def hourly_expired(taken_for: datetime, *, latest: datetime) -> bool:
    """Whether the snapshot of `taken_for` is no longer read (an hour other than midnight,
    older than HOURLY_KEPT before the latest snapshot)."""
    return taken_for.astimezone(UTC).hour != 0 and taken_for < latest - HOURLY_KEPT


@dataclass(frozen=True, slots=True)
class HistogramChunk:
    """Consecutive values of a histogram, ascending, with their players; `above` the
    players with a value above the chunk's highest."""

    values: array
    counts: array
    above: int

    @property
    def low(self) -> int:
        return int(self.values[0])

    def ahead_of(self, value: int) -> int:
        """The players above `value` (a value at or above this chunk's lowest)."""
        return self.above + sum(self.counts[bisect_right(self.values, value):])

    def encoded(self) -> tuple[bytes, bytes]:
        return _little(self.values).tobytes(), _little(self.counts).tobytes()

    @classmethod
    def decoded(cls, values: bytes, counts: bytes, *, above: int) -> HistogramChunk:
        return cls(values=_little(_array(values)), counts=_little(_array(counts)), above=above)


def _array(raw: bytes) -> array:
    out = array("q")
    out.frombytes(raw)
    return out


def _little(items: array) -> array:
    """Stored little-endian whatever the machine."""
    if sys.byteorder == "big":
        items = array("q", items)
        items.byteswap()
    return items


def histogram_chunks(counts: Mapping[int, int], *, size: int = CHUNK_VALUES) -> list[HistogramChunk]:
    """`counts` (value -> players, zero counts left out) cut into chunks, ascending."""
    values = sorted(v for v, n in counts.items() if n)
    chunks: list[HistogramChunk] = []
    above = 0
    for end in range(len(values), 0, -size):
        part = values[max(0, end - size):end]
        players = [counts[v] for v in part]
        chunks.append(HistogramChunk(values=array("q", part), counts=array("q", players), above=above))
        above += sum(players)
    chunks.reverse()
    return chunks


def chunk_of(lows: Sequence[int], value: int) -> int | None:
    """The index of the chunk holding `value` among chunks with these ascending lowest
    values: the last whose lowest is at or below it (None: below every chunk)."""
    at = bisect_right(lows, value)
    return at - 1 if at else None


def value_at(changes: Iterable[tuple[int, int]], version: int) -> int | None:
    """A player's score as of `version`: the score after their last applied change (in
    ledger order) that was published at or before it; None when none was."""
    score = None
    for published, after in changes:
        if published <= version:
            score = after
    return score
