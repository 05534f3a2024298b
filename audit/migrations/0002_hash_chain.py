"""The audit trail becomes a hash chain and append-only.

Existing rows are chained in id order (the order they were written in), then the
database is told to refuse UPDATE on the table, and DELETE on PostgreSQL; SQLite keeps
DELETE so its test runner can flush tables (PostgreSQL flushes with TRUNCATE, which row
triggers don't see). A removed row still shows as a gap in the chain.
"""

import django.utils.timezone
from django.db import migrations, models

PG_UP = """
CREATE OR REPLACE FUNCTION audit_refuse_change() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'the audit trail is append-only (% refused)', TG_OP;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER audit_entry_append_only BEFORE UPDATE OR DELETE ON audit_auditentry
    FOR EACH ROW EXECUTE FUNCTION audit_refuse_change();
"""
PG_DOWN = """
DROP TRIGGER IF EXISTS audit_entry_append_only ON audit_auditentry;
DROP FUNCTION IF EXISTS audit_refuse_change();
"""
SQLITE_UP = """
CREATE TRIGGER audit_entry_append_only BEFORE UPDATE ON audit_auditentry
BEGIN SELECT RAISE(ABORT, 'the audit trail is append-only (UPDATE refused)'); END;
"""
SQLITE_DOWN = "DROP TRIGGER IF EXISTS audit_entry_append_only;"


def chain_existing(apps, schema_editor):  # type: ignore[no-untyped-def]
    from audit.chain import GENESIS, row_hash

    entry_model = apps.get_model("audit", "AuditEntry")
    head_model = apps.get_model("audit", "AuditChainHead")
    prev, seq = GENESIS, 0
    for entry in entry_model.objects.order_by("id").iterator(chunk_size=2000):
        seq += 1
        content = {f: getattr(entry, f) for f in (
            "created_at", "actor_type", "actor_id", "actor_label", "action", "target_type", "target_id",
            "season_slug", "before", "after", "reason")}
        content["seq"] = seq
        digest = row_hash(prev_hash=prev, content=content)
        entry_model.objects.filter(pk=entry.pk).update(seq=seq, prev_hash=prev, row_hash=digest)
        prev = digest
    head_model.objects.create(pk=1, seq=seq, row_hash=prev if seq else "")


def triggers_up(apps, schema_editor):  # type: ignore[no-untyped-def]
    sql = PG_UP if schema_editor.connection.vendor == "postgresql" else SQLITE_UP
    # params=None: no placeholder parsing, so the PL/pgSQL "%" in RAISE stays literal.
    schema_editor.execute(sql, params=None)


def triggers_down(apps, schema_editor):  # type: ignore[no-untyped-def]
    sql = PG_DOWN if schema_editor.connection.vendor == "postgresql" else SQLITE_DOWN
    schema_editor.execute(sql, params=None)


class Migration(migrations.Migration):
    dependencies = [("audit", "0001_initial")]

    operations = [
        migrations.AlterField(
            model_name="auditentry",
            name="created_at",
            field=models.DateTimeField(db_index=True, default=django.utils.timezone.now),
        ),
        migrations.AddField(model_name="auditentry", name="seq", field=models.BigIntegerField(null=True)),
        migrations.AddField(model_name="auditentry", name="prev_hash",
                            field=models.CharField(default="", max_length=64), preserve_default=False),
        migrations.AddField(model_name="auditentry", name="row_hash",
                            field=models.CharField(default="", max_length=64), preserve_default=False),
        migrations.CreateModel(
            name="AuditChainHead",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("seq", models.BigIntegerField(default=0)),
                ("row_hash", models.CharField(blank=True, max_length=64)),
                ("updated_at", models.DateTimeField(default=django.utils.timezone.now)),
            ],
        ),
        migrations.RunPython(chain_existing, migrations.RunPython.noop),
        migrations.AlterField(model_name="auditentry", name="seq", field=models.BigIntegerField(unique=True)),
        migrations.RunPython(triggers_up, triggers_down),
    ]
