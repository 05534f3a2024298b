"""The ASGI application: HTTP to Django, websockets to the Channels routes.

Websockets pass an origin check (leaderboard.live.routing.origin_checked): a browser page
on another site cannot open them (the Origin header must name one of ALLOWED_HOSTS; a
client without one is refused). At shutdown the lifespan protocol stops the worker's
live hubs (leaderboard.live.routing.lifespan).
"""

import os
from typing import Any

from django.core.asgi import get_asgi_application

from config.embedded_redis import environ_ensure

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
environ_ensure()

# Django is set up before the consumers (and the models they import) are imported.
django_application = get_asgi_application()

from asgiref.sync import sync_to_async  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.core.exceptions import SuspiciousOperation  # noqa: E402
from django.core.handlers.exception import response_for_exception  # noqa: E402
from django.http import HttpRequest, HttpResponseBase  # noqa: E402

from leaderboard.api.bodylimit import BodyLimit  # noqa: E402
from leaderboard.api.fastpath import ReadFastPath  # noqa: E402
from leaderboard.live.routing import lifespan, origin_checked, websocket_urlpatterns  # noqa: E402


class StaticFiles(ASGIStaticFilesHandler):
    """The public pages' few static files (STATIC_URL), served by the app itself so the
    service needs no other web server; anything else passes through to Django.

    Django's handler answers a path that escapes the static directories ("/static/../x")
    with an unhandled SuspiciousFileOperation, a 500 and a traceback per probe: here it
    is the 400 Django gives any other suspicious request.
    """

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        try:
            return await super().get_response_async(request)
        except SuspiciousOperation as exc:
            return await sync_to_async(response_for_exception)(request, exc)


http_application: Any = StaticFiles(django_application)
if settings.READ_FAST_PATH:
    # The public read URLs answered before Django (leaderboard/api/fastpath.py).
    http_application = ReadFastPath(http_application, threads=settings.READ_THREADS)
# Outermost: a body over the limit is refused before anything reads it (leaderboard/api/bodylimit.py).
http_application = BodyLimit(http_application, limit=settings.SCORES_MAX_BODY_BYTES)

application = ProtocolTypeRouter({
    "http": http_application,
    "websocket": origin_checked(URLRouter(websocket_urlpatterns)),
    "lifespan": lifespan,
})
