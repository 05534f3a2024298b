"""Audit rows are written by the service that makes the change, inside its transaction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from audit.models import AuditEntry


@dataclass(frozen=True, slots=True)
class Actor:
    kind: str  # "user" | "api_client" | "system"
    id: str
    label: str


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
    return AuditEntry.objects.create(
        actor_type=actor.kind,
        actor_id=actor.id,
        actor_label=actor.label,
        action=action,
        target_type=target_type,
        target_id=target_id,
        season_slug=season_slug,
        before=before,
        after=after,
        reason=reason,
    )
