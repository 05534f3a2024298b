"""Fixtures of the staff console tests, loaded by `pytest_plugins = ["tests.support.staff_fixtures"]`
(a plugin module, so pytest rewrites its asserts; nothing imports it directly)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from seasons.staff.accounts.services import staff_user_create
from tests.support import TEST_ACTOR
from tests.support.staff_console import PASSWORD

_names = itertools.count(1)


@pytest.fixture
def fast_passwords(settings: Any) -> None:
    # PBKDF2 at Django's default cost is ~0.5 s per hash; these tests make dozens of accounts.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def make_staff(db: Any, fast_passwords: None) -> Callable[..., Any]:
    def make(role: str, username: str | None = None) -> Any:
        user, _ = staff_user_create(username=username or f"{role}-{next(_names)}", role=role, password=PASSWORD,
                                    actor=TEST_ACTOR)
        return user

    return make


@pytest.fixture
def client_as(make_staff: Callable[..., Any]) -> Callable[..., Client]:
    """A test client signed in as a new account of `role` (the user is on client.user)."""

    def make(role: str, username: str | None = None) -> Client:
        user = make_staff(role, username)
        client = Client()
        client.force_login(user)
        client.user = user  # type: ignore[attr-defined]
        return client

    return make
