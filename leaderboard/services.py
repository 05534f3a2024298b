"""Writes of the leaderboard app. Each is one transaction; audit rows go in the same one."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from audit.services import Actor, audit_log
from leaderboard import ledger_store
from leaderboard.core.events import ScoreEvent
from leaderboard.core.ledger import Outcome, batch_plan
from leaderboard.core.lifecycle import admission_rejection
from leaderboard.models import ApiClient
from seasons.models import Season

TOKEN_PREFIX = "lbk_"
KNOWN_SCOPES = frozenset({"scores:write"})


@dataclass(frozen=True, slots=True)
class ApplyResult:
    outcomes: list[Outcome]
    leaderboard_version: int

    def as_dict(self) -> dict[str, object]:
        return {
            "results": [outcome.as_dict() for outcome in self.outcomes],
            "leaderboard_version": self.leaderboard_version,
        }


def score_events_apply(
    *, season: Season, events: list[ScoreEvent], client: ApiClient | None
) -> ApplyResult:
    """Apply one validated batch to the ledger (CONTRACT.md 2) in a single transaction.

    A constant number of statements per batch, whatever its size: lock the season's
    writers, fetch prior events and player states, decide in memory, write everything
    (ledger, current scores, change stream) in one set-based statement.
    """
    now = timezone.now()
    with transaction.atomic():
        ledger_store.season_write_lock(season_id=season.pk)
        # Re-read under the lock: a lifecycle transition takes the same lock, so the
        # state that admits these events is the one they commit against.
        state, starts_at, cutoff, published = Season.objects.filter(pk=season.pk).values_list(
            "state", "starts_at", "cutoff", "published_version"
        ).get()
        recorded = ledger_store.recorded_events_fetch(
            season_id=season.pk, event_ids=(e.event_id for e in events)
        )
        current = ledger_store.player_states_fetch(
            season_id=season.pk, player_ids=(e.player_id for e in events)
        )

        def rejection(event: ScoreEvent) -> str | None:
            return admission_rejection(
                state=state, starts_at=starts_at, cutoff=cutoff, completed_at=event.completed_at,
                kind=event.kind,
            )

        plan = batch_plan(
            events=events,
            recorded=recorded,
            current=current,
            rejection=rejection,
            pending_version=published + 1,
        )
        ledger_store.batch_plan_write(
            season_id=season.pk, plan=plan, client_id=client.pk if client else None, now=now
        )
    return ApplyResult(outcomes=plan.outcomes, leaderboard_version=published)


def api_token_hash(token: str) -> str:
    # Tokens are 256-bit random strings, so a fast hash is enough: no dictionary to
    # defend against, and every write request checks one.
    return hashlib.sha256(token.encode()).hexdigest()


def api_client_create(*, name: str, scopes: list[str], actor: Actor) -> tuple[ApiClient, str]:
    """Create a client and return it with its token; the token is never stored or shown again."""
    unknown = set(scopes) - KNOWN_SCOPES
    if unknown:
        raise ValueError(f"unknown scope(s): {', '.join(sorted(unknown))}")
    if not scopes:
        raise ValueError("at least one scope is required")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        client = ApiClient.objects.create(
            name=name,
            token_prefix=token[:12],
            token_hash=api_token_hash(token),
            scopes=sorted(set(scopes)),
        )
        audit_log(
            actor=actor,
            action="api_client.created",
            target_type="api_client",
            target_id=str(client.pk),
            after={"name": name, "scopes": client.scopes, "token_prefix": client.token_prefix},
        )
    return client, token
