import os

from django.core.wsgi import get_wsgi_application

from config.embedded_redis import environ_ensure

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
environ_ensure()

application = get_wsgi_application()
