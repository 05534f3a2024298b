"""Score-range buckets: versioned metadata that readers and writers both take from the manifest.

A layout is a sorted list of lower bounds starting at 0; bucket i holds scores in
[lower[i], lower[i+1] - 1] and the last one reaches the season's highest score
(`max_score`: MAX_SCORE unless the season was created with another). A score value belongs to
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
# The highest score a season may be created with (--max-score): far inside a double's
# exact integers, so -score and first_reached keys stay exact in Redis.
MAX_SCORE_LIMIT = 2**40
# A layout over another range gets this many buckets unless told a width (101 x 10,000
# points over the default range).
DEFAULT_BUCKETS = 100

DEFAULT_BUCKET_WIDTH = 10_000


class LayoutError(DomainError):
    code = "invalid_layout"


@dataclass(frozen=True, slots=True)
class BucketLayout:
    layout_id: int
    lower_bounds: tuple[int, ...]
    # The season's highest score: the last bucket's top.
    max_score: int = MAX_SCORE

    def __post_init__(self) -> None:
        bounds = self.lower_bounds
        if not 1 <= self.max_score <= MAX_SCORE_LIMIT:
            raise LayoutError(f"the highest score must be in 1..{MAX_SCORE_LIMIT} (2^40), got {self.max_score}")
        if not bounds or bounds[0] != MIN_SCORE:
            raise LayoutError("a layout starts at score 0")
        if any(b <= a for a, b in zip(bounds, bounds[1:], strict=False)):
            raise LayoutError("bucket bounds must be strictly increasing")
        if bounds[-1] > self.max_score:
            raise LayoutError(f"bucket bounds must be <= {self.max_score}")

    @classmethod
    def uniform(cls, *, width: int | None = None, layout_id: int = 1, max_score: int = MAX_SCORE) -> BucketLayout:
        """Buckets of `width` points over 0..max_score; no width: 10,000 over the default
        range, else the range in about DEFAULT_BUCKETS buckets."""
        if width is None:
            width = DEFAULT_BUCKET_WIDTH if max_score == MAX_SCORE else max(1, -(-max_score // DEFAULT_BUCKETS))
        if width < 1:
            raise LayoutError("bucket width must be >= 1")
        if not 1 <= max_score <= MAX_SCORE_LIMIT:
            raise LayoutError(f"the highest score must be in 1..{MAX_SCORE_LIMIT} (2^40), got {max_score}")
        return cls(layout_id=layout_id, lower_bounds=tuple(range(MIN_SCORE, max_score + 1, width)),
                   max_score=max_score)

    @classmethod
    def single(cls, *, layout_id: int = 1, max_score: int = MAX_SCORE) -> BucketLayout:
        return cls(layout_id=layout_id, lower_bounds=(MIN_SCORE,), max_score=max_score)

    @property
    def size(self) -> int:
        return len(self.lower_bounds)

    def bucket_of(self, score: int) -> int:
        return bisect_right(self.lower_bounds, score) - 1

    def range_of(self, bucket: int) -> tuple[int, int]:
        low = self.lower_bounds[bucket]
        high = self.lower_bounds[bucket + 1] - 1 if bucket + 1 < self.size else self.max_score
        return low, high

    def as_dict(self) -> dict[str, object]:
        # The default range is left out: every layout written before it existed reads the same.
        return {"layout_id": self.layout_id, "lower_bounds": list(self.lower_bounds),
                **({} if self.max_score == MAX_SCORE else {"max_score": self.max_score})}

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> BucketLayout:
        bounds = data["lower_bounds"]
        assert isinstance(bounds, list)
        return cls(layout_id=int(data["layout_id"]), lower_bounds=tuple(int(b) for b in bounds),  # type: ignore[call-overload]
                   max_score=int(data.get("max_score", MAX_SCORE)))  # type: ignore[call-overload]

    def split(self, *, at: list[int], layout_id: int) -> BucketLayout:
        """A new layout with extra boundaries (a hot range split into narrower buckets)."""
        extra = {int(b) for b in at}
        if any(not MIN_SCORE < b <= self.max_score for b in extra):
            raise LayoutError(f"split points must be in {MIN_SCORE + 1}..{self.max_score}")
        return BucketLayout(layout_id=layout_id, lower_bounds=tuple(sorted(set(self.lower_bounds) | extra)),
                            max_score=self.max_score)
