"""A manifest approved as FINAL keeps its hash: the database refuses to update or delete it."""

from django.db import migrations

PG_UP = """
CREATE OR REPLACE FUNCTION leaderboard_refuse_final_manifest_change() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'a FINAL manifest is immutable (% refused)', TG_OP;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER manifest_final_immutable BEFORE UPDATE OR DELETE ON leaderboard_manifest
    FOR EACH ROW WHEN (OLD.is_final) EXECUTE FUNCTION leaderboard_refuse_final_manifest_change();
"""
PG_DOWN = """
DROP TRIGGER IF EXISTS manifest_final_immutable ON leaderboard_manifest;
DROP FUNCTION IF EXISTS leaderboard_refuse_final_manifest_change();
"""
SQLITE_UP = """
CREATE TRIGGER manifest_final_immutable BEFORE UPDATE ON leaderboard_manifest WHEN OLD.is_final
BEGIN SELECT RAISE(ABORT, 'a FINAL manifest is immutable (UPDATE refused)'); END;
"""
SQLITE_DOWN = "DROP TRIGGER IF EXISTS manifest_final_immutable;"


def forwards(apps, schema_editor):  # type: ignore[no-untyped-def]
    sql = PG_UP if schema_editor.connection.vendor == "postgresql" else SQLITE_UP
    schema_editor.execute(sql, params=None)


def backwards(apps, schema_editor):  # type: ignore[no-untyped-def]
    sql = PG_DOWN if schema_editor.connection.vendor == "postgresql" else SQLITE_DOWN
    schema_editor.execute(sql, params=None)


class Migration(migrations.Migration):
    dependencies = [("leaderboard", "0005_rebuilds_and_reconciliation")]
    operations = [migrations.RunPython(forwards, backwards)]
