"""Hot-bucket split recommendations from measured bucket sizes and change rates.

A bucket is hot when it holds much more than its share of players or of changes: its
sorted set grows slow to update and to copy, and every epoch touches it. The remedy is
narrower score ranges there, placed at score quantiles of the bucket so the new buckets
hold similar numbers of players. A boundary is a score value, never a position, so
ties are never split (docs/rules.md, Ranking).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from leaderboard.core.buckets import BucketLayout, LayoutError


@dataclass(frozen=True, slots=True)
class SplitProposal:
    bucket: int
    low: int
    high: int
    players: int
    share: float
    change_share: float
    split_points: tuple[int, ...]
    why: str


def split_points_valid(layout: BucketLayout, points: Sequence[object]) -> list[int]:
    """Validated integer split points; a boundary inside one score value (a fraction) is refused."""
    out: list[int] = []
    for point in points:
        if isinstance(point, bool) or not isinstance(point, int | float | str):
            raise LayoutError(f"split point {point!r} is not a score")
        try:
            value = float(point)
        except ValueError:
            raise LayoutError(f"split point {point!r} is not a score") from None
        if not math.isfinite(value):  # "nan", "inf", "1e999": int() of them raises
            raise LayoutError(f"split point {point!r} is not a score")
        if value != int(value):
            raise LayoutError(f"split point {point!r} falls inside one score value: ties would be split")
        score = int(value)
        if score in layout.lower_bounds:
            raise LayoutError(f"split point {score} is already a bucket boundary")
        out.append(score)
    if not out:
        raise LayoutError("no split points given")
    layout.split(at=out, layout_id=layout.layout_id + 1)  # raises on out-of-range points
    return sorted(set(out))


def split_recommendations(
    *,
    layout: BucketLayout,
    counts: Sequence[int],
    changes: Sequence[int],
    quantile_scores: dict[int, list[int]] | None = None,
    max_share: float = 0.25,
    max_change_share: float = 0.25,
    parts: int = 4,
) -> list[SplitProposal]:
    """Buckets holding more than `max_share` of players or `max_change_share` of recent changes.

    `quantile_scores[b]` are scores at evenly spaced positions inside bucket b (from the
    index); without them the range is cut evenly.
    """
    total = sum(counts)
    total_changes = sum(changes)
    out: list[SplitProposal] = []
    for bucket, players in enumerate(counts):
        share = players / total if total else 0.0
        change_share = changes[bucket] / total_changes if total_changes else 0.0
        if share <= max_share and change_share <= max_change_share:
            continue
        low, high = layout.range_of(bucket)
        if high == low:
            continue  # a single score value cannot be split
        candidates = (quantile_scores or {}).get(bucket) or [
            low + (high - low + 1) * k // parts for k in range(1, parts)
        ]
        points = tuple(sorted({p for p in candidates if low < p <= high}))
        if not points:
            continue
        why = []
        if share > max_share:
            why.append(f"holds {share:.0%} of players")
        if change_share > max_change_share:
            why.append(f"takes {change_share:.0%} of recent changes")
        out.append(SplitProposal(bucket=bucket, low=low, high=high, players=players, share=share,
                                 change_share=change_share, split_points=points, why=", ".join(why)))
    return out
