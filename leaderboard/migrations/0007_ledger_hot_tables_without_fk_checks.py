"""Drop the FK checks and season-only indexes of the ledger's hot tables (see models)."""

from typing import Any

import django.db.models.deletion
from django.db import migrations, models

from audit.triggers import refuse_changes

_append_only = refuse_changes(
    table="leaderboard_scoreevent", trigger="score_event_append_only",
    function="leaderboard_refuse_ledger_change", message="the score ledger is append-only",
)


def _sqlite_trigger_restore(apps: Any, schema_editor: Any) -> None:
    # SQLite alters a column by rebuilding the table, which drops its triggers.
    if schema_editor.connection.vendor == "sqlite":
        schema_editor.execute("DROP TRIGGER IF EXISTS score_event_append_only;", params=None)
        _append_only.code(apps, schema_editor)


class Migration(migrations.Migration):

    dependencies = [
        ('leaderboard', '0006_final_manifest_immutable'),
        ('seasons', '0006_staff_roles'),
    ]

    operations = [
        migrations.AlterField(
            model_name='playerscore',
            name='season',
            field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='seasons.season'),
        ),
        migrations.AlterField(
            model_name='scorechange',
            name='season',
            field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='seasons.season'),
        ),
        migrations.AlterField(
            model_name='scoreevent',
            name='client',
            field=models.ForeignKey(db_constraint=False, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='leaderboard.apiclient'),
        ),
        migrations.AlterField(
            model_name='scoreevent',
            name='season',
            field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='seasons.season'),
        ),
        migrations.RunPython(_sqlite_trigger_restore, migrations.RunPython.noop),
    ]
