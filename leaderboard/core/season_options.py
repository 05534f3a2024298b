"""A season's options fixed around its creation (docs/rules.md, Regional and friends boards):
its set of regions and how equal scores are ordered.

The region rule is also the rule of a player profile's region, so a profile can only
name a region some season could have.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from leaderboard.core.buckets import MAX_SCORE

# Region names go into Redis keys and URLs: a short, closed alphabet keeps both safe and
# readable (na, eu-west, apac).
MAX_REGION_LENGTH = 16
REGION_RE = re.compile(rf"[a-z0-9-]{{1,{MAX_REGION_LENGTH}}}")
REGION_RULE = f"1..{MAX_REGION_LENGTH} characters from [a-z0-9-]"
# Each region is its own board built by every epoch: a small bound keeps a season's epoch
# cost and manifest size bounded.
MAX_REGIONS = 16

# How a result sets a player's score (docs/rules.md, Board kinds): "best" keeps the
# highest settled best score, "latest" takes the newest (a higher score_version) even
# when lower, "sum" adds each result's points. Fixed once the season opens: the ledger's
# scores are computed under it.
MODE_BEST = "best"
MODE_LATEST = "latest"
MODE_SUM = "sum"
MODES = (MODE_BEST, MODE_LATEST, MODE_SUM)

TIE_BREAK_SHARED = "shared"
TIE_BREAK_FIRST_REACHED = "first_reached"
TIE_BREAKS = (TIE_BREAK_SHARED, TIE_BREAK_FIRST_REACHED)

# Which end of the range ranks first (docs/rules.md, Board kinds): desc, a higher score;
# asc, a lower one (race times). The rank views only ever rank higher values first: an
# asc board holds each score as max_score - score (BoardKind.flipped), turned back where
# a score leaves them.
ORDER_DESC = "desc"
ORDER_ASC = "asc"
ORDERS = (ORDER_DESC, ORDER_ASC)


@dataclass(frozen=True, slots=True)
class BoardKind:
    """What a board is (docs/rules.md, Board kinds): how a score is set, which end of the
    range ranks first, the range, and how equal scores are ordered. Fixed once the season
    opens; published in every version's manifest so each read answer states it."""

    mode: str = MODE_BEST
    order: str = ORDER_DESC
    max_score: int = MAX_SCORE
    tie_break: str = TIE_BREAK_SHARED

    @property
    def flip(self) -> int | None:
        """max_score on an asc board (its view values are max_score - score), else None."""
        return self.max_score if self.order == ORDER_ASC else None

    def flipped(self, value: int) -> int:
        """A score's value in the rank views, and a view value's score: the same map both
        ways (the identity on a desc board)."""
        return value if self.order != ORDER_ASC else self.max_score - value

    def as_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "order": self.order, "max_score": self.max_score, "tie_break": self.tie_break}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BoardKind:
        return cls(mode=str(data["mode"]), order=str(data["order"]), max_score=int(data["max_score"]),
                   tie_break=str(data["tie_break"]))


# The kind of every season created before kinds existed.
BOARD_KIND_DEFAULT = BoardKind()


def check_region(value: object) -> str | None:
    """None for a valid region name, else what is wrong with it."""
    if not isinstance(value, str):
        return "must be a string"
    if not REGION_RE.fullmatch(value):
        return f"must be {REGION_RULE}"
    return None


def unknown_region_detail(region: str, regions: Sequence[str]) -> str:
    """Why a well-formed region names no board of a season: the regions it has instead."""
    have = f"its regions are {', '.join(regions)}" if regions else "it has no regions"
    return f"the season has no region {region!r}: {have}"


def regions_problem(regions: Sequence[object]) -> str | None:
    """None for a valid set of season regions (0..MAX_REGIONS distinct names, in display
    order), else a sentence naming what is wrong."""
    if len(regions) > MAX_REGIONS:
        return f"a season has at most {MAX_REGIONS} regions, got {len(regions)}"
    seen: set[object] = set()
    for region in regions:
        if problem := check_region(region):
            return f"region {region!r} {problem}"
        if region in seen:
            return f"region {region!r} is listed twice: regions must be distinct"
        seen.add(region)
    return None


def mode_problem(mode: object) -> str | None:
    if mode not in MODES:
        return f"mode must be one of {', '.join(MODES)}, got {mode!r}"
    return None


def order_problem(order: object) -> str | None:
    if order not in ORDERS:
        return f"order must be one of {', '.join(ORDERS)}, got {order!r}"
    return None


def tie_break_problem(tie_break: object) -> str | None:
    if tie_break not in TIE_BREAKS:
        return f"tie_break must be one of {', '.join(TIE_BREAKS)}, got {tie_break!r}"
    return None
