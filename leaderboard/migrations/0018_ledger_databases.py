# Ledger partitions in databases of their own (LEDGER_PARTITION_URLS): a partition's database
# runs these same migrations but holds no Season or ApiClient rows, so the ledger-side
# tables' FKs to them lose their database constraints (dropping one is metadata-only, no
# table scan or rewrite); LateResult keeps its FK to ScoreEvent (same database). The event-id
# claims of seasons split over databases live in "default".

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('leaderboard', '0017_partitions'),
        ('seasons', '0012_season_ledger_databases'),
    ]

    operations = [
        migrations.AlterField(
            model_name='lateresult',
            name='season',
            field=models.ForeignKey(db_constraint=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='seasons.season'),
        ),
        migrations.AlterField(
            model_name='scoreeventconflict',
            name='client',
            field=models.ForeignKey(db_constraint=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='leaderboard.apiclient'),
        ),
        migrations.AlterField(
            model_name='scoreeventconflict',
            name='season',
            field=models.ForeignKey(db_constraint=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='seasons.season'),
        ),
        migrations.CreateModel(
            name='LedgerEventClaim',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('event_id', models.CharField(max_length=64)),
                ('partition', models.PositiveSmallIntegerField()),
                ('payload_hash', models.CharField(max_length=64)),
                ('season', models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='seasons.season')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('season', 'event_id'), name='ledger_event_claim_unique_event_id')],
            },
        ),
    ]
