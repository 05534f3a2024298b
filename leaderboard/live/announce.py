"""The publication hook: the epoch's word to the live boards that a version is published.

The process that runs an epoch sends `version_published` (leaderboard.views.signals) when
the transaction recording a version commits, and LeaderboardConfig.ready connects this
hook to it in every process. An epoch worker serves no socket, so the hook must come
without the hub, its sockets or the Channels consumers: it needs only the channel layer,
to tell the server processes that do. The season's group name is here too, beside the one
send to it; the hub's listener (live.hub) joins that group.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings

from seasons.models import Season

log = logging.getLogger(__name__)

GROUP_PREFIX = "live"
# The type of the group message.
VERSION_EVENT = "live.version"
# After an announcement failed (the layer's Redis down or hung), this process skips its
# announcements for this long: each would otherwise cost an epoch its full timeout, and
# the server processes find every version by themselves meanwhile (live.hub's watcher
# reads the season's pointer when no announcement came for VIEWS_CHECK_SECONDS).
ANNOUNCE_QUIET_SECONDS = 5.0
_quiet_until = 0.0


def season_group(season_slug: str) -> str:
    # Slugs are [-a-zA-Z0-9_] and at most 64 characters: always a valid group name.
    return f"{GROUP_PREFIX}.{season_slug}"


def season_live_state(season_slug: str) -> tuple[str, int | None] | None:
    """(state, final_version) of a season, or None when there is no such season."""
    row = Season.objects.filter(slug=season_slug).values_list("state", "final_version").first()
    return None if row is None else (row[0], row[1])


def live_version_published(season_slug: str, version: int, state: str | None = None,
                           final_version: int | None = None, **_: object) -> None:
    """Tell every live socket of the season that `version` is published: one group_send.

    Connected to the views' `version_published` signal (LeaderboardConfig.ready), sent
    after the publishing transaction commits with the season's state. It must never fail
    the epoch: the version is published whether or not anyone is told, and a socket that
    misses it catches up with the next one (full top, events since what it last sent).
    """
    global _quiet_until
    if time.monotonic() < _quiet_until:
        return
    try:
        layer = get_channel_layer()
        if layer is None:
            return
        async_to_sync(_group_send)(layer, season_group(season_slug), {
            "type": VERSION_EVENT, "season": season_slug, "version": version,
            "state": state, "final_version": final_version,
        })
    except Exception:
        _quiet_until = time.monotonic() + ANNOUNCE_QUIET_SECONDS
        log.warning("live: could not announce version %s of season %s; announcements of this process "
                    "skipped for %g s (the live boards check the season's pointer themselves)",
                    version, season_slug, ANNOUNCE_QUIET_SECONDS, exc_info=True)


async def _group_send(layer: Any, group: str, message: dict[str, Any]) -> None:
    # The layer's own socket timeout is longer than its 5 s poll (settings): a Redis that
    # hangs would hold the epoch that long.
    async with asyncio.timeout(settings.LIVE_ANNOUNCE_TIMEOUT_SECONDS):
        await layer.group_send(group, message)
