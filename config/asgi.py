"""The ASGI application: HTTP to Django, websockets to the Channels routes.

Websockets pass AllowedHostsOriginValidator: a browser page on another site cannot open
them (the Origin header must name one of ALLOWED_HOSTS; a client without one is refused).
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

# Django is set up before the consumers (and the models they import) are imported.
django_application = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from leaderboard.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter({
    # The public pages' few static files (STATIC_URL) are served by the app itself, so the
    # service needs no other web server; anything else passes through to Django.
    "http": ASGIStaticFilesHandler(django_application),
    "websocket": AllowedHostsOriginValidator(URLRouter(websocket_urlpatterns)),
})
