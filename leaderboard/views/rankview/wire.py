"""Commands on the wire: protocol encoding, scripts, routing by slot, the readers' one-round-trip
pipelines and the writes sent to every node at once."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, cast

import hiredis
import redis
from redis.crc import key_slot
from redis.exceptions import AskError, ClusterDownError, MovedError, RedisClusterException, TryAgainError

from leaderboard.redis_client import cluster_outage, cluster_unreachable


def _script_call(script: str, script_keys: list[str], argv: list[Any]) -> tuple[Any, ...]:
    # EVAL, not EVALSHA: a write must not depend on a script a restarted or newly promoted
    # node never loaded (NOSCRIPT would refuse the write and send it round again); the body
    # is ~300 bytes of a chunk's ~100 kB, and Redis compiles it once.
    return ("EVAL", script, len(script_keys), *script_keys, *argv)


def _pack(commands: Iterable[tuple[Any, ...]]) -> bytes:
    """Commands in the Redis protocol, encoded by hiredis in one go."""
    return b"".join([hiredis.pack_command(c) for c in commands])


def _transaction(commands: list[tuple[Any, ...]]) -> bytes:
    return _pack((("MULTI",), *commands, ("EXEC",)))


_reader = threading.local()


def _reader_connection(r: redis.Redis) -> Any:
    """This thread's own connection to `r`'s server, made from its pool's settings."""
    pool = r.connection_pool
    conn = getattr(_reader, "conn", None)
    if conn is None or _reader.pool is not pool or _reader.pid != os.getpid():
        conn = pool.connection_class(**pool.connection_kwargs)
        _reader.conn, _reader.pool, _reader.pid = conn, pool, os.getpid()
    return conn


def round_trip(r: redis.Redis, commands: list[tuple[Any, ...]]) -> list[Any]:
    """Send commands in one round trip and return their raw replies (bytes, ints, lists).

    What a redis-py pipeline does, without the Pipeline object, the pool's lock and its
    per-command encoding: each reading thread keeps a connection of its own. ~45 us less
    CPU per round trip, a fifth of a whole rank read once Django is out of the way
    (fastpath.py). Errors drop the connection, so a half-read reply is never reused.
    On a cluster client the commands go to the masters of their keys' slots, one
    connection per node, all sent before any reply is read (`_cluster_reads`).
    """
    if isinstance(r, redis.RedisCluster):
        return _cluster_reads(r, commands)
    conn = _reader_connection(r)
    try:
        conn.send_packed_command([_pack(commands)])
        return [conn.read_response() for _ in commands]
    except BaseException:
        conn.disconnect()
        raise


# Replies by which a cluster node refuses a command without running it: its slot is served
# elsewhere now (MOVED: a failover, a resharding; ASK: a slot being migrated), or not at
# the moment (TRYAGAIN: a multi-key command during a migration; CLUSTERDOWN: a slot with no
# master). The slot map is refreshed and the command sent once more.
CLUSTER_REFUSALS = (MovedError, AskError, ClusterDownError, TryAgainError)
# Errors after which the slot map is refreshed (a failed node's replica has its slots).
_MAP_STALE = (*CLUSTER_REFUSALS, redis.ConnectionError, redis.TimeoutError)
_MAP_ATTEMPTS = 2
# Before sending again what TRYAGAIN or CLUSTERDOWN refused: a migration's key move or a
# promotion takes milliseconds to seconds; a moment's wait gives the one resend a chance.
_REFUSED_PAUSE_SECONDS = 0.1
# A read is sent again up to this many times while a node refuses it, with a shorter pause
# (its deadline, READ_DEADLINE_SECONDS, is 0.2 s): a script naming a key the migrating slot
# does not hold (a hidden set that is empty, a key moved already) is refused with TRYAGAIN
# on both nodes until the slot is handed over, which a reshard does within milliseconds of
# moving its last key.
_READ_RESENDS = 3
_READ_REFUSED_PAUSE_SECONDS = 0.02


def slot_map_refresh(cluster: redis.RedisCluster) -> None:
    """The cluster client's slot map read again from the nodes. No node answering is the
    outage every caller answers (redis ConnectionError), not the client's own exception."""
    try:
        cluster.nodes_manager.initialize()
    except RedisClusterException as exc:
        if not cluster_unreachable(exc):
            raise
        raise cluster_outage(exc) from exc


def _command_key(command: tuple[Any, ...]) -> Any:
    """The key that routes a command: a script's first key, else its first argument."""
    if command[0] in ("EVAL", "EVALSHA", "FCALL"):
        return command[3]
    return command[1]


def slot_batches(nodes: Any, commands: list[tuple[Any, ...]]) -> dict[str, list[int]]:
    """The commands' indexes (in order) by the name of the master serving their key's slot,
    from a cluster client's nodes manager (sync or asyncio)."""
    return keys_by_node(nodes, [_command_key(command) for command in commands])


def keys_by_node(nodes: Any, keys: Iterable[Any]) -> dict[str, list[int]]:
    """The keys' indexes (in order) by the name of the master serving their slot: the one
    routing of reads and writes alike."""
    # The slot map read without the manager's lock: a dict lookup (0.1 us) instead of
    # get_node_from_slot (3.5 us a command, ~30 us of a rank read's nine); a map being
    # replaced meanwhile is a refresh, and a stale one answers MOVED.
    slots = nodes.slots_cache
    batches: dict[str, list[int]] = {}
    for at, key in enumerate(keys):
        slot = key_slot(key if isinstance(key, bytes) else str(key).encode())
        serving = slots.get(slot)
        name = serving[0].name if serving else _slot_node(nodes, slot).name
        batches.setdefault(name, []).append(at)
    return batches


def _slot_node(nodes: Any, slot: int) -> Any:
    """The node serving `slot` from the manager itself (a slot missing from the cached map)."""
    try:
        return nodes.get_node_from_slot(slot)
    except RedisClusterException as exc:
        if not cluster_unreachable(exc):
            raise
        raise cluster_outage(exc) from exc


def _node_connection(cluster: redis.RedisCluster, name: str) -> Any:
    """This thread's own connection to cluster node `name`, from its pool's settings."""
    conns = getattr(_reader, "nodes", None)
    if conns is None or _reader.cluster is not cluster or _reader.nodes_pid != os.getpid():
        conns = _reader.nodes = {}
        _reader.cluster, _reader.nodes_pid = cluster, os.getpid()
    conn = conns.get(name)
    if conn is None:
        pool = cluster.get_redis_connection(cluster.get_node(node_name=name)).connection_pool
        conn = conns[name] = pool.connection_class(**pool.connection_kwargs)
    return conn


def _cluster_reads(cluster: redis.RedisCluster, commands: list[tuple[Any, ...]]) -> list[Any]:
    """`round_trip` on a cluster: the commands grouped by the master of their slot (in
    order within a node, so a read placed after others on the same slot runs after them),
    every node's batch written before any reply is read, so the trip takes about the time
    of the slowest node. A failed node: the slot map refreshed, the whole trip sent once
    more (reads change nothing). Commands a node refused unrun (a slot being migrated
    answers ASK for the keys it no longer has, TRYAGAIN for a script whose keys are split)
    are sent again as writes are (`_refused_resend`: behind ASKING to the node named), up
    to _READ_RESENDS times; still refused, an outage."""
    nodes = cluster.nodes_manager
    for attempt in range(_MAP_ATTEMPTS):
        batches = slot_batches(nodes, commands)
        conns = [(_node_connection(cluster, name), ats) for name, ats in batches.items()]
        replies: list[Any] = [None] * len(commands)
        try:
            for conn, ats in conns:
                conn.send_packed_command([_pack(commands[at] for at in ats)])
            for conn, ats in conns:
                for at in ats:
                    replies[at] = _reply_read(conn)
        except BaseException as exc:
            for conn, _ in conns:
                conn.disconnect()
            if not isinstance(exc, _MAP_STALE) or attempt + 1 == _MAP_ATTEMPTS:
                raise
            slot_map_refresh(cluster)
            continue
        return _cluster_replies_settled(cluster, commands, replies)
    raise AssertionError("unreachable")


def _reply_read(conn: Any) -> Any:
    """One reply; an error reply as its exception (a whole reply: the connection stays in step)."""
    try:
        return conn.read_response()
    except redis.ResponseError as error:
        return error


def _cluster_replies_settled(cluster: redis.RedisCluster, commands: list[tuple[Any, ...]],
                             replies: list[Any]) -> list[Any]:
    """The replies of a cluster trip with the refused commands sent again until answered (at
    most _READ_RESENDS times); the first error left is raised (a command still refused is
    the outage every reader answers)."""
    calls: list[tuple[str, tuple[Any, ...]]] | None = None
    for _ in range(_READ_RESENDS):
        if not any(isinstance(reply, CLUSTER_REFUSALS) for reply in replies):
            break
        calls = calls or [(_command_key(command), command) for command in commands]
        _refused_resend(cluster, calls, replies, pause=_READ_REFUSED_PAUSE_SECONDS)
    for reply in replies:
        if isinstance(reply, CLUSTER_REFUSALS):
            raise redis.ConnectionError(f"Redis Cluster slots still moving: {reply}") from reply
        if isinstance(reply, redis.ResponseError):
            raise reply
    return replies


# Threads sending to the masters of a cluster at once: an epoch's chunk goes to every
# master in parallel, so on K masters it takes about as long as on the slowest one.
_NODE_SENDERS = 8
_node_pool: ThreadPoolExecutor | None = None
_node_pool_lock = threading.Lock()


def _node_senders() -> ThreadPoolExecutor:
    global _node_pool
    with _node_pool_lock:
        if _node_pool is None:
            _node_pool = ThreadPoolExecutor(max_workers=_NODE_SENDERS, thread_name_prefix="redis-node")
        return _node_pool


def slot_client(r: redis.Redis, key: str) -> redis.Redis:
    """The client of the node serving `key`'s slot (`r` itself on a single Redis): for
    transactions and raw connections, which a cluster client only has per node."""
    if not isinstance(r, redis.RedisCluster):
        return r
    return r.get_redis_connection(_slot_node(r.nodes_manager, r.keyslot(key)))  # type: ignore[no-any-return]


def node_clients(r: redis.Redis, routes: Iterable[str]) -> dict[str, tuple[redis.Redis, list[int]]]:
    """The calls' indexes by the client of the node serving each routing key: on a cluster,
    one per master (its slot's current primary); on a single Redis, `r` for all."""
    if not isinstance(r, redis.RedisCluster):
        return {"": (r, list(range(len(list(routes)))))}
    return {name: (r.get_redis_connection(r.get_node(node_name=name)), indexes)
            for name, indexes in keys_by_node(r.nodes_manager, routes).items()}


def nodes_round_trip(r: redis.Redis, calls: list[tuple[str, tuple[Any, ...]]]) -> list[Any]:
    """Send each (routing key, command) to the node serving its key's slot and return the
    raw replies in call order, an error reply as its `redis.ResponseError` (not raised: the
    caller decides, and every other reply is still read).

    One pipeline per node (one packed send, then its replies), every node at once from a
    thread each: a write that spans K masters costs about the time of the slowest one.
    Calls a node refused unrun (CLUSTER_REFUSALS) are sent once more on a fresh slot map;
    their replies are then the second answers. Any other error drops that node's
    connection, so a half-read reply is never reused."""
    return nodes_packed_send(nodes_pack(r, calls))


@dataclass(frozen=True, slots=True)
class NodesPacked:
    """Calls routed to their nodes and encoded (`nodes_pack`), ready for `nodes_packed_send`."""

    total: int
    # (the node's client, the calls' indexes in call order, their commands encoded in pieces)
    batches: list[tuple[redis.Redis, list[int], list[bytes]]]
    # The cluster client they were routed by (None on a single Redis): its slot map is
    # refreshed when a node fails, so that the next write goes to the promoted replica.
    cluster: redis.RedisCluster | None = None
    # The calls themselves (on a cluster), for sending again those a node refused.
    calls: list[tuple[str, tuple[Any, ...]]] | None = None


# A node's batch goes to its socket in pieces of about this size, each with the client's
# whole socket timeout: a build batch is tens of MB that Redis reads only as fast as it
# runs the scripts before them, and one write of it all would have to finish within the
# timeout (2 s) however long those take.
_PIECE_BYTES = 1 << 20


def _pieces(commands: Iterable[tuple[Any, ...]]) -> list[bytes]:
    pieces: list[bytes] = []
    piece: list[bytes] = []
    size = 0
    for command in commands:
        encoded = hiredis.pack_command(command)
        piece.append(encoded)
        size += len(encoded)
        if size >= _PIECE_BYTES:
            pieces.append(b"".join(piece))
            piece, size = [], 0
    if piece:
        pieces.append(b"".join(piece))
    return pieces


def nodes_pack(r: redis.Redis, calls: list[tuple[str, tuple[Any, ...]]]) -> NodesPacked:
    """Route and encode calls for `nodes_packed_send`: a build encodes batch i+1 in its own
    thread while batch i is on the wire, and the sending threads only wait on sockets."""
    cluster = r if isinstance(r, redis.RedisCluster) else None
    by_node = node_clients(r, [key for key, _ in calls])
    return NodesPacked(total=len(calls), batches=[
        (client, indexes, _pieces(calls[i][1] for i in indexes)) for client, indexes in by_node.values()],
        cluster=cluster, calls=calls if cluster is not None else None)


# One node's share of a send: its client, the calls' indexes, their commands encoded, and
# how many replies each call has (2 for a call sent behind ASKING, whose +OK is dropped).
_Batch = tuple[redis.Redis, list[int], list[bytes], int]


def nodes_packed_send(packed: NodesPacked) -> list[Any]:
    """`nodes_round_trip` of calls `nodes_pack` encoded: their replies in call order."""
    out: list[Any] = [None] * packed.total
    try:
        _batches_send([(client, indexes, data, 1) for client, indexes, data in packed.batches], out)
        if packed.cluster is not None and packed.calls is not None:
            _refused_resend(packed.cluster, packed.calls, out)
        return out
    except _MAP_STALE:
        # Not sent again (a write's caller decides what a half-landed one means), but
        # routed afresh next time: a failed master's replica has taken its slots.
        if packed.cluster is not None:
            slot_map_refresh(packed.cluster)
        raise


def _batches_send(batches: list[_Batch], out: list[Any]) -> None:
    """Each node's batch on its own connection, every node at once; replies into `out`."""

    def send(client: redis.Redis, indexes: list[int], data: list[bytes], per_call: int) -> None:
        replies = _replies_read(client, data, len(indexes) * per_call)[per_call - 1::per_call]
        for i, reply in zip(indexes, replies, strict=True):
            out[i] = reply

    if len(batches) == 1:
        send(*batches[0])
        return
    futures = [_node_senders().submit(send, *batch) for batch in batches]
    for future in futures:
        future.result()


def _refused_resend(cluster: redis.RedisCluster, calls: list[tuple[str, tuple[Any, ...]]], out: list[Any], *,
                    pause: float = _REFUSED_PAUSE_SECONDS) -> None:
    """The calls a node refused unrun (CLUSTER_REFUSALS in `out`) sent once more, their new
    replies in `out`: after MOVED, TRYAGAIN or CLUSTERDOWN on a fresh slot map; after ASK
    to the node it names, behind ASKING, as the slot's migration asks (the map still
    names the source until the migration ends)."""
    refused = [i for i, reply in enumerate(out) if isinstance(reply, CLUSTER_REFUSALS)]
    if not refused:
        return
    asked: dict[tuple[str, int], list[int]] = {}
    routed: list[int] = []
    for i in refused:
        reply = out[i]
        if isinstance(reply, AskError) and not isinstance(reply, MovedError):
            asked.setdefault(reply.node_addr, []).append(i)
        else:
            routed.append(i)
    if any(isinstance(out[i], TryAgainError | ClusterDownError) for i in refused):
        time.sleep(pause)
    batches: list[_Batch] = []
    for (host, port), indexes in asked.items():
        commands = [command for i in indexes for command in (("ASKING",), calls[i][1])]
        batches.append((_asked_client(cluster, host, port), indexes, _pieces(commands), 2))
    if routed:
        slot_map_refresh(cluster)
        for client, at in node_clients(cast(redis.Redis, cluster), [calls[i][0] for i in routed]).values():
            indexes = [routed[j] for j in at]
            batches.append((client, indexes, _pieces(calls[i][1] for i in indexes), 1))
    _batches_send(batches, out)


def _asked_client(cluster: redis.RedisCluster, host: str, port: int) -> redis.Redis:
    """The client of the node an ASK names. A master just added to the cluster serves no
    slot until its first one is migrated, so the slot map does not list it: its client is
    made from the cluster client's connection settings and kept on the cluster client."""
    node = cluster.get_node(host=host, port=port)
    if node is not None:
        return cluster.get_redis_connection(node)  # type: ignore[no-any-return]
    with _asked_lock:
        known: dict[tuple[str, int], redis.Redis] = cluster.__dict__.setdefault("_lb_asked", {})
        client = known.get((host, port))
        if client is None:
            manager = cluster.nodes_manager
            client = known[(host, port)] = manager.create_redis_node(host, port, **manager.connection_kwargs)
        return client


_asked_lock = threading.Lock()


def _replies_read(client: redis.Redis, data: list[bytes], count: int) -> list[Any]:
    pool = client.connection_pool
    conn = pool.get_connection()
    try:
        conn.send_packed_command(data)
        replies: list[Any] = []
        for _ in range(count):
            try:
                replies.append(conn.read_response())
            except redis.ResponseError as error:  # a whole reply: the connection stays in step
                replies.append(error)
        return replies
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)
