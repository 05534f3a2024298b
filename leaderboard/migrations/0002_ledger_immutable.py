"""The ledger is append-only: the database itself refuses to rewrite a row.

DELETE is refused on PostgreSQL too; SQLite keeps DELETE so its test runner can flush
tables between tests (PostgreSQL flushes with TRUNCATE, which row triggers don't see).
"""

from django.db import migrations

PG_UP = """
CREATE OR REPLACE FUNCTION leaderboard_refuse_ledger_change() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'the score ledger is append-only (% refused)', TG_OP;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER score_event_append_only BEFORE UPDATE OR DELETE ON leaderboard_scoreevent
    FOR EACH ROW EXECUTE FUNCTION leaderboard_refuse_ledger_change();
"""
PG_DOWN = """
DROP TRIGGER IF EXISTS score_event_append_only ON leaderboard_scoreevent;
DROP FUNCTION IF EXISTS leaderboard_refuse_ledger_change();
"""
SQLITE_UP = """
CREATE TRIGGER score_event_append_only BEFORE UPDATE ON leaderboard_scoreevent
BEGIN SELECT RAISE(ABORT, 'the score ledger is append-only (UPDATE refused)'); END;
"""
SQLITE_DOWN = "DROP TRIGGER IF EXISTS score_event_append_only;"


def forwards(apps, schema_editor):  # type: ignore[no-untyped-def]
    sql = PG_UP if schema_editor.connection.vendor == "postgresql" else SQLITE_UP
    # params=None: no placeholder parsing, so the PL/pgSQL "%" in RAISE stays literal.
    schema_editor.execute(sql, params=None)


def backwards(apps, schema_editor):  # type: ignore[no-untyped-def]
    sql = PG_DOWN if schema_editor.connection.vendor == "postgresql" else SQLITE_DOWN
    # params=None: no placeholder parsing, so the PL/pgSQL "%" in RAISE stays literal.
    schema_editor.execute(sql, params=None)


class Migration(migrations.Migration):
    dependencies = [("leaderboard", "0001_initial")]
    operations = [migrations.RunPython(forwards, backwards)]
