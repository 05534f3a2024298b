"""The fan-out's send (leaderboard.live.frames.send_started): a send runs in the caller's task until
it completes or first waits; only then does the rest need a task of its own, which goes on
exactly where the send stopped and takes a cancellation (the send timeout) into it. And
the garbage collector's pause around a round (gc_paused). Plain asyncio: no database,
Redis or Channels."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable, Iterator

import pytest

from leaderboard.core.gc_pause import gc_paused
from leaderboard.live.frames import send_started


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(body())  # type: ignore[arg-type]


def test_a_send_that_does_not_wait_completes_in_the_callers_task() -> None:
    async def body() -> None:
        ran_in: list[asyncio.Task[object] | None] = []

        writable = asyncio.Event()
        writable.set()

        async def send() -> None:
            await writable.wait()  # as the server's send does: no wait while the buffer has room
            ran_in.append(asyncio.current_task())

        assert send_started(send()) is None
        assert ran_in == [asyncio.current_task()]

    run(body)


def test_a_server_whose_send_returns_a_future_is_awaited_only_while_it_is_pending() -> None:
    """granian's send hands back a future (the frame already on its way), not a coroutine."""
    async def body() -> None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        done.set_result(None)
        assert send_started(done) is None
        pending: asyncio.Future[None] = loop.create_future()
        rest = send_started(pending)
        assert rest is pending
        loop.call_soon(pending.set_result, None)
        await rest
        failed: asyncio.Future[None] = loop.create_future()
        failed.set_exception(ConnectionResetError("the client went away"))
        with pytest.raises(ConnectionResetError):
            send_started(failed)

    run(body)


def test_a_send_that_waits_goes_on_where_it_stopped_when_its_rest_is_awaited() -> None:
    async def body() -> None:
        gate = asyncio.Event()
        steps: list[str] = []

        async def send() -> None:
            steps.append("written")
            await gate.wait()  # the client's buffer is full
            steps.append("drained")
            await asyncio.sleep(0)
            steps.append("done")

        rest = send_started(send())
        assert rest is not None and steps == ["written"]

        async def finish() -> None:
            await rest

        task = asyncio.ensure_future(finish())
        await asyncio.sleep(0.01)
        assert steps == ["written"] and not task.done()
        gate.set()
        await asyncio.wait_for(task, 1)
        assert steps == ["written", "drained", "done"]

    run(body)


def test_the_send_timeout_cancels_the_waiting_send() -> None:
    async def body() -> None:
        seen: list[str] = []

        async def send() -> None:
            try:
                await asyncio.Event().wait()  # a client that never reads again
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise

        rest = send_started(send())
        assert rest is not None

        async def bounded() -> None:
            async with asyncio.timeout(0.05):
                await rest

        with pytest.raises(TimeoutError):
            await asyncio.ensure_future(bounded())
        assert seen == ["cancelled"]

    run(body)


def test_what_a_send_raises_before_it_waits_is_raised_at_once() -> None:
    async def body() -> None:
        async def send() -> None:
            raise ConnectionResetError("the client went away")

        with pytest.raises(ConnectionResetError):
            send_started(send())

    run(body)


@pytest.fixture
def gc_enabled() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


@pytest.mark.usefixtures("gc_enabled")
def test_overlapping_rounds_keep_the_collector_paused_until_the_last_ends() -> None:
    async def body() -> None:
        first_in, second_in, first_out = asyncio.Event(), asyncio.Event(), asyncio.Event()

        async def first() -> None:
            with gc_paused():
                first_in.set()
                await second_in.wait()
            first_out.set()

        async def second() -> None:
            await first_in.wait()
            with gc_paused():
                second_in.set()
                await first_out.wait()
                assert not gc.isenabled()  # the first round ended: this one still runs
            assert gc.isenabled()

        await asyncio.gather(first(), second())

    run(body)
    assert gc.isenabled()


@pytest.mark.usefixtures("gc_enabled")
def test_a_pause_ends_however_the_round_ends_and_leaves_a_disabled_collector_alone() -> None:
    with pytest.raises(RuntimeError), gc_paused():
        assert not gc.isenabled()
        raise RuntimeError("the round failed")
    assert gc.isenabled()
    gc.disable()
    with gc_paused():
        pass
    assert not gc.isenabled()
