"""Signing in and out, and the overview of every season."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from seasons import staff_selectors as sel
from seasons.staff_views.common import context, staff_required


class LoginView(auth_views.LoginView):
    template_name = "staff/login.html"
    redirect_authenticated_user = True
    next_page = "staff:overview"  # a URL name: resolve_url resolves it


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
