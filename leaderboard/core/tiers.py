"""Tiers and percentiles (docs/rules.md, Percentile and tiers): what a rank is worth in words.

A season's tiers are ordered, best first: each bounded by a rank (`top100`: rank <= 100)
or by a top share of the board (`1%`: rank <= 1% of the players, by rank), the last one
unbounded. A player's tier is the first whose bound their rank meets, so tied players
(one rank) share a tier, and the tiers follow the board's size as it grows.

The percentile is the share of the board ranked strictly below the player: 100 x (players
with a worse score) / total, rounded down to two decimals, so tied players share it and
a player is never shown above what they reached.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

MAX_TIERS = 16
MAX_TIER_NAME = 24
TIER_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9 _.-]*")
_TOP_RE = re.compile(r"top([1-9][0-9]{0,11})")
_SHARE_RE = re.compile(r"([0-9]{1,3}(?:\.[0-9]{1,4})?)%")


class TiersError(ValueError):
    """A malformed --tiers value; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class Tier:
    name: str
    # At most one bound: a rank (`top`), or a share of the board in percent (`share`).
    top: int | None = None
    share: Fraction | None = None

    def last_rank(self, total: int) -> int | None:
        """The last rank this tier holds on a board of `total` players (None: unbounded).
        A share holds the ranks r with r x 100 <= P x total, exactly: no float between a
        tie and its tier."""
        if self.top is not None:
            return self.top
        if self.share is not None:
            return self.share.numerator * total // (self.share.denominator * 100)
        return None

    def bound_text(self) -> str:
        if self.top is not None:
            return f"top{self.top}"
        if self.share is not None:
            return f"{_share_text(self.share)}%"
        return ""


def _share_text(share: Fraction) -> str:
    return str(Decimal(share.numerator) / Decimal(share.denominator)).rstrip("0").rstrip(".") \
        if share.denominator != 1 else str(share.numerator)


@dataclass(frozen=True, slots=True)
class Tiers:
    tiers: tuple[Tier, ...]

    def of(self, *, rank: int, total: int) -> str:
        return tier_at(self.bounds(total), rank)

    def bounds(self, total: int) -> list[tuple[int | None, str]]:
        """(last rank, name) of each tier on a board of `total` players, best first: what
        a board works out once and names every entry's tier from (`tier_at`)."""
        return [(tier.last_rank(total), tier.name) for tier in self.tiers]

    def text(self) -> str:
        """The --tiers value this parses from (the season's and the manifest's form)."""
        return ",".join(f"{t.name}:{t.bound_text()}" if t.bound_text() else t.name for t in self.tiers)


def tier_at(bounds: list[tuple[int | None, str]], rank: int) -> str:
    """The tier of `rank`: the first whose last rank it does not pass."""
    for last, name in bounds:
        if last is None or rank <= last:
            return name
    raise AssertionError("the last tier is unbounded")


def tiers_parse(text: str) -> Tiers | None:
    """A --tiers value (`Champion:top100,Diamond:1%,Gold:10%,Silver:50%,Bronze`) as Tiers, or
    None for "" (a season without tiers). Raises TiersError naming what is wrong: a name
    outside the rule or repeated, a bound neither topN nor P% (0 < P <= 100), bounds of
    one kind not growing from tier to tier, a bound after the unbounded tier or none
    unbounded at the end."""
    text = text.strip()
    if not text:
        return None
    parts = [part.strip() for part in text.split(",")]
    if len(parts) > MAX_TIERS:
        raise TiersError(f"a season has at most {MAX_TIERS} tiers, got {len(parts)}")
    tiers: list[Tier] = []
    names: set[str] = set()
    last_top: int | None = None
    last_share: Fraction | None = None
    for i, part in enumerate(parts):
        name, sep, bound = part.partition(":")
        name, bound = name.strip(), bound.strip()
        if not TIER_NAME_RE.fullmatch(name) or len(name) > MAX_TIER_NAME:
            raise TiersError(f"tier {i + 1} name {name!r} must be 1..{MAX_TIER_NAME} letters, digits, spaces "
                             "and _-. starting with a letter or digit")
        if name.casefold() in names:
            raise TiersError(f"tier {name!r} is named twice: tier names must be distinct")
        names.add(name.casefold())
        if tiers and tiers[-1].top is None and tiers[-1].share is None:
            raise TiersError(f"tier {name!r} comes after the unbounded tier {tiers[-1].name!r}: "
                             "only the last tier is unbounded")
        if not sep:
            tiers.append(Tier(name=name))
            continue
        if top := _TOP_RE.fullmatch(bound):
            n = int(top.group(1))
            if last_top is not None and n <= last_top:
                raise TiersError(f"tier {name!r} bound top{n} must be above the tier before it (top{last_top}): "
                                 "tiers are ordered best first")
            last_top = n
            tiers.append(Tier(name=name, top=n))
        elif share := _SHARE_RE.fullmatch(bound):
            p = Fraction(Decimal(share.group(1)))
            if not 0 < p <= 100:
                raise TiersError(f"tier {name!r} bound {bound} must be a share above 0% and at most 100%")
            if last_share is not None and p <= last_share:
                raise TiersError(f"tier {name!r} bound {bound} must be above the tier before it "
                                 f"({_share_text(last_share)}%): tiers are ordered best first")
            last_share = p
            tiers.append(Tier(name=name, share=p))
        else:
            raise TiersError(f"tier {name!r} bound {bound!r} must be topN (a rank, N >= 1) or P% (a top share)")
    if tiers[-1].top is not None or tiers[-1].share is not None:
        raise TiersError(f"the last tier ({tiers[-1].name!r}) must be unbounded: name it without a bound")
    return Tiers(tiers=tuple(tiers))


def percentile(*, rank: int, tied: int, total: int) -> float:
    """100 x the players ranked strictly below (total - those ahead - the tied, the player
    among them) / total, rounded down to two decimals."""
    below = total - (rank - 1) - tied
    if total <= 0 or below <= 0:
        return 0.0
    return (below * 10_000 // total) / 100
