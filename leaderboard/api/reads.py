"""The public read API (docs/api.md, Reads) as plain functions: query in, (status, body, headers) out.

Two front ends call them and must answer identically: the DRF views (read_views.py,
behind Django's middleware) and the fast read path (fastpath.py), which serves the same
URLs straight from ASGI. They return the 200s; every other answer is raised as an
ApiError (a 400 naming the parameter, an unknown season's or player's 404, not_ranked's
404, version_expired's 410, unavailable's 503 with Retry-After), which both front ends
render with api_error_body.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from leaderboard.api.errors import ApiError
from leaderboard.api.params import bool_param, int_param, player_id_param, season_id_param, season_not_found
from leaderboard.core.errors import ReadVersionExpired
from leaderboard.core.manifest import Manifest
from leaderboard.core.ranking import Entry, ranked_among
from leaderboard.rankview import RankReader, Unavailable, VersionExpired
from leaderboard.selectors import leaderboard_reader, player_friends_get, player_pending_score, read_unavailable
from seasons.selectors import season_get

Query = Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


def _envelope(manifest: Manifest, body: dict[str, Any]) -> dict[str, Any]:
    return {"leaderboard_version": manifest.version, "as_of": manifest.as_of, **body}


def _entries(entries: list[Entry]) -> list[dict[str, object]]:
    return [entry.as_dict() for entry in entries]


def _read(season_id: str, call: Callable[[RankReader], Answer]) -> Answer:
    reader = leaderboard_reader(season_slug=season_id_param(season_id))
    try:
        return call(reader)
    except Unavailable:
        if season_get(slug=season_id) is None:
            raise season_not_found(season_id) from None
        raise ApiError.of(read_unavailable()) from None
    except VersionExpired as exc:
        raise ApiError.of(ReadVersionExpired(current_version=exc.current)) from None


def _not_ranked(manifest: Manifest, player_id: str) -> ApiError:
    return ApiError(status_code=404, code="not_ranked", detail="this version has no entry for the player",
                    extra=_envelope(manifest, {"player_id": player_id}))


def top_answer(*, season_id: str, query: Query) -> Answer:
    limit = int_param(query, "limit", default=100, low=1, high=100)
    version = int_param(query, "version", default=None, low=1, high=None)

    def call(reader: RankReader) -> Answer:
        manifest, top = reader.top(limit or 100, version)
        return Answer(200, _envelope(manifest, {"entries": top, "total_players": manifest.total}))

    return _read(season_id, call)


def window_answer(*, season_id: str, query: Query) -> Answer:
    first = int_param(query, "from_position", default=1, low=1, high=None)
    limit = int_param(query, "limit", default=100, low=1, high=100)
    version = int_param(query, "version", default=None, low=1, high=None)

    def call(reader: RankReader) -> Answer:
        manifest, entries = reader.window(first or 1, limit or 100, version)
        return Answer(200, _envelope(manifest, {
            "from_position": first, "entries": _entries(entries), "total_players": manifest.total,
        }))

    return _read(season_id, call)


def rank_answer(*, season_id: str, player_id: str, query: Query) -> Answer:
    player_id_param(player_id)
    version = int_param(query, "version", default=None, low=1, high=None)
    include_pending = bool_param(query, "include_pending")

    def call(reader: RankReader) -> Answer:
        view = reader.rank(player_id, version)
        pending = None
        if include_pending:
            pending = player_pending_score(season_slug=season_id, player_id=player_id, published=view.entry,
                                           version=view.manifest.version)
        if view.entry is None and pending is None:
            raise _not_ranked(view.manifest, player_id)
        body: dict[str, Any] = {"player_id": player_id, "total_players": view.total}
        if view.entry is not None:
            body.update(score=view.entry.score, rank=view.entry.rank, position=view.entry.position)
        else:
            body.update(score=None, rank=None, position=None)
        if include_pending:
            body["pending"] = None if pending is None else {
                "score": pending.score, "score_version": pending.score_version,
                "pending_version": pending.pending_version,
            }
        return Answer(200, _envelope(view.manifest, body))

    return _read(season_id, call)


def neighbors_answer(*, season_id: str, player_id: str, query: Query) -> Answer:
    player_id_param(player_id)
    radius = int_param(query, "radius", default=10, low=0, high=10)
    version = int_param(query, "version", default=None, low=1, high=None)

    def call(reader: RankReader) -> Answer:
        manifest, me, entries = reader.neighbors(player_id, radius or 0, version)
        if me is None:
            raise _not_ranked(manifest, player_id)
        return Answer(200, _envelope(manifest, {
            "player": me.as_dict(), "radius": radius, "entries": _entries(entries),
            "total_players": manifest.total,
        }))

    return _read(season_id, call)


def friends_answer(*, season_id: str, player_id: str, query: Query) -> Answer:
    """The player and their friends ranked among themselves in one version (docs/api.md,
    Friends board). A player the version does not hold is simply not in `entries`; its
    friends without an entry are only counted."""
    player_id_param(player_id)
    version = int_param(query, "version", default=None, low=1, high=None)
    friends = player_friends_get(player_id=player_id)

    def call(reader: RankReader) -> Answer:
        view = reader.players([player_id, *friends.player_ids], version)
        ranks, reached = view.ranks, view.reached
        if reached is None:
            among = ranked_among(view.scores)
        else:  # a first_reached season: an equal score reached earlier is ahead
            among = ranked_among(view.scores, tie_key=lambda member, score: (-score, reached[member]))
        entries = [{"position": position, "rank": rank, "player_id": member, "score": score,
                    "global_rank": ranks[member]}
                   for position, (member, score, rank) in enumerate(among, start=1)]
        unranked = sum(1 for friend in friends.player_ids if friend not in view.scores)
        return Answer(200, _envelope(view.manifest, {
            "player_id": player_id, "graph_version": friends.graph_version, "entries": entries,
            "unranked_friends": unranked,
        }))

    return _read(season_id, call)
