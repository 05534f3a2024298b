"""FINAL standings are written once, on approval, and never change: the database refuses UPDATE
(and DELETE on PostgreSQL; SQLite keeps DELETE so its test runner can flush tables)."""

from django.db import migrations

PG_UP = """
CREATE OR REPLACE FUNCTION seasons_refuse_final_change() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'FINAL standings are immutable (% refused)', TG_OP;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER final_standing_immutable BEFORE UPDATE OR DELETE ON seasons_finalstanding
    FOR EACH ROW EXECUTE FUNCTION seasons_refuse_final_change();
"""
PG_DOWN = """
DROP TRIGGER IF EXISTS final_standing_immutable ON seasons_finalstanding;
DROP FUNCTION IF EXISTS seasons_refuse_final_change();
"""
SQLITE_UP = """
CREATE TRIGGER final_standing_immutable BEFORE UPDATE ON seasons_finalstanding
BEGIN SELECT RAISE(ABORT, 'FINAL standings are immutable (UPDATE refused)'); END;
"""
SQLITE_DOWN = "DROP TRIGGER IF EXISTS final_standing_immutable;"


def forwards(apps, schema_editor):  # type: ignore[no-untyped-def]
    sql = PG_UP if schema_editor.connection.vendor == "postgresql" else SQLITE_UP
    # params=None: no placeholder parsing, so the PL/pgSQL "%" stays literal.
    schema_editor.execute(sql, params=None)


def backwards(apps, schema_editor):  # type: ignore[no-untyped-def]
    sql = PG_DOWN if schema_editor.connection.vendor == "postgresql" else SQLITE_DOWN
    schema_editor.execute(sql, params=None)


class Migration(migrations.Migration):
    dependencies = [("seasons", "0003_final_standings")]
    operations = [migrations.RunPython(forwards, backwards)]
