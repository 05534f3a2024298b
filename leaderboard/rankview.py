"""The rank views in Redis: R copies of a bucketed index, manifests, a fenced pointer.

No Django here: callers pass a redis client and the key prefix. Layout of the keys
(hash tags keep each bucket of each copy in its own Redis Cluster slot, and the small
per-season control keys together in one):

    {P}:{season}:ptr                 current version number
    {P}:{season}:m:{version}         manifest JSON (no expiry while current; MANIFEST_TTL s once superseded)
    {P}:{season}:lease               the coordinator's fencing token (issued by the database)
    {P}:{season}:copy:{c}            copy meta hash: gen, state, watermark, counts, checksums
    {P}:{season:c:L:b}:z             bucket b (layout L) of copy c: member player_id, score -score
    {P}:{season:c:h:k}:h             lookup shard k of copy c: player_id -> score
    {P}:{season:c:r:g:L:b}:z         bucket b of region g's board in copy c (a season with regions)
    {P}:{season:c:g:k}:h             region shard k of copy c: player_id -> region (players with one)

A player's lookup (and region) shard is crc32(player_id) % S, where S, the copy's
`lookup_shards`, is chosen when the copy is built from the scores: a power of two >=
max(16, players / 48), recorded in the copy meta and in every manifest of the copy. Small
shards stay listpack-encoded hashes (~15 bytes a player instead of ~56 in a hashtable),
and the rank read's first round trip still names one shard per copy. A copy that grows
past 96 players a shard through epochs is rebuilt with more (materializer).

Scores are stored negated, so ascending ZRANGE order is score descending, then member
ascending by bytes: the display order (docs/rules.md, Ranking) in one range call, and
ZCOUNT(-inf, (-s) counts the strictly higher scores in a bucket.

A first_reached season (docs/rules.md, Ties decided by who got there first) stores instead
the 53-bit key of core.tiebreak, (bucket high - score) << bits | reached_ms, and its
lookup holds "score:reached_ms": the same single range call and single ZCOUNT, with
equal scores ordered by who reached them first. The encoding rides in the copy meta and
the manifest ("ties"/"tie_break"), so a reader needs nothing else.

A season with regions keeps, in each copy, one more bucketed board per region beside the
global one: the same layout and member encoding, holding only that region's players. A
player's value is read from the global lookup and their region from the region shards,
so a regional board costs its sorted-set members and one small hash field per player.
The epoch moves a player between regional boards in the same chunk transactions that
move them on the global board, and the copy meta and manifest carry every board's counts
and checksums: one version, one copy generation, all boards.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import hiredis
import orjson
import redis

from leaderboard.core.buckets import BucketLayout
from leaderboard.core.checksum import checksum_of
from leaderboard.core.epoch import EpochPlan, board_plan, epoch_plan, locate_position, regional_values
from leaderboard.core.manifest import LOOKUP_SHARDS_DEFAULT, Manifest
from leaderboard.core.ranking import Entry, ranked, ranked_values
from leaderboard.core.tiebreak import (
    FirstReached,
    IndexValue,
    index_key,
    index_value,
    lookup_parse,
    lookup_value,
    value_score,
    value_token,
)

# The fewest lookup shards a copy has, and the count of copies and manifests that predate
# the count's recording (core.manifest.lookup_shards_for sizes a copy).
LOOKUP_SHARDS = LOOKUP_SHARDS_DEFAULT
# Lookup shards read per round trip when every shard of a copy is scanned or counted.
SHARD_SCAN_BATCH = 1024
# Keys a dropped copy unlinks per command.
DROP_BATCH = 8192
# The copies of the index (R = 2): the materializer alternates between them, and a rank
# read fetches the player's lookup score in each with the pointer, in one round trip.
COPY_NAMES = ("0", "1")
# How long a manifest outlives its currency: a candidate never published, or a version
# the pointer swap replaced (pinned readers then get 410). The current version's manifest
# never expires: a quiet season (no match overnight, a FINAL awaiting its approver) must
# stay readable, and an expired one would read as lost views and start a recovery.
MANIFEST_TTL = 3600
APPLY_CHUNK = 2000

STATE_READY = "ready"
STATE_APPLYING = "applying"
# A copy whose contents cannot be trusted (a chunk reply or its verification disagreed):
# the next epoch rebuilds it from the scores instead of applying changes to it.
STATE_BROKEN = "broken"


def lookup_shard(player_id: str, shards: int) -> int:
    """The player's lookup (and region) shard in a copy of `shards` shards."""
    return zlib.crc32(player_id.encode()) % shards


def shards_of(player_ids: Iterable[str], shards: int) -> dict[int, list[str]]:
    """The players grouped by their shard in a copy of `shards` shards."""
    out: dict[int, list[str]] = {}
    crc32 = zlib.crc32
    for player_id in player_ids:  # lookup_shard, inlined: a friends board groups 1,000
        out.setdefault(crc32(player_id.encode()) % shards, []).append(player_id)
    return out


class Keys:
    def __init__(self, prefix: str, season: str):
        self.prefix = prefix
        self.season = season
        base = f"{prefix}:{{{season}}}"
        self.ptr = f"{base}:ptr"
        self.lease = f"{base}:lease"
        self.copies = f"{base}:copies"
        self.due = f"{base}:due"
        self.wanted = f"{base}:wanted"
        self._base = base

    def manifest(self, version: int) -> str:
        return f"{self._base}:m:{version}"

    def copy_meta(self, copy: str) -> str:
        return f"{self._base}:copy:{copy}"

    def bucket(self, copy: str, layout_id: int, bucket: int, board: str = "") -> str:
        if board:
            return f"{self.prefix}:{{{self.season}:{copy}:r:{board}:{layout_id}:{bucket}}}:z"
        return f"{self.prefix}:{{{self.season}:{copy}:{layout_id}:{bucket}}}:z"

    def region(self, copy: str, shard: int) -> str:
        return f"{self.prefix}:{{{self.season}:{copy}:g:{shard}}}:h"

    def lookup(self, copy: str, shard: int) -> str:
        return f"{self.prefix}:{{{self.season}:{copy}:h:{shard}}}:h"

    def lookup_of(self, copy: str, player_id: str, shards: int) -> str:
        return self.lookup(copy, lookup_shard(player_id, shards))


# ---------------------------------------------------------------------------- copies


@dataclass(slots=True)
class CopyMeta:
    copy: str
    gen: int
    state: str
    watermark: tuple[int, int]
    layout: BucketLayout
    counts: list[int]
    checksums: list[int]
    version: int
    released_at: float
    # Holds exactly the ledger at `watermark` (finished by an epoch, which reads every
    # committed change): the next epoch may then take the old scores from the change
    # stream instead of reading them from the copy's lookup.
    exact: bool = False
    # A first_reached copy's key encoding (core.tiebreak); None: a shared board.
    ties: FirstReached | None = None
    # A season with regions: each region's board, (counts, checksums) per bucket.
    boards: dict[str, Board] = field(default_factory=dict)
    # Lookup (and region) shards, fixed when the copy is built (core.manifest.lookup_shards_for).
    lookup_shards: int = LOOKUP_SHARDS

    def fields(self) -> dict[Any, Any]:
        return {
            "lookup_shards": self.lookup_shards,
            **({} if self.ties is None else {"ties": orjson.dumps(self.ties.as_dict())}),
            **({} if not self.boards else {"boards": boards_dumps(self.boards)}),
            "gen": self.gen,
            "state": self.state,
            "watermark": f"{self.watermark[0]}:{self.watermark[1]}",
            "layout": orjson.dumps(self.layout.as_dict()),
            "counts": orjson.dumps(self.counts),
            "checksums": orjson.dumps([f"{c:016x}" for c in self.checksums]),
            "version": self.version,
            "released_at": repr(self.released_at),
            "exact": int(self.exact),
        }

    @classmethod
    def parse(cls, copy: str, raw: dict[Any, Any]) -> CopyMeta:
        txid, _, ident = raw[b"watermark"].decode().partition(":")
        return cls(
            copy=copy,
            gen=int(raw[b"gen"]),
            state=raw[b"state"].decode(),
            watermark=(int(txid), int(ident)),
            layout=BucketLayout.from_dict(orjson.loads(raw[b"layout"])),
            counts=[int(c) for c in orjson.loads(raw[b"counts"])],
            checksums=[int(c, 16) for c in orjson.loads(raw[b"checksums"])],
            version=int(raw[b"version"]),
            released_at=float(raw[b"released_at"]),
            exact=raw.get(b"exact") == b"1",
            ties=FirstReached.from_dict(orjson.loads(raw[b"ties"])) if b"ties" in raw else None,
            boards={name: ([int(c) for c in b["counts"]], [int(c, 16) for c in b["checksums"]])
                    for name, b in orjson.loads(raw[b"boards"]).items()} if b"boards" in raw else {},
            lookup_shards=int(raw.get(b"lookup_shards", LOOKUP_SHARDS)),
        )


# A regional board's (counts, checksums), bucket by bucket.
Board = tuple[list[int], list[int]]


def boards_dumps(boards: Mapping[str, Board]) -> bytes:
    return orjson.dumps({name: {"counts": counts, "checksums": [f"{c:016x}" for c in checksums]}
                         for name, (counts, checksums) in boards.items()})


def copy_meta_load(r: redis.Redis, keys: Keys, copy: str) -> CopyMeta | None:
    raw = r.hgetall(keys.copy_meta(copy))
    if not raw or b"gen" not in raw:
        return None
    return CopyMeta.parse(copy, raw)


def copy_meta_init(r: redis.Redis, keys: Keys, copy: str, layout: BucketLayout,
                   ties: FirstReached | None = None, regions: Iterable[str] = (),
                   lookup_shards: int = LOOKUP_SHARDS) -> CopyMeta:
    meta = CopyMeta(
        copy=copy, gen=0, state=STATE_READY, watermark=(0, 0), layout=layout,
        counts=[0] * layout.size, checksums=[0] * layout.size, version=0, released_at=0.0, ties=ties,
        boards={region: ([0] * layout.size, [0] * layout.size) for region in regions}, lookup_shards=lookup_shards,
    )
    r.hset(keys.copy_meta(copy), mapping=meta.fields())
    return meta


def copy_drop(r: redis.Redis, keys: Keys, meta: CopyMeta, *, token: int | None = None) -> None:
    """Delete a copy's data keys (after a layout change or before a rebuild into it); with
    `token`, only while that token holds the lease (an epoch rebuilding its target copy).

    UNLINK, not DEL: the keys are gone at once either way, but DEL frees a big bucket
    in the server's only thread (a 9M-member sorted set: seconds, every client stalls
    and ours times out); UNLINK frees it in the background.
    """
    doomed = [keys.bucket(meta.copy, meta.layout.layout_id, b, board)
              for board in ("", *meta.boards) for b in range(meta.layout.size)]
    doomed += [keys.lookup(meta.copy, k) for k in range(meta.lookup_shards)]
    if meta.boards:
        doomed += [keys.region(meta.copy, k) for k in range(meta.lookup_shards)]
    # A 10M-player copy has ~520,000 shards, each freed in the server's thread (too small
    # for the lazy-free one): one UNLINK of them all would stall every client for a good
    # part of a second, so they go DROP_BATCH at a time. The generation moves first (readers
    # of the copy's versions retry from then on), and the meta goes last: a crash part-way
    # leaves it, broken, naming the keys still to drop.
    meta_key = keys.copy_meta(meta.copy)
    steps: list[list[tuple[Any, ...]]] = [[("HINCRBY", meta_key, "gen", 1), ("HSET", meta_key, "state", STATE_BROKEN)]]
    steps += [[("UNLINK", *doomed[i:i + DROP_BATCH])] for i in range(0, len(doomed), DROP_BATCH)]
    steps.append([("UNLINK", meta_key)])
    for commands in steps:
        _fenced(r, keys, token, commands)


def copies_get(r: redis.Redis, keys: Keys) -> list[str]:
    """The season's R copies (R = 2): the current one and the one the next epoch updates.

    "0" and "1" until a rebuild publishes a shadow copy in place of one of them.
    """
    raw = r.get(keys.copies)
    return [str(c) for c in orjson.loads(raw)] if raw else list(COPY_NAMES)


def copies_set(r: redis.Redis, keys: Keys, copies: list[str]) -> None:
    r.set(keys.copies, orjson.dumps(copies))


class FenceLost(RuntimeError):
    """Another coordinator holds the season now; this one must stop writing."""


def lease_acquire(r: redis.Redis, keys: Keys, *, token: int, ttl_ms: int) -> int | None:
    """The season's fenced lease under `token`, or None while someone holds it.

    The caller takes the token from the database (materializer.season_lease_acquire),
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

    A dead process stops renewing, so the lease still expires after one TTL; a live one
    that hangs keeps it at most `max_seconds`. Fencing is unchanged: the renewal extends
    the lease only while it still holds this token, a lost lease is never renewed again
    (`lost`), and the holder's next fenced write raises FenceLost.
    """

    def __init__(self, r: redis.Redis, keys: Keys, token: int, *, ttl_ms: int, max_seconds: float):
        self.r, self.keys, self.token, self.ttl_ms = r, keys, token, ttl_ms
        self.deadline = time.monotonic() + max_seconds
        self.lost = False
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

    def _run(self) -> None:
        while not self._stop.wait(self.ttl_ms / 3000) and time.monotonic() < self.deadline:
            try:
                if not lease_renew(self.r, self.keys, self.token, ttl_ms=self.ttl_ms):
                    self.lost = True
                    return
            except redis.RedisError:
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


# HSET into many small hashes (lookup or region shards) as one command. A 10M-player copy
# has ~260,000 shards, so an epoch's chunk or a build's batch names about as many shards as
# players; a command each would cost more to queue and to answer (a reply each, parsed by
# the client) than the writes themselves. KEYS: the shards; ARGV: for each, its number of
# pairs, then the pairs. Returns the fields new to their shard, as HSET counts them.
_HSET_SHARDS = """
local added, at = 0, 1
for i = 1, #KEYS do
  local last = at + 2 * tonumber(ARGV[at])
  at = at + 1
  while at <= last do
    local stop = math.min(at + 999, last)
    added = added + redis.call('HSET', KEYS[i], unpack(ARGV, at, stop))
    at = stop + 1
  end
end
return added
"""
_HLEN_SUM = """
local n = 0
for i = 1, #KEYS do n = n + redis.call('HLEN', KEYS[i]) end
return n
"""


def shards_hset_args(pairs: Mapping[int, list[Any]]) -> list[Any]:
    """The ARGV of `shards_hset` for field/value pairs by shard (in the shards' order)."""
    argv: list[Any] = []
    for fields in pairs.values():
        argv.append(len(fields) // 2)
        argv.extend(fields)
    return argv


def shards_hset(shard_keys: list[str], argv: list[Any]) -> tuple[Any, ...]:
    """One command writing `shards_hset_args` into `shard_keys`: its reply is the fields new
    to their shard."""
    return _script_call(_HSET_SHARDS, shard_keys, argv)


def _script_call(script: str, script_keys: list[str], argv: list[Any]) -> tuple[Any, ...]:
    # EVAL, not EVALSHA: a chunk must not depend on a script a restarted Redis forgot (in a
    # MULTI the other commands would run without it); the body is ~300 bytes of a chunk's
    # ~100 kB, and Redis compiles it once.
    return ("EVAL", script, len(script_keys), *script_keys, *argv)


def _pack(commands: Iterable[tuple[Any, ...]]) -> bytes:
    """Commands in the Redis protocol, encoded by hiredis in one go."""
    return b"".join([hiredis.pack_command(c) for c in commands])


def _transaction(commands: list[tuple[Any, ...]]) -> bytes:
    return _pack((("MULTI",), *commands, ("EXEC",)))


def _fenced(r: redis.Redis, keys: Keys, token: int | None, commands: list[tuple[Any, ...]]) -> list[Any]:
    """Run `commands` as one MULTI/EXEC that happens only while `token` holds the lease; their replies."""
    return _fenced_packed(r, keys, token, _transaction(commands), len(commands))


def transaction_pack(commands: list[tuple[Any, ...]]) -> bytes:
    """`commands` encoded as one MULTI/EXEC, for `fenced_packed_write` (a copy build encodes
    batch i+1 while batch i is sent)."""
    return _transaction(commands)


def fenced_packed_write(r: redis.Redis, keys: Keys, token: int | None, packed: bytes, count: int) -> list[Any]:
    return _fenced_packed(r, keys, token, packed, count)


# Transactions refused by a renewal of the holder's own lease are sent again (at most this
# many tries in all): a renewal comes every third of the lease, a chunk takes milliseconds.
FENCE_ATTEMPTS = 5


def _fenced_packed(r: redis.Redis, keys: Keys, token: int | None, packed: bytes, count: int) -> list[Any]:
    """`_fenced` for a MULTI/EXEC already encoded (`count` commands between them).

    token None: a shadow copy that no published manifest names yet, written only by the
    rebuild job that claimed it in the database; it needs atomic chunks, not a fence.

    Encoding apart lets copy_apply encode the next chunk while a helper thread waits on
    Redis with this one. Any error drops the connection, so a half-read reply or a
    pending WATCH never goes back to the pool.
    """
    conn = r.connection_pool.get_connection()
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
        r.connection_pool.release(conn)


def copy_begin_mutation(r: redis.Redis, keys: Keys, token: int | None, meta: CopyMeta) -> CopyMeta:
    """Bump the copy's generation before touching it: readers of its old version retry."""
    key = keys.copy_meta(meta.copy)
    _fenced(r, keys, token, [("HINCRBY", key, "gen", 1), ("HSET", key, "state", STATE_APPLYING, "exact", 0)])
    meta.gen += 1
    meta.state = STATE_APPLYING
    meta.exact = False
    return meta


def copy_scores_get(r: redis.Redis, keys: Keys, meta: CopyMeta, player_ids: list[str]
                    ) -> dict[str, IndexValue | None]:
    """Each player's value in the copy's lookup (None: absent), in the copy's encoding."""
    ties = meta.ties
    return {player_id: lookup_value(ties, value) if value is not None else None
            for player_id, value in _shard_fields_get(r, meta, keys.lookup, player_ids)}


def copy_regions_get(r: redis.Redis, keys: Keys, meta: CopyMeta, player_ids: list[str]) -> dict[str, str]:
    """Each player's region in the copy ("" for none: no regional board holds them)."""
    return {player_id: value.decode() if value is not None else ""
            for player_id, value in _shard_fields_get(r, meta, keys.region, player_ids)}


def _shard_fields_get(r: redis.Redis, meta: CopyMeta, key_of: Callable[[str, int], str], player_ids: list[str]
                      ) -> Iterator[tuple[str, bytes | None]]:
    """(player, raw field) of each player in the copy's lookup or region shards (`key_of`):
    one HMGET per shard holding some of them, SHARD_SCAN_BATCH shards a round trip (an
    epoch's 10,000 changes name ~10,000 shards of a 10M-player copy)."""
    order = list(shards_of(player_ids, meta.lookup_shards).items())
    for start in range(0, len(order), SHARD_SCAN_BATCH):
        batch = order[start:start + SHARD_SCAN_BATCH]
        replies = round_trip(r, [("HMGET", key_of(meta.copy, shard), *players) for shard, players in batch])
        for (_, players), values in zip(batch, replies, strict=True):
            yield from zip(players, values, strict=True)


@dataclass(frozen=True, slots=True)
class RegionMoves:
    """The changed players' regions before and after, for a copy with regional boards."""

    old: Mapping[str, str]
    new: Mapping[str, str]


class CopyMismatch(RuntimeError):
    """A chunk's replies show the copy did not hold the scores its plan assumed."""


def copy_apply(r: redis.Redis, keys: Keys, token: int | None, meta: CopyMeta,
               old_scores: Mapping[str, IndexValue | None], new_scores: Mapping[str, IndexValue],
               regions: RegionMoves | None = None) -> dict[str, set[int]]:
    """Move each changed player to its new score, in fenced MULTI/EXEC chunks.

    Each chunk is planned from the counts and checksums the previous one left and
    writes them with its moves, so after a crash the copy is consistent at a chunk
    boundary and re-planning from its lookup finishes the job. Returns the touched
    buckets of each board ("" the global one).

    `regions`: a copy with regional boards moves each player on their old and new
    region's boards in the same chunk, with the region shards, so a player is never on
    two boards, nor on none, at a chunk boundary.

    With several chunks, a helper thread sends chunk i and waits for Redis while this
    one plans and encodes chunk i+1, so the epoch's Python work hides behind Redis's (at
    10M players Redis takes ~3x the Python time). Chunk i+1 is sent only once chunk i
    succeeded: its counts assume chunk i's moves, so a failed chunk stops the rest.

    Every chunk's replies are checked against its plan (members removed, members and
    lookup entries inserted): a copy that did not hold the old scores the plan assumed
    is marked broken, so the next epoch rebuilds it, and CopyMismatch is raised.
    """
    players = list(new_scores)
    touched: dict[str, set[int]] = {"": set(), **{board: set() for board in meta.boards}}
    counts, checksums = meta.counts, meta.checksums
    boards = dict(meta.boards)
    sender: ThreadPoolExecutor | None = None
    in_flight: tuple[Future[list[Any]], _Chunk] | None = None

    def landed(chunk: _Chunk, replies: list[Any]) -> None:
        problem = _chunk_mismatch(chunk, replies)
        if problem:
            r.hset(keys.copy_meta(meta.copy), "state", STATE_BROKEN)
            raise CopyMismatch(f"copy {meta.copy}: {problem}")
        meta.counts = chunk.plan.counts
        meta.checksums = chunk.plan.checksums
        touched[""].update(chunk.plan.touched)
        for board, plan in chunk.boards.items():
            meta.boards[board] = (plan.counts, plan.checksums)
            touched[board].update(plan.touched)

    try:
        for start in range(0, len(players), APPLY_CHUNK):
            ids = players[start : start + APPLY_CHUNK]
            olds = {p: old_scores.get(p) for p in ids}
            news = {p: new_scores[p] for p in ids}
            plan = epoch_plan(layout=meta.layout, counts=counts, checksums=checksums, old_scores=olds,
                              new_scores=news)
            chunk = _Chunk(plan=plan)
            if regions is not None and meta.boards:
                _regional_plans(chunk, meta, boards, olds, news, regions)
            if not plan.lookups and not chunk.region_sets and not chunk.region_drops:
                continue
            counts, checksums = plan.counts, plan.checksums
            boards.update({board: (p.counts, p.checksums) for board, p in chunk.boards.items()})
            _chunk_commands(keys, meta, chunk, boards)
            packed = _transaction(chunk.commands)
            if in_flight is not None:
                landed(in_flight[1], in_flight[0].result())
                in_flight = None
            if sender is None and start + APPLY_CHUNK < len(players):
                sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"apply-{keys.season}")
                # The sender needs the GIL for a moment when each reply arrives; with the
                # default 5 ms switch interval it waits for this thread's planning and
                # Redis sits idle (~10% of an epoch at 10M players).
                switch_interval = sys.getswitchinterval()
                sys.setswitchinterval(min(switch_interval, 0.0005))
            if sender is None:
                landed(chunk, _fenced_packed(r, keys, token, packed, len(chunk.commands)))
            else:
                in_flight = (sender.submit(_fenced_packed, r, keys, token, packed, len(chunk.commands)), chunk)
                # Hand the GIL over now: otherwise the sender waits for it until this
                # thread blocks, after planning the next chunk, and nothing overlaps.
                time.sleep(0)
        if in_flight is not None:
            landed(in_flight[1], in_flight[0].result())
    finally:
        if sender is not None:
            sender.shutdown(wait=True)
            sys.setswitchinterval(switch_interval)
    return touched


@dataclass(slots=True)
class _Chunk:
    """One chunk of `copy_apply`: the global plan, each regional board's, the region-shard
    writes, and the commands they became (in that order; the copy-meta HSET last)."""

    plan: EpochPlan
    boards: dict[str, EpochPlan] = field(default_factory=dict)
    region_sets: dict[str, str] = field(default_factory=dict)
    # Players who left every regional board (their region is none now, or not the season's).
    region_drops: list[str] = field(default_factory=list)
    # Those of region_sets who had no region field before (HSET reports them as new).
    region_new: int = 0
    commands: list[tuple[Any, ...]] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)  # one per command but the last


def _regional_plans(chunk: _Chunk, meta: CopyMeta, boards: Mapping[str, Board],
                    olds: Mapping[str, IndexValue | None], news: Mapping[str, IndexValue],
                    regions: RegionMoves) -> None:
    for board, (old_values, new_values) in regional_values(
            regions=meta.boards, old_values=olds, new_values=news, old_regions=regions.old,
            new_regions=regions.new).items():
        if new_values:
            counts, checksums = boards[board]
            chunk.boards[board] = board_plan(layout=meta.layout, counts=counts, checksums=checksums,
                                             old_values=old_values, new_values=new_values)
    # A region-shard entry exists exactly for the players the copy holds on a regional board.
    for player_id in news:
        was = regions.old.get(player_id, "")
        now = regions.new.get(player_id, was)
        had = olds.get(player_id) is not None and was in meta.boards
        if now in meta.boards:
            if not had or was != now:
                chunk.region_sets[player_id] = now
                chunk.region_new += not had
        elif had:
            chunk.region_drops.append(player_id)


def _chunk_mismatch(chunk: _Chunk, replies: list[Any]) -> str:
    """What a chunk's replies say that its plans did not expect. On each board ZREM counts
    the members removed and ZADD the ones inserted; the lookup's shards_hset counts the
    players new to the copy, the region shards' shards_hset and HDELs those new to or gone
    from every regional board (the copy-meta HSET, last, only rewrites fields)."""
    counted: dict[tuple[str, str], int] = {}
    for command, label, reply in zip(chunk.commands[:-1], chunk.labels, replies[:-1], strict=True):
        counted[command[0], label] = counted.get((command[0], label), 0) + int(reply)
    for board, plan in (("", chunk.plan), *chunk.boards.items()):
        name = f"region {board}" if board else "the global board"
        removed = counted.get(("ZREM", f"board:{board}"), 0)
        added = counted.get(("ZADD", f"board:{board}"), 0)
        moved = len(plan.removals) - len(plan.departures)
        if removed != len(plan.removals):
            return f"{name}: removed {removed} members, the plan moved {len(plan.removals)} out of their buckets"
        if added != moved + plan.arrivals:
            return f"{name}: inserted {added} members, the plan expected {moved + plan.arrivals}"
    arrived = counted.get(("EVAL", "lookup"), 0)
    if arrived != chunk.plan.arrivals:
        return f"inserted {arrived} lookup entries, the plan expected {chunk.plan.arrivals}"
    placed, dropped = counted.get(("EVAL", "regions"), 0), counted.get(("HDEL", "regions"), 0)
    if placed != chunk.region_new or dropped != len(chunk.region_drops):
        return (f"inserted {placed} and removed {dropped} region entries, the plan expected "
                f"{chunk.region_new} and {len(chunk.region_drops)}")
    return ""


def _chunk_commands(keys: Keys, meta: CopyMeta, chunk: _Chunk, boards: Mapping[str, Board]) -> None:
    """The commands of one chunk, each labelled with what it writes (for _chunk_mismatch):
    one per touched bucket, and one for all the lookup shards' writes (shards_hset), not
    one per player (the MULTI/EXEC then costs ~100 commands to queue and parse, not
    ~3,000). The copy-meta HSET comes last."""
    plan = chunk.plan
    commands = _board_commands(keys, meta, plan, "")
    labels = ["board:"] * len(commands)
    hsets: dict[int, list[Any]] = {}
    shards = meta.lookup_shards
    if meta.ties is None:
        for player_id, score in plan.lookups.items():
            hsets.setdefault(lookup_shard(player_id, shards), []).extend((player_id, score))
    else:  # a first_reached board: "score:reached_ms" in the lookup
        for player_id, value in plan.lookups.items():
            hsets.setdefault(lookup_shard(player_id, shards), []).extend((player_id, value_token(value)))
    if hsets:
        commands.append(shards_hset([keys.lookup(meta.copy, shard) for shard in hsets], shards_hset_args(hsets)))
    for board, board_plan_ in chunk.boards.items():
        labels += ["lookup"] * (len(commands) - len(labels))
        commands += _board_commands(keys, meta, board_plan_, board)
        labels += [f"board:{board}"] * (len(commands) - len(labels))
    labels += ["lookup"] * (len(commands) - len(labels))
    regions: dict[int, list[Any]] = {}
    for player_id, region in chunk.region_sets.items():
        regions.setdefault(lookup_shard(player_id, shards), []).extend((player_id, region))
    if regions:
        commands.append(shards_hset([keys.region(meta.copy, shard) for shard in regions], shards_hset_args(regions)))
    commands += [("HDEL", keys.region(meta.copy, lookup_shard(p, shards)), p) for p in chunk.region_drops]
    labels += ["regions"] * (len(commands) - len(labels))
    commands.append(("HSET", keys.copy_meta(meta.copy), "counts", orjson.dumps(plan.counts),
                     "checksums", orjson.dumps([f"{c:016x}" for c in plan.checksums]),
                     *(("boards", boards_dumps(boards)) if meta.boards else ())))
    chunk.commands, chunk.labels = commands, labels


def _board_commands(keys: Keys, meta: CopyMeta, plan: EpochPlan, board: str) -> list[tuple[Any, ...]]:
    """One board's ZREMs and ZADDs of a chunk, a command per touched bucket."""
    layout_id = meta.layout.layout_id
    zrems: dict[int, list[str]] = {}
    for bucket, player_id in plan.removals:
        zrems.setdefault(bucket, []).append(player_id)
    zadds: dict[int, list[Any]] = {}
    if meta.ties is None:
        for bucket, player_id, score in plan.additions:
            zadds.setdefault(bucket, []).extend((-score, player_id))  # type: ignore[operator]
    else:
        for bucket, player_id, value in plan.additions:
            zadds.setdefault(bucket, []).extend((index_key(meta.layout, meta.ties, value)[1], player_id))
    return [*(("ZREM", keys.bucket(meta.copy, layout_id, b, board), *members) for b, members in zrems.items()),
            *(("ZADD", keys.bucket(meta.copy, layout_id, b, board), *pairs) for b, pairs in zadds.items())]


def copy_finish(r: redis.Redis, keys: Keys, token: int | None, meta: CopyMeta, *, watermark: tuple[int, int],
                version: int, exact: bool = False) -> CopyMeta:
    """Mark the copy ready at `watermark`; `exact` only when it applied every change committed so far."""
    meta.watermark = watermark
    meta.state = STATE_READY
    meta.version = version
    meta.exact = exact
    _fenced(r, keys, token, [("HSET", keys.copy_meta(meta.copy), *itertools.chain(*meta.fields().items()))])
    return meta


def copy_release(r: redis.Redis, keys: Keys, copy: str, *, at: float) -> None:
    """Record when a copy stopped being current: its grace period starts now."""
    r.hset(keys.copy_meta(copy), "released_at", repr(at))


def copy_verify_counts(r: redis.Redis, keys: Keys, meta: CopyMeta,
                       buckets: Iterable[int] | Mapping[str, Iterable[int]], *, lookups: bool = False) -> list[str]:
    """ZCARD of the given buckets against the copy's counts; with `lookups`, also the
    lookup's size against them and the region shards' against the regional boards' total.
    `buckets`: the global board's, or each board's ("" global) as copy_apply returns them;
    a plain iterable checks every bucket of every regional board too.

    `lookups` counts every shard (HLEN, SHARD_SCAN_BATCH a round trip): after a build,
    not after each epoch, whose chunks checked their lookup and region-shard writes
    against their plans already (copy_apply), and whose copy can have ~260,000 shards."""
    wanted = {"": sorted(set(buckets))} if not isinstance(buckets, Mapping) else {
        board: sorted(set(bs)) for board, bs in buckets.items()}
    if not isinstance(buckets, Mapping):
        wanted.update({board: list(range(meta.layout.size)) for board in meta.boards})
    checks = [(board, bucket) for board, bs in wanted.items() for bucket in bs]
    replies = round_trip(r, [("ZCARD", keys.bucket(meta.copy, meta.layout.layout_id, bucket, board))
                             for board, bucket in checks]) if checks else []
    problems = []
    for (board, bucket), actual in zip(checks, replies, strict=True):
        counted = meta.boards[board][0][bucket] if board else meta.counts[bucket]
        if actual != counted:
            where = f"region {board} bucket {bucket}" if board else f"bucket {bucket}"
            problems.append(f"{where}: {actual} members, counted {counted}")
    if not lookups:
        return problems
    lookup_total, placed = copy_shard_sizes(r, keys, meta.copy, meta.lookup_shards, regions=bool(meta.boards))
    if lookup_total != sum(meta.counts):
        problems.append(f"lookup holds {lookup_total} players, buckets {sum(meta.counts)}")
    if meta.boards:
        regional = sum(sum(counts) for counts, _ in meta.boards.values())
        if placed != regional:
            problems.append(f"region shards hold {placed} players, regional boards {regional}")
    return problems


def copy_shard_sizes(r: redis.Redis, keys: Keys, copy: str, shards: int, *, regions: bool) -> tuple[int, int]:
    """(players in the lookup, players in the region shards: 0 without `regions`) of a copy
    of `shards` shards: their HLEN summed by a script, SHARD_SCAN_BATCH shards a call (a
    reply per shard would cost the client more than the server)."""
    key_of = [keys.lookup, *((keys.region,) if regions else ())]
    sizes = [0, 0]
    for which, key in enumerate(key_of):
        calls = [[key(copy, shard) for shard in range(start, min(shards, start + SHARD_SCAN_BATCH))]
                 for start in range(0, shards, SHARD_SCAN_BATCH)]
        sizes[which] = sum(int(n) for n in round_trip(r, [_script_call(_HLEN_SUM, batch, []) for batch in calls]))
    return sizes[0], sizes[1]


def copy_shards_scan(r: redis.Redis, keys: Keys, copy: str, shards: int, *, regions: bool = False
                     ) -> Iterator[tuple[bytes, bytes]]:
    """Every (player, value) of a copy's lookup shards (`regions`: its region shards).

    One HSCAN from cursor 0 per shard, SHARD_SCAN_BATCH shards a round trip: it answers a
    listpack shard whole at once; a bigger shard (a copy built with 16 before the shards
    were sized) goes on by HSCAN, so no reply holds a whole big hash."""
    key_of = keys.region if regions else keys.lookup
    for start in range(0, shards, SHARD_SCAN_BATCH):
        batch = [key_of(copy, shard) for shard in range(start, min(shards, start + SHARD_SCAN_BATCH))]
        replies = round_trip(r, [("HSCAN", key, 0, "COUNT", 1000) for key in batch])
        for key, (cursor, flat) in zip(batch, replies, strict=True):
            yield from zip(flat[::2], flat[1::2], strict=True)
            while int(cursor) != 0:
                cursor, flat = round_trip(r, [("HSCAN", key, cursor, "COUNT", 5000)])[0]
                yield from zip(flat[::2], flat[1::2], strict=True)


def copy_top(r: redis.Redis, keys: Keys, meta: CopyMeta, limit: int = 100, board: str = "") -> list[dict[str, Any]]:
    """The first `limit` entries of a board in display order, from its few highest non-empty buckets."""
    counts = meta.boards[board][0] if board else meta.counts
    plan: list[tuple[int, int]] = []
    needed = limit
    for bucket in range(meta.layout.size - 1, -1, -1):
        if needed <= 0:
            break
        if counts[bucket]:
            take = min(needed, counts[bucket])
            plan.append((bucket, take))
            needed -= take
    with r.pipeline(transaction=False) as pipe:
        for bucket, take in plan:
            pipe.zrange(keys.bucket(meta.copy, meta.layout.layout_id, bucket, board), 0, take - 1, withscores=True)
        replies = pipe.execute()
    if meta.ties is None:
        pairs = [(m.decode(), -int(s)) for reply in replies for m, s in reply]
        return [entry.as_dict() for entry in ranked(pairs)]
    values = [(m.decode(), index_value(meta.layout, meta.ties, bucket, s))
              for (bucket, _), reply in zip(plan, replies, strict=True) for m, s in reply]
    return [entry.as_dict() for entry in ranked_values(values)]


def bucket_scan(r: redis.Redis, key: str, batch: int = 5000) -> Iterator[tuple[str, int]]:
    """A shared board's bucket, member by member: (player_id, score) in display order."""
    for member, score in _bucket_members(r, key, batch):
        yield member.decode(), -int(score)


def bucket_values_scan(r: redis.Redis, keys: Keys, copy: str, layout: BucketLayout, ties: FirstReached | None,
                       bucket: int, batch: int = 5000, board: str = "") -> Iterator[tuple[str, IndexValue]]:
    """Any board's bucket as (player_id, value): scores, or first_reached (score, reached_ms)."""
    for member, score in _bucket_members(r, keys.bucket(copy, layout.layout_id, bucket, board), batch):
        yield member.decode(), index_value(layout, ties, bucket, score)


def _bucket_members(r: redis.Redis, key: str, batch: int) -> Iterator[tuple[bytes, float]]:
    start = 0
    while True:
        chunk: list[tuple[bytes, float]] = r.zrange(key, start, start + batch - 1, withscores=True)  # type: ignore[assignment]
        yield from chunk
        if len(chunk) < batch:
            return
        start += batch


def bucket_checksum_scan(r: redis.Redis, keys: Keys, meta: CopyMeta, bucket: int, board: str = "") -> tuple[int, int]:
    """(count, checksum) of a bucket of a board of a copy by a full scan."""
    pairs = [(p, value_token(v))
             for p, v in bucket_values_scan(r, keys, meta.copy, meta.layout, meta.ties, bucket, board=board)]
    return len(pairs), checksum_of(pairs)


# -------------------------------------------------------------------------- manifests


def manifest_store(r: redis.Redis, keys: Keys, manifest: Manifest, *, token: int | None = None) -> None:
    """Store a candidate manifest; with `token`, only while that token holds the lease.

    A coordinator that stalls after building a version can find its version number
    published by its successor: unfenced, its late write would replace the successor's
    manifest with one naming a stale copy generation. It expires after MANIFEST_TTL
    unless pointer_publish makes it current (a candidate that fails is not left behind).
    """
    raw = manifest.to_json()
    if token is None:
        r.set(keys.manifest(manifest.version), raw, ex=MANIFEST_TTL)
        return
    _fenced(r, keys, token, [("SET", keys.manifest(manifest.version), raw, "EX", MANIFEST_TTL)])


def copy_holds(r: redis.Redis, keys: Keys, manifest: Manifest) -> bool:
    """Whether the manifest's copy still holds exactly its version.

    The generation alone is not enough: a dropped and rebuilt copy (or one rebuilt after
    Redis lost it) counts its generations again from the start, so an old manifest could
    match it. Version numbers are never reused; (generation, version) is unique.
    """
    gen, version = r.hmget(keys.copy_meta(manifest.copy), ["gen", "version"])
    return _holds(manifest, gen, version)


def _holds(manifest: Manifest, gen: bytes | str | None, version: bytes | str | None) -> bool:
    return gen is not None and version is not None and int(gen) == manifest.gen and int(version) == manifest.version


def pointer_get(r: redis.Redis, keys: Keys) -> int | None:
    raw = r.get(keys.ptr)
    return int(raw) if raw is not None else None


# Least recently used first. Clearing it when full would send every season's readers to
# Redis at once; evicting the oldest keeps the current versions the reads actually use.
_manifest_cache: OrderedDict[tuple[str, str, int], Manifest] = OrderedDict()
# Taken by writers of the cache only: a hit, the hot path of every read, stays lock-free
# (each OrderedDict call is atomic under the GIL; a hit evicted meanwhile is just a hit).
_manifest_cache_lock = threading.Lock()
_MANIFEST_CACHE_MAX = 256


def manifest_get(r: redis.Redis, keys: Keys, version: int) -> Manifest | None:
    """A manifest is immutable once published, so each process caches it by version."""
    cache_key = (keys.prefix, keys.season, version)
    cached = _manifest_cache.get(cache_key)
    if cached is not None:
        try:  # noqa: SIM105 - contextlib.suppress would cost more than the hit itself
            _manifest_cache.move_to_end(cache_key)
        except KeyError:
            pass
        return cached
    raw = r.get(keys.manifest(version))
    if raw is None:
        return None
    manifest = Manifest.from_json(raw)
    with _manifest_cache_lock:
        _manifest_cache[cache_key] = manifest
        while len(_manifest_cache) > _MANIFEST_CACHE_MAX:
            _manifest_cache.popitem(last=False)
    return manifest


def manifest_cache_clear() -> None:
    """Forget every manifest, and the copies' shard counts learned from them: a process
    started afresh."""
    with _manifest_cache_lock:
        _manifest_cache.clear()
        _learned_shards.clear()


def manifest_cache_forget(keys: Keys, version: int) -> None:
    """Forget a cached manifest that was never published (a failed candidate's number is reused)."""
    with _manifest_cache_lock:
        _manifest_cache.pop((keys.prefix, keys.season, version), None)


# ------------------------------------------------------------------------------ reads


class Unavailable(Exception):
    """No complete version can be served right now (none published, or the view is lost)."""


class VersionExpired(Exception):
    def __init__(self, current: int | None):
        super().__init__("version expired")
        self.current = current


class UnknownRegion(Exception):
    """The version has no board for the region asked for (not one of the season's regions)."""

    def __init__(self, region: str, manifest: Manifest):
        super().__init__(f"unknown region {region!r}")
        self.region = region
        self.manifest = manifest


class _Torn(Exception):
    """The copy under a read was mutated (or the read outlived its deadline): retry."""


Torn = _Torn  # for the invariant checker, which reports it instead of retrying


@dataclass(frozen=True, slots=True)
class PlayerView:
    manifest: Manifest
    entry: Entry | None
    total: int
    # The player's region in this version (a season with regions; None: no regional board
    # holds them, or the season has none).
    region: str | None = None


@dataclass(frozen=True, slots=True)
class PlayersView:
    """Some players' scores in one version and each one's season rank: only those the
    version holds are in `scores` and `ranks`."""

    manifest: Manifest
    scores: dict[str, int]
    ranks: dict[str, int]
    # On a first_reached board: each player's reached_ms, which orders equal scores.
    reached: dict[str, int] | None = None


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
    """
    conn = _reader_connection(r)
    try:
        conn.send_packed_command([_pack(commands)])
        return [conn.read_response() for _ in commands]
    except BaseException:
        conn.disconnect()
        raise


# The copy names each process has seen current, per season: readers pipeline the lookup
# of every one of them with the pointer read.
_learned_copies: dict[tuple[str, str], tuple[str, ...]] = {}
# Seasons seen with regional boards: their rank reads pipeline the player's region-shard
# entry with the lookup (a season without regions never pays for it).
_learned_regional: set[tuple[str, str]] = set()
# Each copy's lookup shards as this process last saw them, per (prefix, season, copy): the
# first round trip of a rank read names the player's shard in every copy before it knows
# which manifest it reads. A copy whose manifest says another count (built again since)
# costs one more round trip, which learns the count of every copy of the season.
_learned_shards: dict[tuple[str, str, str], int] = {}


def _window_values(manifest: Manifest, reads: list[tuple[int, int, int]], replies: list[Any]
                   ) -> list[tuple[str, IndexValue]]:
    """The (player_id, value) of raw ZRANGE ... WITHSCORES replies, one per read range."""
    ties = manifest.ties
    out: list[tuple[str, IndexValue]] = []
    for (bucket, _, _), reply in zip(reads, replies, strict=True):
        pairs = reply if not reply or isinstance(reply[0], list) else list(zip(reply[::2], reply[1::2], strict=True))
        if ties is None:
            out += [(m.decode(), -int(float(s))) for m, s in pairs]
        else:
            out += [(m.decode(), index_value(manifest.layout, ties, bucket, float(s))) for m, s in pairs]
    return out


class RankReader:
    """Reads of one published version. Every answer comes from exactly one manifest.

    A read takes the manifest first, does all its sub-queries against that manifest's
    copy, and checks afterwards that the copy's generation did not move (a seqlock)
    and that it finished within its deadline; otherwise it retries on the current
    version, or answers 410 when the caller pinned a version.
    """

    def __init__(self, r: redis.Redis, keys: Keys, *, deadline: float, attempts: int = 3,
                 copies: tuple[str, ...] | None = None, region: str | None = None):
        self.r = r
        self.keys = keys
        self.deadline = deadline
        self.attempts = attempts
        self.copies = copies or _learned_copies.get((keys.prefix, keys.season), COPY_NAMES)
        # A regional reader: every read is on that region's board of the version
        # (Manifest.board_of), and a player of another region is not ranked on it.
        self.region = region

    # -- manifest selection
    def _manifest(self, version: int | None) -> Manifest:
        return self._select(pointer_get(self.r, self.keys), version)

    def _select(self, current: int | None, version: int | None) -> Manifest:
        """The manifest a read uses, given the current pointer and the version asked for:
        on a regional reader, that version's board of the region."""
        manifest = self._select_version(current, version)
        if self.region is None:
            return manifest
        board = manifest.board_of(self.region)
        if board is None:
            raise UnknownRegion(self.region, manifest)
        return board

    def _select_version(self, current: int | None, version: int | None) -> Manifest:
        if version is None:
            if current is None:
                raise Unavailable()
            manifest = manifest_get(self.r, self.keys, current)
            if manifest is None:
                raise Unavailable()
            return manifest
        if current is None:
            raise Unavailable()
        if version > current or version < 1:
            raise VersionExpired(current)
        manifest = manifest_get(self.r, self.keys, version)
        if manifest is None:
            raise VersionExpired(current)
        return manifest

    def _validate(self, manifest: Manifest, started: float) -> None:
        if not copy_holds(self.r, self.keys, manifest):
            raise _Torn()
        if time.monotonic() - started > self.deadline:
            raise _Torn()

    def _bucket_key(self, manifest: Manifest, bucket: int) -> str:
        return self.keys.bucket(manifest.copy, manifest.layout.layout_id, bucket, manifest.board)

    # -- the reads
    def top(self, limit: int, version: int | None = None) -> tuple[Manifest, list[dict[str, Any]]]:
        def body(manifest: Manifest) -> list[dict[str, Any]]:
            return manifest.top[:limit]
        # The top 100 is built once per version and lives in the manifest itself: no
        # copy is read, so there is nothing to validate.
        manifest = self._manifest(version)
        return manifest, body(manifest)

    def locate(self, manifest: Manifest, player_id: str) -> tuple[IndexValue, int, int] | None:
        """(value, position, rank) of a player in this version, or None; the value is the
        score, or (score, reached_ms) on a first_reached board."""
        shard = lookup_shard(player_id, manifest.lookup_shards)
        if manifest.board:
            score_raw, region = round_trip(self.r, [("HGET", self.keys.lookup(manifest.copy, shard), player_id),
                                                    ("HGET", self.keys.region(manifest.copy, shard), player_id)])
            if region is None or region.decode() != manifest.board:
                return None
        else:
            score_raw = self.r.hget(self.keys.lookup(manifest.copy, shard), player_id)
        if score_raw is None:
            return None
        score = lookup_value(manifest.ties, score_raw)
        bucket, sort_key = index_key(manifest.layout, manifest.ties, score)
        key = self._bucket_key(manifest, bucket)
        with self.r.pipeline(transaction=False) as pipe:
            pipe.zcount(key, "-inf", f"({sort_key}")
            pipe.zrank(key, player_id)
            higher_in_bucket, index = pipe.execute()
        if index is None:
            # The lookup and the index disagree: only possible mid-mutation.
            raise _Torn()
        before = manifest.higher[bucket]
        return score, before + int(index) + 1, before + int(higher_in_bucket) + 1

    def rank(self, player_id: str, version: int | None = None) -> PlayerView:
        """The player's entry in one version, in two round trips.

        The same reads and the same seqlock as `_run` + `locate`, pipelined: (1) the
        pointer, then the player's lookup score in every copy (read after the pointer,
        so the current version's copy already held it); (2) ZCOUNT and ZRANK in the
        score's bucket, then the copy's (generation, version), which Redis executes
        after them, so an unchanged pair proves no mutation began before the reads.
        """
        for _ in range(self.attempts):
            manifest, score_raw, region_raw, started = self._player_lookup(player_id, version)
            try:
                return self._rank_of(manifest, player_id, score_raw, region_raw, started)
            except _Torn:
                current = pointer_get(self.r, self.keys)
                if version is not None:
                    raise VersionExpired(current) from None
        raise Unavailable()

    def _player_lookup(self, player_id: str, version: int | None
                       ) -> tuple[Manifest, bytes | None, bytes | None, float]:
        """The first round trip of a player's reads: the pointer, and the player's lookup
        value (and region, in a season with regions) in every copy this process has seen
        current, each in its shard by the copy's learned shard count. (manifest, value,
        region, when the read started)."""
        prefix, slug = season = (self.keys.prefix, self.keys.season)
        started = time.monotonic()
        regional = self.region is not None or season in _learned_regional
        copies = self.copies
        learned = [_learned_shards.get((prefix, slug, copy), LOOKUP_SHARDS) for copy in copies]
        shards = [lookup_shard(player_id, count) for count in learned]
        commands: list[tuple[Any, ...]] = [("GET", self.keys.ptr)]
        commands += [("HGET", self.keys.lookup(copy, shard), player_id)
                     for copy, shard in zip(copies, shards, strict=True)]
        if regional:
            commands += [("HGET", self.keys.region(copy, shard), player_id)
                         for copy, shard in zip(copies, shards, strict=True)]
        raw_ptr, *replies = round_trip(self.r, commands)
        manifest = self._select(int(raw_ptr) if raw_ptr is not None else None, version)
        shard = lookup_shard(player_id, manifest.lookup_shards)
        at = copies.index(manifest.copy) if manifest.copy in copies else None
        if at is not None and learned[at] == manifest.lookup_shards:
            score_raw = replies[at]
            region_raw = replies[len(copies) + at] if regional else None
        else:
            if at is None:
                # A rebuild published a copy under a new name: pipeline it from now on.
                copies = self.copies = (manifest.copy, *copies[:1])
                _learned_copies[season] = copies
            # Not the shard this process learned for the copy (built again since with
            # another count, or never read here): learn its count, and the other copies'
            # from their meta in the same round trip.
            others = [copy for copy in copies if copy != manifest.copy]
            score_raw, region_raw, *counts = round_trip(self.r, [
                ("HGET", self.keys.lookup(manifest.copy, shard), player_id),
                ("HGET", self.keys.region(manifest.copy, shard), player_id),
                *(("HGET", self.keys.copy_meta(copy), "lookup_shards") for copy in others)])
            regional = True
            _learned_shards[(prefix, slug, manifest.copy)] = manifest.lookup_shards
            for copy, count in zip(others, counts, strict=True):
                if count is not None:
                    _learned_shards[(prefix, slug, copy)] = int(count)
        if not regional and manifest.regions:
            # The first read of a season with regions in this process: from now on the
            # region comes with the lookup.
            region_raw = self.r.hget(self.keys.region(manifest.copy, shard), player_id)
            _learned_regional.add(season)
        return manifest, score_raw, region_raw, started

    def _rank_of(self, manifest: Manifest, player_id: str, score_raw: bytes | None, region_raw: bytes | None,
                 started: float) -> PlayerView:
        region = region_raw.decode() if region_raw is not None else None
        if score_raw is None or (manifest.board and region != manifest.board):
            self._validate(manifest, started)
            return PlayerView(manifest=manifest, entry=None, total=manifest.total, region=region)
        if manifest.ties is None:
            score = int(score_raw)
            bucket = manifest.layout.bucket_of(score)
            sort_key = -score
        else:
            value = lookup_parse(score_raw)
            score = value[0]
            bucket, sort_key = index_key(manifest.layout, manifest.ties, value)
        key = self._bucket_key(manifest, bucket)
        higher_in_bucket, index, (gen, held) = round_trip(self.r, [
            ("ZCOUNT", key, "-inf", f"({sort_key}"), ("ZRANK", key, player_id),
            ("HMGET", self.keys.copy_meta(manifest.copy), "gen", "version"),
        ])
        if index is None:
            # The lookup and the index disagree: only possible mid-mutation.
            raise _Torn()
        if not _holds(manifest, gen, held) or time.monotonic() - started > self.deadline:
            raise _Torn()
        before = manifest.higher[bucket]
        entry = Entry(position=before + int(index) + 1, rank=before + int(higher_in_bucket) + 1,
                      player_id=player_id, score=score)
        return PlayerView(manifest=manifest, entry=entry, total=manifest.total, region=region)

    def players(self, player_ids: Iterable[str], version: int | None = None) -> PlayersView:
        """Scores and season ranks of a set of players (a friends board) in one version.

        Two round trips after the pointer, whatever the number of players: (1) one HMGET
        per lookup shard holding some of them; (2) one ZCOUNT per distinct score in its
        bucket (the season rank is the manifest's count above that bucket + 1 + the higher
        scores in it), then the copy's (generation, version), checked as `_rank_of` does,
        so every score and rank comes from the one version. Nothing is kept per player:
        the cost is this request's, never a score change's.
        """
        wanted = list(dict.fromkeys(player_ids))
        for _ in range(self.attempts):
            manifest = self._manifest(version)
            # By shard of the manifest's copy, whose count can differ from another copy's.
            groups = list(shards_of(wanted, manifest.lookup_shards).items())
            started = time.monotonic()
            try:
                return self._players_of(manifest, groups, started)
            except _Torn:
                current = pointer_get(self.r, self.keys)
                if version is not None:
                    raise VersionExpired(current) from None
        raise Unavailable()

    def _players_of(self, manifest: Manifest, groups: list[tuple[int, list[str]]], started: float) -> PlayersView:
        ties = manifest.ties
        values: dict[str, IndexValue] = {}
        if groups:
            replies = round_trip(self.r, [("HMGET", self.keys.lookup(manifest.copy, shard), *ids)
                                          for shard, ids in groups])
            for (_, ids), reply in zip(groups, replies, strict=True):
                for player_id, raw in zip(ids, reply, strict=True):
                    if raw is not None:
                        values[player_id] = int(raw) if ties is None else lookup_parse(raw)
        # A season rank depends on the value alone (the score, or the score and when it
        # was reached): one ZCOUNT per distinct value.
        distinct = [(value, *index_key(manifest.layout, ties, value)) for value in set(values.values())]
        *higher, (gen, held) = round_trip(self.r, [
            *(("ZCOUNT", self._bucket_key(manifest, bucket), "-inf", f"({key}") for _, bucket, key in distinct),
            ("HMGET", self.keys.copy_meta(manifest.copy), "gen", "version"),
        ])
        if not _holds(manifest, gen, held) or time.monotonic() - started > self.deadline:
            raise _Torn()
        rank_of = {value: manifest.higher[bucket] + int(count) + 1
                   for (value, bucket, _), count in zip(distinct, higher, strict=True)}
        ranks = {player_id: rank_of[value] for player_id, value in values.items()}
        if ties is None:
            return PlayersView(manifest=manifest, scores=values, ranks=ranks)  # type: ignore[arg-type]
        return PlayersView(manifest=manifest, scores={p: value_score(v) for p, v in values.items()}, ranks=ranks,
                           reached={p: v[1] for p, v in values.items() if not isinstance(v, int)})

    def entries_at(self, manifest: Manifest, first: int, limit: int,
                   known: tuple[int, IndexValue, int] | None = None) -> list[Entry]:
        """Entries at positions first..first+limit-1; `known` = (position, value, rank) of one
        of them. Not validated: the caller checks the copy still holds the version."""
        return self._entries(manifest, first, limit, known, None)

    def _entries(self, manifest: Manifest, first: int, limit: int, known: tuple[int, IndexValue, int] | None,
                 started: float | None) -> list[Entry]:
        """`entries_at`, and with `started` validated in the same round trip as its reads
        (the copy's generation and version read after them, and the read's deadline).

        One member more is read above the window: when it differs from the first entry,
        that entry's rank is its position, and no ZCOUNT is needed; only a first entry
        tied with players above the window (and not the known player's value) costs one
        more round trip."""
        if limit <= 0 or first > manifest.total:
            if started is not None:
                self._validate(manifest, started)
            return []
        start = first - 1 if first > 1 else first
        reads = self._window_reads(manifest, start, limit + first - start)
        commands: list[tuple[Any, ...]] = [("ZRANGE", self._bucket_key(manifest, b), low, high, "WITHSCORES")
                                           for b, low, high in reads]
        if started is not None:
            commands.append(("HMGET", self.keys.copy_meta(manifest.copy), "gen", "version"))
        replies = round_trip(self.r, commands)
        if started is not None:
            gen, held = replies.pop()
            if not _holds(manifest, gen, held) or time.monotonic() - started > self.deadline:
                raise _Torn()
        values = _window_values(manifest, reads, replies)
        if len(values) != min(limit + first - start, manifest.total - start + 1):
            raise _Torn()
        rank_of_first: int | None = 1
        if start < first:
            above, values = values[0], values[1:]
            if above[1] != values[0][1]:
                rank_of_first = first
            elif known is not None and known[1] == values[0][1]:
                rank_of_first = known[2]
            else:
                rank_of_first = None
        if rank_of_first is None:
            b, sort_key = index_key(manifest.layout, manifest.ties, values[0][1])
            check = [("HMGET", self.keys.copy_meta(manifest.copy), "gen", "version")] if started is not None else []
            higher, *held_now = round_trip(self.r, [("ZCOUNT", self._bucket_key(manifest, b), "-inf", f"({sort_key}"),
                                                    *check])
            if held_now and not _holds(manifest, *held_now[0]):
                raise _Torn()
            rank_of_first = manifest.higher[b] + int(higher) + 1
        if manifest.ties is None:
            return ranked(values, first_position=first, rank_of_first=rank_of_first)  # type: ignore[arg-type]
        return ranked_values(values, first_position=first, rank_of_first=rank_of_first)

    def _window_reads(self, manifest: Manifest, first: int, limit: int) -> list[tuple[int, int, int]]:
        """(bucket, first index, last index) ranges holding positions first..first+limit-1:
        the walk down the buckets from the one holding `first`."""
        located = locate_position(manifest.counts, first)
        assert located is not None
        bucket, index = located
        reads: list[tuple[int, int, int]] = []
        remaining = limit
        while remaining > 0 and bucket >= 0:
            available = manifest.counts[bucket] - index
            if available > 0:
                take = min(available, remaining)
                reads.append((bucket, index, index + take - 1))
                remaining -= take
            bucket -= 1
            index = 0
        return reads

    def window(self, from_position: int, limit: int, version: int | None = None) -> tuple[Manifest, list[Entry]]:
        """Two round trips: the pointer, then the window's ranges with the copy's generation."""
        for _ in range(self.attempts):
            manifest = self._manifest(version)
            try:
                return manifest, self._entries(manifest, from_position, limit, None, time.monotonic())
            except _Torn:
                current = pointer_get(self.r, self.keys)
                if version is not None:
                    raise VersionExpired(current) from None
        raise Unavailable()

    def neighbors(
        self, player_id: str, radius: int, version: int | None = None
    ) -> tuple[Manifest, Entry | None, list[Entry]]:
        """The player's entry and the entries `radius` positions around it, in three round
        trips: the pointer with the player's lookup (as `rank`), ZCOUNT and ZRANK in their
        bucket, then the window's ranges with the copy's generation (which validates all)."""
        for _ in range(self.attempts):
            manifest, score_raw, region_raw, started = self._player_lookup(player_id, version)
            try:
                region = region_raw.decode() if region_raw is not None else None
                if score_raw is None or (manifest.board and region != manifest.board):
                    self._validate(manifest, started)
                    return manifest, None, []
                value = lookup_value(manifest.ties, score_raw)
                bucket, sort_key = index_key(manifest.layout, manifest.ties, value)
                key = self._bucket_key(manifest, bucket)
                higher_in_bucket, index = round_trip(self.r, [("ZCOUNT", key, "-inf", f"({sort_key}"),
                                                              ("ZRANK", key, player_id)])
                if index is None:
                    raise _Torn()
                before = manifest.higher[bucket]
                position, rank = before + int(index) + 1, before + int(higher_in_bucket) + 1
                first = max(1, position - radius)
                entries = self._entries(manifest, first, position + radius - first + 1, (position, value, rank),
                                        started)
                return manifest, Entry(position=position, rank=rank, player_id=player_id,
                                       score=value_score(value)), entries
            except _Torn:
                current = pointer_get(self.r, self.keys)
                if version is not None:
                    raise VersionExpired(current) from None
        raise Unavailable()
