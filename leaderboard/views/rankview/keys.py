"""The rank views in Redis: R copies of a bucketed index, manifests, a fenced pointer.

No Django here: callers pass a redis client and the key prefix. Layout of the keys
(hash tags put the small per-season control keys in one Redis Cluster slot, and each
slot group of each index in a slot of its own; c is a copy's name, i the index its data
is in, CopyMeta.index, its own name unless its meta says another):

    {P}:{season}:ptr                 current version number
    {P}:{season}:m:{version}         manifest JSON (no expiry while current; MANIFEST_TTL s once superseded)
    {P}:{season}:lease               the coordinator's fencing token (issued by the database)
    {P}:{season}:copy:{c}            copy meta hash: gen, state, watermark, counts, checksums, groups,
                                     index, side
    {P}:{season}:retiring            names of copies a new index replaced, dropped once their
                                     grace period is over
    {P}:{season:i:g}:z:L:b           bucket b (layout L) of index i: member player_id, score -score
    {P}:{season:i:g}:r:REG:L:b       bucket b of region REG's board in index i (a season with regions)
    {P}:{season:i:g}:h:k             lookup shard k of index i: player_id -> score
    {P}:{season:i:g}:rg:k            region shard k of index i: player_id -> region (players with one)
    {P}:{season:i:g}:x:s:L:b         hidden set of side s of bucket b (layout L): entries that side
                                     does not see (core.shared_index.hidden_member); beside the
                                     bucket, in its slot group
    {P}:{season:i:g}:xr:s:REG:L:b    the same for bucket b of region REG's board
    {P}:{season:i:g}:f               fence of group g of index i: `token` (the highest fencing
                                     token that wrote the group) and each side's generation
                                     at its last write there (`gen` for side 0, `gen1` for 1)

The control keys (pointer, manifests, lease, copy metas) share the season's one slot, so
the pointer swap stays one script. A copy's data keys are spread over G slot groups (G,
`groups`, in the copy meta and every manifest; core.slots maps a bucket or shard to its
group g, and only Keys turns that into a key name): one slot per group, spread over every
master of a cluster, one script per group for each fenced write.

A player's lookup (and region) shard is crc32(player_id) % S, where S, the copy's
`lookup_shards`, is chosen when the copy is built from the scores: a power of two >=
max(16, players / 48), recorded in the copy meta and in every manifest of the copy. Small
shards stay listpack-encoded hashes (~15 bytes a player instead of ~56 in a hashtable),
and the rank read's first round trip still names one shard per copy. A copy that grows
past 96 players a shard through epochs is rebuilt with more (views.epoch).

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
The epoch moves a player between regional boards in the same chunk (the same slot-group
scripts) that moves them on the global board, and the copy meta and manifest carry every board's counts
and checksums: one version, one copy generation, all boards.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

from leaderboard.core.manifest import LOOKUP_SHARDS_DEFAULT
from leaderboard.core.slots import SLOT_GROUPS_DEFAULT, bucket_group, shard_group

# The fewest lookup shards a copy has, and the count of copies and manifests that predate
# the count's recording (core.manifest.lookup_shards_for sizes a copy).
LOOKUP_SHARDS = LOOKUP_SHARDS_DEFAULT
# The slot groups of a manifest that predates their recording.
SLOT_GROUPS = SLOT_GROUPS_DEFAULT
# The groups of a copy whose meta records none: it was made before its data keys were
# spread over slot groups, so they have other names (`legacy_data_keys`). Such a copy
# reads as broken (the epoch rebuilds it) and holds no version (a current one is lost:
# a recovery rebuilds it from the ledger); dropping it unlinks its old names.
LEGACY_GROUPS = 0
# Lookup shards read per round trip when every shard of a copy is scanned or counted.
SHARD_SCAN_BATCH = 1024
# Keys a dropped copy unlinks per command.
DROP_BATCH = 8192
# The copies of the index (R = 2): the epochs alternate between them, and a rank
# read fetches the player's lookup score in each with the pointer, in one round trip.
COPY_NAMES = ("0", "1")
# How long a manifest outlives its currency: a candidate never published, or a version
# the pointer swap replaced (pinned readers then get 410). The current version's manifest
# never expires: a quiet season (no match overnight, a FINAL awaiting its approver) must
# stay readable, and an expired one would read as lost views and start a recovery.
MANIFEST_TTL = 3600

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
        self.retiring = f"{base}:retiring"
        self._base = base

    def manifest(self, version: int) -> str:
        return f"{self._base}:m:{version}"

    @property
    def moved(self) -> str:
        """rank_24h_ago's snapshot and the ranks read in it (leaderboard.history.selectors):
        field "" the snapshot's id, each other field a player's "<snapshot id>:<rank>"."""
        return f"{self._base}:moved"

    def copy_meta(self, copy: str) -> str:
        return f"{self._base}:copy:{copy}"

    def part_claim(self, epoch: str, part: int) -> str:
        """Who runs part `part` of apply `epoch` (views.parts): SET NX with a short TTL its
        runner renews, in the season's control slot like the lease."""
        return f"{self._base}:part:{epoch}:{part}"

    def part_started(self, epoch: str, part: int) -> str:
        """Set by each runner of the part once it claimed it: a claim gone without a report
        then means its runner died (the coordinator runs the part again at once)."""
        return f"{self._base}:part:{epoch}:{part}:started"

    def part_report(self, epoch: str, part: int) -> str:
        """What part `part` of apply `epoch` applied: its counts' deltas and figures (JSON)."""
        return f"{self._base}:part:{epoch}:{part}:report"

    def parts_done(self, epoch: str) -> str:
        """The parts of apply `epoch` that reported, pushed as they do: the coordinator
        blocks on it (BLPOP) instead of polling each report."""
        return f"{self._base}:part:{epoch}:done"

    def group(self, index: str, group: int) -> str:
        """The hash-tagged base of every key of slot group `group` of index `index` (the
        data a copy reads: CopyMeta.index, Manifest.index)."""
        return f"{self.prefix}:{{{self.season}:{index}:{group}}}"

    def fence(self, index: str, group: int) -> str:
        """The fence hash of a slot group (`token`, and each side's generation: gen_field)."""
        return f"{self.group(index, group)}:f"

    def bucket(self, index: str, layout_id: int, bucket: int, board: str = "", *, groups: int) -> str:
        base = self.group(index, bucket_group(bucket=bucket, groups=groups, board=board))
        if board:
            return f"{base}:r:{board}:{layout_id}:{bucket}"
        return f"{base}:z:{layout_id}:{bucket}"

    def hidden(self, index: str, side: int, layout_id: int, bucket: int, board: str = "", *, groups: int) -> str:
        """The hidden set of side `side` of a bucket: in the bucket's slot group, so a read
        counts in the bucket and subtracts its hidden entries in one script."""
        base = self.group(index, bucket_group(bucket=bucket, groups=groups, board=board))
        if board:
            return f"{base}:xr:{side}:{board}:{layout_id}:{bucket}"
        return f"{base}:x:{side}:{layout_id}:{bucket}"

    def region(self, index: str, shard: int, *, groups: int) -> str:
        return f"{self.group(index, shard_group(shard=shard, groups=groups))}:rg:{shard}"

    def lookup(self, index: str, shard: int, *, groups: int) -> str:
        return f"{self.group(index, shard_group(shard=shard, groups=groups))}:h:{shard}"

    def lookup_of(self, index: str, player_id: str, shards: int, *, groups: int) -> str:
        return self.lookup(index, lookup_shard(player_id, shards), groups=groups)


def gen_field(side: int) -> str:
    """The field of a group fence holding side `side`'s generation: "gen" for side 0 (what
    every fence has held since there were fences), "gen1" for side 1."""
    return "gen" if side == 0 else f"gen{side}"


def legacy_data_keys(keys: Keys, copy: str, layout_id: int, buckets: int, boards: Iterable[str],
                     shards: int) -> list[str]:
    """Every data key a copy made before slot groups can have (buckets of each board,
    lookup and region shards), under the names it was written with then."""
    base = f"{keys.prefix}:{{{keys.season}:{copy}"
    names = [f"{base}:{layout_id}:{b}}}:z" for b in range(buckets)]
    for board in boards:
        names += [f"{base}:r:{board}:{layout_id}:{b}}}:z" for b in range(buckets)]
    names += [f"{base}:h:{k}}}:h" for k in range(shards)]
    names += [f"{base}:g:{k}}}:h" for k in range(shards)]
    return names
