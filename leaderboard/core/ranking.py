"""The ranking rules (docs/rules.md, Ranking), as plain functions.

Rank is competition ranking: 1 + the number of players with a strictly higher score.
Display order is score descending, then player_id ascending by its UTF-8 bytes; position
is the 1-based index in display order and never changes rank. The brute-force
`Standings` is the reference the Redis views are tested against, and it is what the
FINAL standings are built with.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from leaderboard.core.season_options import BoardKind
from leaderboard.core.tiebreak import IndexValue

# Entries on each side of a player in a neighbours read (the API's `radius`, the live
# board's): 21 entries cover a phone screen, and a wider one would be a window read.
RADIUS_MAX = 10


def display_key(player_id: str, score: int) -> tuple[int, bytes]:
    return (-score, player_id.encode())


@dataclass(frozen=True, slots=True)
class Entry:
    position: int
    rank: int
    player_id: str
    score: int

    def as_dict(self) -> dict[str, object]:
        return {"position": self.position, "rank": self.rank, "player_id": self.player_id, "score": self.score}


def entry_shown(kind: BoardKind, entry: Entry) -> Entry:
    """An entry as players see it: the rank views hold an asc board's scores as
    max_score - score (BoardKind.flipped), turned back where they leave the views."""
    return entry if kind.flip is None else replace(entry, score=kind.flipped(entry.score))


def ranked(pairs: Iterable[tuple[str, int]], *, first_position: int = 1, higher_before: int = 0,
           rank_of_first: int | None = None, reached: Sequence[int] | None = None) -> list[Entry]:
    """Entries for consecutive pairs already in display order.

    `higher_before` is how many players precede the first pair; `rank_of_first` is the
    first pair's rank when players above the window share it. `reached`: a first_reached
    board's reached_ms of each pair (core.tiebreak), so players share a rank only when
    both score and reached_at are equal.
    """
    out: list[Entry] = []
    prev_score: object = None
    rank = 0
    for offset, (player_id, score) in enumerate(pairs):
        position = first_position + offset
        tie = score if reached is None else (score, reached[offset])
        if tie != prev_score:
            rank = rank_of_first if (offset == 0 and rank_of_first is not None) else position
            prev_score = tie
        out.append(Entry(position=position, rank=rank, player_id=player_id, score=score))
    return out


def ranked_values(values: Sequence[tuple[str, IndexValue]], *, first_position: int = 1,
                  rank_of_first: int | None = None) -> list[Entry]:
    """`ranked` over a board's index values in display order: scores, or on a first_reached
    board (score, reached_ms) (core.tiebreak)."""
    if not values or isinstance(values[0][1], int):
        return ranked(values, first_position=first_position, rank_of_first=rank_of_first)  # type: ignore[arg-type]
    pairs = [(p, v if isinstance(v, int) else v[0]) for p, v in values]
    reached = [0 if isinstance(v, int) else v[1] for _, v in values]
    return ranked(pairs, first_position=first_position, rank_of_first=rank_of_first, reached=reached)


class Standings:
    """A whole board in memory: exact by construction, O(N log N) to build.

    With `reached` (player -> when they reached their score, any comparable value) it is
    a first_reached board: order (score desc, reached asc, player_id bytes), and rank =
    1 + the players with a higher score or the same score reached earlier.
    """

    def __init__(self, scores: Mapping[str, int], reached: Mapping[str, Any] | None = None):
        self._reached = dict(reached) if reached is not None else None
        self._scores = dict(scores)
        self._order = sorted(scores.items(), key=lambda item: (self._tie(*item), item[0].encode()))
        self._position = {player_id: i + 1 for i, (player_id, _) in enumerate(self._order)}
        self._ties = [self._tie(p, score) for p, score in self._order]
        self._neg_scores = [-score for _, score in self._order]

    def _tie(self, player_id: str, score: int) -> Any:
        return -score if self._reached is None else (-score, self._reached[player_id])

    def __len__(self) -> int:
        return len(self._order)

    def rank_of_score(self, score: int) -> int:
        """1 + the players with a higher score (a shared board's rank of that score)."""
        return 1 + bisect_left(self._neg_scores, -score)

    def rank_of(self, player_id: str) -> int:
        return 1 + bisect_left(self._ties, self._tie(player_id, self._scores[player_id]))

    def entry(self, player_id: str) -> Entry | None:
        if player_id not in self._scores:
            return None
        score = self._scores[player_id]
        return Entry(position=self._position[player_id], rank=self.rank_of(player_id),
                     player_id=player_id, score=score)

    def window(self, *, from_position: int, limit: int) -> list[Entry]:
        start = max(from_position, 1) - 1
        pairs = self._order[start : start + limit]
        return [Entry(position=start + 1 + i, rank=self.rank_of(p), player_id=p, score=score)
                for i, (p, score) in enumerate(pairs)]

    def top(self, limit: int) -> list[Entry]:
        return self.window(from_position=1, limit=limit)

    def neighbors(self, player_id: str, radius: int) -> list[Entry]:
        me = self.entry(player_id)
        if me is None:
            return []
        first = max(1, me.position - radius)
        return self.window(from_position=first, limit=me.position + radius - first + 1)


# What orders players before their player_id and decides who shares a rank: two players
# with equal keys share it. A "shared" season's key is the score alone; a tie-break that
# orders equal scores (who reached the score first) plugs in here as another key function.
TieKey = Callable[[str, int], Any]


def shared_tie_key(player_id: str, score: int) -> int:
    return -score


def ranked_among(scores: Mapping[str, int], *, tie_key: TieKey = shared_tie_key) -> list[tuple[str, int, int]]:
    """A small set of players (a friends board) ranked among themselves: (player_id, score,
    rank) in display order, so position = index + 1, and rank = 1 + the number of them
    ahead that do not share their tie key.

    Tuples, not Entry: a board of 1,001 players is built per request, and a frozen
    dataclass costs ~0.4 us per instance. Ids sort as str: the id rule allows ASCII only,
    whose code point order is its UTF-8 byte order.
    """
    order = sorted(scores.items(), key=lambda item: (tie_key(*item), item[0]))
    out: list[tuple[str, int, int]] = []
    rank = 0
    previous: Any = None
    for position, (player_id, score) in enumerate(order, start=1):
        key = tie_key(player_id, score)
        if position == 1 or key != previous:
            rank, previous = position, key
        out.append((player_id, score, rank))
    return out
