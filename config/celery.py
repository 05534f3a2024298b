import os

from celery import Celery

from config.embedded_redis import environ_ensure

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("leaderboard")
# Every process imports this app with the `config` package, so it starts nothing then: the
# embedded Redis (REDIS_URL unset) is started when the app is first configured, which a
# worker or beat does before it reads the settings, and a web process after its own entry
# point has already set REDIS_URL.
app.on_configure.connect(lambda sender, **kwargs: environ_ensure(), weak=False)
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
