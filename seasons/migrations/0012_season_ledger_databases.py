# Where each ledger partition of a season lives (leaderboard.ledger_databases); existing
# seasons get [] (every partition in "default"), a constant default: no table rewrite.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('seasons', '0011_season_partitions'),
    ]

    operations = [
        migrations.AddField(
            model_name='season',
            name='ledger_databases',
            field=models.JSONField(blank=True, default=list),
        ),
    ]
