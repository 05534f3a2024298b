"""Bearer-token authentication for machine clients, and scope checks."""

from __future__ import annotations

from typing import Any

from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from leaderboard.api_clients import api_client_by_token
from leaderboard.models import ApiClient


class ClientPrincipal:
    """request.user for a machine client: authenticated, never staff."""

    is_authenticated = True
    is_staff = False

    def __init__(self, client: ApiClient):
        self.client = client


class ApiClientTokenAuthentication(BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[ClientPrincipal, ApiClient] | None:
        header = get_authorization_header(request).split()
        if not header:
            return None
        if header[0].lower() != b"bearer" or len(header) != 2:
            raise AuthenticationFailed("expected 'Authorization: Bearer <token>'")
        try:
            token = header[1].decode("ascii")
        except UnicodeDecodeError as exc:
            raise AuthenticationFailed("malformed token") from exc
        client = api_client_by_token(token=token)
        if client is None:
            raise AuthenticationFailed("unknown or revoked token")
        return ClientPrincipal(client), client

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="leaderboard"'


def scope_required(scope: str) -> type[BasePermission]:
    class HasScope(BasePermission):
        message = f"this token lacks the '{scope}' scope"

        def has_permission(self, request: Request, view: Any) -> bool:
            client = request.auth
            if client is None:
                return False
            return isinstance(client, ApiClient) and client.has_scope(scope)

    return HasScope
