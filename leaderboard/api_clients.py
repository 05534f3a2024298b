"""API clients: the services that call the write API with a bearer token (scopes say what
each may write). Creating one (its token shown once, only its hash stored), deactivating
one (a rotation is a new client, then the old one deactivated), and finding the active
client of a request's token. Writes are one transaction with their audit row."""

from __future__ import annotations

import hashlib
import secrets

from django.db import transaction

from audit.services import Actor, audit_log
from leaderboard.core.errors import DomainError
from leaderboard.models import ApiClient

TOKEN_PREFIX = "lbk_"
# scores:write: the match-results service; disputes:write: a support tool filing disputes;
# profiles:write: the profile service (players' regions); social:write: the social service (friend lists).
KNOWN_SCOPES = frozenset({"scores:write", "disputes:write", "profiles:write", "social:write"})


class ApiClientError(DomainError):
    code = "invalid_api_client"


def api_token_hash(*, token: str) -> str:
    # Tokens are 256-bit random strings, so a fast hash is enough: no dictionary to
    # defend against, and every write request checks one.
    return hashlib.sha256(token.encode()).hexdigest()


def api_client_create(*, name: str, scopes: list[str], actor: Actor) -> tuple[ApiClient, str]:
    """Create a client and return it with its token; the token is never stored or shown again."""
    unknown = set(scopes) - KNOWN_SCOPES
    if unknown:
        raise ApiClientError(f"unknown scope(s): {', '.join(sorted(unknown))}")
    if not scopes:
        raise ApiClientError("at least one scope is required")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        client = ApiClient.objects.create(
            name=name,
            token_prefix=token[:12],
            token_hash=api_token_hash(token=token),
            scopes=sorted(set(scopes)),
        )
        audit_log(
            actor=actor,
            action="api_client.created",
            target_type="api_client",
            target_id=str(client.pk),
            after={"name": name, "scopes": client.scopes, "token_prefix": client.token_prefix},
        )
    return client, token


def api_client_deactivate(*, name: str, actor: Actor, reason: str = "") -> ApiClient:
    """Stop a client's token from authenticating (a rotation's last step, or a leak's first).

    Tokens are never stored, so a deactivated client cannot be brought back: a new client
    with a new token replaces it.
    """
    with transaction.atomic():
        client = ApiClient.objects.select_for_update().filter(name=name).first()
        if client is None:
            raise ApiClientError(f"no API client named {name!r}")
        if not client.active:
            raise ApiClientError(f"API client {name!r} is already deactivated")
        client.active = False
        client.save(update_fields=["active"])
        audit_log(actor=actor, action="api_client.deactivated", target_type="api_client", target_id=str(client.pk),
                  before={"name": client.name, "active": True}, after={"name": client.name, "active": False},
                  reason=reason)
    return client


def api_client_by_token(*, token: str) -> ApiClient | None:
    """The active client whose token this is (None: unknown or deactivated)."""
    return ApiClient.objects.filter(token_hash=api_token_hash(token=token), active=True).first()
