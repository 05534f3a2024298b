"""Query-parameter parsing shared by the read APIs: a 400 naming the parameter, never a 500.

They take the query as a mapping (a QueryDict, or the fast read path's dict), not a request."""

from __future__ import annotations

from collections.abc import Mapping

from leaderboard.api.errors import ApiError, validation_error
from leaderboard.core.events import ID_RULE, id_is_valid

# The largest integer a bigint column and the JSON renderer (orjson) both carry: beyond it
# a query or the response itself would fail with a 500.
MAX_INT_PARAM = 2**63 - 1


def int_param(query: Mapping[str, str], name: str, *, default: int | None, low: int, high: int | None) -> int | None:
    raw = query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise validation_error({name: ["must be an integer"]}) from None
    if value < low or (high is not None and value > high):
        bounds = f"{low}..{high}" if high is not None else f">= {low}"
        raise validation_error({name: [f"must be in {bounds}"]})
    if value > MAX_INT_PARAM:
        raise validation_error({name: [f"must be <= {MAX_INT_PARAM}"]})
    return value


def bool_param(query: Mapping[str, str], name: str) -> bool:
    raw = (query.get(name) or "").lower()
    if raw in ("", "false", "0", "no"):
        return False
    if raw in ("true", "1", "yes"):
        return True
    raise validation_error({name: ["must be true or false"]})


def player_id_param(player_id: str) -> str:
    """A player id of a read URL: one outside the id rule names no player, a 404."""
    if not id_is_valid(player_id):
        raise ApiError(status_code=404, code="player_not_found",
                       detail=f"no player {player_id!r}: player ids are {ID_RULE}")
    return player_id


def season_id_param(season_id: str, *, write: bool = False) -> str:
    """A season id of a URL, checked before it reaches a query or a Redis key: outside the
    id rule it names no season, a 404 on reads and a 400 naming `season_id` on writes."""
    if not id_is_valid(season_id):
        if write:
            raise validation_error({"season_id": [f"must be {ID_RULE}"]})
        raise season_not_found(season_id)
    return season_id


def season_not_found(season_id: str) -> ApiError:
    return ApiError(status_code=404, code="season_not_found", detail=f"no season {season_id!r}")
