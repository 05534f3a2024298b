"""Stopping a live hub's tasks (`tasks_stop`): a task that loses its cancellation is
cancelled again, so a hub whose last socket left, or a closing event loop, never keeps
a listener polling the channel layer."""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import Any, cast

import pytest
from channels_redis.core import RedisChannelLayer
from django.conf import settings

from leaderboard.live.hub import tasks_stop


def test_a_task_that_loses_its_first_cancellation_is_cancelled_again() -> None:
    async def body() -> None:
        async def stubborn() -> None:
            with contextlib.suppress(asyncio.CancelledError):  # lost, as redis-py's wait_for can lose one (below)
                await asyncio.sleep(60)
            await asyncio.sleep(60)

        task = asyncio.ensure_future(stubborn())
        await asyncio.sleep(0)
        await asyncio.wait_for(tasks_stop(lambda: [task], retry_seconds=0.05), 5)
        assert task.cancelled()

    asyncio.run(body())


def test_a_task_started_while_stopping_is_stopped_too() -> None:
    """A publisher an announcement started after the first cancellation ends as well."""
    async def body() -> None:
        tasks: list[asyncio.Task[None]] = []

        async def first() -> None:
            try:
                await asyncio.sleep(60)
            finally:
                tasks.append(asyncio.ensure_future(asyncio.sleep(60)))  # started on its way out

        tasks.append(asyncio.ensure_future(first()))
        await asyncio.sleep(0)
        await asyncio.wait_for(tasks_stop(lambda: tasks, retry_seconds=0.05), 5)
        assert len(tasks) == 2 and all(task.cancelled() for task in tasks)

    asyncio.run(body())


def test_tasks_that_ended_already_or_none_return_at_once() -> None:
    async def body() -> None:
        done = asyncio.ensure_future(asyncio.sleep(0))
        await done
        await asyncio.wait_for(tasks_stop(lambda: [done]), 1)
        await asyncio.wait_for(tasks_stop(lambda: []), 1)

    asyncio.run(body())


@pytest.mark.parametrize("seed", [1, 2])
def test_channel_layer_receives_cancelled_anywhere_all_end(seed: int) -> None:
    """Real channels-redis receives on the project's channel layer settings, cancelled a
    few milliseconds in (while their first commands are sent, where Python 3.11's
    wait_for inside redis-py loses some cancellations): every one ends."""
    rng = random.Random(seed)

    async def body() -> None:
        config = cast(dict[str, Any], settings.CHANNEL_LAYERS["default"]["CONFIG"])
        layer = RedisChannelLayer(hosts=config["hosts"], prefix=f"{config['prefix']}:stop-test")
        for _ in range(40):
            channel = await layer.new_channel(prefix="live")
            receiving: list[asyncio.Task[None]] = [asyncio.ensure_future(layer.receive(channel))]
            await asyncio.sleep(rng.choice([0, 0.001, 0.002, 0.003, 0.005, 0.01]))
            await asyncio.wait_for(tasks_stop(receiving.copy, retry_seconds=0.2), 10)
            assert receiving[0].done()
        await layer.flush()

    asyncio.run(body())
