"""What a socket is sent besides the rounds' versions: its snapshot, read for it alone on
connect and on request (`snapshot_read`, `snapshot_message`), and "unavailable" with the
running recovery's progress (`unavailable_message`, `unavailable_text`).

Apart from the hub because these are one socket's reads, through the API's reader and
the database, mostly sent by its consumer (live.consumers); the hub only sends the
unavailable notice to all of a season's sockets when its views are lost.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import orjson
from channels.db import database_sync_to_async

from leaderboard.core.live import TOP_LIMIT, Subscription, board_fields, player_payload, recovery_payload
from leaderboard.core.manifest import Manifest
from leaderboard.core.ranking import entry_shown
from leaderboard.history.selectors import movement_call, rank_24h_ago_riding
from leaderboard.live.players import PlayerRead, player_shown
from leaderboard.models import ACTIVE_REBUILD_STATUSES, RebuildJob
from leaderboard.views import rankview
from leaderboard.views.names import names_read, top_names_read, top_shown
from leaderboard.views.selectors import leaderboard_reader, read_unavailable

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Snapshot:
    manifest: Manifest
    top: list[dict[str, Any]]
    player: PlayerRead | None


def snapshot_read(season_slug: str, subscription: Subscription) -> Snapshot | None:
    """The current version for one socket (on connect and on request); None: unavailable.

    Top and player come from the one manifest the reader chose: the top 100 lives in it.
    A regional subscription reads that region's board of the version; a version without
    it (the consumer checked the season has the region) has nothing to show either.
    """
    reader = leaderboard_reader(season_slug=season_slug, region=subscription.region)
    try:
        if subscription.player_id is None:
            manifest, _ = reader.top(TOP_LIMIT)
            return Snapshot(manifest=manifest, top=_top(reader, manifest), player=None)
        if subscription.region is None:  # the snapshots are of the global board
            reader.also.append(movement_call(reader.keys, subscription.player_id))
        manifest, me, window = reader.neighbors(subscription.player_id, subscription.radius)
        kind = manifest.kind
        names = names_read(reader.r, prefix=reader.keys.prefix, player_ids=[e.player_id for e in window])
        moved = None
        if me is not None and subscription.region is None:
            # A follow's first message: computed here (a worker thread) when not kept yet,
            # so the versions after it find it in Redis.
            moved = rank_24h_ago_riding(reader, player_id=subscription.player_id, at=0)
        return Snapshot(manifest=manifest, top=_top(reader, manifest),
                        player=PlayerRead(entry=None if me is None else entry_shown(kind, me),
                                          window=tuple(entry_shown(kind, e) for e in window),
                                          radius=subscription.radius, tied=reader.tied, names=names,
                                          rank_24h_ago=moved))
    except (rankview.Unavailable, rankview.UnknownRegion):
        return None


def _top(reader: rankview.RankReader, manifest: Manifest) -> list[dict[str, Any]]:
    """The version's top with the names it has now."""
    return top_shown(manifest, top_names_read(reader.r, prefix=reader.keys.prefix, manifest=manifest))[:TOP_LIMIT]


def snapshot_message(season_slug: str, state: str | None, final_version: int | None, snapshot: Snapshot,
                     subscription: Subscription) -> dict[str, Any]:
    manifest = snapshot.manifest
    message: dict[str, Any] = {
        "type": "snapshot", "season_id": season_slug, **board_fields(manifest.board), "state": state,
        "final_version": final_version,
        "leaderboard_version": manifest.version, "as_of": manifest.as_of, "total_players": manifest.total,
        # Fixed for the season: the snapshot states it, the version messages after it do not repeat it.
        "kind": manifest.kind_dict, "top": snapshot.top,
    }
    if subscription.player_id is not None and snapshot.player is not None:
        message["player"] = player_payload(subscription.player_id, snapshot.player.entry,
                                           snapshot.player.window, subscription.radius,
                                           **player_shown(manifest, snapshot.player))
    return message


def snapshot_text(season_slug: str, state: str | None, final_version: int | None, snapshot: Snapshot,
                  subscription: Subscription) -> str:
    """`snapshot_message` encoded: once per version and season state for every socket
    without a player (the top is all it shows), per socket with one."""
    if subscription.player_id is not None:
        return orjson.dumps(snapshot_message(season_slug, state, final_version, snapshot, subscription)).decode()
    key = ("snapshot", season_slug, state, final_version, len(snapshot.top))
    text: str | None = snapshot.manifest.memo.get(key)
    if text is None:
        text = snapshot.manifest.memo[key] = orjson.dumps(
            snapshot_message(season_slug, state, final_version, snapshot, subscription)).decode()
    return text


def unavailable_message(season_slug: str, state: str | None, final_version: int | None,
                        recovery: dict[str, Any] | None = None, *, region: str | None = None) -> dict[str, Any]:
    """The read API's 503 body as a socket message: the same reason and retry_after, and
    the progress of the season's recovery while one runs (`recovery_payload`), else null."""
    refusal = read_unavailable()
    return {
        "type": refusal.code, "season_id": season_slug, **board_fields(region or ""), "state": state,
        "final_version": final_version,
        "retry_after": refusal.retry_after,
        "detail": f"{refusal.detail}; the next published version is pushed to this socket",
        "recovery": recovery,
    }


def recovery_progress(season_slug: str) -> dict[str, Any] | None:
    """The progress of the season's running recovery (a RebuildJob of kind recovery that
    is queued, building or comparing), as the console shows it; None when none runs."""
    row = (
        RebuildJob.objects
        .filter(season__slug=season_slug, kind=RebuildJob.Kind.RECOVERY, status__in=ACTIVE_REBUILD_STATUSES)
        .values_list("status", "done", "total", "eta_seconds")
        .first()
    )
    if row is None:
        return None
    status, done, total, eta_seconds = row
    return recovery_payload(status=status, done=done, total=total, eta_seconds=eta_seconds)


async def unavailable_text(season_slug: str, state: str | None, final_version: int | None, *,
                           region: str | None = None) -> str:
    """The unavailable message, serialized, with the running recovery's progress (null
    when none runs, or when the database cannot say: the notice matters more)."""
    try:
        progress = await database_sync_to_async(recovery_progress)(season_slug)
    except Exception:
        log.warning("live: recovery progress of %s could not be read", season_slug, exc_info=True)
        progress = None
    return orjson.dumps(unavailable_message(season_slug, state, final_version, progress, region=region)).decode()
