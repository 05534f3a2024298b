"""Signing in and out, and the overview of every season."""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.contrib.staticfiles import finders
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_GET

from leaderboard.metrics.samples import SAMPLED_STATES
from leaderboard.ratelimit import request_address
from seasons.staff.accounts.services import staff_login_attempt_check
from seasons.staff.console import selectors as sel
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


def _overview(request: HttpRequest) -> dict[str, Any]:
    # An unknown ?window= shows the default window: it only chooses what to draw.
    raw = request.GET.get("window", "")
    window = int(raw) if raw.isdigit() and int(raw) in sel.CHART_WINDOWS else sel.DEFAULT_CHART_WINDOW
    return context(
        request, stats=sel.seasons_overview(window_seconds=window), window=window, windows=sel.CHART_WINDOWS,
        window_label=sel.CHART_WINDOWS[window], sample_seconds=settings.METRICS_SAMPLE_SECONDS,
        stale_seconds=3 * settings.METRICS_SAMPLE_SECONDS, sampled_states=[str(s) for s in SAMPLED_STATES],
    )


@require_GET
@staff_required("console_view")
def overview(request: HttpRequest) -> HttpResponse:
    return render(request, "staff/overview.html", _overview(request))


@require_GET
@staff_required("console_view")
def overview_stats(request: HttpRequest) -> HttpResponse:
    """The polled partial of the overview (every 2 s): numbers and charts only."""
    return render(request, "staff/partials/overview_stats.html", _overview(request))


@cache
def _favicon() -> bytes:
    found = finders.find("favicon.ico")
    return Path(str(found)).read_bytes()


@require_GET
@cache_control(public=True, max_age=86_400)
def favicon(request: HttpRequest) -> HttpResponse:
    """The site's icon at /favicon.ico, where browsers ask for it whatever a page links (pages link
    static/favicon.svg)."""
    return HttpResponse(_favicon(), content_type="image/x-icon")
