"""The audit trail becomes a hash chain and append-only.

Existing rows are chained in id order (the order they were written in), then the
database is told to refuse UPDATE on the table, and DELETE on PostgreSQL; SQLite keeps
DELETE so its test runner can flush tables (PostgreSQL flushes with TRUNCATE, which row
triggers don't see). A removed row still shows as a gap in the chain.
"""

import django.utils.timezone
from django.db import migrations, models

from audit.triggers import refuse_changes

def chain_existing(apps, schema_editor):  # type: ignore[no-untyped-def]
    from audit.chain import GENESIS, row_hash

    entry_model = apps.get_model("audit", "AuditEntry")
    head_model = apps.get_model("audit", "AuditChainHead")
    # The database being migrated (every ledger database runs these migrations too).
    db = schema_editor.connection.alias
    prev, seq = GENESIS, 0
    for entry in entry_model.objects.using(db).order_by("id").iterator(chunk_size=2000):
        seq += 1
        content = {f: getattr(entry, f) for f in (
            "created_at", "actor_type", "actor_id", "actor_label", "action", "target_type", "target_id",
            "season_slug", "before", "after", "reason")}
        content["seq"] = seq
        digest = row_hash(prev_hash=prev, content=content)
        entry_model.objects.using(db).filter(pk=entry.pk).update(seq=seq, prev_hash=prev, row_hash=digest)
        prev = digest
    head_model.objects.using(db).create(pk=1, seq=seq, row_hash=prev if seq else "")


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
        refuse_changes(table="audit_auditentry", trigger="audit_entry_append_only", function="audit_refuse_change",
                       message="the audit trail is append-only"),
    ]
