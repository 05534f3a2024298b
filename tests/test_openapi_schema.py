"""The OpenAPI schema (/api/schema/) and its browsable page (/api/docs/).

.ci/fuzz holds the running server to this schema; these tests keep the schema itself whole:
it generates without a warning, names every API URL, and its page needs no CDN.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib.staticfiles import finders
from django.core.management import call_command
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.views import APIView

from leaderboard.api import health

PROBES = {health.healthz, health.readyz, health.metrics}
_CONVERTER = re.compile(r"<(?:\w+:)?(\w+)>")


def _routes(patterns: list[Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for entry in patterns:
        route = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            out += _routes(entry.url_patterns, route)
        elif isinstance(entry, URLPattern):
            out.append(("/" + _CONVERTER.sub(r"{\1}", route), entry.callback))
    return out


def _api_operations() -> set[tuple[str, str]]:
    """(path, method) of every DRF view and probe the URLconf routes, the schema's own views aside."""
    operations: set[tuple[str, str]] = set()
    for path, callback in _routes(get_resolver().url_patterns):
        view = getattr(callback, "cls", None)
        if view is not None and issubclass(view, APIView) and not view.__module__.startswith("drf_spectacular"):
            operations |= {(path, method) for method in ("get", "post", "put", "patch", "delete")
                           if hasattr(view, method)}
        elif callback in PROBES:
            operations.add((path, "get"))
    return operations


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    response = Client().get("/api/schema/?format=json")
    assert response.status_code == 200
    body: dict[str, Any] = response.json()
    return body


def test_schema_generates_and_validates_with_no_warning(tmp_path: Path) -> None:
    # --fail-on-warn turns any warning of the generator (a view it cannot describe, a
    # serializer it has to guess) into an error; --validate checks the OpenAPI 3 document.
    out = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(out))
    assert out.read_text().startswith("openapi: 3.")


def test_schema_is_yaml_by_default_and_json_on_request() -> None:
    response = Client().get("/api/schema/")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/vnd.oai.openapi")
    assert response.content.startswith(b"openapi: 3.")
    response = Client().get("/api/schema/?format=json")
    assert response["Content-Type"].startswith("application/vnd.oai.openapi+json")


def test_schema_lists_every_api_url_and_method(schema: dict[str, Any]) -> None:
    expected = _api_operations()
    listed = {(path, method) for path, item in schema["paths"].items() for method in item}
    assert ("/internal/v1/seasons/{season_id}/scores:apply", "post") in expected  # the walk finds the API
    assert ("/healthz", "get") in expected
    assert expected == listed


def test_every_operation_documents_its_error_bodies(schema: dict[str, Any]) -> None:
    for path, item in schema["paths"].items():
        if path in ("/healthz", "/readyz", "/metrics"):
            continue
        for method, operation in item.items():
            responses = operation["responses"]
            assert "400" in responses, (method, path)
            # A URL naming a season may name none; the player writes (profiles, friend lists)
            # name no season and create what they name, so they have no 404.
            if "{season_id}" in path:
                assert "404" in responses, (method, path)
            if path.startswith("/internal/"):
                assert {"401", "403", "413", "503"} <= responses.keys(), (method, path)
                assert operation["security"] == [{"bearerToken": []}], (method, path)
            for status, response in responses.items():
                if status.startswith(("4", "5")):
                    ref = response["content"]["application/json"]["schema"]["$ref"]
                    component = schema["components"]["schemas"][ref.rsplit("/", 1)[1]]
                    assert {"error", "detail"} <= set(component["required"]), (method, path, status)
    reads = schema["paths"]["/v1/seasons/{season_id}/players/{player_id}/rank"]["get"]["responses"]
    assert {"410", "503"} <= reads.keys()


def _body(schema: dict[str, Any], operation: dict[str, Any], status: str) -> dict[str, Any]:
    ref = operation["responses"][status]["content"]["application/json"]["schema"]["$ref"]
    component: dict[str, Any] = schema["components"]["schemas"][ref.rsplit("/", 1)[1]]
    return component


def test_each_read_of_a_board_has_its_regional_twin(schema: dict[str, Any]) -> None:
    """Same query parameters and body as the global read, plus the region (path and body),
    and the 404 names unknown_region; the global rank names the player's region."""
    for tail in ("/leaderboard/top", "/leaderboard", "/players/{player_id}/rank", "/players/{player_id}/neighbors"):
        plain = schema["paths"][f"/v1/seasons/{{season_id}}{tail}"]["get"]
        regional = schema["paths"][f"/v1/seasons/{{season_id}}/regions/{{region}}{tail}"]["get"]
        names = {(p["in"], p["name"]) for p in regional["parameters"]}
        assert names == {(p["in"], p["name"]) for p in plain["parameters"]} | {("path", "region")}, tail
        (region,) = [p for p in regional["parameters"] if p["name"] == "region"]
        assert region["schema"]["pattern"] == "^[a-z0-9-]{1,16}$"
        assert "unknown_region" in regional["responses"]["404"]["description"]
        assert regional["responses"].keys() == plain["responses"].keys()
        body, plain_body = _body(schema, regional, "200"), _body(schema, plain, "200")
        assert "region" in body["required"]
        assert set(body["properties"]) == set(plain_body["properties"]) | {"region"}, tail
    rank = _body(schema, schema["paths"]["/v1/seasons/{season_id}/players/{player_id}/rank"]["get"], "200")
    assert "region" in rank["required"] and rank["properties"]["region"]["nullable"] is True


def test_docs_page_loads_its_assets_locally() -> None:
    response = Client().get("/api/docs/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "swagger-ui" in html.lower()
    assert not re.search(r"""https?://""", html), "the docs page must not load anything from another site"
    assets = re.findall(r"""(?:src|href)=["']/static/([^"']+)["']""", html)
    assert any(asset.endswith("swagger-ui-bundle.js") for asset in assets)
    for asset in assets:
        assert finders.find(asset) is not None, f"{asset} is not among the static files"
