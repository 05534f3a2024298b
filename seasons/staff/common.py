"""What the staff services share: the refusal they raise (StaffError), the actor of a
signed-in staff member, the checks of their inputs and the player's current score."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

from audit.services import Actor
from leaderboard.core.errors import DomainError
from leaderboard.core.events import MAX_SCORE, MIN_SCORE, check_int, check_player_id
from leaderboard.ledger_reads import ledger_queryset_of_player
from leaderboard.models import PlayerScore
from seasons.models import Season


class StaffError(DomainError):
    """An action the rules refuse; the message is shown to the staff member as is."""

    code = "action_refused"


def staff_actor(user: AbstractBaseUser | AnonymousUser) -> Actor:
    return Actor(kind="user", id=str(user.pk), label=user.get_username())


def _user_id(actor: Actor) -> int:
    if actor.kind != "user" or not actor.id:
        raise StaffError("only a signed-in staff member can do this")
    return int(actor.id)


def _text(value: str, *, field: str, required: bool = True, limit: int | None = None) -> str:
    value = value.strip()
    if required and not value:
        raise StaffError(f"{field} is required")
    if limit is not None and len(value) > limit:
        raise StaffError(f"{field} must be at most {limit} characters")
    if "\x00" in value:
        # PostgreSQL text cannot hold NUL.
        raise StaffError(f"{field} must not contain NUL characters")
    return value


def _score(value: int, *, field: str = "score", high: int = MAX_SCORE) -> int:
    """A score in 0..`high` (the season's highest score)."""
    problem = check_int(value, low=MIN_SCORE, high=high)
    if problem:
        raise StaffError(f"{field}: {problem}")
    return value


def _player(player_id: str) -> str:
    problem = check_player_id(player_id)
    if problem:
        raise StaffError(f"player id {problem}")
    return player_id


def _player_state(season: Season, player_id: str) -> tuple[int | None, int]:
    row = ledger_queryset_of_player(
        season=season, player_id=player_id,
        queryset=PlayerScore.objects.filter(season=season, player_id=player_id).values_list("score", "score_version"),
    ).first()
    return (row[0], int(row[1])) if row is not None else (None, 0)
