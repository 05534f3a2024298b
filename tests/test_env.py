"""The settings' environment readers (config/env.py) and what importing the settings does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from config.env import ConfigError, env_float
from tests.support.demo import fresh_env

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN", "Infinity"])
def test_env_float_refuses_values_that_are_not_finite(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LB_TEST_FLOAT", value)
    with pytest.raises(ConfigError, match="finite"):
        env_float("LB_TEST_FLOAT", 1.0, minimum=0.1)


def test_env_float_reads_a_number_and_checks_its_minimum(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LB_TEST_FLOAT", "0.25")
    assert env_float("LB_TEST_FLOAT", 1.0, minimum=0.1) == 0.25
    monkeypatch.setenv("LB_TEST_FLOAT", "0.05")
    with pytest.raises(ConfigError, match=">= 0.1"):
        env_float("LB_TEST_FLOAT", 1.0, minimum=0.1)


def test_importing_the_settings_starts_no_redis(tmp_path: Path) -> None:
    """Without REDIS_URL the settings refuse with a reason; the entry points (manage.py,
    the ASGI, WSGI and Celery apps, the test run) start the embedded Redis, not an import."""
    run = subprocess.run([sys.executable, "-c", "import config.settings"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, env=fresh_env(tmp_path, SECRET_KEY="x"))
    assert run.returncode != 0
    assert "REDIS_URL is unset" in run.stderr
    assert not (tmp_path / "redis").exists(), "importing the settings started the embedded Redis"
