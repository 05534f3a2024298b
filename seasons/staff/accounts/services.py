"""Staff accounts and roles, and signing in: the role groups and their permissions,
creating an account, the sign-in and sign-out audit rows, the failed sign-in counts and
the sign-in throttle."""

from __future__ import annotations

import logging
import time
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.db import transaction

from audit.services import Actor, audit_log
from leaderboard.ratelimit import rate_take, request_address
from leaderboard.redis_client import redis_get
from leaderboard.redis_errors import REDIS_OUTAGES
from seasons.models import StaffConsole
from seasons.staff.common import StaffError, _text, staff_actor

log = logging.getLogger(__name__)
User = get_user_model()

# Role -> the StaffConsole permissions its group holds. Each role includes the one before:
# an approver can also propose, but never approve their own proposal.
VIEWER = ("console_view",)
REVIEWER = VIEWER + ("disputes_manage", "revocation_propose", "late_results_dismiss", "views_operate",
                     "final_propose", "players_moderate")
APPROVER = REVIEWER + ("revocation_approve", "split_publish", "final_approve", "season_transition")
ROLE_PERMISSIONS: dict[str, tuple[str, ...]] = {"viewer": VIEWER, "reviewer": REVIEWER, "approver": APPROVER}
ROLES = tuple(ROLE_PERMISSIONS)


def perm(codename: str) -> str:
    """The full permission name the views check, e.g. perm("final_approve")."""
    return f"seasons.{codename}"


def staff_roles_ensure() -> dict[str, Group]:
    """Create (or repair) the role groups and their permissions; idempotent."""
    content_type = ContentType.objects.get_for_model(StaffConsole, for_concrete_model=False)
    names = dict(StaffConsole._meta.permissions)
    permissions = {
        codename: Permission.objects.get_or_create(content_type=content_type, codename=codename,
                                                   defaults={"name": names[codename]})[0]
        for codename in names
    }
    groups = {}
    for role, codenames in ROLE_PERMISSIONS.items():
        group, _ = Group.objects.get_or_create(name=role)
        group.permissions.set([permissions[c] for c in codenames])
        groups[role] = group
    return groups


def staff_role_of(user: Any) -> str | None:
    """The highest role the user's groups give. Being a Django superuser gives none: a
    superuser could make a second account, and the two-person rule would count two people."""
    if not getattr(user, "is_authenticated", False):
        return None
    names = set(user.groups.values_list("name", flat=True))
    return next((role for role in reversed(ROLES) if role in names), None)


def staff_user_create(*, username: str, role: str, password: str, actor: Actor) -> tuple[Any, bool]:
    """Create a staff account with one role, or give an existing account that role (and password)."""
    if role not in ROLE_PERMISSIONS:
        raise StaffError(f"role must be one of {', '.join(ROLES)}")
    username = _text(username, field="username", limit=150)
    if not password:
        raise StaffError("a password is required")
    with transaction.atomic():
        groups = staff_roles_ensure()
        # Any: the configured user model; the console needs groups (PermissionsMixin).
        user: Any
        user, created = User.objects.get_or_create(username=username)
        before = None if created else {"role": staff_role_of(user)}
        user.set_password(password)
        user.save()
        user.groups.remove(*[g for name, g in groups.items() if name != role])
        user.groups.add(groups[role])
        audit_log(actor=actor, action="staff.user.created" if created else "staff.user.updated",
                  target_type="user", target_id=str(user.pk), before=before,
                  after={"username": username, "role": role})
    return user, created


def _client_address(request: Any) -> str:
    return request_address(request.META) if request is not None and hasattr(request, "META") else ""


def staff_login_audit(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    """Signal receiver (user_logged_in): one audit row per sign-in."""
    audit_log(actor=staff_actor(user), action="auth.login", target_type="user", target_id=str(user.pk),
              after={"role": staff_role_of(user), "address": _client_address(request)})


def staff_logout_audit(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    if user is None:
        return  # the session had expired: nobody to name
    audit_log(actor=staff_actor(user), action="auth.logout", target_type="user", target_id=str(user.pk))


# Failed sign-ins are counted per hour, address and user name in Redis, kept a week.
LOGIN_FAILURES_KEEP_SECONDS = 7 * 86_400


def login_failures_key(hour: int) -> str:
    return f"{settings.REDIS_KEY_PREFIX}:auth:failed:{hour}"


_COUNTER_UNREACHABLE: tuple[type[Exception], ...] = (*REDIS_OUTAGES, OSError)


def staff_login_failed_count(sender: Any, credentials: dict[str, Any], request: Any = None, **kwargs: Any) -> None:
    """Signal receiver (user_login_failed): counted, not audited.

    Anyone can fail a sign-in, as often as the login throttle lets them: a chained audit
    row each (under the chain's one lock) would let anonymous traffic grow the trail and
    stall every staff action. What is security-relevant, a throttled address or user
    name, is audited once per window (staff_login_attempt_check); successful sign-ins
    are audited. Django has already masked the password; the user name tried is kept.
    """
    username = str(credentials.get("username", ""))[:150]
    address = _client_address(request)
    key = login_failures_key(int(time.time()) // 3600)
    try:
        with redis_get().pipeline(transaction=False) as pipe:
            pipe.hincrby(key, f"{address}|{username}", 1)
            pipe.expire(key, LOGIN_FAILURES_KEEP_SECONDS)
            pipe.execute()
    except _COUNTER_UNREACHABLE:
        log.warning("failed sign-in of %r from %s not counted: Redis unreachable", username, address)


def staff_login_attempt_check(*, address: str, username: str) -> float:
    """One sign-in attempt from `address` for `username`: 0.0 to go ahead, else the seconds
    to wait (LOGIN_RATE_LIMIT, per address and per user name).

    The first refusal of a window is audited (`auth.login.throttled`): someone is guessing
    passwords. Later refusals in the same window are not, so a flood writes one row.
    """
    rate = settings.LOGIN_RATE_LIMIT
    if rate is None:
        return 0.0
    per_second, size = rate
    name = username.strip().lower()[:150]
    waits = {"address": rate_take(kind="login-address", name=address, rate=rate),
             "username": rate_take(kind="login-user", name=name, rate=rate)}
    blocked = {by: wait for by, wait in waits.items() if wait}
    if not blocked:
        return 0.0
    window = (1 / (size / per_second), 1)  # one audit row per bucket's refill time
    for by in blocked:
        if not rate_take(kind="login-throttle-audited", name=f"{by}:{address if by == 'address' else name}",
                         rate=window):
            audit_log(actor=Actor(kind="anonymous", id="", label=username[:150] or "(no username)"),
                      action="auth.login.throttled", target_type="user", target_id=name,
                      after={"address": address, "by": by, "limit": f"{size} per {size / per_second:.0f} s"})
    return max(blocked.values())
