"""Realistic settled match results, as the trusted match service would send them.

Pure: no Django, no I/O, no clock of its own. Used by `manage.py simulate_matches` (the
demo of `make run`) and by `bench/ingest.py`, so both exercise the write path with the
same mix of events (docs/rules.md, Writes: per-event outcomes):

- matches of 2..8 players; each player has a skill (log-normal: many casual players, a
  long tail of strong ones), a per-match spread, and a trend, so some players improve
  over the season and climb the board;
- `best_score` is the player's absolute season best as settled upstream: it never goes
  down, except after a correction;
- `score_version` strictly increases per player;
- a few percent of events are exact retries of a recent event (same `event_id`, same
  payload: the ledger answers `duplicate`);
- rarely a `correction` with a reason, which revokes part of a player's best;
- a staff revocation is honoured as a match service should: when a result comes back
  `held` because staff revoked the player's score (`acknowledge_revocation`), the
  player's best drops to the revoked score (and their skill with it: the revoked match
  overstated it), and the next batch carries a `correction` with that score, which
  acknowledges the revocation.

Everything is drawn from one seeded `random.Random`, so a given seed and call sequence
produce the same events.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

MAX_SCORE = 1_000_000

CORRECTION_REASONS = (
    "dispute upheld: match result revoked after review",
    "anti-cheat: score invalidated",
    "server desync: match re-settled",
    "moderator correction of a mis-settled match",
)


def player_ids(count: int, *, prefix: str = "p", start: int = 0) -> list[str]:
    """`count` player ids such as p000123 (at least six digits)."""
    width = max(6, len(str(start + count - 1)))
    return [f"{prefix}{i:0{width}d}" for i in range(start, start + count)]


def rfc3339(moment: datetime) -> str:
    """UTC, millisecond precision, "Z" suffix: what a match service typically sends."""
    utc = moment.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


@dataclass(slots=True)
class SimPlayer:
    player_id: str
    skill: float  # mean match score
    spread: float  # standard deviation of a match score
    trend: float  # relative skill change per match (improvers > 0)
    best: int = 0
    version: int = 0
    matches: int = 0


@dataclass(frozen=True, slots=True)
class SimConfig:
    duplicate_rate: float = 0.03  # share of events that are exact retries
    correction_rate: float = 0.01  # share of events that are corrections
    improver_share: float = 0.2  # share of players whose skill grows match after match
    min_players_per_match: int = 2
    max_players_per_match: int = 8
    activity_skew: float = 1.5  # > 1: a minority of players plays most matches
    duplicate_window: int = 2000  # retries pick among this many recent events


class MatchSimulator:
    """Generates batches of score events for a set of players.

    `version_source`, when given, is called for each new event and the event's
    score_version is max(previous + 1, version_source()): pass a millisecond clock so a
    restarted simulator keeps versions increasing for players it already reported.
    """

    def __init__(
        self,
        *,
        players: Sequence[str],
        seed: int = 0,
        config: SimConfig | None = None,
        event_prefix: str = "e",
        version_source: Callable[[], int] | None = None,
    ) -> None:
        if not players:
            raise ValueError("at least one player is required")
        self.config = config or SimConfig()
        self.rng = random.Random(seed)
        self.event_prefix = event_prefix
        self.version_source = version_source
        self.players = [self._new_player(pid) for pid in players]
        self._recent: deque[dict[str, Any]] = deque(maxlen=self.config.duplicate_window)
        self._match_seq = 0
        self._event_seq = 0
        # The rates are shares of events, but one draw yields a whole match (~5 events):
        # weight the draws so the shares come out as configured.
        cfg = self.config
        per_match = (cfg.min_players_per_match + cfg.max_players_per_match) / 2
        matches = max(0.0, 1.0 - cfg.duplicate_rate - cfg.correction_rate) / per_match
        weights = (cfg.duplicate_rate, cfg.correction_rate, matches)
        total = sum(weights)
        self._p_duplicate = weights[0] / total
        self._p_correction = weights[1] / total
        self.generated = 0  # new events (retries excluded)
        self.retries = 0
        self.corrections = 0
        self.acknowledged = 0
        self._by_id = {player.player_id: player for player in self.players}
        # Revocations to acknowledge in the next batch: player -> the revoked score.
        self._acks: dict[str, int] = {}

    def _new_player(self, player_id: str) -> SimPlayer:
        rng = self.rng
        # Median 20k, a long tail towards the 1,000,000 cap.
        skill = min(0.9 * MAX_SCORE, rng.lognormvariate(math.log(20_000), 0.9))
        improver = rng.random() < self.config.improver_share
        trend = rng.uniform(0.005, 0.04) if improver else rng.gauss(0.0, 0.002)
        spread = skill * rng.uniform(0.1, 0.4)
        return SimPlayer(player_id=player_id, skill=skill, spread=spread, trend=trend)

    def _pick_player(self) -> SimPlayer:
        # Skewed activity: low indices play more (u ** skew concentrates near 0).
        index = int(len(self.players) * self.rng.random() ** self.config.activity_skew)
        return self.players[min(index, len(self.players) - 1)]

    def _next_version(self, player: SimPlayer) -> int:
        version = player.version + 1
        if self.version_source is not None:
            version = max(version, self.version_source())
        player.version = version
        return version

    def _next_event_id(self) -> str:
        self._event_seq += 1
        return f"{self.event_prefix}{self._event_seq:09d}"

    def _match_events(self, completed_at: str, room: int) -> list[dict[str, Any]]:
        cfg = self.config
        rng = self.rng
        self._match_seq += 1
        match_id = f"{self.event_prefix}m{self._match_seq:09d}"
        size = min(room, rng.randint(cfg.min_players_per_match, cfg.max_players_per_match))
        seen: set[str] = set()
        events = []
        for _ in range(size):
            player = self._pick_player()
            if player.player_id in seen:
                continue
            seen.add(player.player_id)
            player.matches += 1
            player.skill = min(0.95 * MAX_SCORE, max(1.0, player.skill * (1.0 + player.trend)))
            played = int(rng.gauss(player.skill, player.spread))
            player.best = max(player.best, min(MAX_SCORE, max(0, played)))
            events.append(
                {
                    "event_id": self._next_event_id(),
                    "match_id": match_id,
                    "player_id": player.player_id,
                    "best_score": player.best,
                    "score_version": self._next_version(player),
                    "completed_at": completed_at,
                }
            )
        return events

    def _correction(self, completed_at: str) -> dict[str, Any]:
        player = self._pick_player()
        # Revoke part of the best (a disputed or cheated match); upstream's best drops too.
        player.best = int(player.best * self.rng.uniform(0.5, 0.95))
        self._match_seq += 1
        return {
            "event_id": self._next_event_id(),
            "match_id": f"{self.event_prefix}m{self._match_seq:09d}",
            "player_id": player.player_id,
            "best_score": player.best,
            "score_version": self._next_version(player),
            "completed_at": completed_at,
            "kind": "correction",
            "reason": self.rng.choice(CORRECTION_REASONS),
        }

    def acknowledge_revocation(self, player_id: str, score: int) -> None:
        """Staff revoked `player_id`'s score to `score` (a result of theirs came back held,
        reason `score_revoked`): take it into the player's best and send the correction
        that acknowledges it with the next batch. Idempotent: answers of resent events
        ask again for the same acknowledgment."""
        player = self._by_id.get(player_id)
        if player is None or score >= player.best:
            return
        player.skill = max(1.0, player.skill * score / player.best)
        player.spread = player.skill * 0.25
        player.best = score
        self._acks[player_id] = score

    def _acknowledgment(self, player_id: str, score: int, completed_at: str) -> dict[str, Any]:
        player = self._by_id[player_id]
        self._match_seq += 1
        return {
            "event_id": self._next_event_id(),
            "match_id": f"{self.event_prefix}m{self._match_seq:09d}",
            "player_id": player_id,
            "best_score": score,
            "score_version": self._next_version(player),
            "completed_at": completed_at,
            "kind": "correction",
            "reason": "staff revocation acknowledged: the revoked match is removed upstream",
        }

    def batch(
        self, size: int, *, completed_at: datetime | str, spread_seconds: float = 30.0
    ) -> list[dict[str, Any]]:
        """The next `size` events.

        Given a datetime, each match ends at its own time within `spread_seconds` before
        it (a trusted server time: pass now or earlier); given a string, every event
        carries that exact string.
        """
        if size < 1:
            raise ValueError("size must be >= 1")
        rng = self.rng
        out: list[dict[str, Any]] = []
        while self._acks and len(out) < size:
            player_id, score = self._acks.popitem()
            when = completed_at if isinstance(completed_at, str) else rfc3339(completed_at)
            out.append(self._acknowledgment(player_id, score, when))
            self.acknowledged += 1
        while len(out) < size:
            if isinstance(completed_at, str):
                when = completed_at
            else:
                when = rfc3339(completed_at - timedelta(seconds=rng.uniform(0, spread_seconds)))
            draw = rng.random()
            if draw < self._p_duplicate and self._recent:
                # A retry: the exact same event object, so the same payload.
                out.append(self._recent[rng.randrange(len(self._recent))])
                self.retries += 1
                continue
            if draw < self._p_duplicate + self._p_correction:
                fresh = [self._correction(when)]
                self.corrections += 1
            else:
                fresh = self._match_events(when, size - len(out))
            out.extend(fresh)
            self._recent.extend(fresh)
            self.generated += len(fresh)
        return out
