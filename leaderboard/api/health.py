from __future__ import annotations

import hmac
import ipaddress

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from leaderboard.api.errors import ApiError, api_error_response, api_methods
from leaderboard.metrics.render import metrics_render
from leaderboard.redis_client import redis_get


# The probes answer GET and HEAD; any other method is the API's JSON 405 with Allow
# (CSRF-exempt: they change nothing, and the CSRF check would answer an unknown method 403).
@csrf_exempt
@api_methods("GET", "HEAD")
def healthz(request: HttpRequest) -> JsonResponse:
    """The process is up; says nothing of its dependencies."""
    return JsonResponse({"status": "ok"})


def operator_request(request: HttpRequest) -> bool:
    """Whether the client may see the service's internals (metrics, readiness details).

    With METRICS_TOKEN set, only the token counts: behind a proxy on the same host every
    client arrives from loopback. Unset, a loopback client qualifies unless a proxy
    forwarded its request.
    """
    token = settings.METRICS_TOKEN
    if token:
        scheme, _, sent = request.headers.get("Authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(sent.strip().encode(), token.encode())
    if "HTTP_X_FORWARDED_FOR" in request.META or "HTTP_FORWARDED" in request.META:
        return False
    try:
        return ipaddress.ip_address(request.META.get("REMOTE_ADDR") or "").is_loopback
    except ValueError:
        return False


@csrf_exempt
@api_methods("GET", "HEAD")
def readyz(request: HttpRequest) -> JsonResponse:
    """Ready to serve: the database and Redis both answer (503 otherwise).

    The public gets the status alone; an operator (operator_request) also gets which
    dependency failed and how.
    """
    checks: dict[str, str] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:  # noqa: BLE001 - any failure means not ready
        checks["database"] = f"error: {exc.__class__.__name__}"
    try:
        redis_get().ping()
        checks["redis"] = "ok"
    except Exception as exc:  # noqa: BLE001
        checks["redis"] = f"error: {exc.__class__.__name__}"
    ready = all(value == "ok" for value in checks.values())
    body: dict[str, object] = {"status": "ok" if ready else "unavailable"}
    if operator_request(request):
        body["checks"] = checks
    return JsonResponse(body, status=200 if ready else 503)


@csrf_exempt
@api_methods("GET", "HEAD")
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus text exposition, for operators only: it names every season."""
    if not operator_request(request):
        refused = ApiError(status_code=403, code="forbidden",
                           detail="metrics need the bearer token set in METRICS_TOKEN (or, when none is set, "
                                  "a request from this host)")
        return api_error_response(refused)
    return HttpResponse(metrics_render(), content_type="text/plain; version=0.0.4; charset=utf-8")
