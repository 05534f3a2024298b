"""A request body over the limit is refused before it is read, on every URL, authenticated
or not: a declared Content-Length at once, a chunked body as soon as the bytes received
pass the limit. Through the real server (uvicorn and config.asgi), raw sockets."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings

from leaderboard.api_clients import api_client_create
from tests.support import TEST_ACTOR, browser

pytestmark = pytest.mark.django_db(transaction=True)

LIMIT = settings.SCORES_MAX_BODY_BYTES
URLS = ["/internal/v1/seasons/s1/scores:apply", "/staff/login/", "/v1/seasons/s1/leaderboard/top", "/nowhere"]


@pytest.fixture
def server() -> Iterator[tuple[str, int]]:
    with browser.asgi_server() as base:
        host, port = base.removeprefix("http://").split(":")
        yield host, int(port)


def _response(sock: socket.socket, timeout: float = 20.0) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of one response read from `sock`."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed without answering: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    while len(body) < int(headers.get("content-length", "0")):
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), headers, body


def _head(method: str, path: str, port: int, extra: str) -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"{extra}\r\n").encode()


@pytest.mark.parametrize("path", URLS)
def test_a_declared_length_over_the_limit_is_413_before_a_byte_is_sent(server: tuple[str, int], path: str) -> None:
    host, port = server
    with socket.create_connection((host, port)) as sock:
        sock.sendall(_head("POST", path, port, "Content-Length: 10000000000\r\n"))
        status, headers, body = _response(sock)
    assert status == 413, body
    assert json.loads(body)["error"] == "payload_too_large"
    assert headers["connection"] == "close"


@pytest.mark.parametrize("path", ["/internal/v1/seasons/s1/scores:apply", "/staff/login/"])
def test_a_chunked_body_is_refused_as_soon_as_it_passes_the_limit(server: tuple[str, int], path: str) -> None:
    host, port = server
    total = 40 * LIMIT  # never sent in full: the answer comes long before
    chunk = b"x" * 65536
    frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    sent = 0
    answered = threading.Event()
    sent_when_answered: list[int] = []

    def feed(sock: socket.socket) -> None:
        nonlocal sent
        try:
            while sent < total and not answered.is_set():
                sock.sendall(frame)
                sent += len(chunk)
        except OSError:
            pass  # the server closed the connection: what we expect

    with socket.create_connection((host, port)) as sock:
        sock.sendall(_head("POST", path, port, "Transfer-Encoding: chunked\r\n"))
        feeder = threading.Thread(target=feed, args=(sock,), daemon=True)
        started = time.monotonic()
        feeder.start()
        status, _headers, body = _response(sock)
        sent_when_answered.append(sent)
        answered.set()
        feeder.join(timeout=20)
    assert status == 413, body
    assert json.loads(body)["error"] == "payload_too_large"
    # Socket buffers hold a few MB in flight; the server never waited for the whole body.
    assert sent_when_answered[0] < 6 * LIMIT, (sent_when_answered, time.monotonic() - started)


def test_a_body_within_the_limit_sent_in_parts_still_reaches_the_view(server: tuple[str, int], season: Any) -> None:
    host, port = server
    _client, token = api_client_create(name="match-service", scopes=["scores:write"], actor=TEST_ACTOR)
    event = {"event_id": "e1", "match_id": "m1", "player_id": "p1", "best_score": 10, "score_version": 1,
             "completed_at": "2026-11-15T12:00:00Z"}
    payload = json.dumps(event).encode()
    with socket.create_connection((host, port)) as sock:
        sock.sendall(_head("POST", f"/internal/v1/seasons/{season.slug}/scores:apply", port,
                           f"Authorization: Bearer {token}\r\nContent-Length: {len(payload)}\r\n"))
        for part in (payload[:20], payload[20:]):
            time.sleep(0.05)
            sock.sendall(part)
        status, _headers, body = _response(sock)
    assert status == 200, body
    assert json.loads(body)["results"][0]["status"] == "applied"
