"""Every table a migration made append-only refuses an UPDATE once all migrations ran, on
PostgreSQL and on SQLite alike: SQLite rebuilds a table it alters, dropping its triggers,
so a later migration that alters such a table must install them again."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction
from django.db.migrations.loader import MigrationLoader

from audit.triggers import APPEND_ONLY_TRIGGERS


def installed_triggers() -> dict[str, str]:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT tgname, tgrelid::regclass::text FROM pg_trigger WHERE NOT tgisinternal")
        else:
            cursor.execute("SELECT name, tbl_name FROM sqlite_master WHERE type = 'trigger'")
        return dict(cursor.fetchall())


@pytest.mark.django_db
def test_every_append_only_trigger_the_migrations_install_is_in_place() -> None:
    MigrationLoader(connection)  # imports every migration module, which records its triggers
    assert len(APPEND_ONLY_TRIGGERS) >= 6
    installed = installed_triggers()
    missing = {t: table for t, table in APPEND_ONLY_TRIGGERS.items() if installed.get(t) != table}
    assert not missing, f"append-only triggers missing after the migrations: {missing}"


@pytest.mark.django_db
def test_an_update_of_an_append_only_table_is_refused() -> None:
    MigrationLoader(connection)
    table = APPEND_ONLY_TRIGGERS["score_event_conflict_append_only"]
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        # The trigger fires per row: one row is needed, and refused before it changes.
        cursor.execute(f"INSERT INTO {table} (season_id, event_id, payload_hash, payload, received_at) "
                       "VALUES (1, 'e', 'h', '{}', CURRENT_TIMESTAMP)")
        cursor.execute(f"UPDATE {table} SET payload_hash = 'x'")
