"""Every API error is {"error": code, "detail": text, ...extra}, never an HTML page.

One path for all of them: a view raises ApiError, or lets a domain refusal (DomainError)
escape, and both front ends (DRF's exception handler here, the fast read path) render it
with `api_error_body`, its status and its headers.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar, cast

from django import db
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler

from leaderboard.core.errors import DomainError
from leaderboard.redis_errors import REDIS_OUTAGES

_View = TypeVar("_View", bound=Callable[..., HttpResponse])


class ApiError(exceptions.APIException):
    def __init__(self, *, status_code: int, code: str, detail: str, extra: dict[str, Any] | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(detail=detail, code=code)
        self.status_code = status_code
        self.error_code = code
        self.extra = extra or {}
        self.headers = headers or {}

    @classmethod
    def of(cls, refusal: DomainError) -> ApiError:
        retry_after = refusal.extra.get("retry_after")
        return cls(status_code=refusal.status, code=refusal.code, detail=refusal.detail, extra=refusal.extra,
                   headers={"Retry-After": str(retry_after)} if retry_after is not None else None)


_CODES = {
    exceptions.ParseError: "malformed_json",
    exceptions.NotAuthenticated: "unauthenticated",
    exceptions.AuthenticationFailed: "unauthenticated",
    exceptions.PermissionDenied: "forbidden",
    exceptions.NotFound: "not_found",
    exceptions.MethodNotAllowed: "method_not_allowed",
    exceptions.UnsupportedMediaType: "unsupported_media_type",
    exceptions.NotAcceptable: "not_acceptable",
    exceptions.Throttled: "throttled",
}
# The project's own words where DRF's default text would leak through.
_DETAILS = {
    exceptions.NotAuthenticated: "an API token is required: send 'Authorization: Bearer <token>'",
}


def api_error_body(exc: ApiError) -> dict[str, Any]:
    return {"error": exc.error_code, "detail": str(exc.detail), **exc.extra}


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DomainError):
        exc = ApiError.of(exc)
    elif isinstance(exc, OUTAGES):
        exc = outage_error(exc)
    if isinstance(exc, ApiError):
        return Response(api_error_body(exc), status=exc.status_code, headers=exc.headers or None)
    response = exception_handler(exc, context)
    if response is None:
        return None
    code = next((c for klass, c in _CODES.items() if isinstance(exc, klass)), "error")
    detail = next((d for klass, d in _DETAILS.items() if isinstance(exc, klass)), None)
    if detail is None:
        detail = str(exc.detail) if isinstance(exc, exceptions.APIException) else str(exc)
    response.data = {"error": code, "detail": detail}
    return response


def api_error_response(exc: ApiError) -> JsonResponse:
    """An ApiError answered by a plain Django view (the probes, unknown API paths)."""
    return JsonResponse(api_error_body(exc), status=exc.status_code, headers=exc.headers or None)


@csrf_exempt  # a POST to a mistyped path is told so, not refused for a CSRF token the API never uses
def api_path_unknown(request: HttpRequest) -> JsonResponse:
    """Any path under /v1/ or /internal/ that names no operation (a typo, or an id with an
    encoded '/' that split it): the API's JSON 404, never Django's HTML page."""
    return api_error_response(ApiError(
        status_code=status.HTTP_404_NOT_FOUND, code="not_found",
        detail=f"no API operation at {request.path!r}: the operations are listed at /api/schema/ "
               "(an id may not contain '/')"))


def api_methods(*methods: str) -> Callable[[_View], _View]:
    """require_http_methods answering the API's JSON 405 (with Allow) instead of an empty
    HTML body: for the plain Django views under the API's rules (the probes)."""
    allowed = sorted({m.upper() for m in methods})

    def decorate(view: _View) -> _View:
        @functools.wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if request.method not in allowed:
                refused = api_error_response(ApiError(
                    status_code=status.HTTP_405_METHOD_NOT_ALLOWED, code="method_not_allowed",
                    detail=f"method {request.method} is not allowed here; allowed: {', '.join(allowed)}"))
                refused["Allow"] = ", ".join(allowed)
                return refused
            return view(request, *args, **kwargs)

        return cast(_View, wrapped)

    return decorate


def validation_error(fields: dict[str, list[str]], *, write: bool = False) -> ApiError:
    """A 400 naming each bad field. `write`: the request would have written, and the
    client may rely on nothing having been written (a read writes nothing anyway)."""
    return ApiError(
        status_code=status.HTTP_400_BAD_REQUEST,
        code="validation_error",
        detail="the request is invalid; nothing was written" if write else "the request is invalid",
        extra={"fields": fields},
    )


log = logging.getLogger(__name__)

# A dependency that does not answer: Redis (redis_errors.REDIS_OUTAGES) or PostgreSQL refused the
# connection or timed out, or the database pool ran dry. The client should come back later; it is not a
# bug, so it is a 503 and never a 500. Other database and Redis errors are bugs and stay 500s.
OUTAGES: tuple[type[Exception], ...] = (*REDIS_OUTAGES, db.OperationalError, db.InterfaceError)
# Long enough not to hammer a dependency that is restarting, short enough to notice it back.
OUTAGE_RETRY_AFTER_SECONDS = 5


def reads_saturated() -> ApiError:
    """The 503 of a read the process does not take on: as many reads as it may hold are
    running or queued (api.fastpath.QUEUED_PER_THREAD), most likely behind a dependency
    that does not answer."""
    return ApiError(status_code=status.HTTP_503_SERVICE_UNAVAILABLE, code="unavailable",
                    detail="too many reads are waiting on this server; retry shortly",
                    extra={"retry_after": 1}, headers={"Retry-After": "1"})


def outage_error(exc: Exception | None) -> ApiError:
    """The 503 for a request that met an outage (one of OUTAGES; None: one met just before,
    not tried again): retry after a few seconds."""
    if exc is not None:
        which = "redis" if isinstance(exc, REDIS_OUTAGES) else "database"
        log.warning("%s unreachable: %s: %s", which, exc.__class__.__name__, exc)
    retry = OUTAGE_RETRY_AFTER_SECONDS
    return ApiError(status_code=status.HTTP_503_SERVICE_UNAVAILABLE, code="unavailable",
                    detail="the leaderboard's storage does not answer right now; retry shortly",
                    extra={"retry_after": retry}, headers={"Retry-After": str(retry)})
