from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from audit.models import AuditEntry


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Read-only for superusers: the staff console is where the trail is used and verified."""

    list_display = ("seq", "created_at", "actor_label", "action", "target_type", "target_id", "season_slug")
    list_filter = ("action", "season_slug")
    search_fields = ("actor_label", "target_id", "reason")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
