"""Query-parameter parsing shared by the read APIs: a 400 naming the parameter, never a 500.

They take the query as a mapping (a QueryDict, or the fast read path's dict), not a request."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from leaderboard.api.errors import ApiError, validation_error
from leaderboard.core.events import BIGINT_MAX, ID_RULE, check_int, id_is_valid
from leaderboard.core.season_options import check_region, unknown_region_detail

_INTEGER = re.compile(r"[+-]?[0-9]+")


def int_param(query: Mapping[str, str], name: str, *, default: int | None, low: int, high: int | None) -> int | None:
    """`high=None`: up to the largest integer a bigint column and the JSON renderer (orjson)
    both carry; beyond it a query or the response itself would fail with a 500."""
    raw = query.get(name)
    if raw is None or raw == "":
        return default
    value: int | float | str = raw
    # ASCII digits only: int() would also take " 8\n", "1_000" or another script's digits,
    # which are no integer to the API's schema (nor to most clients).
    if _INTEGER.fullmatch(raw):
        try:
            value = int(raw)
        except ValueError:
            # int() refuses a number of over 4,300 digits: it is out of range (float: inf), not "no integer".
            value = float(raw)
    problem = check_int(value, low=low, high=BIGINT_MAX if high is None else high)
    if problem:
        raise validation_error({name: [problem]})
    return int(value)


def bool_param(query: Mapping[str, str], name: str) -> bool:
    raw = (query.get(name) or "").lower()
    if raw in ("", "false", "0", "no"):
        return False
    if raw in ("true", "1", "yes"):
        return True
    raise validation_error({name: ["must be true or false"]})


def region_param(query: Mapping[str, str], *, regions: Sequence[str]) -> str | None:
    """`?region=`: None when absent or empty (the whole board); a malformed name is a 400
    naming `region`, a well-formed one the season does not have a 404 `unknown_region`."""
    raw = query.get("region")
    if raw is None or raw == "":
        return None
    if raw not in regions:
        raise unknown_region(region_name_param(raw), regions=regions)
    return raw


def region_name_param(region: str) -> str:
    """A region of a URL or query: 1..16 of [a-z0-9-], else a 400 naming `region`."""
    if problem := check_region(region):
        raise validation_error({"region": [problem]})
    return region


def unknown_region(region: str, *, regions: Sequence[str]) -> ApiError:
    """The 404 of a well-formed region that is not one of the season's."""
    return ApiError(status_code=404, code="unknown_region", detail=unknown_region_detail(region, regions))


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
            raise validation_error({"season_id": [f"must be {ID_RULE}"]}, write=True)
        raise season_not_found(season_id)
    return season_id


def season_not_found(season_id: str) -> ApiError:
    return ApiError(status_code=404, code="season_not_found", detail=f"no season {season_id!r}")
