from __future__ import annotations

from functools import lru_cache

import redis
from django.conf import settings


@lru_cache(maxsize=1)
def redis_get() -> redis.Redis:
    return redis.Redis.from_url(
        settings.REDIS_URL, socket_timeout=5.0, socket_connect_timeout=2.0, health_check_interval=30
    )
