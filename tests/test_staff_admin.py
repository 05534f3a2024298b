"""The Django admin's user and role pages: every change of who holds which role is audited,
and a superuser is not a console role by being a superuser."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client

from audit.models import AuditEntry
from audit.selectors import staff_role_granters
from seasons.staff.accounts.services import staff_roles_ensure

pytestmark = pytest.mark.django_db
pytest_plugins = ["tests.support.staff_fixtures"]
User = get_user_model()


@pytest.fixture
def root(fast_passwords: None) -> Client:
    admin = User.objects.create_superuser("root", password="root-password-1")
    client = Client()
    client.force_login(admin)
    client.user = admin  # type: ignore[attr-defined]
    return client


def _change_form(user: Any, **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "username": user.username, "first_name": "", "last_name": "", "email": "",
        "is_active": "on", "date_joined_0": user.date_joined.strftime("%Y-%m-%d"),
        "date_joined_1": user.date_joined.strftime("%H:%M:%S"), "groups": [], "user_permissions": [],
    }
    data.update(changes)
    return data


def test_a_role_granted_in_the_admin_is_audited_with_who_granted_it(root: Client) -> None:
    staff_roles_ensure()
    created = root.post("/admin/auth/user/add/", {"username": "sock", "password1": "sock-password-1",
                                                  "password2": "sock-password-1", "usable_password": "true"})
    assert created.status_code == 302, created.content[:2000]
    sock = User.objects.get(username="sock")
    approver = Group.objects.get(name="approver")
    changed = root.post(f"/admin/auth/user/{sock.pk}/change/", _change_form(sock, groups=[approver.pk]))
    assert changed.status_code == 302, changed.content[:2000]
    rows = list(AuditEntry.objects.filter(target_type="user", target_id=str(sock.pk)).order_by("seq"))
    assert [r.action for r in rows] == ["staff.user.created", "staff.user.updated"]
    assert rows[1].actor_label == "root" and rows[1].reason == "Django admin"
    assert (rows[1].before or {})["role"] is None and (rows[1].after or {})["role"] == "approver"
    # The two-person rule can tell the superuser made this approver.
    assert staff_role_granters(user_id=sock.pk) == {root.user.pk}  # type: ignore[attr-defined]


def test_changing_a_roles_permissions_in_the_admin_is_audited(root: Client) -> None:
    viewer = staff_roles_ensure()["viewer"]
    perms = list(Group.objects.get(name="approver").permissions.values_list("pk", flat=True))
    response = root.post(f"/admin/auth/group/{viewer.pk}/change/", {"name": "viewer", "permissions": perms})
    assert response.status_code == 302, response.content[:2000]
    row = AuditEntry.objects.get(action="staff.role.changed")
    assert (row.target_id, row.actor_label) == ("viewer", "root")
    assert set((row.after or {})["permissions"]) > set((row.before or {})["permissions"])


def test_a_superuser_is_no_console_role_and_cannot_approve(root: Client) -> None:
    assert root.get("/staff/").status_code == 403
    assert root.post("/staff/revocations/1/approve").status_code == 403
