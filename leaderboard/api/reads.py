"""The public read API (docs/api.md, Reads) as plain functions: query in, (status, body, headers) out.

Two front ends call them and must answer identically: the DRF views (read_views.py,
behind Django's middleware) and the fast read path (fastpath.py), which serves the same
URLs straight from ASGI. They return the 200s; every other answer is raised as an
ApiError (a 400 naming the parameter, an unknown season's or player's 404, not_ranked's
404, version_expired's 410, unavailable's 503 with Retry-After), which both front ends
render with api_error_body.

Each read of a board takes `region`: None reads the season's global board, a region name
that region's board of the same version (docs/api.md, Regional boards), with the same
pinning, 410 and 503 rules; its answers name the `region`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from leaderboard.api.cursors import cursor_make, cursor_read
from leaderboard.api.errors import ApiError, validation_error
from leaderboard.api.params import (
    bool_param,
    int_param,
    player_id_param,
    region_name_param,
    season_id_param,
    season_not_found,
    unknown_region,
)
from leaderboard.core.errors import ReadVersionExpired
from leaderboard.core.manifest import Manifest
from leaderboard.core.ranking import RADIUS_MAX, Entry, entry_shown, ranked_among
from leaderboard.core.tiers import percentile
from leaderboard.history.selectors import movement_call, rank_24h_ago_riding
from leaderboard.views.names import (
    NO_NAME,
    Name,
    entry_dict,
    names_call,
    names_of,
    names_read,
    top_names_read,
    top_shown,
)
from leaderboard.views.rankview import RankReader, Rider, Unavailable, UnknownRegion, VersionExpired
from leaderboard.views.selectors import leaderboard_reader, player_friends_get, player_pending_score, read_unavailable
from seasons.selectors import season_get

Query = Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    # The body already encoded (the top of a version: encoded once, served many times).
    raw: bytes | None = None


def _envelope(manifest: Manifest, body: dict[str, Any]) -> dict[str, Any]:
    return {"leaderboard_version": manifest.version, "as_of": manifest.as_of, "kind": manifest.kind_dict, **body}


def _entries(manifest: Manifest, entries: list[Entry], names: Mapping[str, Name]) -> list[dict[str, object]]:
    """Entries as players see them: the score (an asc board's turned back, core.ranking.
    entry_shown), the player's current name and country, and the tier of the rank."""
    kind = manifest.kind
    return [entry_dict(manifest, entry_shown(kind, entry), names) for entry in entries]


def _names_read(reader: RankReader, player_ids: list[str]) -> dict[str, Name]:
    return names_read(reader.r, prefix=reader.keys.prefix, player_ids=player_ids)


def _names_along(reader: RankReader, player_ids: list[str]) -> None:
    """Ask for the players' names in the reader's first round trip (`_names_riding` reads them)."""
    reader.also = [names_call(reader.keys.prefix, player_ids)]


def _names_riding(reader: RankReader, player_ids: list[str]) -> dict[str, Name]:
    if reader.also_replies is None:  # the read needed no round trip of its own
        return _names_read(reader, player_ids)
    return names_of(player_ids, reader.also_replies[0])


def _board(region: str | None) -> dict[str, Any]:
    """What names the board an answer is of: nothing for the global one."""
    return {} if region is None else {"region": region}


def _region(region: str | None) -> str | None:
    """A region of a URL, checked before it reaches a Redis key (400 when malformed)."""
    return None if region is None else region_name_param(region)


def _read(season_id: str, call: Callable[[RankReader], Answer], *, region: str | None = None,
          rider: Rider | None = None) -> Answer:
    reader = leaderboard_reader(season_slug=season_id_param(season_id), region=region, rider=rider)
    try:
        return call(reader)
    except Unavailable:
        # No version to ask: the database says whether the season, and the region, exist.
        season = season_get(slug=season_id)
        if season is None:
            raise season_not_found(season_id) from None
        if region is not None and region not in season.regions:
            raise unknown_region(region, regions=season.regions) from None
        raise ApiError.of(read_unavailable()) from None
    except UnknownRegion as exc:
        raise unknown_region(exc.region, regions=list(exc.manifest.regions)) from None
    except VersionExpired as exc:
        raise ApiError.of(ReadVersionExpired(current_version=exc.current)) from None


def _not_ranked(manifest: Manifest, player_id: str, region: str | None) -> ApiError:
    return ApiError(status_code=404, code="not_ranked", detail="this version has no entry for the player",
                    extra=_envelope(manifest, {**_board(region), "player_id": player_id}))


def top_answer(*, season_id: str, query: Query, region: str | None = None, rider: Rider | None = None) -> Answer:
    region, limit, version = top_params(query=query, region=region)

    def call(reader: RankReader) -> Answer:
        manifest, _ = reader.top(limit, version)
        names = top_names_read(reader.r, prefix=reader.keys.prefix, manifest=manifest)
        return top_of(manifest, region=region, limit=limit, names=names)

    return _read(season_id, call, region=region, rider=rider)


def top_params(*, query: Query, region: str | None) -> tuple[str | None, int, int | None]:
    """(region, limit, version) of a top read, each checked (a 400 naming it)."""
    region = _region(region)
    limit = int_param(query, "limit", default=100, low=1, high=100)
    version = int_param(query, "version", default=None, low=1, high=None)
    return region, limit or 100, version


def top_of(manifest: Manifest, *, region: str | None, limit: int, names: list[Any]) -> Answer:
    """The top answer of a version's board (the manifest holds its top 100), with the
    names (the raw reply of names_call for top_ids) as they are now."""
    head, entries, tail, shown = _top_encoded(manifest, region, names)
    cursor = _top_cursor(manifest, region, limit)
    return Answer(200, _envelope(manifest, {**_board(region), "entries": shown[:limit],
                                            "total_players": manifest.total, "next_cursor": cursor}),
                  raw=head + b",".join(entries[:limit]) + tail + b',"next_cursor":' + orjson.dumps(cursor) + b"}")


def _top_cursor(manifest: Manifest, region: str | None, limit: int) -> str | None:
    """The cursor after the top's `limit`-th entry, made once per version and limit."""
    cursors: dict[int, str | None] = manifest.memo.setdefault("top_cursors", {})
    if limit not in cursors:
        top = manifest.top[:limit]
        if not top or top[-1]["position"] >= manifest.total:
            cursors[limit] = None
        else:
            last = top[-1]
            value = last["score"] if "reached_ms" not in last else (last["score"], last["reached_ms"])
            cursors[limit] = cursor_make(season=manifest.season, region=region, value=value,
                                         player_id=last["player_id"])
    return cursors[limit]


def _top_encoded(manifest: Manifest, region: str | None, names: list[Any]
                 ) -> tuple[bytes, list[bytes], bytes, list[dict[str, Any]]]:
    """The version's top answer encoded once for a set of names, in three parts: every
    `limit` is the head, that many entries and the tail (the same bytes as the body
    encoded whole, but for next_cursor, which follows the tail), and the entries. Kept
    with the names it has (views.names.top_shown)."""
    shown = top_shown(manifest, names)
    held: tuple[list[dict[str, Any]], tuple[bytes, list[bytes], bytes, list[dict[str, Any]]]] | None = \
        manifest.memo.get("top_answer")
    if held is not None and held[0] is shown:
        return held[1]
    head = orjson.dumps(_envelope(manifest, _board(region)))[:-1] + b',"entries":['
    tail = b'],"total_players":' + orjson.dumps(manifest.total)
    parts = (head, [orjson.dumps(entry) for entry in shown], tail, shown)
    manifest.memo["top_answer"] = (shown, parts)
    return parts


def window_answer(*, season_id: str, query: Query, region: str | None = None,
                  rider: Rider | None = None) -> Answer:
    """A page of the board from `from_position`, or with `after` (a next_cursor) the page
    after the cursor's entry in the current version (docs/api.md, Paging without expiry)."""
    region = _region(region)
    limit = int_param(query, "limit", default=100, low=1, high=100) or 100
    after = query.get("after")
    if after is not None:
        for other in ("from_position", "version"):
            if other in query:
                raise validation_error({other: ["a cursor (after) pages the current version from its own place: "
                                                "leave this parameter out"]})
        value, player_id = cursor_read(after, season=season_id, region=region)
    first = int_param(query, "from_position", default=1, low=1, high=None) or 1
    version = int_param(query, "version", default=None, low=1, high=None)

    def call(reader: RankReader) -> Answer:
        if after is None:
            manifest, entries = reader.window(first, limit, version)
        else:
            manifest, entries = reader.after(value, player_id, limit)
        names = _names_read(reader, [entry.player_id for entry in entries])
        body: dict[str, Any] = {**_board(region)}
        if after is None:
            body["from_position"] = first
        body.update(entries=_entries(manifest, entries, names), total_players=manifest.total,
                    next_cursor=_next_cursor(season_id, region, manifest, entries, reader.last))
        return Answer(200, _envelope(manifest, body))

    return _read(season_id, call, region=region, rider=rider)


def _next_cursor(season_id: str, region: str | None, manifest: Manifest, entries: list[Entry],
                 last: tuple[str, Any] | None) -> str | None:
    """The cursor after a page's last entry; None when the page reaches the board's end."""
    if not entries or last is None or entries[-1].position >= manifest.total:
        return None
    return cursor_make(season=season_id, region=region, value=last[1], player_id=last[0])


def rank_answer(*, season_id: str, player_id: str, query: Query, region: str | None = None,
                rider: Rider | None = None) -> Answer:
    """The player's entry; the answer names the player's `region` in the version (null for
    none), which on a regional board is that board's."""
    region = _region(region)
    player_id_param(player_id)
    version = int_param(query, "version", default=None, low=1, high=None)
    include_pending = bool_param(query, "include_pending")

    def call(reader: RankReader) -> Answer:
        _names_along(reader, [player_id])
        if region is None:  # the snapshots are of the global board
            reader.also.append(movement_call(reader.keys, player_id))
        view = reader.rank(player_id, version)
        name, country = _names_riding(reader, [player_id]).get(player_id, NO_NAME)
        entry = None if view.entry is None else entry_shown(view.manifest.kind, view.entry)
        pending = None
        if include_pending:
            pending = player_pending_score(season_slug=season_id, player_id=player_id, published=entry,
                                           version=view.manifest.version, region=region)
        if view.entry is None and pending is None:
            raise _not_ranked(view.manifest, player_id, region)
        # On a regional board a player only pending there is named by the board, not by
        # the region the version still holds them in.
        body: dict[str, Any] = {"player_id": player_id, "display_name": name, "country": country,
                                "region": region or view.region, "total_players": view.total}
        if entry is not None:
            body.update(score=entry.score, rank=entry.rank, position=entry.position,
                        percentile=percentile(rank=entry.rank, tied=view.tied, total=view.total),
                        tier=view.manifest.tier_of(entry.rank))
        else:
            body.update(score=None, rank=None, position=None, percentile=None, tier=None)
        if region is None:
            body["rank_24h_ago"] = rank_24h_ago_riding(reader, player_id=player_id, at=1)
        if include_pending:
            body["pending"] = None if pending is None else {
                "score": pending.score, "score_version": pending.score_version,
                "pending_version": pending.pending_version,
            }
        return Answer(200, _envelope(view.manifest, body))

    return _read(season_id, call, region=region, rider=rider)


def neighbors_answer(*, season_id: str, player_id: str, query: Query, region: str | None = None,
                     rider: Rider | None = None) -> Answer:
    region = _region(region)
    player_id_param(player_id)
    radius = int_param(query, "radius", default=RADIUS_MAX, low=0, high=RADIUS_MAX)
    version = int_param(query, "version", default=None, low=1, high=None)

    def call(reader: RankReader) -> Answer:
        manifest, me, entries = reader.neighbors(player_id, radius or 0, version)
        if me is None:
            raise _not_ranked(manifest, player_id, region)
        names = _names_read(reader, [entry.player_id for entry in entries])
        return Answer(200, _envelope(manifest, {
            **_board(region), "player": _entries(manifest, [me], names)[0], "radius": radius,
            "entries": _entries(manifest, entries, names),
            "total_players": manifest.total,
        }))

    return _read(season_id, call, region=region, rider=rider)


def friends_answer(*, season_id: str, player_id: str, query: Query, rider: Rider | None = None) -> Answer:
    """The player and their friends ranked among themselves in one version (docs/api.md,
    Friends board). A player the version does not hold is simply not in `entries`; its
    friends without an entry are only counted."""
    player_id_param(player_id)
    version = int_param(query, "version", default=None, low=1, high=None)
    friends = player_friends_get(player_id=player_id)

    members = [player_id, *friends.player_ids]

    def call(reader: RankReader) -> Answer:
        _names_along(reader, members)
        view = reader.players(members, version)
        names = _names_riding(reader, members)
        ranks, reached, shown, tier_of = view.ranks, view.reached, view.manifest.kind.flipped, view.manifest.tier_of
        if reached is None:
            among = ranked_among(view.scores)
        else:  # a first_reached season: an equal score reached earlier is ahead
            among = ranked_among(view.scores, tie_key=lambda member, score: (-score, reached[member]))
        # Ranked on the board's values (higher first), shown as scores.
        entries = [{"position": position, "rank": rank, "player_id": member, "score": shown(score),
                    "display_name": name, "country": country, "global_rank": ranks[member],
                    "tier": tier_of(ranks[member])}
                   for position, (member, score, rank) in enumerate(among, start=1)
                   for name, country in [names.get(member, NO_NAME)]]
        unranked = sum(1 for friend in friends.player_ids if friend not in view.scores)
        return Answer(200, _envelope(view.manifest, {
            "player_id": player_id, "graph_version": friends.graph_version, "entries": entries,
            "unranked_friends": unranked,
        }))

    return _read(season_id, call, rider=rider)
