"""Signing in and out, and the overview of every season."""

from __future__ import annotations

import math
from typing import Any

from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from leaderboard.ratelimit import request_address
from seasons import staff_selectors as sel
from seasons.staff_services import staff_login_attempt_check
from seasons.staff_views.common import context, staff_required


class LoginView(auth_views.LoginView):
    template_name = "staff/login.html"
    redirect_authenticated_user = True
    next_page = "staff:overview"  # a URL name: resolve_url resolves it

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        # Throttled before the password is checked, per address and per user name.
        wait = staff_login_attempt_check(address=request_address(request.META),
                                         username=request.POST.get("username", ""))
        if not wait:
            return super().post(request, *args, **kwargs)
        seconds = math.ceil(wait)
        # An unbound form: a bound one would check the password when the page shows its errors.
        context = self.get_context_data(form=self.get_form_class()(request), throttled=seconds)
        response = self.render_to_response(context, status=429)
        response["Retry-After"] = str(seconds)
        return response


class LogoutView(auth_views.LogoutView):
    next_page = "staff:login"


@require_GET
@staff_required("console_view")
def overview(request: HttpRequest) -> HttpResponse:
    return render(request, "staff/overview.html", context(request, stats=sel.seasons_overview()))


@require_GET
@staff_required("console_view")
def overview_stats(request: HttpRequest) -> HttpResponse:
    """The polled partial of the overview (every 2 s): numbers and charts only."""
    return render(request, "staff/partials/overview_stats.html", context(request, stats=sel.seasons_overview()))
