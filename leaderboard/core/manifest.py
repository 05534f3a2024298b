"""A published version: what it contains and where it lives (docs/rules.md, Publication)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import orjson

from leaderboard.core.buckets import BucketLayout
from leaderboard.core.epoch import higher_counts
from leaderboard.core.partitions import Watermark
from leaderboard.core.season_options import BOARD_KIND_DEFAULT, TIE_BREAK_FIRST_REACHED, BoardKind
from leaderboard.core.slots import SLOT_GROUPS_DEFAULT
from leaderboard.core.tiebreak import FirstReached
from leaderboard.core.tiers import Tiers, tier_at, tiers_parse

# The lookup shards of a manifest written before the copies sized them by their players,
# and the fewest a copy gets unless the caller asks for more (VIEW_LOOKUP_SHARDS_MIN: a
# new season's first build, with few players yet, is sized for the players to come).
LOOKUP_SHARDS_DEFAULT = 16
# A copy is built with a power of two >= players / LOOKUP_SHARD_PLAYERS lookup shards: at
# ~48 players a shard every shard stays a listpack-encoded hash (Redis converts one past
# hash-max-listpack-entries, 128 by default, for good), ~15 bytes a player instead of ~56.
LOOKUP_SHARD_PLAYERS = 48
# Past this many players a shard on average (a season that grew through epochs), the
# biggest shards near 128 and start to convert: time for a rebuild to size them again.
LOOKUP_SHARD_OUTGROWN = 96


def lookup_shards_for(*, players: int, minimum: int = LOOKUP_SHARDS_DEFAULT) -> int:
    """The lookup shards of a copy built with `players`: a power of two, at least `minimum`."""
    wanted = max(minimum, -(-players // LOOKUP_SHARD_PLAYERS), 1)
    return 1 << (wanted - 1).bit_length()


def lookup_shards_outgrown(*, players: int, shards: int) -> bool:
    """Whether a copy of `shards` lookup shards holding `players` wants a rebuild."""
    return players > shards * LOOKUP_SHARD_OUTGROWN


@dataclass(frozen=True)
class RegionBoard:
    """A regional board of a version: bucketed like the global board (same layout), its
    own counts, checksums and top 100."""

    counts: list[int]
    checksums: list[int]
    top: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self, layout: BucketLayout) -> dict[str, Any]:
        return {"buckets": _buckets(layout, self.counts, self.checksums), "total_players": sum(self.counts),
                "top": self.top}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RegionBoard:
        counts, checksums = _buckets_parse(data["buckets"])
        return cls(counts=counts, checksums=checksums, top=list(data.get("top", [])))


def _kind_of_ties(data: dict[str, Any]) -> BoardKind:
    """A manifest without a kind: a best season over the default range, with its tie rule."""
    return BOARD_KIND_DEFAULT if "tie_break" not in data else BoardKind(tie_break=TIE_BREAK_FIRST_REACHED)


def _buckets(layout: BucketLayout, counts: list[int], checksums: list[int]) -> list[dict[str, Any]]:
    return [
        {"bucket": b, "low": layout.range_of(b)[0], "high": layout.range_of(b)[1], "count": c, "checksum": f"{s:016x}"}
        for b, (c, s) in enumerate(zip(counts, checksums, strict=True))
    ]


def _buckets_parse(buckets: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    return [int(b["count"]) for b in buckets], [int(b["checksum"], 16) for b in buckets]


@dataclass(frozen=True)
class Manifest:
    season: str
    version: int
    as_of: str
    # Everything in the change stream up to this watermark (a (txid, id) cursor per ledger
    # partition) is in the version.
    watermark: Watermark
    copy: str
    # The copy's generation when the version was published; a reader that sees another
    # generation after its reads knows the copy was mutated under it.
    gen: int
    layout: BucketLayout
    counts: list[int]
    checksums: list[int]
    top: list[dict[str, Any]] = field(default_factory=list)
    # A first_reached board's key encoding (core.tiebreak); None: ties share a rank.
    ties: FirstReached | None = None
    # A season with regions: each region's board, in the same copy and the same version.
    regions: dict[str, RegionBoard] = field(default_factory=dict)
    # "" for the global board; a region's name for the view `board_of` returns, whose
    # counts, checksums and top are that region's (readers take its bucket keys from it).
    board: str = ""
    # How many lookup (and region) shards the copy has: a player's shard is
    # crc32(player_id) % lookup_shards, so every reader takes it from here.
    lookup_shards: int = LOOKUP_SHARDS_DEFAULT
    # How many slot groups the copy's data keys are spread over (core.slots): a bucket's or
    # shard's key, and the fence whose `gen` a reader checks, are named from it.
    groups: int = SLOT_GROUPS_DEFAULT
    # What the board is (mode, order, range, tie rule), stated by every read answer.
    kind: BoardKind = BOARD_KIND_DEFAULT
    # Which side of the copy's buckets the version reads (0 or 1): a bucket can hold
    # entries one side does not see, recorded in that side's hidden sets (docs/architecture.md,
    # The shared index), and the lookup holds each side's value.
    side: int = 0
    # The index (the data keys) the copy reads: its own name unless two copies share one
    # set of buckets, each reading its own side.
    index: str = ""
    # The season's tiers (core.tiers): every entry of the version names its tier, by its
    # rank and this board's total. None: the season has none (entries carry tier null).
    tiers: Tiers | None = None

    def __post_init__(self) -> None:
        if not self.index:
            object.__setattr__(self, "index", self.copy)

    def board_of(self, region: str) -> Manifest | None:
        """This version seen as one regional board (the same copy, generation and watermark),
        or None when the season has no such region."""
        if region not in self.regions:
            return None
        return self._boards[region]

    @cached_property
    def _boards(self) -> dict[str, Manifest]:
        # Built once per version and cached with it: a regional read costs no more than a global one.
        return {name: replace(self, counts=b.counts, checksums=b.checksums, top=b.top, regions={}, board=name)
                for name, b in self.regions.items()}

    @cached_property
    def total(self) -> int:
        return sum(self.counts)

    @cached_property
    def shown_top(self) -> list[dict[str, Any]]:
        """The top as players see it: `top` holds the board's values, an asc board's
        max_score - score (BoardKind.flipped), turned back here once per version, and
        each entry's tier."""
        flip = self.kind.flip
        return [{"position": entry["position"], "rank": entry["rank"], "player_id": entry["player_id"],
                 "score": entry["score"] if flip is None else flip - entry["score"],
                 "tier": self.tier_of(entry["rank"])} for entry in self.top]

    def tier_of(self, rank: int) -> str | None:
        """The tier of a rank on this board (None: the season has no tiers)."""
        return None if self._tier_bounds is None else tier_at(self._tier_bounds, rank)

    @cached_property
    def _tier_bounds(self) -> list[tuple[int | None, str]] | None:
        # Worked out once per version and board: every entry of a page, the top and a live
        # round's windows name their tier from it.
        return None if self.tiers is None else self.tiers.bounds(self.total)

    @cached_property
    def kind_dict(self) -> dict[str, Any]:
        """The kind as read answers carry it, built once per version."""
        return self.kind.as_dict()

    @cached_property
    def memo(self) -> dict[Any, Any]:
        """What readers derive from this version once and serve many times (an encoded
        answer of its top), cached with the manifest and gone with it: a version is
        immutable, so nothing in here is ever stale."""
        return {}

    @cached_property
    def higher(self) -> list[int]:
        return higher_counts(self.counts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "season": self.season,
            "version": self.version,
            "as_of": self.as_of,
            "watermark": self.watermark.as_json(),
            "copy": self.copy,
            "gen": self.gen,
            "layout": self.layout.as_dict(),
            "buckets": _buckets(self.layout, self.counts, self.checksums),
            "total_players": self.total,
            "top": self.top,
            "lookup_shards": self.lookup_shards,
            "groups": self.groups,
            **({"side": self.side} if self.side else {}),
            **({"index": self.index} if self.index != self.copy else {}),
            # Only on first_reached boards: a shared season's manifest is as it always was.
            **({} if self.ties is None else {"tie_break": self.ties.as_dict()}),
            # Only when not the default: a manifest written before kinds existed reads the same.
            **({} if self.kind == BOARD_KIND_DEFAULT else {"kind": self.kind.as_dict()}),
            **({} if self.tiers is None else {"tiers": self.tiers.text()}),
            **({} if not self.regions else
               {"regions": {name: b.to_dict(self.layout) for name, b in self.regions.items()}}),
        }

    def to_json(self) -> bytes:
        return orjson.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        counts, checksums = _buckets_parse(data["buckets"])
        return cls(
            season=data["season"],
            version=int(data["version"]),
            as_of=data["as_of"],
            watermark=Watermark.from_json(data["watermark"]),
            copy=str(data["copy"]),
            gen=int(data["gen"]),
            layout=BucketLayout.from_dict(data["layout"]),
            counts=counts,
            checksums=checksums,
            top=list(data.get("top", [])),
            ties=FirstReached.from_dict(data["tie_break"]) if "tie_break" in data else None,
            kind=BoardKind.from_dict(data["kind"]) if "kind" in data else _kind_of_ties(data),
            regions={name: RegionBoard.from_dict(b) for name, b in data.get("regions", {}).items()},
            lookup_shards=int(data.get("lookup_shards", LOOKUP_SHARDS_DEFAULT)),
            groups=int(data.get("groups", SLOT_GROUPS_DEFAULT)),
            side=int(data.get("side", 0)),
            index=str(data.get("index", data["copy"])),
            tiers=tiers_parse(data.get("tiers", "")),
        )

    @classmethod
    def from_json(cls, raw: bytes | str) -> Manifest:
        return cls.from_dict(orjson.loads(raw))
