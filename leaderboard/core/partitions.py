"""Ledger partitions of a season and the vector watermarks of its change stream.

A season's players are split into partitions by a stable hash of the player id; each
partition has its own write lock and its own commit numbers, so batches on disjoint
partitions commit in parallel (docs/architecture.md, Partitions).

A partition's commit numbers carry the partition in their high bits,
`txid = partition << TXID_PARTITION_SHIFT | n`: one column and one index serve every
partition, a partition's stream is the txid range [p << 48, (p + 1) << 48), and a row
names its own partition. Partition 0's numbers are the plain numbers every season had
before partitions, so an unpartitioned season's stream, watermarks and manifests are
unchanged.

A season's layout is `partitions` partitions numbered from `base`: a repartition moves
the season to a new layout numbered above every partition it had, so the old
partitions' streams stay as they are (nothing is renumbered) and every player's older
changes sort before their newer ones when partitions are read in ascending order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

TXID_PARTITION_SHIFT = 48
# Commit numbers are bigint: 63 bits, 48 of them for the number within the partition.
MAX_PARTITION_IDS = 1 << (63 - TXID_PARTITION_SHIFT)
# A batch holds the advisory lock of each partition it writes, and PostgreSQL's lock table
# is shared (max_locks_per_transaction x max_connections): docs/operations.md, Sizing
# ledger partitions.
MAX_PARTITIONS = 64

Cursor = tuple[int, int]


def partition_of(player_id: str, partitions: int) -> int:
    """The partition (0..partitions-1) of a player in a layout of `partitions`.

    BLAKE2b with its own personalization, not the crc32 of the lookup shards: with both
    counts powers of two, crc32 % partitions would be the low bits of crc32 % shards, and
    each partition's players would fill only 1/partitions of the shards.
    """
    if partitions == 1:
        return 0
    digest = hashlib.blake2b(player_id.encode(), digest_size=8, person=b"lb-ledger-part").digest()
    return int.from_bytes(digest, "big") % partitions


def layout_partition(player_id: str, *, base: int, partitions: int) -> int:
    """The partition id of a player in the layout (`base`, `partitions`)."""
    return base + partition_of(player_id, partitions)


def layout_check(*, base: int, partitions: int) -> None:
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise ValueError(f"partitions must be 1..{MAX_PARTITIONS}, not {partitions}")
    if base < 0 or base + partitions > MAX_PARTITION_IDS:
        raise ValueError(f"partition ids {base}..{base + partitions - 1} out of range")


def txid_partition(txid: int) -> int:
    return txid >> TXID_PARTITION_SHIFT


def partition_start(partition: int) -> Cursor:
    """The cursor before every change of `partition`."""
    return (partition << TXID_PARTITION_SHIFT, 0)


def partition_end(partition: int) -> int:
    """The first txid of the next partition (exclusive bound of `partition`'s range)."""
    return (partition + 1) << TXID_PARTITION_SHIFT


@dataclass(frozen=True, slots=True, init=False)
class Watermark:
    """A position in a season's change stream: one (txid, id) cursor per partition,
    everything at or before each read. A partition it has no cursor for is at its start.

    Ordered as a vector (`a <= b`: every cursor of a at or before b's), so two watermarks
    can be incomparable; `merge` is their least upper bound. Trailing cursors at their
    partition's start are dropped, so an unpartitioned season's watermark is one cursor,
    written "txid:id" exactly as before partitions.
    """

    cursors: tuple[Cursor, ...]

    def __init__(self, cursors: Iterable[Sequence[int]] = ()):
        listed = [(int(c[0]), int(c[1])) for c in cursors]
        for p, (txid, _) in enumerate(listed):
            if txid_partition(txid) != p and (txid, _) != (0, 0):
                raise ValueError(f"cursor {txid}:{_} is not in partition {p}")
        # (0, 0) for a partition p > 0 is "nothing read" written loosely: the partition's start.
        listed = [partition_start(p) if c == (0, 0) else c for p, c in enumerate(listed)]
        while len(listed) > 1 and listed[-1] == partition_start(len(listed) - 1):
            listed.pop()
        object.__setattr__(self, "cursors", tuple(listed) or ((0, 0),))

    @classmethod
    def single(cls, txid: int, id: int) -> Watermark:  # noqa: A002 - the column's name
        """The watermark of an unpartitioned stream (partition 0)."""
        return cls([(txid, id)])

    @classmethod
    def of_partitions(cls, cursors: dict[int, Cursor]) -> Watermark:
        """From {partition: cursor}; partitions left out are at their start."""
        size = max(cursors, default=0) + 1
        return cls([cursors.get(p, partition_start(p)) for p in range(size)])

    def cursor(self, partition: int) -> Cursor:
        return self.cursors[partition] if partition < len(self.cursors) else partition_start(partition)

    @property
    def partitions(self) -> int:
        """How many partitions it names (the ones after them are at their start)."""
        return len(self.cursors)

    def covers(self, txid: int, id: int) -> bool:  # noqa: A002 - the column's name
        """Whether the change (txid, id) is at or before this watermark (in its partition)."""
        return (txid, id) <= self.cursor(txid >> TXID_PARTITION_SHIFT)

    def merge(self, other: Watermark) -> Watermark:
        """The least watermark at or after both."""
        size = max(len(self.cursors), len(other.cursors))
        return Watermark([max(self.cursor(p), other.cursor(p)) for p in range(size)])

    def advanced(self, changes: Iterable[Sequence[Any]]) -> Watermark:
        """This watermark moved past `changes` (rows starting with txid, id, in cursor order)."""
        last = {p: c for p, c in enumerate(self.cursors)}
        for change in changes:
            last[change[0] >> TXID_PARTITION_SHIFT] = (change[0], change[1])
        return Watermark.of_partitions(last)

    def _le(self, other: Watermark) -> bool:
        size = max(len(self.cursors), len(other.cursors))
        return all(self.cursor(p) <= other.cursor(p) for p in range(size))

    def __le__(self, other: object) -> bool:
        if not isinstance(other, Watermark):
            return NotImplemented
        return self._le(other)

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, Watermark):
            return NotImplemented
        return other._le(self)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Watermark):
            return NotImplemented
        return self != other and self._le(other)

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, Watermark):
            return NotImplemented
        return self != other and other._le(self)

    def __str__(self) -> str:
        return self.dump()

    def dump(self) -> str:
        """"txid:id" per partition, comma-separated (what `parse` reads)."""
        return ",".join(f"{t}:{i}" for t, i in self.cursors)

    @classmethod
    def parse(cls, text: str) -> Watermark:
        cursors = []
        for part in text.split(","):
            txid, sep, ident = part.strip().partition(":")
            if not sep:
                raise ValueError(f"not a watermark: {text!r}")
            cursors.append((int(txid), int(ident)))
        return cls(cursors)

    def as_json(self) -> list[int] | list[list[int]]:
        """[txid, id] for one partition (as manifests always had it), else [[txid, id], ...]."""
        if len(self.cursors) == 1:
            return list(self.cursors[0])
        return [list(c) for c in self.cursors]

    @classmethod
    def from_json(cls, data: Sequence[Any]) -> Watermark:
        if data and isinstance(data[0], int):
            return cls([(data[0], data[1])])
        return cls(data)

    def columns(self) -> tuple[int, int, list[list[int]] | None]:
        """(txid, id, vector) for the database: the legacy columns keep partition 0's
        cursor, the vector is stored only when the watermark names more partitions."""
        txid, ident = self.cursors[0]
        return txid, ident, ([list(c) for c in self.cursors] if len(self.cursors) > 1 else None)

    @classmethod
    def from_columns(cls, txid: int | None, id: int | None,  # noqa: A002 - the column's name
                     vector: Sequence[Any] | None = None) -> Watermark:
        if vector:
            return cls(vector)
        return cls([(txid or 0, id or 0)])


def stream_heads_watermark(heads: dict[int, int], *, last_id: int) -> Watermark:
    """The watermark of every change committed at or below each partition's head
    ({partition: head txid}), whatever its id (`last_id`: the largest id there can be)."""
    return Watermark.of_partitions({p: (head, last_id) for p, head in heads.items()})
