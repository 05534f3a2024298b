"""Page cursors (docs/api.md, Paging without expiry): where a top or window page ended, as
an opaque, signed token that `after=` continues from in the current version.

A cursor holds the board it came from and its last entry's place in display order: the
player and their value in the rank views (the score as the views hold it, and on a
first_reached board when it was reached). The next page starts after that place in
whatever version is current when it is read, so a cursor never expires, and a player who
did not move in between is neither shown twice nor skipped. Signed with the SECRET_KEY
(django.core.signing): a cursor made up or altered, or of another board, is a 400.
"""

from __future__ import annotations

from typing import Any

from django.core import signing

from leaderboard.api.errors import validation_error
from leaderboard.core.events import id_is_valid
from leaderboard.core.tiebreak import IndexValue

# No timestamp (signing.dumps would add one): a cursor never expires.
_SIGNER = signing.Signer(salt="leaderboard.cursor.v1")
# A signed cursor is ~100 characters; anything much longer is not one of ours.
MAX_CURSOR = 512


def cursor_make(*, season: str, region: str | None, value: IndexValue, player_id: str) -> str:
    held: Any = list(value) if isinstance(value, tuple) else value
    return _SIGNER.sign_object([season, region or "", held, player_id])


def cursor_read(token: str, *, season: str, region: str | None) -> tuple[IndexValue, str]:
    """(value, player_id) of a cursor this service made for this board; a 400 naming
    `after` otherwise."""
    if len(token) > MAX_CURSOR:
        raise validation_error({"after": ["is not a cursor of this service (too long)"]})
    try:
        board_season, board_region, held, player_id = _SIGNER.unsign_object(token)
    except (signing.BadSignature, ValueError, TypeError):
        raise validation_error({"after": ["is not a cursor of this service: pass next_cursor as it came"]}) from None
    if (board_season, board_region) != (season, region or ""):
        raise validation_error({"after": ["is a cursor of another board: page each board with its own cursors"]})
    value: IndexValue
    if isinstance(held, list) and len(held) == 2 and all(type(v) is int for v in held):
        value = (held[0], held[1])
    elif type(held) is int:
        value = held
    else:  # signed by us, so never; checked all the same before it reaches Redis
        raise validation_error({"after": ["is not a cursor of this service"]})
    if not isinstance(player_id, str) or not id_is_valid(player_id):
        raise validation_error({"after": ["is not a cursor of this service"]})
    return value, player_id
