"""Request bodies over the limit are refused before they are read, for every URL.

Django's ASGI handler reads the whole body (spooled to disk past 2.5 MB) before any view,
authentication or size check runs, so a check in a view comes too late: an anonymous
client could make every process write gigabytes to disk. This middleware sits in front
of everything HTTP (config/asgi.py): a declared Content-Length over the limit is a 413
without reading a byte, and a chunked body is counted as it arrives and refused with a
413 the moment it passes the limit, holding no more than the chunk in hand.

The application behind then sees the client gone (http.disconnect), the way Django
treats an aborted upload; anything it still tries to send is dropped.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

from leaderboard.api.errors import ApiError, api_error_body

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server refuses a malformed length before we see it
    return None


class BodyLimit:
    def __init__(self, app: App, *, limit: int) -> None:
        self.app = app
        self.limit = limit

    def _refusal(self, detail: str) -> list[Message]:
        body = orjson.dumps(api_error_body(ApiError(status_code=413, code="payload_too_large", detail=detail)))
        # connection: close: the client is still sending; the server stops reading it.
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        return [{"type": "http.response.start", "status": 413, "headers": headers},
                {"type": "http.response.body", "body": body}]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _declared_length(scope)
        if declared is not None and declared > self.limit:
            for message in self._refusal(f"the body is {declared} bytes; the limit is {self.limit}"):
                await send(message)
            return

        received = 0
        started = False
        refused = False

        async def limited_receive() -> Message:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    refused = True
                    if not started:
                        for reply in self._refusal(f"the body exceeds {self.limit} bytes"):
                            await send(reply)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if refused:
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, limited_receive, guarded_send)
