"""Staff writes on one player of a season: hiding them from every board and restoring them
(docs/rules.md, Hidden players)."""

from __future__ import annotations

import itertools

from django.db import transaction
from django.utils import timezone

from audit.services import Actor, audit_log
from leaderboard.core.errors import DomainError
from leaderboard.core.lifecycle import SEALED_STATES
from leaderboard.ingest import ledger_store
from leaderboard.models import PlayerScore
from seasons.models import Season


class HideRefused(DomainError):
    """A hide or restore that cannot be done; the message says why."""

    code = "hide_refused"


# Distinct event ids of the change-stream rows of hides and restores in one process; the
# id also carries the instant, so two processes never repeat one either.
_numbers = itertools.count(1)


def player_hide(*, season: Season, player_id: str, actor: Actor, reason: str) -> PlayerScore:
    """A reviewer takes a player off every board of the season (audited `player.hidden`,
    with a reason): from the next version they are on none, counted in no rank or total,
    and left out of a FINAL approved while they are hidden. Their events still apply."""
    return _hidden_set(season=season, player_id=player_id, actor=actor, reason=reason, hidden=True)


def player_restore(*, season: Season, player_id: str, actor: Actor, reason: str) -> PlayerScore:
    """An approver puts a hidden player back (audited `player.restored`, with a reason): the
    next version shows their current score on every board."""
    return _hidden_set(season=season, player_id=player_id, actor=actor, reason=reason, hidden=False)


def _hidden_set(*, season: Season, player_id: str, actor: Actor, reason: str, hidden: bool) -> PlayerScore:
    verb = "hide" if hidden else "restore"
    if not reason.strip():
        raise HideRefused(f"a reason is required to {verb} a player")
    now = timezone.now()
    with transaction.atomic():
        ledger_store.season_write_lock(season_id=season.pk)
        season = Season.objects.select_for_update().get(pk=season.pk)
        if season.state in SEALED_STATES:
            raise HideRefused(f"season {season.slug} is {season.state}: its boards are sealed, so a player can "
                              f"be hidden or restored only before the seal")
        score, changed = ledger_store.season_player_hidden_set(
            season=season, player_id=player_id, hidden=hidden, now=now,
            event_id=f"{verb}:{now.timestamp():.6f}:{next(_numbers)}")
        if score is None:
            raise HideRefused(f"{player_id} has no score in season {season.slug}")
        if not changed:
            raise HideRefused(f"{player_id} is {'already' if hidden else 'not'} hidden in season {season.slug}")
        audit_log(actor=actor, action="player.hidden" if hidden else "player.restored", target_type="player",
                  target_id=player_id, season_slug=season.slug, before={"hidden": not hidden},
                  after={"hidden": hidden, "score": score.score}, reason=reason)
    return score
