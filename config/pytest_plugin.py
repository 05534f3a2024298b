"""A test run is a process start like manage.py's: loaded with `-p config.pytest_plugin`
(pyproject.toml's addopts) while pytest reads its options, before pytest-django sets
Django up, it starts (or joins) the embedded Redis when REDIS_URL is unset, as every
other entry point does (config/embedded_redis.py)."""

from config.embedded_redis import environ_ensure

environ_ensure()
