"""Writing scores the way the match service does (the real write API, or the write service
for bulk set-up), and reading back what the ledger holds."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Any

from django.db import connection

from audit.services import Actor
from leaderboard.core.events import events_parse
from leaderboard.core.partitions import Watermark
from leaderboard.core.ranking import Standings
from leaderboard.ingest.selectors import stream_last_watermark
from leaderboard.ingest.services import score_events_apply
from leaderboard.ledger_databases import ledger_aliases
from leaderboard.models import PlayerScore, ScoreChange
from seasons.models import Season

Post = Callable[..., Any]

TEST_ACTOR = Actor(kind="system", id="", label="tests")
COMPLETED_AT = "2026-11-15T12:00:00Z"


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


class Events:
    """Builds valid score events: ids unique across builders, and per player a score_version
    newer than every one sent before, whichever builder sent it."""

    # One counter for ids and versions, shared by every builder: two builders writing the
    # same player (a fixture's board, then a test's own events) never send a stale version.
    _ids = itertools.count(1)

    def __init__(self, tag: str = "e", completed_at: str = COMPLETED_AT):
        self.tag = tag
        self.completed_at = completed_at
        self.versions: dict[str, int] = {}
        self.sent: list[dict[str, Any]] = []

    def result(self, player_id: str, best_score: int, **extra: Any) -> dict[str, Any]:
        return self._make(player_id, best_score, **extra)

    def correction(self, player_id: str, best_score: int, reason: str = "dispute upheld",
                   **extra: Any) -> dict[str, Any]:
        return self._make(player_id, best_score, kind="correction", reason=reason, **extra)

    def stale(self, player_id: str, best_score: int) -> dict[str, Any]:
        """A result older than the last one this builder sent for the player: recorded, ignored."""
        return self._make(player_id, best_score, score_version=max(1, self.versions[player_id] - 1))

    def _make(self, player_id: str, best_score: int, **extra: Any) -> dict[str, Any]:
        n = next(self._ids)
        event = {"event_id": f"{self.tag}-{n}", "match_id": f"{self.tag}-m{n}", "player_id": player_id,
                 "best_score": best_score, "score_version": n, "completed_at": self.completed_at, **extra}
        if "score_version" not in extra:
            self.versions[player_id] = n
        self.sent.append(event)
        return event


def post_ok(post_scores: Post, season: Season | str, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events through the write API, which must answer 200 with one result per event."""
    slug = season if isinstance(season, str) else season.slug
    response = post_scores(slug, {"events": events})
    assert response.status_code == 200, response.content
    results: list[dict[str, Any]] = response.json()["results"]
    assert len(results) == len(events)
    return results


def statuses(results: Iterable[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(r["status"], r.get("reason", "")) for r in results]


def apply_events(season: Season, events: list[dict[str, Any]], *, batch: int = 1000) -> list[Any]:
    """Events through the write service itself (no HTTP): for bulk set-up."""
    outcomes = []
    for start in range(0, len(events), batch):
        parsed = events_parse({"events": events[start : start + batch]})
        outcomes.extend(score_events_apply(season=season, events=parsed, client=None).outcomes)
    return outcomes


def players(prefix: str, n: int) -> Iterable[str]:
    return (f"{prefix}{i:05d}" for i in range(n))


def ledger_rows(model: type[Any], season: Season, *fields: str) -> list[Any]:
    """`model`'s rows of the season (a ledger-side table: ScoreEvent, PlayerScore,
    ScoreChange, StreamHead, ...) from every database holding its partitions: objects,
    tuples of `fields`, or the values of one field."""
    rows: list[Any] = []
    for alias in ledger_aliases(season=season):
        query = model.objects.using(alias).filter(season_id=season.pk)
        rows += query.values_list(*fields, flat=len(fields) == 1) if fields else query
    return rows


def db_scores(season: Season) -> dict[str, int]:
    return dict(ledger_rows(PlayerScore, season, "player_id", "score"))


def db_standings(season: Season) -> Standings:
    """The reference board: the ranking rules (docs/rules.md, "Ranking") applied to the
    current-scores table, less the players staff hid (docs/rules.md, Hidden players)."""
    hidden = set(ledger_rows(PlayerScore, season, "player_id", "hidden"))
    return Standings({p: s for p, s in db_scores(season).items() if (p, True) not in hidden})


def change_head(season: Season) -> Watermark:
    """The watermark of the season's newest committed change in each ledger partition;
    the start of the stream when it has none."""
    return stream_last_watermark(season_id=season.pk)


def scores_at_watermark(season: Season, watermark: Watermark) -> dict[str, int]:
    """The board a version with this watermark must hold, replayed from the change stream
    alone: per player, the newest (highest score_version) change at or below the cursor."""
    newest: dict[str, tuple[int, int]] = {}
    for txid, ident, player_id, score, version in ledger_rows(
        ScoreChange, season, "txid", "id", "player_id", "new_score", "score_version"
    ):
        if not watermark.covers(txid, ident):
            continue
        seen = newest.get(player_id)
        if seen is None or version > seen[1]:
            newest[player_id] = (score, version)
    return {p: s for p, (s, _) in newest.items()}
