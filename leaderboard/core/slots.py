"""Slot groups: where each data key of a copy of the rank views lives in a Redis Cluster.

A Redis Cluster runs a command or a script only on keys of one hash slot, and a slot
lives on one master. A copy's data keys are spread over `groups` slot groups; every key
of group g carries the hash tag {season:copy:g}, so one script can write a group's
buckets, lookup shards and fence together, and a season's groups spread over every
master (16,384 slots, groups hashed to them by CRC16 like any key).

The functions below are the only mapping from a bucket or shard to its group:

    bucket b of the global board          b % groups
    bucket b of region REG's board        (b + crc32(REG)) % groups
    lookup shard k, region shard k        k % groups

A region's offset spreads its few busy buckets (the middle of a layout holds most players)
over other groups than the global board's same buckets. A player's lookup and region
shards share a group, so their reads and writes go to one node.
"""

from __future__ import annotations

import zlib
from functools import lru_cache

# The slot groups of a new copy: enough that a season spreads over every master of any
# cluster worth running (64 groups land on 3 masters about 21 each), few enough that an
# epoch's chunk costs at most one small script per group.
SLOT_GROUPS_DEFAULT = 64


@lru_cache(maxsize=256)
def _region_offset(board: str) -> int:
    return zlib.crc32(board.encode())


def bucket_group(*, bucket: int, groups: int, board: str = "") -> int:
    """The slot group of bucket `bucket` of `board` ("" the global board)."""
    if board:
        return (bucket + _region_offset(board)) % groups
    return bucket % groups


def shard_group(*, shard: int, groups: int) -> int:
    """The slot group of lookup (and region) shard `shard`."""
    return shard % groups
