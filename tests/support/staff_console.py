"""Helpers of the staff console tests: actors, reading the audit trail and flash messages,
and the append-only trigger (fixtures are in tests/support/staff_fixtures.py)."""

from __future__ import annotations

from typing import Any

from django.test import Client

from audit.models import AuditEntry
from audit.services import Actor
from seasons.models import Season
from seasons.staff.common import staff_actor

PASSWORD = "staff-test-password-1"


def actor_of(user: Any) -> Actor:
    return staff_actor(user)


def audit_rows(season: Season | None = None, *, since: int = 0) -> list[AuditEntry]:
    qs = AuditEntry.objects.filter(seq__gt=since).order_by("seq")
    if season is not None:
        qs = qs.filter(season_slug=season.slug)
    return list(qs)


def audit_actions(season: Season | None = None, *, since: int = 0) -> list[str]:
    return [row.action for row in audit_rows(season, since=since)]


def audit_head() -> int:
    last = AuditEntry.objects.order_by("-seq").values_list("seq", flat=True).first()
    return int(last or 0)


def follow_messages(client: Client, response: Any) -> list[str]:
    """The flash messages an action left, read from the page it redirected to."""
    assert response.status_code == 302, (response.status_code, getattr(response, "content", b"")[:500])
    page = client.get(response["Location"])
    return [str(m) for m in page.context["messages"]]


def drop_audit_trigger_sql(vendor: str) -> tuple[str, str]:
    """(disable, enable) statements of the append-only trigger, as migration audit 0002 creates it."""
    if vendor == "postgresql":
        return ("ALTER TABLE audit_auditentry DISABLE TRIGGER audit_entry_append_only",
                "ALTER TABLE audit_auditentry ENABLE TRIGGER audit_entry_append_only")
    return ("DROP TRIGGER audit_entry_append_only",
            "CREATE TRIGGER audit_entry_append_only BEFORE UPDATE ON audit_auditentry "
            "BEGIN SELECT RAISE(ABORT, 'the audit trail is append-only (UPDATE refused)'); END;")
