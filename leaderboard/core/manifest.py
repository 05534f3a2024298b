"""A published version: what it contains and where it lives (docs/rules.md, Publication)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import orjson

from leaderboard.core.buckets import BucketLayout
from leaderboard.core.epoch import higher_counts
from leaderboard.core.tiebreak import FirstReached


@dataclass(frozen=True)
class Manifest:
    season: str
    version: int
    as_of: str
    # Everything in the change stream up to this (txid, id) cursor is in the version.
    watermark: tuple[int, int]
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

    @property
    def total(self) -> int:
        return sum(self.counts)

    @cached_property
    def higher(self) -> list[int]:
        return higher_counts(self.counts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "season": self.season,
            "version": self.version,
            "as_of": self.as_of,
            "watermark": list(self.watermark),
            "copy": self.copy,
            "gen": self.gen,
            "layout": self.layout.as_dict(),
            "buckets": [
                {"bucket": b, "low": self.layout.range_of(b)[0], "high": self.layout.range_of(b)[1],
                 "count": c, "checksum": f"{s:016x}"}
                for b, (c, s) in enumerate(zip(self.counts, self.checksums, strict=True))
            ],
            "total_players": self.total,
            "top": self.top,
            # Only on first_reached boards: a shared season's manifest is as it always was.
            **({} if self.ties is None else {"tie_break": self.ties.as_dict()}),
        }

    def to_json(self) -> bytes:
        return orjson.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        buckets = data["buckets"]
        return cls(
            season=data["season"],
            version=int(data["version"]),
            as_of=data["as_of"],
            watermark=(int(data["watermark"][0]), int(data["watermark"][1])),
            copy=str(data["copy"]),
            gen=int(data["gen"]),
            layout=BucketLayout.from_dict(data["layout"]),
            counts=[int(b["count"]) for b in buckets],
            checksums=[int(b["checksum"], 16) for b in buckets],
            top=list(data.get("top", [])),
            ties=FirstReached.from_dict(data["tie_break"]) if "tie_break" in data else None,
        )

    @classmethod
    def from_json(cls, raw: bytes | str) -> Manifest:
        return cls.from_dict(orjson.loads(raw))
