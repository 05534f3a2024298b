"""LEDGER_PARTITION_URLS: which ledger partitions of new seasons live in a PostgreSQL database of their own.

"P=URL" or "P-Q=URL" entries, separated by spaces or commas; each distinct URL becomes a
DATABASES alias `ledger_<database name>` with the default database's connection options.
Partitions no entry names live in "default". Parsed once, by the settings: a mistake stops
every process at start, never at a season's first write.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

_POSTGRES = "django.db.backends.postgresql"
_ENTRY = re.compile(r"^(\d+)(?:-(\d+))?=(.+)$")


def ledger_databases_parse(text: str, *, default: Mapping[str, Any], max_partitions: int,
                           ) -> tuple[dict[str, dict[str, Any]], dict[int, str]]:
    """(DATABASES entries to add, {partition: alias}) for LEDGER_PARTITION_URLS = `text`;
    both empty when it is empty."""
    entries = [e for e in re.split(r"[\s,]+", text.strip()) if e]
    if not entries:
        return {}, {}
    if default.get("ENGINE") != _POSTGRES:
        raise ImproperlyConfigured(
            "LEDGER_PARTITION_URLS needs PostgreSQL as the default database (DATABASE_URL): the event-id "
            "claims and the season locks of a ledger split over databases live there")
    databases: dict[str, dict[str, Any]] = {}
    urls: dict[str, str] = {}
    placement: dict[int, str] = {}
    for entry in entries:
        match = _ENTRY.match(entry)
        if match is None:
            raise ImproperlyConfigured(
                f"LEDGER_PARTITION_URLS: {entry!r} is not P=URL or P-Q=URL (e.g. 4-7=postgresql://host/ledger_b)")
        first = int(match.group(1))
        last = first if match.group(2) is None else int(match.group(2))
        url = match.group(3)
        if first > last or last >= max_partitions:
            raise ImproperlyConfigured(
                f"LEDGER_PARTITION_URLS: {entry.partition('=')[0]!r} is not a range of partitions "
                f"within 0..{max_partitions - 1}")
        alias = _alias_add(url=url, default=default, databases=databases, urls=urls)
        for partition in range(first, last + 1):
            if partition in placement:
                raise ImproperlyConfigured(
                    f"LEDGER_PARTITION_URLS: partition {partition} is named twice (ranges overlap)")
            placement[partition] = alias
    return databases, placement


def _alias_add(*, url: str, default: Mapping[str, Any], databases: dict[str, dict[str, Any]],
               urls: dict[str, str]) -> str:
    try:
        parsed: dict[str, Any] = dict(dj_database_url.parse(url))
    except ValueError as exc:
        raise ImproperlyConfigured(f"LEDGER_PARTITION_URLS: {url!r} is not a database URL: {exc}") from exc
    if parsed.get("ENGINE") != _POSTGRES:
        raise ImproperlyConfigured(f"LEDGER_PARTITION_URLS: {url!r} is not a PostgreSQL URL (postgresql://...)")
    name = str(parsed.get("NAME") or "")
    if not name:
        raise ImproperlyConfigured(f"LEDGER_PARTITION_URLS: {url!r} names no database")
    if (name, str(parsed.get("HOST") or ""), str(parsed.get("PORT") or "")) == (
            default.get("NAME"), str(default.get("HOST") or ""), str(default.get("PORT") or "")):
        raise ImproperlyConfigured(
            f"LEDGER_PARTITION_URLS: {url!r} names the default database itself ({name!r}): "
            "a ledger database must be another database")
    alias = f"ledger_{name}"
    if alias in urls:
        if urls[alias] != url:
            raise ImproperlyConfigured(
                f"LEDGER_PARTITION_URLS: two URLs name a database {name!r} ({urls[alias]!r} and {url!r}); "
                "each ledger database needs a name of its own")
        return alias
    urls[alias] = url
    # The default database's connection handling (persistent connections or a pool, health
    # checks): a ledger database serves the same writers.
    databases[alias] = {
        **parsed,
        "CONN_MAX_AGE": default.get("CONN_MAX_AGE", 0),
        "CONN_HEALTH_CHECKS": default.get("CONN_HEALTH_CHECKS", False),
        "OPTIONS": {**default.get("OPTIONS", {}), **parsed.get("OPTIONS", {})},
    }
    return alias
