"""The season's lease, fencing tokens, fenced transactions and the atomic pointer swap."""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import orjson
import redis

from leaderboard.redis_errors import REDIS_ERRORS
from leaderboard.views.rankview.keys import MANIFEST_TTL, Keys, gen_field
from leaderboard.views.rankview.wire import (
    _MAP_ATTEMPTS,
    CLUSTER_REFUSALS,
    NodesPacked,
    _pack,
    _script_call,
    _transaction,
    node_clients,
    nodes_packed_send,
    nodes_round_trip,
    slot_client,
    slot_map_refresh,
)

log = logging.getLogger(__name__)


class FenceLost(RuntimeError):
    """Another coordinator holds the season now; this one must stop writing."""


class ReplicasBehind(RuntimeError):
    """Fewer replicas than required acknowledged a copy's writes in time: a failover now
    could promote a replica without them, so the copy is not trusted."""


def lease_acquire(r: redis.Redis, keys: Keys, *, token: int, ttl_ms: int) -> int | None:
    """The season's fenced lease under `token`, or None while someone holds it.

    The caller takes the token from the database (epoch.season_lease_acquire),
    larger than every one issued before: a counter kept in Redis would go back with a
    Redis restarted from an old snapshot, and issue again a token that a stalled
    coordinator still holds, whose fenced writes would then pass.
    """
    if r.set(keys.lease, token, nx=True, px=ttl_ms):
        return token
    return None


_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# Publication: one atomic pointer swap, only by the lease holder, only from the version
# it built on. KEYS: lease, ptr, copies, the new version's manifest, the replaced one's.
# ARGV: token, expected current ('' = none), new version, the season's new copy names
# ('' = unchanged: a rebuild publishing its shadow names them in the same step, so the
# pointer never names a copy the list lacks), the replaced manifest's TTL ('' = keep it).
# The manifests' expiry moves in the same step: the current one never expires, so no
# crash between two commands can leave the current version with a clock on it.
_PUBLISH = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local cur = redis.call('GET', KEYS[2])
if (cur or '') ~= ARGV[2] then return -2 end
redis.call('SET', KEYS[2], ARGV[3])
redis.call('PERSIST', KEYS[4])
if cur and ARGV[5] ~= '' then redis.call('EXPIRE', KEYS[5], ARGV[5]) end
if ARGV[4] ~= '' then redis.call('SET', KEYS[3], ARGV[4]) end
return 1
"""


def lease_release(r: redis.Redis, keys: Keys, token: int) -> None:
    r.eval(_RELEASE, 1, keys.lease, str(token))


_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""


def epoch_due_mark(r: redis.Redis, keys: Keys, *, ttl_ms: int) -> None:
    """Leave a note for the lease holder: an epoch came due while it held the season."""
    r.set(keys.due, 1, px=ttl_ms)


def epoch_due_take(r: redis.Redis, keys: Keys) -> bool:
    """Whether an epoch came due since the last take (and clear the note)."""
    return r.getdel(keys.due) is not None


def lease_wanted_mark(r: redis.Redis, keys: Keys, *, ttl_ms: int) -> None:
    """Ask the epochs to leave the season's lease free for a while: a rebuild or split waiting
    to compare and publish would otherwise wait as long as writes keep epochs coming back
    to back. Expires by itself, so a waiter that died blocks nothing for long."""
    r.set(keys.wanted, 1, px=ttl_ms)


def lease_wanted(r: redis.Redis, keys: Keys) -> bool:
    return bool(r.exists(keys.wanted))


def lease_wanted_clear(r: redis.Redis, keys: Keys) -> None:
    r.delete(keys.wanted)


def lease_renew(r: redis.Redis, keys: Keys, token: int, *, ttl_ms: int) -> bool:
    """Extend a lease this token still holds; False once it is lost."""
    return bool(r.eval(_RENEW, 1, keys.lease, str(token), str(ttl_ms)))


class LeaseKeeper:
    """Renews a held lease every third of its TTL from a daemon thread, for work under the
    lease that can outlast one TTL (an epoch, a rebuild's comparison, a recovery's
    reconciliation): the TTL can then be short, so a dead holder is replaced quickly.

    A dead process stops renewing, so the lease still expires after one TTL. A live one
    whose work is stuck (a Redis or PostgreSQL call that does not return, a part that
    hangs) would renew for ever from this thread: with `stall_seconds`, the work proves it
    moves by calling `progress()` (each round trip landed, each wait of the parts, each
    batch of a build), and the keeper stops renewing once it has not for that long, so the
    season is free `stall_seconds` + one TTL after the work stopped. Without it, a live
    holder keeps the lease at most `max_seconds`. Fencing is unchanged: the renewal
    extends the lease only while it still holds this token, a lost lease is never renewed
    again (`lost`), and the holder's next fenced write raises FenceLost, so the stuck
    holder writes nothing once it wakes.
    """

    def __init__(self, r: redis.Redis, keys: Keys, token: int, *, ttl_ms: int, max_seconds: float,
                 stall_seconds: float | None = None):
        self.r, self.keys, self.token, self.ttl_ms = r, keys, token, ttl_ms
        self.base_ttl_ms = ttl_ms
        self.deadline = time.monotonic() + max_seconds
        self.lost = False
        # When the lease was last known held and for how long (it was acquired just before).
        self.renewed_at, self.renewed_ttl_ms = time.monotonic(), ttl_ms
        self.stall_seconds = stall_seconds
        self.progressed_at = time.monotonic()
        self.stalled = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-{keys.season}", daemon=True)

    def start(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def __enter__(self) -> LeaseKeeper:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def progress(self) -> None:
        """The work under the lease got on (called from its thread; a float store, no I/O)."""
        self.progressed_at = time.monotonic()

    def renew(self) -> None:
        """Renew now, from the caller's thread, which is progress: a long job's own loop proves
        it progresses (the keeper's renewals only that its process lives). FenceLost once the
        lease is lost.

        A transient Redis error is tolerated as the keeper thread tolerates it, while the
        last renewal still covers the lease (less than one TTL ago, so nobody can have taken
        it over): the next call tries again. Past that it raises: the lease may be lost."""
        if self.lost:
            raise FenceLost(f"season {self.keys.season}: lease {self.token} lost (expired or taken over)")
        started = self.progressed_at = time.monotonic()
        try:
            held = lease_renew(self.r, self.keys, self.token, ttl_ms=self.ttl_ms)
        except REDIS_ERRORS:
            if started - self.renewed_at < self.renewed_ttl_ms / 1000:
                log.warning("season %s: lease renewal failed; it still holds, trying again later", self.keys.season,
                            exc_info=True)
                return
            raise
        if not held:
            self.lost = True
            raise FenceLost(f"season {self.keys.season}: lease {self.token} lost (expired or taken over)")
        self._renewed(started)

    def _renewed(self, started: float) -> None:
        # The lease runs from before the request was sent: a renewal's TTL counts from when
        # Redis ran it, which is no earlier.
        self.renewed_at, self.renewed_ttl_ms = started, self.ttl_ms

    @contextlib.contextmanager
    def stretched(self, ttl_ms: int) -> Iterator[LeaseKeeper]:
        """The lease renewed with `ttl_ms` (not less than its own) for the block: a copy's
        build from the scores holds the interpreter in single calls (a fetch converting
        its rows, a sort, a garbage collection) and waits on Redis behind long scripts, for
        more than a 2 s lease on a loaded machine. The keeper still renews every third of
        the short lease; a dead holder keeps the season `ttl_ms` at most, against the
        minutes its build would have taken. Fencing is unchanged."""
        self.ttl_ms = max(ttl_ms, self.base_ttl_ms)
        try:
            self.renew()
            yield self
        finally:
            self.ttl_ms = self.base_ttl_ms
            if not self.lost:
                with contextlib.suppress(FenceLost, redis.RedisError):
                    self.renew()  # back to the short lease now, not at the keeper's next tick

    def _run(self) -> None:
        while not self._stop.wait(self.base_ttl_ms / 3000) and time.monotonic() < self.deadline:
            started = time.monotonic()
            if self.stall_seconds is not None and started - self.progressed_at > self.stall_seconds:
                # Renewing now would keep the season for work that does not move; left to
                # expire, it goes to another worker within one TTL. Work that moves again
                # before then (a long single call that returned) is renewed again.
                if not self.stalled:
                    log.warning("season %s: the work under lease %s made no progress for %.1f s; the lease is "
                                "left to expire", self.keys.season, self.token, started - self.progressed_at)
                self.stalled = True
                continue
            self.stalled = False
            try:
                if not lease_renew(self.r, self.keys, self.token, ttl_ms=self.ttl_ms):
                    self.lost = True
                    return
                self._renewed(started)
            except REDIS_ERRORS:
                continue  # try again at the next tick; the TTL covers two more


def pointer_publish(r: redis.Redis, keys: Keys, *, token: int, expected: int | None, version: int,
                    copies: list[str] | None = None, keep_replaced: bool = False) -> None:
    """Make `version` current; the manifest it replaces expires after MANIFEST_TTL.

    keep_replaced: the replaced version keeps its manifest for good (the FINAL version,
    readable by number for as long as a copy still holds it).
    """
    result = r.eval(_PUBLISH, 5, keys.lease, keys.ptr, keys.copies, keys.manifest(version),
                    keys.manifest(expected or 0), str(token),
                    "" if expected is None else str(expected), str(version),
                    orjson.dumps(copies) if copies else "", "" if keep_replaced else str(MANIFEST_TTL))
    if result == -1:
        raise FenceLost("the lease moved to another coordinator before publication")
    if result == -2:
        raise FenceLost("the current version moved before publication")


_HLEN_SUM = """
local n = 0
for i = 1, #KEYS do n = n + redis.call('HLEN', KEYS[i]) end
return n
"""


def _fenced(r: redis.Redis, keys: Keys, token: int | None, commands: list[tuple[Any, ...]]) -> list[Any]:
    """Run `commands` as one MULTI/EXEC that happens only while `token` holds the lease; their replies."""
    return _fenced_packed(r, keys, token, _transaction(commands), len(commands))


# Transactions refused by a renewal of the holder's own lease are sent again (at most this
# many tries in all): a renewal comes every third of the lease, a chunk takes milliseconds.
FENCE_ATTEMPTS = 5


def _fenced_packed(r: redis.Redis, keys: Keys, token: int | None, packed: bytes, count: int) -> list[Any]:
    """`_fenced` for a MULTI/EXEC already encoded (`count` commands between them).

    token None: a shadow copy that no published manifest names yet, written only by the
    rebuild job that claimed it in the database; it needs atomic chunks, not a fence.

    Encoding apart lets a caller encode the next batch while a helper thread waits on
    Redis with this one. Any error drops the connection, so a half-read reply or a
    pending WATCH never goes back to the pool.

    On a cluster a transaction the control slot's node refused unrun (MOVED, ASK,
    TRYAGAIN or CLUSTERDOWN on the WATCH, a queued command, which aborts the EXEC, or the
    EXEC) is sent once more on a fresh slot map; a failed node refreshes the map without
    sending again (its EXEC may have run).
    """
    cluster = r if isinstance(r, redis.RedisCluster) else None
    for attempt in range(_MAP_ATTEMPTS):
        try:
            # On a cluster, the node of the season's control slot: the lease and every key a
            # fenced transaction writes (pointer, manifests, copy metas) are in that slot.
            return _fenced_on(slot_client(r, keys.lease), keys, token, packed, count)
        except CLUSTER_REFUSALS as exc:
            if cluster is None:
                raise
            if attempt + 1 == _MAP_ATTEMPTS:
                raise redis.ConnectionError(f"Redis Cluster refused a fenced transaction twice: {exc}") from exc
            slot_map_refresh(cluster)
        except (redis.ConnectionError, redis.TimeoutError):
            if cluster is not None:
                slot_map_refresh(cluster)
            raise
    raise AssertionError("unreachable")


def _fenced_on(client: redis.Redis, keys: Keys, token: int | None, packed: bytes, count: int) -> list[Any]:
    """`_fenced_packed` on the control slot's node's client."""
    pool = client.connection_pool
    conn = pool.get_connection()
    try:
        for _ in range(FENCE_ATTEMPTS):
            if token is not None:
                conn.send_packed_command([_pack([("WATCH", keys.lease), ("GET", keys.lease)])])
                conn.read_response()
                held = conn.read_response()
                if held is None or int(held) != token:
                    raise FenceLost("the lease is no longer ours")
            conn.send_packed_command([packed])
            for _ in range(count + 1):  # +OK for MULTI, then QUEUED for each command
                conn.read_response()
            replies = conn.read_response()
            if replies is None:
                # EXEC refused: the watched lease key was touched. The holder's own
                # LeaseKeeper renewal (PEXPIRE) touches it too, and then the token is
                # still ours: nothing of the transaction ran, so it is sent again. A
                # takeover changed the value, and the next GET says so.
                continue
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
            return replies  # type: ignore[no-any-return]
        raise FenceLost("the lease kept changing while applying")
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)


# A fenced write to one slot group of an index, the only way a copy's data keys are
# written: one script on the group's slot, so it needs no other slot and is atomic on its
# master. KEYS: the group's fence hash, then the data keys the ops write. ARGV: the fencing
# token ('' = none: a shadow copy, claimed in the database), the copy generation to record
# ('' = keep), the fence field it goes in (the copy's side's, keys.gen_field), then each op
# as its command name, the index of its key in KEYS, its argument count and the arguments
# (sent 1,000 at a time: Lua's unpack has a limit). Refused, with nothing written, when the
# group holds a higher token: a coordinator that took the season over stamped it there
# (copy_groups_stamp). Replies: each op's reply, summed over its pieces (members or fields
# added or removed).
_GROUP_FENCE = """
if ARGV[1] ~= '' then
  local held = redis.call('HGET', KEYS[1], 'token')
  if held and tonumber(held) > tonumber(ARGV[1]) then return redis.error_reply('FENCED ' .. held) end
  redis.call('HSET', KEYS[1], 'token', ARGV[1])
end
if ARGV[2] ~= '' then redis.call('HSET', KEYS[1], ARGV[3], ARGV[2]) end
"""
_GROUP_WRITE = _GROUP_FENCE + """
local out, at = {}, 4
while at <= #ARGV do
  local op, key, last = ARGV[at], KEYS[tonumber(ARGV[at + 1])], at + 2 + tonumber(ARGV[at + 2])
  at = at + 3
  local n = 0
  while at <= last do
    local stop = math.min(at + 999, last)
    n = n + redis.call(op, key, unpack(ARGV, at, stop))
    at = stop + 1
  end
  out[#out + 1] = n
end
return out
"""
# UNLINK a group's keys (KEYS after the fence), under the same fence.
_GROUP_UNLINK = _GROUP_FENCE + """
local n = 0
for at = 2, #KEYS, 1000 do n = n + redis.call('UNLINK', unpack(KEYS, at, math.min(at + 999, #KEYS))) end
return n
"""

# One write of a group: (command, key, arguments), e.g. ("ZADD", bucket key, [score, member, ...]).
GroupOp = tuple[str, str, list[Any]]


def group_write_call(fence: str, token: int | None, gen: int | None, ops: list[GroupOp], *,
                     side: int = 0) -> tuple[Any, ...]:
    """The EVAL of one fenced group write (`_GROUP_WRITE`); `fence` the group's fence key,
    `gen` side `side`'s generation to record there."""
    script_keys = [fence]
    at: dict[str, int] = {}
    argv: list[Any] = ["" if token is None else token, "" if gen is None else gen, gen_field(side)]
    for command, key, args in ops:
        index = at.get(key)
        if index is None:
            script_keys.append(key)
            index = at[key] = len(script_keys)
        argv += [command, index, len(args), *args]
    return _script_call(_GROUP_WRITE, script_keys, argv)


def group_unlink_call(fence: str, token: int | None, gen: int | None, doomed: list[str], *,
                      side: int = 0) -> tuple[Any, ...]:
    return _script_call(_GROUP_UNLINK, [fence, *doomed],
                        ["" if token is None else token, "" if gen is None else gen, gen_field(side)])


def groups_send(r: redis.Redis, calls: list[tuple[str, tuple[Any, ...]]]) -> list[Any]:
    """Fenced group writes (fence key, call), every master at once; their replies in order.

    Every reply is read before anything is raised: FenceLost when a group refused the
    token (a newer coordinator stamped it: nothing of that call was written), else the
    first error."""
    return groups_replies_check(nodes_round_trip(r, calls))


def groups_packed_send(packed: NodesPacked) -> list[Any]:
    """`groups_send` of calls already routed and encoded (wire.nodes_pack)."""
    return groups_replies_check(nodes_packed_send(packed))


def groups_replies_check(replies: list[Any]) -> list[Any]:
    """The replies of group writes, or the error that stops the writer: FenceLost for a
    group that refused the token; a redis ConnectionError (an outage: the epoch or build
    is tried again later) for a call the cluster refused even when sent again on a fresh
    slot map (wire.nodes_round_trip: nothing of it ran); else the first error."""
    errors = [reply for reply in replies if isinstance(reply, redis.ResponseError)]
    for error in errors:
        if str(error).startswith("FENCED"):
            raise FenceLost(f"a slot group holds a newer fencing token ({error})")
    for error in errors:
        if isinstance(error, CLUSTER_REFUSALS):
            raise redis.ConnectionError(f"Redis Cluster refused a slot group write twice: {error}") from error
    if errors:
        raise errors[0]
    return replies


def copy_groups_stamp(r: redis.Redis, keys: Keys, index: str, groups: int, *, token: int | None,
                      gen: int | None = None, side: int = 0, replicas: int = 0, replicas_ms: int = 0) -> None:
    """Write `token` (and side `side`'s `gen`, when given) into every group fence of an
    index (the data of a copy), all masters at once.

    A coordinator that takes a season over stamps its token into every group of every copy
    before it writes or trusts one: from then on no older token writes anything anywhere
    in the cluster (each group refuses a lower token), and whatever an older one wrote
    before lay inside a mutation it had opened in the control slot under the lease, which
    the copy meta shows. Raises FenceLost when a newer token got there first. `gen`: a
    copy made ready stamps its generation, the one its manifests carry, into every group,
    so a reader that finds another in the group it read knows the copy moved under it.

    `replicas`: then WAIT for that many replicas of each master, on the connection the
    stamps went on and after them. A master replicates its writes in one ordered stream,
    so replicas that acknowledged the stamp hold every earlier write of that master too
    (the copy's whole mutation or build, whichever connection sent it). ReplicasBehind
    when a master got fewer acknowledgements within `replicas_ms`."""
    fences = [keys.fence(index, group) for group in range(groups)]
    calls = [(fence, group_write_call(fence, token, gen, [], side=side)) for fence in fences]
    if replicas > 0:
        # One WAIT per master, routed by one of its own fences so it follows its stamps.
        calls += [(fences[indexes[-1]], ("WAIT", replicas, replicas_ms))
                  for _, indexes in node_clients(r, fences).values()]
    acknowledged = [int(n) for n in groups_send(r, calls)[groups:]]
    if any(n < replicas for n in acknowledged):
        raise ReplicasBehind(f"index {index}: {min(acknowledged)} of {replicas} replicas acknowledged its writes "
                             f"within {replicas_ms} ms on some master")
