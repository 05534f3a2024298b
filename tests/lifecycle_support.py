"""Helpers of the season lifecycle and FINAL tests: staff actors, seasons in a given state,
materializing until a version covers what was committed, and a whole FINAL run."""

from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model

from audit.models import AuditEntry
from audit.services import Actor
from leaderboard import rankview
from leaderboard.core.lifecycle import SeasonState
from leaderboard.core.manifest import Manifest
from leaderboard.materializer import season_epoch_run, season_keys
from leaderboard.models import PlayerScore, ScoreChange
from leaderboard.redis_client import redis_get
from seasons.models import FinalCandidate, FinalStanding, Season
from seasons.services import (
    season_final_approve,
    season_final_candidate_build,
    season_final_propose,
    season_seal_ingest,
)
from tests.conftest import TEST_ACTOR

Post = Callable[..., Any]

# Every check CONTRACT.md 5 asks of a FINAL candidate, plus the invariant checks it runs first.
RECONCILIATION_CHECKS = frozenset({
    # invariants of the version's own copy (leaderboard/invariants.py, full scan)
    "bucket_counts", "total_players", "players_once", "bucket_ranges", "bucket_checksums",
    "lookup_equals_index", "sampled_ranks",
    # against the ledger (leaderboard/reconcile.py)
    "player_count", "bucket_count_sum", "top_100", "ledger_sampled_ranks", "ledger_bucket_checksums",
})

_users = itertools.count(1)


def staff(name: str | None = None) -> Actor:
    """A staff member: a Django user, acting as Actor(kind="user")."""
    username = name or f"staff-{next(_users)}"
    user = get_user_model().objects.create_user(username=username)  # no password: no slow hashing
    return Actor(kind="user", id=str(user.pk), label=user.get_username())


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def closing_season(season_factory: Callable[..., Season], slug: str, *, cutoff_ago: timedelta = timedelta(minutes=5),
                   length: timedelta = timedelta(days=10)) -> Season:
    """A season whose cutoff has passed (created CLOSING: ingest still open)."""
    cutoff = datetime.now(UTC) - cutoff_ago
    season = season_factory(slug=slug, starts_at=cutoff - length, cutoff=cutoff)
    assert season.state == SeasonState.CLOSING
    return season


def in_season(season: Season, *, before_cutoff: timedelta = timedelta(hours=1)) -> str:
    """An RFC 3339 completed_at inside the season, `before_cutoff` before its cutoff."""
    return iso(season.cutoff - before_cutoff)


class Events:
    """Valid score events with unique ids and, per player, increasing score versions."""

    def __init__(self, tag: str, completed_at: str):
        self.tag = tag
        self.completed_at = completed_at
        self.n = itertools.count(1)
        self.versions: dict[str, int] = {}

    def result(self, player_id: str, best_score: int, **extra: Any) -> dict[str, Any]:
        return self._make(player_id, best_score, **extra)

    def correction(self, player_id: str, best_score: int, reason: str = "dispute upheld",
                   **extra: Any) -> dict[str, Any]:
        return self._make(player_id, best_score, kind="correction", reason=reason, **extra)

    def _make(self, player_id: str, best_score: int, **extra: Any) -> dict[str, Any]:
        n = next(self.n)
        version = self.versions.get(player_id, 0) + 1
        self.versions[player_id] = version
        event = {"event_id": f"{self.tag}-{n}", "match_id": f"{self.tag}-m{n}", "player_id": player_id,
                 "best_score": best_score, "score_version": version, "completed_at": self.completed_at}
        event.update(extra)
        return event


def post_ok(post_scores: Post, season: Season, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    response = post_scores(season.slug, {"events": events})
    assert response.status_code == 200, response.content
    results: list[dict[str, Any]] = response.json()["results"]
    assert len(results) == len(events)
    return results


def statuses(results: Iterable[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(r["status"], r.get("reason", "")) for r in results]


def change_head(season: Season) -> tuple[int, int]:
    row = ScoreChange.objects.filter(season=season).order_by("-txid", "-id").values_list("txid", "id").first()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def current_manifest(season: Season) -> Manifest | None:
    r = redis_get()
    keys = season_keys(season)
    version = rankview.pointer_get(r, keys)
    return rankview.manifest_get(r, keys, version) if version else None


def materialize(season: Season, *, timeout: float = 20.0) -> Manifest:
    """Run epochs until the published version covers every change committed so far.

    On PostgreSQL the change stream only returns a transaction's changes once every older
    transaction of the whole server has ended; other sessions on the same server (another
    test run, a benchmark) can delay that, so this retries instead of assuming one epoch.
    """
    head = change_head(season)
    deadline = time.monotonic() + timeout
    while True:
        season_epoch_run(season=season)
        manifest = current_manifest(season)
        if manifest is not None and manifest.watermark >= head:
            season.refresh_from_db()
            return manifest
        assert time.monotonic() < deadline, f"no version covers {head} after {timeout} s"
        time.sleep(0.02)


def db_scores(season: Season) -> dict[str, int]:
    return dict(PlayerScore.objects.filter(season=season).values_list("player_id", "score"))


def final_rows(season: Season) -> list[tuple[int, int, str, int]]:
    return list(
        FinalStanding.objects.filter(season=season).order_by("position")
        .values_list("position", "rank", "player_id", "score")
    )


def canonical_sha256(rows: Iterable[tuple[int, int, str, int]]) -> str:
    """The documented FINAL hash, written out independently of the service."""
    return hashlib.sha256(
        "".join(f"{position}\t{rank}\t{player}\t{score}\n" for position, rank, player, score in rows).encode()
    ).hexdigest()


def seal_and_build(season: Season, *, actor: Actor = TEST_ACTOR, seal: bool = True) -> FinalCandidate:
    """Seal ingest (unless already sealed), catch the materializer up, build the candidate."""
    if seal:
        season_seal_ingest(season=season, actor=actor)
    materialize(season)
    return season_final_candidate_build(season=season, actor=actor)


def finalize(season: Season, *, proposer: Actor | None = None, approver: Actor | None = None,
             seal: bool = True) -> Season:
    """CLOSING (or FINALIZING with seal=False) -> FINAL the regular way: seal, materialize,
    candidate, propose, approve."""
    candidate = seal_and_build(season, seal=seal)
    assert candidate.reconciliation_ok, candidate.report
    season_final_propose(candidate=candidate, actor=proposer or staff())
    return season_final_approve(candidate=candidate, actor=approver or staff())


def audit_actions(season: Season) -> list[str]:
    return list(AuditEntry.objects.filter(season_slug=season.slug).order_by("id").values_list("action", flat=True))
