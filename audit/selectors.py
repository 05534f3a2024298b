"""Reads of the audit trail that other rules depend on."""

from __future__ import annotations

from audit.models import AuditEntry

# The actions that give an account its role: the console's create_staff and the admin pages.
ROLE_GRANTING_ACTIONS = ("staff.user.created", "staff.user.updated")


def staff_role_granters(*, user_id: int) -> frozenset[int]:
    """Every staff member who created this account or set its role, by user id.

    The two-person rule reads it: whoever made an account an approver is not a second
    person for that account's approvals of their own proposals.
    """
    ids = (
        AuditEntry.objects.filter(target_type="user", target_id=str(user_id), action__in=ROLE_GRANTING_ACTIONS,
                                  actor_type="user")
        .values_list("actor_id", flat=True)
    )
    return frozenset(int(i) for i in ids if i.isdigit())
