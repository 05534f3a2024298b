"""Score-range buckets: versioned metadata that readers and writers both take from the manifest.

A layout is a sorted list of lower bounds starting at 0; bucket i holds scores in
[lower[i], lower[i+1] - 1] and the last one reaches MAX_SCORE. A score value belongs to
exactly one bucket, so ties are never split across buckets and "count of scores above
mine" is a sum over whole higher buckets plus one ZCOUNT in my own.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from leaderboard.core.errors import DomainError

# The score domain: every valid best_score (core.events checks it), split into buckets here.
MIN_SCORE = 0
MAX_SCORE = 1_000_000

DEFAULT_BUCKET_WIDTH = 10_000


class LayoutError(DomainError):
    code = "invalid_layout"


@dataclass(frozen=True, slots=True)
class BucketLayout:
    layout_id: int
    lower_bounds: tuple[int, ...]

    def __post_init__(self) -> None:
        bounds = self.lower_bounds
        if not bounds or bounds[0] != MIN_SCORE:
            raise LayoutError("a layout starts at score 0")
        if any(b <= a for a, b in zip(bounds, bounds[1:], strict=False)):
            raise LayoutError("bucket bounds must be strictly increasing")
        if bounds[-1] > MAX_SCORE:
            raise LayoutError(f"bucket bounds must be <= {MAX_SCORE}")

    @classmethod
    def uniform(cls, *, width: int = DEFAULT_BUCKET_WIDTH, layout_id: int = 1) -> BucketLayout:
        if width < 1:
            raise LayoutError("bucket width must be >= 1")
        return cls(layout_id=layout_id, lower_bounds=tuple(range(MIN_SCORE, MAX_SCORE + 1, width)))

    @classmethod
    def single(cls, *, layout_id: int = 1) -> BucketLayout:
        return cls(layout_id=layout_id, lower_bounds=(MIN_SCORE,))

    @property
    def size(self) -> int:
        return len(self.lower_bounds)

    def bucket_of(self, score: int) -> int:
        return bisect_right(self.lower_bounds, score) - 1

    def range_of(self, bucket: int) -> tuple[int, int]:
        low = self.lower_bounds[bucket]
        high = self.lower_bounds[bucket + 1] - 1 if bucket + 1 < self.size else MAX_SCORE
        return low, high

    def as_dict(self) -> dict[str, object]:
        return {"layout_id": self.layout_id, "lower_bounds": list(self.lower_bounds)}

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> BucketLayout:
        bounds = data["lower_bounds"]
        assert isinstance(bounds, list)
        return cls(layout_id=int(data["layout_id"]), lower_bounds=tuple(int(b) for b in bounds))  # type: ignore[call-overload]

    def split(self, *, at: list[int], layout_id: int) -> BucketLayout:
        """A new layout with extra boundaries (a hot range split into narrower buckets)."""
        extra = {int(b) for b in at}
        if any(not MIN_SCORE < b <= MAX_SCORE for b in extra):
            raise LayoutError(f"split points must be in {MIN_SCORE + 1}..{MAX_SCORE}")
        return BucketLayout(layout_id=layout_id, lower_bounds=tuple(sorted(set(self.lower_bounds) | extra)))
