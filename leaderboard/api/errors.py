"""Every API error is {"error": code, "detail": text, "fields"?: {...}}, never an HTML page."""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler


class ApiError(exceptions.APIException):
    def __init__(self, *, status_code: int, code: str, detail: str, extra: dict[str, Any] | None = None):
        super().__init__(detail=detail, code=code)
        self.status_code = status_code
        self.error_code = code
        self.extra = extra or {}


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


def api_error_body(exc: ApiError) -> dict[str, Any]:
    return {"error": exc.error_code, "detail": str(exc.detail), **exc.extra}


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, ApiError):
        return Response(api_error_body(exc), status=exc.status_code)
    response = exception_handler(exc, context)
    if response is None:
        return None
    code = next((c for klass, c in _CODES.items() if isinstance(exc, klass)), "error")
    detail = exc.detail if isinstance(exc, exceptions.APIException) else str(exc)
    response.data = {"error": code, "detail": str(detail)}
    return response


def validation_error(fields: dict[str, list[str]]) -> ApiError:
    return ApiError(
        status_code=status.HTTP_400_BAD_REQUEST,
        code="validation_error",
        detail="the request is invalid; nothing was written",
        extra={"fields": fields},
    )
