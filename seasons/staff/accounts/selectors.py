"""Reads of the staff accounts."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import QuerySet

from seasons.staff.accounts.services import ROLES


def staff_users() -> QuerySet[Any]:
    """Accounts that can use the console: members of a role group."""
    return (get_user_model().objects.filter(is_active=True)
            .filter(groups__name__in=ROLES)
            .distinct().order_by("username"))
