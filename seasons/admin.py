"""The Django admin's user and group pages, audited: a role granted there is a staff action
like any other, and the two-person rule reads who granted whose role from the trail
(audit.selectors.staff_role_granters)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group
from django.db import transaction
from django.forms import ModelForm
from django.http import HttpRequest

from audit.services import audit_log
from seasons.staff.accounts.services import staff_role_of
from seasons.staff.common import staff_actor

User = get_user_model()


def _account(user: Any) -> dict[str, Any]:
    return {"username": user.get_username(), "role": staff_role_of(user), "is_superuser": user.is_superuser,
            "is_active": user.is_active}


class AuditedUserAdmin(UserAdmin):  # type: ignore[type-arg]
    def save_model(self, request: HttpRequest, obj: Any, form: ModelForm, change: bool) -> None:  # type: ignore[type-arg]
        # The role lives in the groups, saved after the user (save_related): remember the
        # account as it was, and write one audit row once both are saved.
        before = _account(User.objects.get(pk=obj.pk)) if change else None
        request._audit_account_before = before  # type: ignore[attr-defined]
        super().save_model(request, obj, form, change)

    def save_related(self, request: HttpRequest, form: ModelForm, formsets: Any, change: bool) -> None:  # type: ignore[type-arg]
        with transaction.atomic():
            super().save_related(request, form, formsets, change)
            user = form.instance
            before = getattr(request, "_audit_account_before", None)
            after = _account(user)
            if before != after:
                audit_log(actor=staff_actor(request.user),
                          action="staff.user.updated" if change else "staff.user.created",
                          target_type="user", target_id=str(user.pk), before=before, after=after,
                          reason="Django admin")

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        with transaction.atomic():
            audit_log(actor=staff_actor(request.user), action="staff.user.deleted", target_type="user",
                      target_id=str(obj.pk), before=_account(obj), reason="Django admin")
            super().delete_model(request, obj)


class AuditedGroupAdmin(GroupAdmin):
    """A role is a group of permissions: changing the group changes what every holder may do."""

    def save_related(self, request: HttpRequest, form: ModelForm, formsets: Any, change: bool) -> None:  # type: ignore[type-arg]
        group = form.instance
        before = sorted(group.permissions.values_list("codename", flat=True)) if change else None
        with transaction.atomic():
            super().save_related(request, form, formsets, change)
            after = sorted(group.permissions.values_list("codename", flat=True))
            if before != after:
                audit_log(actor=staff_actor(request.user), action="staff.role.changed", target_type="role",
                          target_id=group.name, before={"permissions": before}, after={"permissions": after},
                          reason="Django admin")


admin.site.unregister(User)
admin.site.register(User, AuditedUserAdmin)
admin.site.unregister(Group)
admin.site.register(Group, AuditedGroupAdmin)
