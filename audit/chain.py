"""The audit hash chain, as pure functions: the canonical content of a row, its hash, and
a verifier that names the first row where the chain breaks.

row_hash = SHA-256 of the canonical JSON of {prev_hash, seq, created_at, actor_*,
action, target_*, season_slug, before, after, reason}: sorted keys, no whitespace,
UTF-8, timestamps in UTC with microseconds. `before`/`after` are normalised to what a
JSON column gives back (tuples become lists, integral floats become ints: PostgreSQL
jsonb may return 1e20 as an integer), so a row hashes the same before and after storage.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

GENESIS = "0" * 64
# Beyond 2**53 a float no longer holds every integer exactly; leave such values alone.
_EXACT_FLOAT = 2.0**53

CONTENT_FIELDS = (
    "seq", "created_at", "actor_type", "actor_id", "actor_label", "action", "target_type", "target_id",
    "season_slug", "before", "after", "reason",
)


def _normalise(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) < _EXACT_FLOAT:
        return int(value)
    if isinstance(value, list):
        return [_normalise(v) for v in value]
    if isinstance(value, dict):
        return {k: _normalise(v) for k, v in value.items()}
    return value


def json_value(value: Any) -> Any:
    """What a JSON column returns for `value`: a JSON round trip, then number normalisation."""
    if value is None:
        return None
    return _normalise(json.loads(json.dumps(value, allow_nan=False)))


def timestamp(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def row_hash(*, prev_hash: str, content: Mapping[str, Any]) -> str:
    document = {field: content[field] for field in CONTENT_FIELDS}
    document["created_at"] = timestamp(document["created_at"])
    document["before"] = json_value(document["before"])
    document["after"] = json_value(document["after"])
    document["prev_hash"] = prev_hash
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class ChainReport:
    ok: bool
    checked: int
    head_seq: int
    head_hash: str
    # The first row that does not verify (None when ok or when only the head disagrees).
    broken_id: int | None = None
    broken_seq: int | None = None
    problem: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "checked": self.checked, "head_seq": self.head_seq, "head_hash": self.head_hash,
                "broken_id": self.broken_id, "broken_seq": self.broken_seq, "problem": self.problem}


def chain_verify(rows: Iterable[Mapping[str, Any]], *, head: tuple[int, str] | None) -> ChainReport:
    """Walk rows in seq order; `head` is (seq, hash) as the chain head records it.

    Each row must (1) continue the numbering without a gap, (2) hash to its stored hash
    (else: it was edited), (3) link to the previous row's hash (else: the row before it
    was rewritten and re-hashed, or rows between them were removed).
    """
    expected_seq = 1
    prev = GENESIS
    checked = 0
    for row in rows:
        seq, ident = int(row["seq"]), int(row["id"])
        problem = ""
        if seq != expected_seq:
            problem = (f"row {ident} has seq {seq}, expected {expected_seq}: "
                       f"{'rows were removed before it' if seq > expected_seq else 'the numbering was rewritten'}")
        elif row_hash(prev_hash=row["prev_hash"], content=row) != row["row_hash"]:
            problem = f"row {ident} (seq {seq}, {row['action']}) does not match its hash: its content was edited"
        elif row["prev_hash"] != prev:
            problem = (f"row {ident} (seq {seq}) does not link to the hash of seq {seq - 1}: "
                       "the row before it was rewritten and re-hashed, or rows were removed")
        if problem:
            return ChainReport(ok=False, checked=checked, head_seq=expected_seq - 1, head_hash=prev,
                               broken_id=ident, broken_seq=seq, problem=problem)
        prev = row["row_hash"]
        expected_seq += 1
        checked += 1
    last_seq = expected_seq - 1
    recorded = head if head is not None else (0, "")
    if recorded[0] != last_seq or (last_seq and recorded[1] != prev):
        return ChainReport(ok=False, checked=checked, head_seq=last_seq, head_hash=prev,
                           problem=f"the chain head records seq {recorded[0]} but the last row is seq {last_seq}: "
                                   "rows at the end were removed, or the head was altered")
    return ChainReport(ok=True, checked=checked, head_seq=last_seq, head_hash=prev)
