"""Running a test's async body the way the live board's server process runs: in an event
loop whose live hubs are stopped (`LiveRegistry.aclose`) before it closes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from asgiref.sync import async_to_sync

from leaderboard.live import hub as live


def live_run(body: Callable[[], Awaitable[None]]) -> None:
    """Run an async test body with async_to_sync (sync_to_async inside it runs on this,
    the test's, thread, where its database connection is), then stop the loop's hubs and
    wait for their listeners to leave their groups, so none is left for the loop's close
    to cancel."""

    async def whole() -> None:
        try:
            await body()
        finally:
            await live.registry().aclose()

    async_to_sync(whole)()
