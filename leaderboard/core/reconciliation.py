"""Findings of invariant checks and reconciliations, and how samples are drawn."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from leaderboard.core.manifest import Manifest


@dataclass(frozen=True, slots=True)
class Finding:
    check: str
    ok: bool
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"check": self.check, "ok": self.ok, "detail": self.detail}


@dataclass(slots=True)
class Report:
    version: int | None
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.findings)

    def add(self, check: str, ok: bool, detail: str = "") -> None:
        self.findings.append(Finding(check=check, ok=ok, detail=detail))

    def failures(self) -> list[Finding]:
        return [f for f in self.findings if not f.ok]

    def as_dict(self) -> dict[str, Any]:
        return {"version": self.version, "ok": self.ok, "findings": [f.as_dict() for f in self.findings]}


def board_check(check: str, board: str = "") -> str:
    """A finding's name on one board: the global board's checks keep their names, a regional
    board's are `region.<name>.<check>` (a region's name has no dot), so a report lists the
    findings of every board side by side and names the board of each failure."""
    return f"region.{board}.{check}" if board else check


def version_boards(manifest: Manifest) -> list[Manifest]:
    """A version's boards, each as a Manifest view: the global one, then each region's
    (Manifest.board_of), in the manifest's order."""
    boards = [manifest]
    for region in manifest.regions:
        board = manifest.board_of(region)
        assert board is not None  # one of its own regions
        boards.append(board)
    return boards


def board_sample(sample: int, *, board: Manifest, regions: int) -> int:
    """Positions to sample on a board: `sample` on the global board; the regional boards
    share another `sample` equally (at least one each), so a season with regions costs about
    twice one without, whatever its number of regions (a rebuild compares under the lease)."""
    if not board.board:
        return sample
    return max(1, -(-sample // max(regions, 1)))


def stratified_positions(total: int, size: int, *, seed: int | None = None) -> list[int]:
    """`size` display positions spread over the whole board: one random pick per stratum.

    Covers the top, the middle and the long tail alike; a plain random sample of a
    heavy-tailed board would almost never look at the top.
    """
    if total <= 0 or size <= 0:
        return []
    if size >= total:
        return list(range(1, total + 1))
    rng = random.Random(seed)
    picks = []
    for i in range(size):
        low = 1 + (i * total) // size
        high = ((i + 1) * total) // size
        picks.append(rng.randint(low, max(low, high)))
    return sorted(set(picks))


def first_mismatch(expected: Sequence[Any], actual: Sequence[Any]) -> str:
    for i, (a, b) in enumerate(zip(expected, actual, strict=False)):
        if a != b:
            return f"first difference at index {i}: expected {a!r}, got {b!r}"
    if len(expected) != len(actual):
        return f"length differs: expected {len(expected)}, got {len(actual)}"
    return ""
