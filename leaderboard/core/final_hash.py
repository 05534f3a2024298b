"""The canonical lines the FINAL content hash is taken over (docs/api.md, FINAL standings).

One UTF-8 line per standing, in position order, fields separated by tabs. Every season's
line starts `position, rank, player_id, score`; a first_reached season adds reached_at, a
season with regions then adds region, regional position and regional rank, and a season
with tiers then the tier. A season that has none of them hashes exactly the four fields
it always did, so FINAL hashes taken before these fields existed still verify.
"""

from __future__ import annotations

from dataclasses import dataclass

BASE_FIELDS = ("position", "rank", "player_id", "score")
REACHED_FIELDS = ("reached_at",)
REGIONAL_FIELDS = ("region", "regional_position", "regional_rank")
TIER_FIELDS = ("tier",)


@dataclass(frozen=True, slots=True)
class FinalLineFormat:
    first_reached: bool
    regional: bool
    tiered: bool = False

    @property
    def fields(self) -> tuple[str, ...]:
        return (BASE_FIELDS + (REACHED_FIELDS if self.first_reached else ())
                + (REGIONAL_FIELDS if self.regional else ()) + (TIER_FIELDS if self.tiered else ()))

    def describe(self) -> str:
        """The algorithm as the FINAL manifest names it."""
        # Written with escapes, "\\t" and "\\n", as the manifest has always named them.
        fields = "\\t".join(self.fields)
        return f"sha256 over '{fields}\\n' lines in position order"

    def line(self, *, position: int, rank: int, player_id: str, score: int, reached_at: str, region: str,
             regional_position: int | None, regional_rank: int | None, tier: str | None = None) -> str:
        """One standing's line; `reached_at` as the API writes it. A player with no region
        has empty region and regional fields, so the line still has all its tabs."""
        line = f"{position}\t{rank}\t{player_id}\t{score}"
        if self.first_reached:
            line += f"\t{reached_at}"
        if self.regional:
            line += f"\t{region}\t{_blank_if_none(regional_position)}\t{_blank_if_none(regional_rank)}"
        if self.tiered:
            line += f"\t{tier or ''}"
        return line + "\n"


def _blank_if_none(value: int | None) -> str:
    return "" if value is None else str(value)
