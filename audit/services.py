"""Audit rows are written by the service that makes the change, inside its transaction.

Every row is appended to one hash chain (audit/chain.py). Appending takes a row lock on
the chain head (SELECT ... FOR UPDATE on PostgreSQL; SQLite's BEGIN IMMEDIATE already
serializes writers), so two concurrent transactions can never both link to the same
predecessor: the second waits until the first commits and then links to its row.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from audit.chain import GENESIS, ChainReport, chain_verify, row_hash
from audit.models import AuditChainHead, AuditEntry

HEAD_PK = 1


@dataclass(frozen=True, slots=True)
class Actor:
    kind: str  # "user" | "api_client" | "system" | "anonymous" (a failed sign-in)
    id: str
    label: str

    @property
    def public_ref(self) -> str:
        """How public pages name this actor: an opaque id, never a person's user name."""
        return staff_public_ref(self.id) if self.kind == "user" else self.kind


def staff_public_ref(user_id: str | int) -> str:
    return f"staff-{user_id}"


SYSTEM = Actor(kind="system", id="", label="system")


def audit_log(
    *,
    actor: Actor,
    action: str,
    target_type: str,
    target_id: str,
    season_slug: str = "",
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    reason: str = "",
) -> AuditEntry:
    """Append one row to the chain, in the caller's transaction (or its own if there is none)."""
    with transaction.atomic():
        head = _head_locked()
        # Link to the last committed row rather than trusting the head's copy: the head is
        # a lock and a tail marker, the rows are the record.
        last = AuditEntry.objects.order_by("-seq").values_list("seq", "row_hash").first()
        seq, prev = (last[0] + 1, last[1]) if last is not None else (1, GENESIS)
        entry = AuditEntry(
            created_at=timezone.now(),
            actor_type=actor.kind,
            actor_id=actor.id,
            actor_label=actor.label,
            action=action,
            target_type=target_type,
            target_id=str(target_id),
            season_slug=season_slug,
            before=before,
            after=after,
            reason=reason,
            seq=seq,
            prev_hash=prev,
        )
        entry.row_hash = row_hash(prev_hash=prev, content=_content(entry))
        entry.save(force_insert=True)
        head.seq, head.row_hash, head.updated_at = seq, entry.row_hash, entry.created_at
        head.save(update_fields=["seq", "row_hash", "updated_at"])
    return entry


def _head_locked() -> AuditChainHead:
    # The head row may be missing (a fresh or flushed database): create it without a race
    # (INSERT ... ON CONFLICT DO NOTHING), then lock it.
    AuditChainHead.objects.bulk_create([AuditChainHead(pk=HEAD_PK)], ignore_conflicts=True)
    return AuditChainHead.objects.select_for_update().get(pk=HEAD_PK)


def _content(entry: AuditEntry) -> dict[str, Any]:
    return {
        "seq": entry.seq, "created_at": entry.created_at, "actor_type": entry.actor_type, "actor_id": entry.actor_id,
        "actor_label": entry.actor_label, "action": entry.action, "target_type": entry.target_type,
        "target_id": entry.target_id, "season_slug": entry.season_slug, "before": entry.before,
        "after": entry.after, "reason": entry.reason,
    }


_ROW_FIELDS = ("id", "seq", "prev_hash", "row_hash", "created_at", "actor_type", "actor_id", "actor_label", "action",
               "target_type", "target_id", "season_slug", "before", "after", "reason")


def _rows() -> Iterator[dict[str, Any]]:
    yield from AuditEntry.objects.order_by("seq").values(*_ROW_FIELDS).iterator(chunk_size=2000)


def audit_chain_verify() -> ChainReport:
    """Recompute the whole chain from the stored rows; names the first row that does not verify.

    Not one long transaction (on SQLite that would hold the write lock for the whole
    walk): the head is read first and rows appended after it are left for the next run;
    a last statement then checks, on one snapshot, that no row lies beyond the head.
    """
    head_row = AuditChainHead.objects.filter(pk=HEAD_PK).values_list("seq", "row_hash").first()
    head = (int(head_row[0]), str(head_row[1])) if head_row is not None else None
    limit = head[0] if head is not None else 0
    report = chain_verify((row for row in _rows() if row["seq"] <= limit), head=head)
    if not report.ok:
        return report
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT seq FROM audit_auditchainhead WHERE id = %s), (SELECT MAX(seq) FROM audit_auditentry)",
            [HEAD_PK],
        )
        head_now, max_seq = cursor.fetchone()
    if max_seq is not None and (head_now is None or max_seq > head_now):
        stray = AuditEntry.objects.filter(seq__gt=head_now or 0).order_by("seq").values_list("id", "seq").first()
        ident, seq = stray if stray is not None else (None, None)
        return ChainReport(ok=False, checked=report.checked, head_seq=report.head_seq, head_hash=report.head_hash,
                           broken_id=ident, broken_seq=seq,
                           problem=f"row {ident} (seq {seq}) lies beyond the chain head: "
                                   "it was inserted without going through audit_log")
    return report
