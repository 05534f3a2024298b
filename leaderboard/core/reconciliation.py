"""Findings of invariant checks and reconciliations, and how samples are drawn."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


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
