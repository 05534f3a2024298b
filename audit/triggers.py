"""Database triggers that make a table append-only (used by migrations).

PostgreSQL refuses UPDATE and DELETE; SQLite refuses UPDATE only, so its test runner can
still flush tables with DELETE (PostgreSQL flushes with TRUNCATE, which row triggers
don't see).
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

# trigger -> table, for every append-only table the migrations set up (filled as the
# migration modules are imported): what tests/test_append_only_tables.py checks is in place.
APPEND_ONLY_TRIGGERS: dict[str, str] = {}


def refuse_changes(*, table: str, trigger: str, function: str, message: str,
                   when: str | None = None) -> migrations.RunPython:
    """A reversible migration operation that installs the triggers; `when` limits them to some rows."""
    APPEND_ONLY_TRIGGERS[trigger] = table
    pg_when = f" WHEN ({when})" if when else ""
    sqlite_when = f" WHEN {when}" if when else ""
    pg_up = f"""
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION '{message} (% refused)', TG_OP;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER {trigger} BEFORE UPDATE OR DELETE ON {table}
    FOR EACH ROW{pg_when} EXECUTE FUNCTION {function}();
"""
    pg_down = f"DROP TRIGGER IF EXISTS {trigger} ON {table}; DROP FUNCTION IF EXISTS {function}();"
    sqlite_up = f"""
CREATE TRIGGER {trigger} BEFORE UPDATE ON {table}{sqlite_when}
BEGIN SELECT RAISE(ABORT, '{message} (UPDATE refused)'); END;
"""
    sqlite_down = f"DROP TRIGGER IF EXISTS {trigger};"

    def forwards(apps: Any, schema_editor: Any) -> None:
        # params=None: no placeholder parsing, so the PL/pgSQL "%" stays literal.
        schema_editor.execute(pg_up if schema_editor.connection.vendor == "postgresql" else sqlite_up, params=None)

    def backwards(apps: Any, schema_editor: Any) -> None:
        schema_editor.execute(pg_down if schema_editor.connection.vendor == "postgresql" else sqlite_down,
                              params=None)

    return migrations.RunPython(forwards, backwards)


def refuse_changes_again_on_sqlite(*, table: str, trigger: str, function: str, message: str,
                                   when: str | None = None) -> migrations.RunPython:
    """`refuse_changes`' triggers installed again on SQLite, for a migration that altered the
    table: SQLite alters a column (or adds a NOT NULL one) by rebuilding the table, which
    drops its triggers. Nothing on PostgreSQL, whose ALTER TABLE keeps them."""
    install = refuse_changes(table=table, trigger=trigger, function=function, message=message, when=when)

    def forwards(apps: Any, schema_editor: Any) -> None:
        if schema_editor.connection.vendor == "sqlite":
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {trigger};", params=None)
            install.code(apps, schema_editor)

    return migrations.RunPython(forwards, migrations.RunPython.noop)
