"""Drop the FK checks and season-only indexes of the ledger's hot tables (see models)."""

import django.db.models.deletion
from django.db import migrations, models

from audit.triggers import refuse_changes_again_on_sqlite


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
        refuse_changes_again_on_sqlite(
            table="leaderboard_scoreevent", trigger="score_event_append_only",
            function="leaderboard_refuse_ledger_change", message="the score ledger is append-only",
        ),
    ]
