"""Raw pipelines on the live hub's asyncio Redis client: one round trip of commands packed
into one buffer (`resp_pack`), the replies read as the parser gives them, on a plain
client or across a cluster's masters (`pipeline_raw`).

redis-py's own pipeline packs each command and runs each reply through its callbacks in
Python, which with the thousands of commands of a round's player reads was half their
cost. Apart from the reads (live.players) because this knows commands, connections, a
cluster's slot map and its outages, and nothing of what is read.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, cast

import redis
import redis.asyncio
from django.conf import settings

from leaderboard.redis_client import cluster_outage, cluster_unreachable
from leaderboard.views.rankview.wire import slot_batches

ASYNC_REDIS_CONNECTIONS = 16
# The bound of one read (a round trip) of the hub's Redis client.
REDIS_READ_TIMEOUT_SECONDS = 5.0

# A Redis command: its name and arguments (str, bytes or int), its reply taken raw (no
# redis-py callback applies to these commands' replies but ZRANGE's, which is why the plan
# sends it without the withscores option it would need).
Call = tuple[Any, ...]


_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, redis.asyncio.Redis] = weakref.WeakKeyDictionary()


def loop_redis() -> redis.asyncio.Redis:
    """The running event loop's asyncio Redis client for the rank views (live rounds, the
    fast path's top reads). A blocking pool: a burst of reads waits for a connection
    instead of failing (redis-py's default pool raises). No socket_timeout: redis-py would
    wrap every reply of a pipeline in a timer of its own; its callers bound each read as a
    whole (REDIS_READ_TIMEOUT_SECONDS, or the reads' own)."""
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        if settings.REDIS_CLUSTER:
            # Per node: a pool of up to ASYNC_REDIS_CONNECTIONS each (pipeline_raw).
            client = cast(redis.asyncio.Redis, redis.asyncio.RedisCluster.from_url(
                settings.REDIS_URL, max_connections=ASYNC_REDIS_CONNECTIONS, socket_timeout=None,
                socket_connect_timeout=2.0))
        else:
            pool = redis.asyncio.BlockingConnectionPool.from_url(
                settings.REDIS_URL, max_connections=ASYNC_REDIS_CONNECTIONS, timeout=10,
                socket_timeout=None, socket_connect_timeout=2.0)
            client = redis.asyncio.Redis(connection_pool=pool)
        _clients[loop] = client
    return client


async def pipeline_raw(r: redis.asyncio.Redis, commands: list[Call]) -> list[Any]:
    """One round trip of commands on a connection of the client's pool, packed into one
    buffer here and the replies read as the parser gives them.

    redis-py's pipeline packs each command and runs each reply through its callbacks in
    Python: with a few thousand commands per round that was half the cost of reading a
    version's players. A reply that is an error raises (the connection is dropped, since
    the replies after it are unread), like the pipeline's execute. On a cluster client the
    commands go to their slots' masters, all at once (`_nodes_pipeline_raw`).
    """
    if isinstance(r, redis.asyncio.RedisCluster):
        return await _nodes_pipeline_raw(r, commands)
    pool = r.connection_pool
    connection = await pool.get_connection()
    try:
        await connection.send_packed_command(resp_pack(commands), check_health=False)
        return [await connection.read_response() for _ in commands]
    except BaseException:
        await connection.disconnect()
        raise
    finally:
        await pool.release(connection)


async def _nodes_pipeline_raw(r: redis.asyncio.RedisCluster, commands: list[Call]) -> list[Any]:
    """`pipeline_raw` on a cluster: the commands grouped by the master of their slot (in
    order within a node, so the seqlock's reads of a slot group run after the group's
    data reads), every node's batch written before any reply is read. A stale slot map
    (a failover) drops the connections, refreshes the map and fails the round: the
    round's caller reads the next version or retries. No node answering is a redis
    ConnectionError, as on the sync client (redis_client.cluster_outage)."""
    await _cluster_call(r.initialize())
    nodes = r.nodes_manager
    batches = slot_batches(nodes, commands)
    taken = []
    try:
        # Nodes in one order for every round, so two rounds waiting for connections never
        # each hold the other's.
        for name, ats in sorted(batches.items()):
            node = r.get_node(node_name=name)
            assert node is not None
            connection = await _connection_acquire(node)
            taken.append((node, connection, ats))
            await connection.send_packed_command(resp_pack([commands[at] for at in ats]), check_health=False)
        replies: list[Any] = [None] * len(commands)
        for _, connection, ats in taken:
            for at in ats:
                replies[at] = await connection.read_response()
        return replies
    except BaseException as exc:
        for _, connection, _ in taken:
            await connection.disconnect(nowait=True)
        if isinstance(exc, redis.exceptions.RedisError):
            await _cluster_call(nodes.initialize())
        raise
    finally:
        for node, connection, _ in taken:
            node.release(connection)


async def _cluster_call(call: Awaitable[Any]) -> Any:
    """An asyncio cluster client's call that may find no node or slot available: then the
    outage every caller already handles (redis ConnectionError), not RedisClusterException."""
    try:
        return await call
    except redis.exceptions.RedisClusterException as exc:
        if not cluster_unreachable(exc):
            raise
        raise cluster_outage(exc) from exc


async def _connection_acquire(node: Any) -> Any:
    """A connection of a cluster node's pool (ASYNC_REDIS_CONNECTIONS at most): when all are
    in use, wait for one as the plain client's blocking pool does (the round's timeout
    bounds the wait), instead of failing the round."""
    while True:
        try:
            return node.acquire_connection()
        except redis.exceptions.MaxConnectionsError:
            await asyncio.sleep(0.002)


try:
    import hiredis

    _pack_command: Callable[..., bytes] | None = hiredis.pack_command
except ImportError:  # redis-py without hiredis
    _pack_command = None


def resp_pack(commands: list[Call]) -> bytes:
    """Commands in the Redis protocol (RESP arrays of bulk strings): hiredis's packer (C,
    half the time of the loop below on a round's thousands of commands) when it is there."""
    if _pack_command is not None:
        return b"".join(map(_pack_command, commands))
    out: list[bytes] = []
    for command in commands:
        out.append(b"*%d\r\n" % len(command))
        for arg in command:
            data = arg if isinstance(arg, bytes) else str(arg).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)
