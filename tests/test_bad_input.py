"""Bad input is a clear 4xx, never a 500: ids outside the id rule (1..64 characters from
[A-Za-z0-9_.:-]) are 404 on every read and on the live socket's handshake (close 4404)
and 400 on writes; they never reach PostgreSQL (which refuses a NUL) or a Redis key.
Date-times outside 1970..9999 and split points that are no number (nan, inf) are refused
naming the field."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from channels.testing.websocket import WebsocketCommunicator
from django.test import Client
from rest_framework.test import APIClient

from config.asgi import application
from leaderboard.api_clients import api_client_create
from leaderboard.core.buckets import BucketLayout, LayoutError
from leaderboard.core.splits import split_points_valid
from leaderboard.models import RebuildJob, ScoreEvent
from seasons.models import Season
from tests.support import TEST_ACTOR, fast_get, live_run
from tests.support.staff_console import follow_messages

# The staff fixtures (make_staff, client_as, fast_passwords).
pytest_plugins = ["tests.support.staff_fixtures"]

pytestmark = pytest.mark.django_db

Post = Callable[..., Any]
# A NUL, a slash-free 65-character id, a non-ASCII one, a space, a brace (a Redis Cluster hash tag).
BAD_IDS = ["%00", "x" * 65, "caf%C3%A9", "a%20b", "%7Bs1%7D"]
READ_URLS = [
    "/v1/seasons/{s}/leaderboard/top",
    "/v1/seasons/{s}/leaderboard",
    "/v1/seasons/{s}/players/p1/rank",
    "/v1/seasons/{s}/players/p1/neighbors",
    "/v1/seasons/{s}/final",
    "/v1/seasons/{s}/final/standings",
    "/v1/seasons/{s}/final/players/p1",
    "/v1/seasons/{s}/final/corrections",
]
PLAYER_URLS = [
    "/v1/seasons/s1/players/{p}/rank",
    "/v1/seasons/s1/players/{p}/neighbors",
    "/v1/seasons/s1/final/players/{p}",
]


@pytest.mark.parametrize("bad", BAD_IDS)
def test_a_season_id_outside_the_rule_is_404_on_every_read(client: APIClient, season: Season, bad: str) -> None:
    for template in READ_URLS:
        response = client.get(template.format(s=bad))
        assert response.status_code == 404, (template, bad, response.content[:200])
        assert response.json()["error"] == "season_not_found", template


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("bad", BAD_IDS)
def test_a_season_id_outside_the_rule_is_404_on_the_fast_read_path(season: Season, bad: str) -> None:
    for template in READ_URLS[:4]:
        response = fast_get(template.format(s=bad))
        assert response.status_code == 404, (template, bad, response.content[:200])
        assert response.json()["error"] == "season_not_found", template


@pytest.mark.parametrize("bad", BAD_IDS)
def test_a_player_id_outside_the_rule_is_404_on_reads(client: APIClient, season: Season, bad: str) -> None:
    for template in PLAYER_URLS:
        response = client.get(template.format(p=bad))
        assert response.status_code == 404, (template, bad, response.content[:200])
        assert response.json()["error"] == "player_not_found", template


@pytest.mark.parametrize("bad", BAD_IDS)
def test_the_live_page_of_a_season_id_outside_the_rule_is_404(season: Season, bad: str) -> None:
    assert Client().get(f"/seasons/{bad}/live").status_code == 404


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("bad", ["%00", "x" * 65, "a%20b"])
def test_the_live_socket_of_a_season_id_outside_the_rule_closes_4404(season: Season, bad: str) -> None:
    async def body() -> None:
        comm = WebsocketCommunicator(application, f"/ws/v1/seasons/{bad}/live",
                                     headers=[(b"origin", b"http://testserver"), (b"host", b"testserver")])
        connected, _ = await comm.connect(timeout=10)
        assert connected
        message = await comm.receive_json_from(timeout=10)
        assert message["error"] == "unknown_season"
        close = await comm.receive_output(timeout=10)
        assert close["type"] == "websocket.close" and close["code"] == 4404
        await comm.disconnect()

    live_run(body)


@pytest.mark.parametrize("bad", BAD_IDS)
def test_a_season_id_outside_the_rule_is_400_on_writes(api: APIClient, event_factory: Callable[..., Any],
                                                       bad: str) -> None:
    response = api.post(f"/internal/v1/seasons/{bad}/scores:apply", event_factory(), format="json")
    assert response.status_code == 400, response.content[:200]
    assert "season_id" in response.json()["fields"]


@pytest.mark.parametrize("bad", BAD_IDS)
def test_a_season_id_outside_the_rule_is_400_when_filing_a_dispute(bad: str) -> None:
    _row, token = api_client_create(name="support", scopes=["disputes:write"], actor=TEST_ACTOR)
    support = APIClient()
    support.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    response = support.post(f"/internal/v1/seasons/{bad}/disputes", {"player_id": "p1", "summary": "x"},
                            format="json")
    assert response.status_code == 400, response.content[:200]
    assert "season_id" in response.json()["fields"]


# --- date-times and split points ---------------------------------------------------------


@pytest.mark.parametrize("completed_at", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00",
                                          "1969-12-31T23:59:59Z"])
def test_a_date_outside_1970_to_9999_is_400_naming_the_field(season: Season, post_scores: Post,
                                                             event_factory: Callable[..., Any],
                                                             completed_at: str) -> None:
    response = post_scores(season.slug, {"events": [event_factory(), event_factory(completed_at=completed_at)]})
    assert response.status_code == 400, response.content[:200]
    assert list(response.json()["fields"]) == ["events[1].completed_at"]
    assert not ScoreEvent.objects.exists()


@pytest.mark.parametrize("point", ["nan", "inf", "-inf", "1e999", float("nan"), float("inf")])
def test_a_split_point_that_is_no_finite_number_is_refused(point: object) -> None:
    with pytest.raises(LayoutError, match="is not a score"):
        split_points_valid(BucketLayout.uniform(), [point])


@pytest.mark.usefixtures("redis_flushed")
@pytest.mark.parametrize("points", ["nan", "inf", "150, 1e999"])
def test_the_staff_split_form_refuses_nan_and_inf_with_a_message(season: Season, client_as: Any,
                                                                 points: str) -> None:
    reviewer = client_as("reviewer")
    response = reviewer.post(f"/staff/seasons/{season.slug}/splits", {"split_points": points, "reason": "hot"})
    assert "is not a score" in follow_messages(reviewer, response)[-1]
    assert not RebuildJob.objects.exists()
