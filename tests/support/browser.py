"""A real server and a real browser for the end-to-end tests (live page, staff console)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection

from tests.support.failure import ROOT
from tests.support.processes import process_stop

CHROMIUM = "/usr/bin/chromium"
# The websocket protocol production's servers run (docs/operations.md, Deploying).
LIVE_WS_PROTOCOL = "leaderboard.live.protocol:LiveWebSocketProtocol"
# Without the background-networking flags Chromium keeps dialling out, and this machine's
# closed network refuses it.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def database_url() -> str:
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    auth = db["USER"] or ""
    if db.get("PASSWORD"):
        auth += f":{db['PASSWORD']}"
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


@contextmanager
def asgi_server(*, ws: str | None = None, **extra_env: str) -> Iterator[str]:
    """uvicorn serving config.asgi:application on the test database and Redis; yields its base URL.

    A subprocess, as in production: pages need websockets, and the server's database
    connections end with it (PostgreSQL refuses to drop a test database still in use).
    `ws`: uvicorn's --ws (production's is LIVE_WS_PROTOCOL); its default otherwise.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "REDIS_KEY_PREFIX": settings.REDIS_KEY_PREFIX,
        "SECRET_KEY": "test-only-not-secret",
        "DEBUG": "false",
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "LOG_LEVEL": "WARNING",
        **extra_env,
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "config.asgi:application", "--fd", str(sock.fileno()),
         "--log-level", "warning", "--lifespan", "off", *(["--ws", ws] if ws else [])],
        cwd=ROOT, env=env, pass_fds=[sock.fileno()],
    )
    sock.close()
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, "uvicorn exited"
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                assert time.monotonic() < deadline, "uvicorn did not start listening"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        process_stop(process)


async def shot(page: Any, name: str) -> None:
    """A full-page PNG of `page` in SCREENSHOT_DIR, when it is set (to look at what a test saw)."""
    folder = os.environ.get("SCREENSHOT_DIR") or os.environ.get("STAFF_SCREENSHOT_DIR")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=True)


async def signed_in(chromium: Any, base: str, username: str, password: str, errors: list[str],
                    viewport: tuple[int, int] = (1400, 1000)) -> Any:
    """A page of a fresh browser context (its own cookies) signed in to the staff console
    as `username`; the page's JavaScript errors go to `errors`."""
    context = await chromium.new_context(viewport={"width": viewport[0], "height": viewport[1]})
    page = await context.new_page()
    page.set_default_timeout(20_000)
    page.on("pageerror", lambda error: errors.append(str(error)))
    await page.goto(f"{base}/staff/")
    assert "/staff/login/" in page.url  # anonymous: sent to the login page
    await page.fill("input[name=username]", username)
    await page.fill("input[name=password]", password)
    await page.click("#login-form button[type=submit]")
    await page.wait_for_selector("#whoami")
    assert (await page.inner_text("#whoami")).strip() == username
    assert page.url == f"{base}/staff/"
    return page
