"""Query-parameter parsing shared by the read APIs: a 400 naming the parameter, never a 500.

They take the query as a mapping (a QueryDict, or the fast read path's dict), not a request."""

from __future__ import annotations

from collections.abc import Mapping

from leaderboard.api.errors import validation_error
from leaderboard.core.events import check_player_id

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
    problem = check_player_id(player_id)
    if problem:
        raise validation_error({"player_id": [problem]})
    return player_id
