"""What every console view shares: the one permission decorator and the one action helper.

Every view checks a StaffConsole permission through `staff_required` (the roles are groups
of them); every action is a POST (CSRF-checked by the middleware) that goes through `act`:
validate the form, call one service, report the outcome as a message, redirect
(POST/redirect/GET), or show the form again with its errors on a form page.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.models import PermissionsMixin
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import redirect, render
from django.urls import reverse_lazy
from django.views.decorators.http import require_http_methods

from leaderboard.core.errors import DomainError
from leaderboard.ledger_databases import LedgerDatabaseMissing
from seasons.models import StaffConsole
from seasons.staff.accounts.services import ROLE_PERMISSIONS, staff_role_of

View = Callable[..., HttpResponseBase]
LOGIN_URL = reverse_lazy("staff:login")
# What a refused action reports to the staff member: any refusal of the domain (anything
# else is a bug: a 500).
REFUSALS = DomainError
# A page that is also its form's action.
GET_OR_POST = require_http_methods(["GET", "POST"])


def staff_required(codename: str, *, post: str | None = None) -> Callable[[View], View]:
    """Anonymous: to the login page (coming back afterwards). Signed in without the permission: 403.

    `post` names the permission a POST needs instead, for a page that is also the form of
    an action only some roles may take (the season's rebuilds, its reconciliation runs).
    """

    def decorator(view: View) -> View:
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path(), str(LOGIN_URL))
            needed = post if post is not None and request.method == "POST" else codename
            if not can(request, needed):
                return forbidden(request, needed)
            try:
                return view(request, *args, **kwargs)
            except LedgerDatabaseMissing as exc:
                return unavailable(request, exc)

        return wrapper

    return decorator


def forbidden(request: HttpRequest, needed: str) -> HttpResponse:
    """403, naming the user's role, what they tried in words, and the roles that may."""
    what = dict(StaffConsole._meta.permissions).get(needed, needed)
    roles = [role for role, granted in ROLE_PERMISSIONS.items() if needed in granted]
    return render(request, "staff/forbidden.html",
                  context(request, needed=needed, what=what.removeprefix("Can ").rstrip("."), roles=roles),
                  status=403)


def unavailable(request: HttpRequest, refusal: LedgerDatabaseMissing) -> HttpResponse:
    """A page reading a season's ledger in a database this server has no settings for:
    503 with the reason, as the API answers (a deployment fault, not the staff member's)."""
    response = render(request, "staff/unavailable.html", context(request, reason=refusal.detail,
                                                                  database=refusal.extra.get("database", "")),
                      status=refusal.status)
    response["Retry-After"] = str(refusal.extra.get("retry_after", 60))
    return response


def can(request: HttpRequest, codename: str) -> bool:
    """Whether the user's role grants the permission. Only the role counts: a Django
    superuser is not an approver (has_perm would say yes to everything, and one person
    with two such accounts would pass the two-person rule)."""
    user = request.user
    return isinstance(user, PermissionsMixin) and codename in ROLE_PERMISSIONS.get(staff_role_of(user) or "", ())


@dataclass(frozen=True, slots=True)
class Done:
    """An action's outcome when a plain success message back on the same page is not it."""

    message: str
    # Where to go next (default: back where the action was taken).
    then: str | None = None
    # messages.WARNING: the service ran but did not do what was asked (the page offers a retry).
    level: int = messages.SUCCESS


Action = Callable[[dict[str, Any]], str | Done]


def act(request: HttpRequest, form: forms.Form, action: Action, *, back: str,
        page: Callable[[], HttpResponse] | None = None) -> HttpResponse:
    """Validate, run one service, report its outcome, redirect (PRG).

    Without `page` an invalid form or a refusal is a message on the page `back` leads to.
    With `page` (a form page: GET shows the form, POST runs the action) they are shown on
    the form itself, which is rendered again as typed.
    """
    if not form.is_valid():
        if page is not None:
            return page()
        problems = "; ".join(f"{name}: {' '.join(str(e) for e in errors)}" for name, errors in form.errors.items())
        messages.error(request, f"Nothing was done: {problems}")
        return redirect(back)
    try:
        outcome = action(form.cleaned_data)
    except REFUSALS as exc:
        if page is not None:
            form.add_error(None, str(exc))
            return page()
        messages.error(request, str(exc))
        return redirect(back)
    done = outcome if isinstance(outcome, Done) else Done(outcome)
    messages.add_message(request, done.level, done.message)
    return redirect(done.then or back)


def context(request: HttpRequest, **extra: Any) -> dict[str, Any]:
    role = staff_role_of(request.user)
    # `perms` as the role grants them (see `can`), so a page offers only what its user may do.
    granted = dict.fromkeys(ROLE_PERMISSIONS.get(role or "", ()), True)
    return {"role": role, "perms": {"seasons": granted}, **extra}
