"""The site's icon: /favicon.ico answers (browsers ask for it on every site) and the console links one."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

pytest_plugins = ["tests.support.staff_fixtures"]


@pytest.mark.django_db
def test_favicon_ico_is_served_and_the_console_pages_link_an_icon(client_as: Any) -> None:
    response = Client().get("/favicon.ico")
    assert response.status_code == 200
    assert response["Content-Type"] == "image/x-icon" and "max-age=86400" in response["Cache-Control"]
    assert response.content[:4] == b"\x00\x00\x01\x00"  # an ICO file
    login = Client().get("/staff/login/").content.decode()
    assert '<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">' in login
    assert '<link rel="icon"' in client_as("viewer").get("/staff/").content.decode()
