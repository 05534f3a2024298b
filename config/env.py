"""Small typed readers for environment variables: the only place settings touch os.environ."""

from __future__ import annotations

import contextlib
import math
import os
import secrets
from pathlib import Path


class ConfigError(RuntimeError):
    pass


def var_dir() -> Path:
    """VAR_DIR: where the embedded defaults keep their files (SQLite, the embedded Redis,
    a developer's secret key); `var/` beside manage.py unless set."""
    path = Path(env_str("VAR_DIR") or Path(__file__).resolve().parent.parent / "var")
    path.mkdir(parents=True, exist_ok=True)
    return path


def env_str(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value


def env_bool(name: str, default: bool) -> bool:
    value = env_str(name)
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ConfigError(f"{name} must be a boolean (true/false), got {value!r}")


def env_int(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    value = env_str(name)
    if value is None:
        return default
    try:
        parsed = int(value)
    except ValueError as exc:
        raise ConfigError(f"{name} must be an integer, got {value!r}") from exc
    if minimum is not None and parsed < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {parsed}")
    if maximum is not None and parsed > maximum:
        raise ConfigError(f"{name} must be <= {maximum}, got {parsed}")
    return parsed


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    value = env_str(name)
    if value is None:
        return default
    try:
        parsed = float(value)
    except ValueError as exc:
        raise ConfigError(f"{name} must be a number, got {value!r}") from exc
    if not math.isfinite(parsed):
        # float() accepts "nan" and "inf": a timeout of inf waits for ever, and nan
        # passes every `minimum` comparison.
        raise ConfigError(f"{name} must be a finite number, got {value!r}")
    if minimum is not None and parsed < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {parsed}")
    return parsed


def env_list(name: str, default: list[str]) -> list[str]:
    value = env_str(name)
    if value is None:
        return default
    return [item.strip() for item in value.split(",") if item.strip()]


def env_urls(name: str, default: list[str], *, schemes: tuple[str, ...]) -> list[str]:
    """One URL or several, comma-separated, each with one of `schemes` (a server's address,
    e.g. redis://host:6379/0): a typo fails at start, not at the first message."""
    urls = env_list(name, default)
    if not urls:
        raise ConfigError(f"{name} must name at least one server")
    for url in urls:
        scheme = url.partition("://")[0].lower() if "://" in url else ""
        if scheme not in schemes:
            raise ConfigError(f"{name} must be a {'/'.join(schemes)} URL, got {url!r}")
    return urls


def env_url(name: str, default: str, *, schemes: tuple[str, ...]) -> str:
    """One server's URL with one of `schemes`."""
    urls = env_urls(name, [default], schemes=schemes)
    if len(urls) != 1:
        raise ConfigError(f"{name} must name one server, got {len(urls)}")
    return urls[0]


def dev_secret_key(var_dir: Path) -> str:
    """A development key, generated on first use and kept (mode 0600) under var_dir."""
    path = var_dir / "secret_key"
    if not path.exists():
        # Written aside and linked into place: a concurrent first start never reads a
        # half-written key, and the first link wins.
        tmp = var_dir / f".secret_key.{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(50))
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
        tmp.unlink()
    return path.read_text().strip()


_RATE_PERIODS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def env_rate(name: str, default: str) -> tuple[float, int] | None:
    """A rate limit "COUNT/PERIOD[:BURST]" (PERIOD s, m or h), e.g. "100/s:200" or "10/m":
    (tokens per second, bucket size; the burst defaults to COUNT). "off" is no limit."""
    text = (env_str(name, default) or default).strip().lower()
    if text in {"off", "0", "none", "false"}:
        return None
    rate, _, burst = text.partition(":")
    count, _, period = rate.partition("/")
    try:
        tokens, seconds = int(count), _RATE_PERIODS[period.strip()]
        size = int(burst) if burst else tokens
    except (ValueError, KeyError) as exc:
        raise ConfigError(f"{name} must look like 100/s, 10/m:20 or off, got {text!r}") from exc
    if tokens < 1 or size < 1:
        raise ConfigError(f"{name} must allow at least 1 request, got {text!r}")
    return tokens / seconds, size
