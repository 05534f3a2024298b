# A revocation applying a late result names the database holding it (late_result_alias): a
# season's late results live in its partitions' databases, each numbering its own. Both steps
# are cheap: a column with a constant default is metadata-only in PostgreSQL 11+ (no table
# rewrite; existing rows read "default", where their late results are), and dropping the
# foreign key's constraint is metadata-only too (its index stays).

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('leaderboard', '0018_ledger_databases'),
        ('seasons', '0012_season_ledger_databases'),
    ]

    operations = [
        migrations.AddField(
            model_name='scorerevocation',
            name='late_result_alias',
            field=models.CharField(default='default', max_length=64),
        ),
        migrations.AlterField(
            model_name='scorerevocation',
            name='late_result',
            field=models.ForeignKey(blank=True, db_constraint=False, null=True,
                                    on_delete=django.db.models.deletion.PROTECT, related_name='+',
                                    to='leaderboard.lateresult'),
        ),
    ]
